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
        let title = if e.cached {
            format!("entry {i}: {} graph(s)", e.graphs.len())
        } else {
            format!("latest trace (not cached: {} graph break(s))", e.breaks.len())
        };
        egui::CollapsingHeader::new(title).default_open(true).show(ui, |ui| {
            for g in &e.guards {
                ui.monospace(g);
            }
            for b in &e.breaks {
                ui.label(format!("graph break at {}: {}", b.loc, b.reason));
            }
        });
    }
}
