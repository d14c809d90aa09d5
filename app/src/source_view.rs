//! The source view: a file of the user's code with each line annotated by the kernels it went into and
//! the graph breaks it caused, so a person reads their own code and sees what kiln made of it.

use kiln::graph::report::GraphReport;
use kiln::SourceLoc;
use std::collections::BTreeMap;

/// What kiln made of one line.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LineNotes {
    /// Kernels computing nodes from this line.
    pub kernels: Vec<String>,
    /// Graph breaks at this line, with their reasons.
    pub breaks: Vec<String>,
}

/// The user files the graphs' nodes came from (kiln's own `<kiln>` nodes left out), first seen first.
pub fn files(graphs: &[&GraphReport]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for g in graphs {
        for n in &g.captured.nodes {
            if n.loc.line > 0 && !out.contains(&n.loc.file) {
                out.push(n.loc.file.clone());
            }
        }
    }
    out
}

/// Notes per line of `file`, from the graphs' kernels and the breaks that ended them.
pub fn notes(file: &str, graphs: &[&GraphReport]) -> BTreeMap<u32, LineNotes> {
    let mut by_line: BTreeMap<u32, LineNotes> = BTreeMap::new();
    for g in graphs {
        for k in &g.kernels {
            for l in k.lines.iter().filter(|l| l.file == file) {
                let n = by_line.entry(l.line).or_default();
                if !n.kernels.contains(&k.name) {
                    n.kernels.push(k.name.clone());
                }
            }
        }
        if let Some(b) = g.ended_by.as_ref().filter(|b| b.loc.file == file) {
            by_line.entry(b.loc.line).or_default().breaks.push(b.reason.clone());
        }
    }
    by_line
}

/// The file's text: as named (paths are relative to the workspace the program was built in), else
/// under each directory above this one.
pub fn read(file: &str) -> Result<String, String> {
    let direct = std::fs::read_to_string(file);
    if let Ok(t) = direct {
        return Ok(t);
    }
    let mut dir = std::env::current_dir().ok();
    while let Some(d) = dir {
        if let Ok(t) = std::fs::read_to_string(d.join(file)) {
            return Ok(t);
        }
        dir = d.parent().map(|p| p.to_path_buf());
    }
    Err(format!("{file} is not readable from here (the report names files as its program was built)"))
}

/// Draws `file` with its notes (scrolled to the first annotated line when `jump`); returns a line the user
/// clicked (its nodes light up in the graph).
pub fn show(ui: &mut egui::Ui, file: &str, graphs: &[&GraphReport], jump: bool) -> Option<SourceLoc> {
    let text = match read(file) {
        Ok(t) => t,
        Err(e) => {
            ui.label(e);
            return None;
        }
    };
    let notes = notes(file, graphs);
    ui.label(format!("{file}: {} annotated line(s)", notes.len()));
    let mut clicked = None;
    egui::ScrollArea::both().show(ui, |ui| {
        egui::Grid::new("source lines").striped(true).show(ui, |ui| {
            for (i, line) in text.lines().enumerate() {
                let number = i as u32 + 1;
                let note = notes.get(&number);
                let n = egui::RichText::new(format!("{number:4}")).monospace().weak();
                if note.is_some() {
                    let r = ui.link(n);
                    if jump && notes.keys().next() == Some(&number) {
                        r.scroll_to_me(Some(egui::Align::Center));
                    }
                    if r.clicked() {
                        clicked = Some(SourceLoc { file: file.into(), line: number, column: 0 });
                    }
                } else {
                    ui.label(n);
                }
                ui.label(egui::RichText::new(line).monospace());
                match note {
                    Some(n) => {
                        let mut parts: Vec<String> = n.kernels.iter().map(|k| format!("➡ {k}")).collect();
                        parts.extend(n.breaks.iter().map(|b| format!("✂ graph break: {b}")));
                        ui.colored_label(egui::Color32::from_rgb(120, 180, 255), parts.join("  "));
                    }
                    None => {
                        ui.label("");
                    }
                }
                ui.end_row();
            }
        });
    });
    clicked
}
