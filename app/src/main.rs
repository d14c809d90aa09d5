//! `kiln-explorer`: the desktop explorer. `--workload W3` opens a built-in workload, `--open FILE` a
//! compile report or bench JSON; `--screenshot out.png` renders the first frames, saves them and exits.

#[cfg(not(target_arch = "wasm32"))]
fn main() -> eframe::Result {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |flag: &str| args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1)).cloned();
    let mut app = kiln_app::Explorer::default();
    if let Some(w) = value("--workload") {
        app.open_workload(&w);
    }
    if let Some(p) = value("--open") {
        app.open_path(&p);
    }
    let options = eframe::NativeOptions {
        viewport: egui::ViewportBuilder::default().with_inner_size([1400.0, 900.0]).with_title("kiln explorer"),
        ..Default::default()
    };
    eframe::run_native("kiln explorer", options, Box::new(|_cc| Ok(Box::new(App(app)))))
}

#[cfg(target_arch = "wasm32")]
fn main() {}

/// The explorer as an eframe app.
struct App(kiln_app::Explorer);

impl eframe::App for App {
    fn ui(&mut self, ui: &mut egui::Ui, _frame: &mut eframe::Frame) {
        self.0.show(ui);
    }
}
