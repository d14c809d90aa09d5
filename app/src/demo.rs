//! The demo tab (the browser page's landing view, also in the desktop app): pick built-in workloads at
//! sizes that fit a laptop GPU, compile them here, run them eager, compiled and reduce-overhead on this
//! device, and see each one's time, speed-up, share of the device's copy rate and check against the f64
//! reference; or write an expression of your own and watch it compile. Each finished run opens its
//! report, so the Graph and Kernel tabs show what kiln made of it (the fused graph, each kernel's WGSL).

use crate::explorer::{Explorer, Tab};
use crate::expr::{Expr, FUNCTIONS, INPUTS};
use crate::live::{LiveRun, LiveTime, Subject};

/// The workloads the demo offers (the convolution workload W6 is not in kiln yet).
pub const DEMO_WORKLOADS: [&str; 5] = ["W1", "W2", "W3", "W4", "W5"];

impl Explorer {
    /// Queues the demo's runs of `ids` at their quick sizes.
    pub fn run_demo(&mut self, ids: &[&str]) {
        self.queue_runs(ids.iter().map(|id| Subject::Workload { id: id.to_string(), quick: true }));
    }

    /// Parses the expression line, traces it on its inputs' shapes (so a shape error shows at once, in
    /// kiln's words) and queues its run; a bad line is shown under it instead.
    pub fn run_expression(&mut self) {
        let checked = Expr::parse(&self.expression).map_err(|e| e.to_string()).and_then(|e| {
            kiln::graph::trace::capture(&e.specs(), |x| Ok(vec![e.eval(x)?])).map_err(|err| err.to_string())?;
            Ok(e)
        });
        match checked {
            Ok(e) => {
                self.expression_error = None;
                self.queue_runs([Subject::Expression(e)]);
            }
            Err(e) => self.expression_error = Some(e),
        }
    }

    /// The demo tab: backend, workload buttons, the expression line, the table of runs.
    pub(crate) fn demo_tab(&mut self, ui: &mut egui::Ui) {
        if let Some(n) = &self.notice {
            ui.label(n.as_str());
        }
        let backends = self.backends.get_or_insert_with(crate::live::run_backends).clone();
        let idle = self.runs_idle();
        ui.horizontal_wrapped(|ui| {
            ui.label("run on");
            crate::live::backend_combo(ui, "demo backend", &mut self.run_backend, &backends);
            ui.separator();
            for id in DEMO_WORKLOADS {
                if ui.add_enabled(idle, egui::Button::new(format!("Run {id}"))).clicked() {
                    self.run_demo(&[id]);
                }
            }
            if ui.add_enabled(idle, egui::Button::new("Run W1–W5")).clicked() {
                self.run_demo(&DEMO_WORKLOADS);
            }
        });
        ui.label(format!(
            "Each workload at its bench --quick size: eager, compiled and reduce-overhead; {} ({} calls after {} untimed ones); results checked against kiln's f64 reference.",
            crate::live::TIMING,
            self.run_calls,
            crate::live::WARMUP
        ));
        ui.separator();
        ui.strong("Write your own");
        ui.label(format!(
            "inputs: {}; operators + - * / @ (matmul); functions: {}",
            INPUTS.iter().map(|(n, s)| format!("{n} {s:?}")).collect::<Vec<_>>().join(", "),
            FUNCTIONS.iter().map(|(n, _, _)| *n).collect::<Vec<_>>().join(", ")
        ));
        ui.horizontal(|ui| {
            let line = ui.add(egui::TextEdit::singleline(&mut self.expression).desired_width(420.0));
            let enter = line.lost_focus() && ui.input(|i| i.key_pressed(egui::Key::Enter));
            if (ui.add_enabled(idle, egui::Button::new("Compile and run")).clicked() || enter) && idle {
                self.run_expression();
            }
        });
        if let Some(e) = &self.expression_error {
            ui.colored_label(egui::Color32::from_rgb(230, 80, 80), format!("rejected: {e}"));
        }
        if let Some((title, p, _)) = &self.running {
            ui.add(egui::ProgressBar::new(*p).text(title.as_str()));
        }
        ui.separator();
        self.demo_table(ui);
    }

