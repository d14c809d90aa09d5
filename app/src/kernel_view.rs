//! The kernel view: the selected kernel's launch, traffic and user lines, and its kernel IR, WGSL and PTX
//! side by side. Clicking a line lights up the graph nodes that came from it.

use kiln::graph::report::KernelReport;
use kiln::SourceLoc;

/// What the view asks the explorer to do.
pub enum KernelAction {
    /// Light up the nodes of this kernel that came from this line.
    ShowLine(SourceLoc),
}

/// Draws `k` (`ir`: its kernel IR, printed, when the report has the compiled graph); returns the action
/// the user took.
pub fn show(ui: &mut egui::Ui, k: &KernelReport, ir: Option<&str>) -> Option<KernelAction> {
    let mut action = None;
    ui.heading(&k.name);
    ui.label(format!(
        "{} kernel · {} threads × {} groups · reads {} B, writes {} B · {} IR statements",
        k.kind, k.threads, k.groups, k.bytes_read, k.bytes_written, k.statements
    ));
    ui.label(format!("computes {} node(s) of the captured graph, from these lines:", k.nodes.len()));
    for line in &k.lines {
        if ui.link(line.to_string()).clicked() {
            action = Some(KernelAction::ShowLine(line.clone()));
        }
    }
    ui.separator();
    // The kernel IR first (what `graph` decided), then each language it was rendered to.
    let ir_source =
        ir.map(|text| kiln::graph::report::KernelSource { language: "kernel IR".into(), text: Ok(text.into()) });
    let panes: Vec<&kiln::graph::report::KernelSource> = ir_source.iter().chain(&k.sources).collect();
    if k.sources.is_empty() {
        ui.label("no kernel sources in this report (no renderer was registered when it was made)");
    }
    if panes.is_empty() {
        return action;
    }
    ui.columns(panes.len(), |cols| {
        for (col, src) in cols.iter_mut().zip(&panes) {
            match &src.text {
                Ok(text) => {
                    col.strong(format!("{} ({} lines)", src.language.to_uppercase(), text.lines().count()));
                    let language = src.language.clone();
                    let dark = col.visuals().dark_mode;
                    let mut layouter = |ui: &egui::Ui, buf: &dyn egui::TextBuffer, _wrap: f32| {
                        ui.fonts_mut(|f| f.layout_job(crate::highlight::layout(buf.as_str(), &language, dark)))
                    };
                    egui::ScrollArea::both().id_salt(&src.language).show(col, |ui| {
                        ui.add(
                            egui::TextEdit::multiline(&mut text.as_str())
                                .code_editor()
                                .desired_width(f32::INFINITY)
                                .layouter(&mut layouter),
                        );
                    });
                }
                Err(e) => {
                    col.strong(src.language.to_uppercase());
                    col.label(format!("not rendered: {e}"));
                }
            }
        }
    });
    action
}
