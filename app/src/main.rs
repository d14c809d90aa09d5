//! `kiln-explorer`: the desktop explorer. `--workload W3` opens a built-in workload, `--example "graph breaks"`
//! an example program (`"digits CNN (ONNX)"` the other), `--open FILE` a
//! compile report or bench JSON (repeat it to chart several bench JSONs side by side); `--tab graph|kernel|source|timelines|guards|bench|run|demo` picks the tab;
//! `--collapse` draws fused regions as one box; `--run BACKEND` times the workload live; `--synthetic N` opens a made-up graph of N ops and `--fps SECONDS` pans and zooms it, printing the frame rate; `--screenshot out.png` renders the window, saves it and exits
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
    if value("--workload").is_some() && value("--example").is_some() {
        eprintln!("kiln-explorer: --workload and --example each open a report: give one");
        std::process::exit(2);
    }
    if let Some(e) = value("--example") {
        app.open_example(&e);
        if screenshot.is_some() {
            app.wait_for_work();
        }
    }
    if let Some(n) = value("--synthetic") {
        // `--synthetic N`: a made-up graph of N ops (the frame-rate measurement's subject).
        match n.parse().map_err(|e| format!("--synthetic {n}: {e}")).and_then(kiln_app::synthetic_report) {
            Ok(r) => app.set_report(format!("synthetic graph of {n} ops"), r),
            Err(e) => app.error = Some(e),
        }
    }
    let fps = value("--fps").and_then(|s| s.parse::<f64>().ok()).map(FrameTimes::new);
    // `--open` may repeat: several bench JSONs chart side by side.
    for (i, _) in args.iter().enumerate().filter(|(_, a)| *a == "--open") {
        if let Some(p) = args.get(i + 1) {
            app.open_path(p);
        }
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
            "demo" => kiln_app::Tab::Demo,
            _ => kiln_app::Tab::Graph,
        };
        if app.tab == kiln_app::Tab::Kernel {
            app.kernel = Some(0);
        }
    }
    if let Some(b) = value("--run") {
        // `--run wgpu|wgpu:N|cuda|kernels|cpu`: a live run of the opened workload (waited for under
        // --screenshot).
        app.run_backend = match b.parse::<kiln::Backend>() {
            Ok(b) => b,
            Err(e) => {
                eprintln!("kiln-explorer: {e}");
                std::process::exit(2);
            }
        };
        app.tab = kiln_app::Tab::Run;
        app.start_run(false);
        if screenshot.is_some() {
            app.wait_for_run();
        }
    }
    let mut options = eframe::NativeOptions {
        viewport: egui::ViewportBuilder::default().with_inner_size([1400.0, 900.0]).with_title("kiln explorer"),
        ..Default::default()
    };
    if fps.is_some() {
        // The frame rate the app can draw, not the display's refresh.
        options.wgpu_options.surface.present_mode = eframe::wgpu::PresentMode::AutoNoVsync;
    }
    eframe::run_native(
        "kiln explorer",
        options,
        Box::new(|cc| {
            if let Some(storage) = cc.storage {
                app.restore(storage);
            }
            Ok(Box::new(App { app, screenshot, frames: 0, fps }))
        }),
    )
}

#[cfg(target_arch = "wasm32")]
fn main() {}

/// The explorer as an eframe app, with the `--screenshot` mode.
#[cfg(not(target_arch = "wasm32"))]
struct App {
    app: kiln_app::Explorer,
    screenshot: Option<std::path::PathBuf>,
    frames: u32,
    fps: Option<FrameTimes>,
}

/// `--fps SECONDS`: the graph view panned and zoomed for that long, every frame's interval kept; then the
/// frame rate is printed and the app exits.
#[cfg(not(target_arch = "wasm32"))]
struct FrameTimes {
    seconds: f64,
    start: Option<std::time::Instant>,
    last: Option<std::time::Instant>,
    intervals_ms: Vec<f64>,
    /// Time spent building each frame's UI (the app's own work, before egui tessellates and the
    /// renderer draws).
    ui_ms: Vec<f64>,
    /// eframe's CPU time of each frame (UI, tessellation and rendering, without waiting for vsync).
    cpu_ms: Vec<f64>,
}

#[cfg(not(target_arch = "wasm32"))]
impl FrameTimes {
    fn new(seconds: f64) -> Self {
        FrameTimes { seconds, start: None, last: None, intervals_ms: Vec::new(), ui_ms: Vec::new(), cpu_ms: Vec::new() }
    }

    /// Notes a frame; `Some(summary)` once the time is up.
    fn frame(&mut self) -> Option<String> {
        let now = std::time::Instant::now();
        let start = *self.start.get_or_insert(now);
        if let Some(last) = self.last.replace(now) {
            self.intervals_ms.push((now - last).as_secs_f64() * 1e3);
        }
        if (now - start).as_secs_f64() < self.seconds || self.intervals_ms.len() < 10 {
            return None;
        }
        let sorted = |v: &[f64]| {
            let mut v = v.to_vec();
            v.sort_by(f64::total_cmp);
            v
        };
        let at = |v: &[f64], q: f64| v.get(((v.len().max(1) - 1) as f64 * q).round() as usize).copied().unwrap_or(0.0);
        let (v, ui, cpu) = (sorted(&self.intervals_ms), sorted(&self.ui_ms), sorted(&self.cpu_ms));
        Some(format!(
            "{} frames in {:.1} s: median frame {:.2} ms ({:.0} fps), p95 {:.2} ms ({:.0} fps), worst {:.2} ms; \
             the app's UI median {:.2} ms (p95 {:.2}); eframe CPU (UI + tessellation + rendering) median {:.2} ms (p95 {:.2})",
            v.len(),
            (now - start).as_secs_f64(),
            at(&v, 0.5),
            1e3 / at(&v, 0.5),
            at(&v, 0.95),
            1e3 / at(&v, 0.95),
            at(&v, 1.0),
            at(&ui, 0.5),
            at(&ui, 0.95),
            at(&cpu, 0.5),
            at(&cpu, 0.95),
        ))
    }
}

#[cfg(not(target_arch = "wasm32"))]
impl eframe::App for App {
    /// The recent files outlive the window.
    fn save(&mut self, storage: &mut dyn eframe::Storage) {
        self.app.save(storage);
    }

    fn ui(&mut self, ui: &mut egui::Ui, frame: &mut eframe::Frame) {
        if let Some(fps) = &mut self.fps {
            self.frames += 1;
            // The first frames lay the graph out (once); the measurement is of the frames after.
            if self.frames > 3 {
                let t = fps.start.map_or(0.0, |s| s.elapsed().as_secs_f32());
                self.app.animate(t);
                if let Some(summary) = fps.frame() {
                    // Which device drew the frames: the figure means nothing without it.
                    let drawn = frame.wgpu_render_state().map_or("an unknown renderer".into(), |r| {
                        let i = r.adapter.get_info();
                        format!("{} ({:?}, {:?})", i.name, i.backend, i.device_type)
                    });
                    println!("kiln-explorer: {summary}; drawn by {drawn}");
                    ui.ctx().send_viewport_cmd(egui::ViewportCommand::Close);
                    self.fps = None;
                    return;
                }
            }
            ui.ctx().request_repaint();
        }
        let started = std::time::Instant::now();
        self.app.show(ui);
        if let Some(fps) = &mut self.fps {
            if fps.start.is_some() {
                fps.ui_ms.push(started.elapsed().as_secs_f64() * 1e3);
                fps.cpu_ms.extend(frame.info().cpu_usage.map(|s| f64::from(s) * 1e3));
            }
        }
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