    fn demo_table(&mut self, ui: &mut egui::Ui) {
        if self.runs.is_empty() {
            ui.label("No runs yet.");
            return;
        }
        let mut open = None;
        egui::Grid::new("demo runs").striped(true).show(ui, |ui| {
            for h in ["run", "eager ms", "compiled ms", "reduce-overhead ms", "speed-up", "copy rate", "check", ""] {
                ui.strong(h);
            }
            ui.end_row();
            for (i, (title, r)) in self.runs.iter().enumerate() {
                ui.label(title.as_str());
                match r {
                    Ok(run) => {
                        for mode in ["eager", "compiled", "reduce-overhead"] {
                            ui.label(run.times.iter().find(|t| t.mode == mode).map_or("–".into(), mode_time));
                        }
                        ui.label(speedup(run));
                        let best = run.best_compiled();
                        ui.label(
                            best.and_then(|t| run.copy_share(t)).map_or("–".into(), |s| format!("{:.0}%", 100.0 * s)),
                        );
                        ui.label(verdict(run));
                        if run.report.is_some() && ui.button("graph & kernels").clicked() {
                            open = Some(i);
                        }
                    }
                    Err(e) => {
                        ui.colored_label(egui::Color32::from_rgb(230, 80, 80), format!("failed: {e}"));
                    }
                }
                ui.end_row();
            }
        });
        if let Some(how) = self.runs.iter().find_map(|(_, r)| r.as_ref().ok()?.device_timing) {
            ui.label(format!("Times are call + wait, ms; \"device\" is the device's own time of a call ({how})."));
        }
        if let Some(Some((title, Ok(run)))) = open.map(|i| self.runs.get(i)) {
            if let Some(report) = run.report.clone() {
                let title = title.clone();
                self.show_run_report(&title, report);
                self.tab = Tab::Graph;
            }
        }
    }

    /// Every finished run as JSON, with the device and whether all matched the reference (what the
    /// browser page publishes for its test).
    pub fn runs_json(&self) -> serde_json::Value {
        let runs: Vec<serde_json::Value> = self
            .runs
            .iter()
            .map(|(title, r)| match r {
                Ok(run) => run.to_json(),
                Err(e) => serde_json::json!({ "title": title, "error": e, "correct": false }),
            })
            .collect();
        let correct = self.runs.iter().all(|(_, r)| r.as_ref().is_ok_and(LiveRun::correct));
        serde_json::json!({ "notice": self.notice, "correct": correct, "runs": runs })
    }
}

/// A mode's call + wait, and the device's own time of the call where it timed itself.
fn mode_time(t: &LiveTime) -> String {
    match t.device_ms {
        Some(d) => format!("{:.3} (device {d:.3})", t.ms),
        None => format!("{:.3}", t.ms),
    }
}

/// Compiled (the faster of its modes) over eager.
fn speedup(run: &LiveRun) -> String {
    let eager = run.ms("eager");
    match (eager, run.best_compiled().map(|t| t.ms)) {
        (Some(e), Some(b)) if b > 0.0 => format!("{:.2}×", e / b),
        _ => "–".into(),
    }
}

/// ✔ with the worst relative error, or ✖ naming the modes that disagreed with the reference.
fn verdict(run: &LiveRun) -> String {
    let wrong: Vec<&str> = run.times.iter().filter(|t| !t.outcome.correct).map(|t| t.mode).collect();
    if wrong.is_empty() {
        let worst = run.times.iter().map(|t| t.outcome.max_rel_err).fold(0.0, f64::max);
        format!("✔ matches the reference (max rel. err {worst:.1e})")
    } else {
        format!("✖ differs from the reference: {}", wrong.join(", "))
    }
}
