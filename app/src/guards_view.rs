//! Guards and recompiles: each entry's guards, the recompile log with its reasons, and the counters.

use kiln::CompileReport;

/// Draws the guards of every entry and the recompile log of `r`.
pub fn show(ui: &mut egui::Ui, r: &CompileReport) {
    let s = &r.stats;
    ui.label(format!(
        "{} call(s), {} trace(s), {} cache hit(s), {} recompile(s), {} eager fallback(s)",
        s.calls, s.traces, s.cache_hits, s.recompiles, s.eager_fallbacks
    ));
    ui.separator();
    ui.strong("recompiles");
    if s.guard_failures.is_empty() {
        ui.label("none");
    }
    for (i, why) in s.guard_failures.iter().enumerate() {
        ui.label(format!("recompile {}: {why}", i + 1));
    }
    ui.separator();
    for (i, e) in r.entries.iter().enumerate() {
        let title = if e.cached() {
            format!("entry {i}: {} graph(s)", e.graphs.len())
        } else {
            format!("latest trace (not cached: {} graph break(s))", e.breaks.len())
        };
        egui::CollapsingHeader::new(title).default_open(true).show(ui, |ui| {
            for g in e.guard_lines() {
                ui.monospace(g);
            }
            for b in &e.breaks {
                ui.label(format!("graph break at {}: {}", b.loc, b.reason));
            }
        });
    }
}

/// Argument shapes as a person types them: `[8, 64], [64], [64]` (one bracket per tensor argument).
pub fn parse_shapes(text: &str) -> Result<Vec<Vec<usize>>, String> {
    let mut shapes = Vec::new();
    let mut rest = text.trim();
    while !rest.is_empty() {
        let open = rest.find('[').ok_or(format!("expected `[` in `{rest}`"))?;
        let close = rest[open..].find(']').map(|c| open + c).ok_or("a `[` without its `]`")?;
        let dims = rest[open + 1..close]
            .split(',')
            .map(str::trim)
            .filter(|d| !d.is_empty())
            .map(|d| d.parse::<usize>().map_err(|_| format!("`{d}` is not a size")))
            .collect::<Result<Vec<_>, _>>()?;
        shapes.push(dims);
        rest = rest[close + 1..].trim_start_matches([',', ';', ' ']).trim();
    }
    if shapes.is_empty() {
        return Err("no shapes: write one `[..]` per tensor argument".into());
    }
    Ok(shapes)
}

/// The "try these shapes" box: whether a call with these argument shapes runs a cached entry (binding
/// which symbols) or recompiles, and why.
pub fn try_shapes(ui: &mut egui::Ui, r: &CompileReport, text: &mut String, verdict: &mut Option<String>) {
    ui.horizontal(|ui| {
        ui.label("try these shapes:");
        ui.add(egui::TextEdit::singleline(text).hint_text("[8, 64], [64], [64]").desired_width(260.0));
        if ui.button("Check").clicked() {
            *verdict = Some(match parse_shapes(text) {
                Ok(shapes) => format!("verdict: {}", r.try_shapes(&shapes)),
                Err(e) => format!("verdict: not shapes: {e}"),
            });
        }
    });
    if let Some(v) = verdict {
        ui.label(v.as_str());
    }
}

#[cfg(test)]
mod tests {
    use super::parse_shapes;

    #[test]
    fn shapes_parse_as_people_write_them() {
        assert_eq!(parse_shapes("[8, 64], [64]; [ ]").unwrap(), vec![vec![8, 64], vec![64], vec![]]);
        assert!(parse_shapes("").is_err() && parse_shapes("[8, x]").is_err() && parse_shapes("[8").is_err());
    }
}
