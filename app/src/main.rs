//! `kiln-explorer`: the desktop explorer. `--workload W3` opens a built-in workload, `--open FILE` a
//! compile report or bench JSON; `--tab graph|kernel|source|timelines|guards|bench|run` picks the tab;
//! `--collapse` draws fused regions as one box; `--run BACKEND` times the workload live; `--screenshot out.png` renders the window, saves it and exits
//! (CI runs this under Xvfb on lavapipe to see the real app draw).

#[cfg(not(target_arch = "wasm32"))]
fn main() -> eframe::Result {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |flag: &str| args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1)).cloned();
    let mut app = kiln_app::Explorer::default();
    let screenshot = value("--screenshot").map(std::path::PathBuf::from);
    if let Some(w) = value("--workload") {
        app.open_workload(&w);
        if screenshot.is_some() {
            // The picture is of the opened workload, not of its progress bar.
            app.wait_for_work();
        }
    }
    if let Some(p) = value("--open") {
        app.open_path(&p);
    }
    app.collapse = args.iter().any(|a| a == "--collapse");
    if let Some(t) = value("--tab") {
        app.tab = match t.as_str() {
            "kernel" => kiln_app::Tab::Kernel,
            "guards" => kiln_app::Tab::Guards,
            "source" => kiln_app::Tab::Source,
            "timelines" => kiln_app::Tab::Timelines,
            "run" => kiln_app::Tab::Run,
            "bench" => kiln_app::Tab::Bench,
            _ => kiln_app::Tab::Graph,
        };
        if app.tab == kiln_app::Tab::Kernel {
            app.kernel = Some(0);
        }
    }
    if let Some(b) = value("--run") {
        // `--run wgpu|cuda|kernels|cpu`: a live run of the opened workload (waited for under --screenshot).
        app.run_backend = match b.as_str() {
            "cuda" => kiln::Backend::Cuda,
            "wgpu" => kiln::Backend::Wgpu,
            "cpu" => kiln::Backend::Cpu,
            _ => kiln::Backend::Kernels,
        };
        app.tab = kiln_app::Tab::Run;
        app.start_run(false);
        if screenshot.is_some() {
            app.wait_for_run();
        }
    }
    let options = eframe::NativeOptions {
        viewport: egui::ViewportBuilder::default().with_inner_size([1400.0, 900.0]).with_title("kiln explorer"),
        ..Default::default()
    };
    eframe::run_native("kiln explorer", options, Box::new(|_cc| Ok(Box::new(App { app, screenshot, frames: 0 }))))
}

#[cfg(target_arch = "wasm32")]
fn main() {}

/// The explorer as an eframe app, with the `--screenshot` mode.
#[cfg(not(target_arch = "wasm32"))]
struct App {
    app: kiln_app::Explorer,
    screenshot: Option<std::path::PathBuf>,
    frames: u32,
}

#[cfg(not(target_arch = "wasm32"))]
impl eframe::App for App {
    fn ui(&mut self, ui: &mut egui::Ui, _frame: &mut eframe::Frame) {
        self.app.show(ui);
        let Some(path) = self.screenshot.clone() else { return };
        self.frames += 1;
        // A few frames first: the graph's scene fits itself to the layout on its first frames.
        if self.frames == 5 {
            ui.ctx().send_viewport_cmd(egui::ViewportCommand::Screenshot(egui::UserData::default()));
        }
        ui.ctx().request_repaint();
        let shot = ui.ctx().input(|i| {
            i.events.iter().find_map(|e| match e {
                egui::Event::Screenshot { image, .. } => Some(image.clone()),
                _ => None,
            })
        });
        if let Some(image) = shot {
            let [w, h] = image.size;
            let rgba: Vec<u8> = image.pixels.iter().flat_map(|p| p.to_array()).collect();
            let Some(img) = image::RgbaImage::from_raw(w as u32, h as u32, rgba) else {
                eprintln!("kiln-explorer: the screenshot had the wrong size");
                std::process::exit(1);
            };
            if let Err(e) = img.save(&path) {
                eprintln!("kiln-explorer: saving {}: {e}", path.display());
                std::process::exit(1);
            }
            println!("kiln-explorer: saved {} ({w}×{h})", path.display());
            match kiln_app::check_screenshot(&img, self.app.report.is_some() && self.app.tab == kiln_app::Tab::Graph) {
                Ok(what) => println!("kiln-explorer: screenshot check: {what}"),
                Err(e) => {
                    eprintln!("kiln-explorer: screenshot check failed: {e}");
                    std::process::exit(1);
                }
            }
            ui.ctx().send_viewport_cmd(egui::ViewportCommand::Close);
        }
    }
}
