//! The explorer's state and its frame: a top bar to open things, a side panel of graphs and kernels, and
//! the selected tab (graph, kernel, guards, bench). Compiling a workload runs on a worker thread; the UI
//! only polls for its result, so it never blocks.

use crate::bench::BenchTable;
use crate::kernel_view::KernelAction;
use crate::layout::{layered, Layout};
use crate::{graph_view, guards_view, kernel_view, open, source_view};
use kiln::CompileReport;
use std::sync::mpsc::{channel, Receiver, Sender};

/// A file's name and its text, or why it could not be read.
type FileText = (String, Result<String, String>);

/// Files remembered in the recent list.
const RECENT: usize = 10;

/// The central panel's tabs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tab {
    /// The demo: built-in workloads and your own expression compiled and run here, checked and timed.
    Demo,
    /// The graph, coloured by region.
    Graph,
    /// The selected kernel's sources.
    Kernel,
    /// The user's source, annotated.
    Source,
    /// Compile phases and the memory plan over time.
    Timelines,
    /// Live runs: eager against compiled on a chosen backend.
    Run,
    /// Guards and recompiles.
    Guards,
    /// Bench charts.
    Bench,
}

/// The app: what is open and what is selected.
pub struct Explorer {
    /// The open report and where it came from.
    pub report: Option<(String, CompileReport)>,
    /// The open bench reports, charted side by side.
    pub benches: Vec<BenchTable>,
    /// The last error, shown until something opens.
    pub error: Option<String>,
    /// The last thing done that the user should see (a chart saved).
    pub status: Option<String>,
    /// Files opened lately, newest first (kept across runs by the desktop app).
    pub recent: Vec<String>,
    /// Where "Export PNG" writes the shown chart.
    pub chart_path: String,
    /// The shown tab.
    pub tab: Tab,
    /// Selected (entry, graph) of the report.
    pub graph: (usize, usize),
    /// Show the decomposed graph instead of the captured one.
    pub decomposed: bool,
    /// Draw each fused region as one box.
    pub collapse: bool,
    /// The selected node of the shown graph.
    pub node: Option<usize>,
    /// The selected kernel of the selected graph.
    pub kernel: Option<usize>,
    /// Nodes lit up by a source line.
    pub highlight: Vec<usize>,
    /// The "try these shapes" text and its verdict.
    pub shapes: String,
    /// See `shapes`.
    pub verdict: Option<String>,
    /// The graph view's search text (op names, lines).
    pub search: String,
    /// The source view's file.
    pub source_file: Option<String>,
    /// The built-in workload the open report is of (live runs need one).
    pub workload: Option<String>,
    /// The backend live runs use.
    pub run_backend: kiln::Backend,
    /// Calls timed per mode in a live run.
    pub run_calls: usize,
    /// The latest live run: what it ran, and its times.
    pub run_result: Option<(String, Result<crate::live::LiveRun, String>)>,
    /// Every finished live run, oldest first (the demo's table).
    pub runs: Vec<(String, Result<crate::live::LiveRun, String>)>,
    /// Live runs waiting their turn (the demo's "run all").
    pub(crate) queue: std::collections::VecDeque<crate::live::Subject>,
    /// The demo's expression line.
    pub expression: String,
    /// Why the expression line was rejected, shown under it.
    pub expression_error: Option<String>,
    /// What the page or app found about its device (the browser demo says whether it has WebGPU).
    pub notice: Option<String>,
    /// Files read off the UI thread (dropped in a browser): their names and texts.
    dropped: (Sender<FileText>, Receiver<FileText>),
    /// The shown chart's tab and rectangle, for its export.
    chart_rect: Option<(Tab, egui::Rect)>,
    /// The live run under way: its progress and its channel.
    pub(crate) running: Option<(String, f32, Receiver<crate::live::LiveMsg>)>,
    pub(crate) backends: Option<Vec<(kiln::Backend, String)>>,
    /// A workload being compiled on the worker, and its name.
    pending: Option<(String, Receiver<Result<CompileReport, String>>)>,
    layout: Option<((usize, usize, bool, bool), Layout)>,
    scene_rect: egui::Rect,
    path: String,
    /// "Browse…": a file dialog for reports and bench JSONs (a page has drag-and-drop instead).
    #[cfg(not(target_arch = "wasm32"))]
    pub file_dialog: egui_file_dialog::FileDialog,
}

/// The dialog's filter for what the explorer opens.
#[cfg(not(target_arch = "wasm32"))]
const JSON_FILES: &str = "kiln reports and bench JSONs";

/// The explorer's file dialog (JSON files only), opening in `start` when given.
#[cfg(not(target_arch = "wasm32"))]
pub fn json_dialog(start: Option<std::path::PathBuf>) -> egui_file_dialog::FileDialog {
    let d = egui_file_dialog::FileDialog::new()
        .add_file_filter_extensions(JSON_FILES, vec!["json"])
        .default_file_filter(JSON_FILES);
    match start {
        Some(dir) => d.initial_directory(dir),
        None => d,
    }
}

impl Default for Explorer {
    fn default() -> Self {
        Explorer {
            report: None,
            benches: Vec::new(),
            error: None,
            status: None,
            recent: Vec::new(),
            chart_path: "kiln-chart.png".into(),
            dropped: channel(),
            chart_rect: None,
            tab: Tab::Graph,
            graph: (0, 0),
            decomposed: false,
            collapse: false,
            node: None,
            kernel: None,
            highlight: Vec::new(),
            shapes: String::new(),
            verdict: None,
            search: String::new(),
            source_file: None,
            workload: None,
            run_backend: kiln::Backend::Kernels,
            run_calls: 10,
            run_result: None,
            runs: Vec::new(),
            queue: Default::default(),
            expression: "gelu(x*1.5+0.5)*sigmoid(x)".into(),
            expression_error: None,
            notice: None,
            running: None,
            backends: None,
            pending: None,
            layout: None,
            scene_rect: egui::Rect::ZERO,
            path: String::new(),
            #[cfg(not(target_arch = "wasm32"))]
            file_dialog: json_dialog(None),
        }
    }
}

impl Explorer {
    /// Starts compiling built-in workload `id` on a worker; the report opens when it is done.
    pub fn open_workload(&mut self, id: &str) {
        self.compile_on_worker(format!("workload {id}"), id, open::workload_report);
        self.workload = Some(id.to_string());
    }

    /// Starts compiling example program `name` ([`open::EXAMPLES`]) on a worker; its report opens when done.
    pub fn open_example(&mut self, name: &str) {
        self.compile_on_worker(format!("example {name}"), name, open::example_report);
        self.workload = None;
    }

    /// Runs `make(name)` on a worker; its report opens when it arrives (see `pending`).
    fn compile_on_worker(&mut self, title: String, name: &str, make: fn(&str) -> Result<CompileReport, String>) {
        let (tx, rx) = channel();
        let name = name.to_string();
        crate::spawn_task(move || async move {
            let _ = tx.send(make(&name));
        });
        self.pending = Some((title, rx));
    }

    /// Pans and zooms the graph view along a fixed path, `t` seconds in, as a person's drags and scrolls
    /// would (the frame-rate measurement drives the view with it): from the whole graph down to a sixth
    /// of it, sweeping across.
    pub fn animate(&mut self, t: f32) {
        let Some((_, layout)) = &self.layout else { return };
        let b = layout.bounds;
        let shown = 1.0 / 6.0 + (5.0 / 6.0) * (0.5 + 0.5 * (t * 0.9).cos());
        let centre = b.center() + egui::vec2((t * 0.5).sin() * b.width(), (t * 0.37).sin() * b.height()) * 0.4;
        self.scene_rect = egui::Rect::from_center_size(centre, b.size() * shown);
    }

    /// Waits for the worker's report, if one is compiling (tests and `--screenshot` use this; a page
    /// cannot block).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn wait_for_work(&mut self) {
        if let Some((name, rx)) = self.pending.take() {
            let r = rx.recv().unwrap_or_else(|_| Err("the worker stopped".into()));
            self.finish(name, r);
        }
    }

    /// Whether a workload is compiling.
    pub fn busy(&self) -> bool {
        self.pending.is_some()
    }

    fn poll(&mut self) {
        let done = match &self.pending {
            Some((_, rx)) => rx.try_recv().ok(),
            None => None,
        };
        if let Some(r) = done {
            let name = self.pending.take().map(|(n, _)| n).unwrap_or_default();
            self.finish(name, r);
        }
    }

    fn finish(&mut self, name: String, r: Result<CompileReport, String>) {
        match r {
            Ok(report) => self.set_report(name, report),
            Err(e) => self.error = Some(format!("{name}: {e}")),
        }
    }

    /// Shows `report` (from `source`).
    pub fn set_report(&mut self, source: String, report: CompileReport) {
        self.report = Some((source, report));
        self.error = None;
        self.graph = (0, 0);
        self.node = None;
        self.kernel = None;
        self.highlight.clear();
        self.layout = None;
        self.scene_rect = egui::Rect::ZERO;
        self.source_file = None;
    }

    /// Starts a live run of the open workload on `run_backend` (a worker; the Run tab shows progress).
    pub fn start_run(&mut self, quick: bool) {
        let Some(id) = self.workload.clone() else { return };
        self.queue_runs([crate::live::Subject::Workload { id, quick }]);
    }

    /// Queues live runs on `run_backend`; they run one after another (the first starts now, if no run is
    /// under way) and each lands in [`Explorer::runs`].
    pub fn queue_runs(&mut self, subjects: impl IntoIterator<Item = crate::live::Subject>) {
        self.queue.extend(subjects);
        self.next_run();
    }

    fn next_run(&mut self) {
        if self.running.is_some() {
            return;
        }
        let Some(subject) = self.queue.pop_front() else { return };
        let (tx, rx) = channel();
        let backend = self.run_backend;
        let title = format!("{} on {}", subject.title(), crate::live::backend_label(backend));
        crate::live::start(subject, backend, self.run_calls, tx);
        self.running = Some((title, 0.0, rx));
    }

    /// Whether no live run is under way or waiting.
    pub fn runs_idle(&self) -> bool {
        self.running.is_none() && self.queue.is_empty()
    }

    /// Waits for the live runs under way and queued, if any (tests use this; a page cannot block).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn wait_for_run(&mut self) {
        while let Some((_, _, rx)) = &self.running {
            match rx.recv() {
                Ok(crate::live::LiveMsg::Done(r)) => self.finish_run(*r),
                Ok(_) => {}
                Err(_) => self.finish_run(Err("the worker stopped".into())),
            }
        }
    }

    /// The run under way ended with `r`: its title loses the progress text, and it is recorded.
    fn finish_run(&mut self, r: Result<crate::live::LiveRun, String>) {
        let title = self.running.take().map(|(t, _, _)| t).unwrap_or_default();
        let title = title.split(" — ").next().unwrap_or_default().to_string();
        self.run_done(title, r);
    }

    fn poll_run(&mut self) {
        let Some((title, progress, rx)) = &mut self.running else { return };
        let mut done = None;
        loop {
            match rx.try_recv() {
                Ok(crate::live::LiveMsg::Progress(what, p)) => {
                    *title = title.split(" — ").next().unwrap_or_default().to_string() + " — " + &what;
                    *progress = p;
                }
                Ok(crate::live::LiveMsg::Done(r)) => done = Some(*r),
                // A worker that died without a word must not hold the queue forever.
                Err(std::sync::mpsc::TryRecvError::Disconnected) if done.is_none() => {
                    done = Some(Err("the worker stopped".into()))
                }
                Err(_) => break,
            }
            if done.is_some() {
                break;
            }
        }
        if let Some(r) = done {
            self.finish_run(r);
        }
    }

    /// A live run ended: its times are shown, its report (profiled on the desktop: each kernel's device
    /// time on the run's backend) replaces the open one, it joins [`Explorer::runs`], and the next
    /// queued run starts.
    fn run_done(&mut self, title: String, r: Result<crate::live::LiveRun, String>) {
        if let Ok(run) = &r {
            if let Some(report) = run.report.clone() {
                self.show_run_report(&title, report);
            }
        }
        self.run_result = Some((title.clone(), r.clone()));
        self.runs.push((title, r));
        self.next_run();
    }

    /// Opens a live run's report, keeping what is selected where the run was of the open workload.
    pub(crate) fn show_run_report(&mut self, title: &str, report: CompileReport) {
        let (graph, kernel, tab) = (self.graph, self.kernel, self.tab);
        let workload = self.workload.clone();
        let same = self.report.as_ref().is_some_and(|(_, r)| r.function == report.function);
        self.set_report(format!("{title} (live run)"), report);
        if same {
            (self.graph, self.kernel) = (graph, kernel);
        }
        (self.tab, self.workload) = (tab, workload);
    }

    fn run_tab(&mut self, ui: &mut egui::Ui) {
        let Some(id) = self.workload.clone() else {
            ui.label("Live runs need a built-in workload: open one with the buttons above.");
            return;
        };
        let backends = self.backends.get_or_insert_with(crate::live::run_backends).clone();
        ui.horizontal(|ui| {
            ui.label(format!("run {id} on"));
            crate::live::backend_combo(ui, "run backend", &mut self.run_backend, &backends);
            let idle = self.running.is_none();
            if ui.add_enabled(idle, egui::Button::new("Run at check size")).clicked() {
                self.start_run(false);
            }
            if ui.add_enabled(idle, egui::Button::new("Run at quick size")).clicked() {
                self.start_run(true);
            }
        });
        if let Some((title, p, _)) = &self.running {
            ui.add(egui::ProgressBar::new(*p).text(title.as_str()));
        }
        if matches!(self.run_result, Some((_, Ok(_)))) {
            self.export_row(ui);
        }
        match &self.run_result {
            Some((title, Ok(run))) => {
                let rect = crate::live::show(ui, title, run);
                self.chart_rect = Some((Tab::Run, rect));
            }
            Some((title, Err(e))) => {
                ui.colored_label(egui::Color32::from_rgb(230, 80, 80), format!("run failed: {title}: {e}"));
            }
            None => {
                ui.label(format!(
                    "eager, compiled and reduce-overhead calls on inputs already on the device, call + wait, median of {}.",
                    self.run_calls
                ));
            }
        }
    }

    /// Opens a report from its JSON text; a bad one becomes the shown error.
    pub fn open_report_text(&mut self, text: &str, source: &str) {
        match CompileReport::from_json(text) {
            Ok(r) => {
                self.workload = None;
                self.set_report(source.into(), r)
            }
            Err(e) => self.error = Some(format!("{source}: {e}")),
        }
    }

    /// Opens a bench report from its JSON text and charts it beside the ones already open (one from the
    /// same source replaces its older self); a bad one becomes the shown error.
    pub fn open_bench_text(&mut self, text: &str, source: &str) {
        match BenchTable::parse(text, source) {
            Ok(b) => {
                self.benches.retain(|t| t.source != b.source);
                self.benches.push(b);
                self.error = None;
                self.tab = Tab::Bench;
            }
            Err(e) => self.error = Some(e),
        }
    }

    /// Opens a file: a bench report if it says so, else a compile report. It joins the recent list.
    pub fn open_path(&mut self, path: &str) {
        match std::fs::read_to_string(path) {
            Ok(text) => {
                self.open_text(&text, path);
                if self.error.is_none() {
                    self.recent.retain(|p| p != path);
                    self.recent.insert(0, path.to_string());
                    self.recent.truncate(RECENT);
                }
            }
            Err(e) => self.error = Some(format!("{path}: {e}")),
        }
    }

    /// The recent list from a saved app state (the desktop app keeps it between runs).
    pub fn restore(&mut self, storage: &dyn eframe::Storage) {
        if let Some(text) = storage.get_string("kiln-recent") {
            self.recent = serde_json::from_str(&text).unwrap_or_default();
        }
    }

    /// Saves what [`Explorer::restore`] reads.
    pub fn save(&self, storage: &mut dyn eframe::Storage) {
        storage.set_string("kiln-recent", serde_json::to_string(&self.recent).unwrap_or_default());
    }

    /// Opens a file's text: a bench report if it says so, else a compile report.
    pub fn open_text(&mut self, text: &str, source: &str) {
        if text.contains("\"kiln-bench/") {
            self.open_bench_text(text, source)
        } else {
            self.open_report_text(text, source)
        }
    }

    /// The selected graph's report.
    pub fn selected_graph(&self) -> Option<&kiln::graph::report::GraphReport> {
        let (_, r) = self.report.as_ref()?;
        r.entries.get(self.graph.0)?.graphs.get(self.graph.1)
    }

    /// The selected kernel's report.
    pub fn selected_kernel(&self) -> Option<&kiln::graph::report::KernelReport> {
        self.selected_graph()?.kernels.get(self.kernel?)
    }

    /// Draws one frame.
    pub fn show(&mut self, ui: &mut egui::Ui) {
        self.poll();
        self.poll_run();
        if self.running.is_some() {
            ui.ctx().request_repaint_after(std::time::Duration::from_millis(50));
        }
        if self.busy() {
            ui.ctx().request_repaint_after(std::time::Duration::from_millis(50));
        }
        for file in ui.ctx().input(|i| i.raw.dropped_files.clone()) {
            let name = file.path().display().to_string();
            #[cfg(not(target_arch = "wasm32"))]
            match file.bytes() {
                Ok(bytes) => self.open_text(&String::from_utf8_lossy(&bytes), &name),
                Err(e) => self.error = Some(format!("{name}: {e}")),
            }
            // A browser reads a file only asynchronously: a task reads it and the next frames open it.
            #[cfg(target_arch = "wasm32")]
            {
                let tx = self.dropped.0.clone();
                wasm_bindgen_futures::spawn_local(async move {
                    let text = file.bytes_async().await.map(|b| String::from_utf8_lossy(&b).into_owned());
                    let _ = tx.send((name, text));
                });
            }
        }
        while let Ok((name, text)) = self.dropped.1.try_recv() {
            match text {
                Ok(text) => self.open_text(&text, &name),
                Err(e) => self.error = Some(format!("{name}: {e}")),
            }
        }
        // A chart export asked for last frame arrives as this frame's screenshot (a page writes no files).
        #[cfg(not(target_arch = "wasm32"))]
        if let Some(saved) = crate::export::take(ui.ctx()) {
            match saved {
                Ok(what) => self.status = Some(what),
                Err(e) => self.error = Some(e),
            }
        }
        #[cfg(not(target_arch = "wasm32"))]
        {
            self.file_dialog.update(ui.ctx());
            if let Some(picked) = self.file_dialog.take_picked() {
                self.path = picked.to_string_lossy().into_owned();
                let p = self.path.clone();
                self.open_path(&p);
            }
        }
        egui::Panel::top("open").show(ui, |ui| self.top_bar(ui));
        egui::Panel::left("contents").resizable(true).default_size(260.0).show(ui, |ui| {
            egui::ScrollArea::vertical().show(ui, |ui| self.contents(ui));
        });
        egui::CentralPanel::default().show(ui, |ui| self.central(ui));
    }

    fn top_bar(&mut self, ui: &mut egui::Ui) {
        ui.horizontal_wrapped(|ui| {
            ui.strong("kiln explorer");
            ui.separator();
            // The built-in workloads, then the example programs: one button each.
            let groups = [(open::workload_ids(), false), (open::EXAMPLES.to_vec(), true)];
            for (names, example) in groups {
                let hover = if example {
                    "the example program's function, compiled and run here"
                } else {
                    "compile and run it here"
                };
                for name in names {
                    if ui.add_enabled(!self.busy(), egui::Button::new(name)).on_hover_text(hover).clicked() {
                        match example {
                            true => self.open_example(name),
                            false => self.open_workload(name),
                        }
                    }
                }
                ui.separator();
            }
            ui.add(
                egui::TextEdit::singleline(&mut self.path).hint_text("report or bench JSON path").desired_width(240.0),
            );
            if ui.button("Open").clicked() {
                let p = self.path.clone();
                self.open_path(&p);
            }
            #[cfg(not(target_arch = "wasm32"))]
            if ui.button("Browse…").on_hover_text("pick a report or bench JSON").clicked() {
                self.file_dialog.pick_file();
            }
            let mut pick = None;
            ui.add_enabled_ui(!self.recent.is_empty(), |ui| {
                ui.menu_button("Recent", |ui| {
                    for p in &self.recent {
                        if ui.button(p.as_str()).clicked() {
                            pick = Some(p.clone());
                        }
                    }
                });
            });
            if let Some(p) = pick {
                self.open_path(&p);
            }
            if let Some((name, _)) = &self.pending {
                ui.spinner();
                ui.label(format!("compiling {name}…"));
            }
        });
        if let Some(e) = &self.error {
            ui.colored_label(egui::Color32::from_rgb(230, 80, 80), format!("error: {e}"));
        } else if let Some(s) = &self.status {
            ui.label(s.as_str());
        }
    }

    /// The selected entry's graphs in the order the trace made them, each break drawn as a cut between
    /// the graph it ended and the next (where and why); a click opens a graph.
    fn trace_strip(&mut self, ui: &mut egui::Ui) {
        let Some((_, r)) = &self.report else { return };
        let (e, shown) = self.graph;
        let Some(entry) = r.entries.get(e) else { return };
        if entry.graphs.len() < 2 && entry.graphs.iter().all(|g| g.ended_by.is_none()) {
            return;
        }
        let mut pick = None;
        ui.horizontal_wrapped(|ui| {
            ui.label(format!("entry {e}:"));
            for (g, graph) in entry.graphs.iter().enumerate() {
                let text = format!("graph {g} ({} ops)", graph.captured.nodes.len());
                if ui.selectable_label(g == shown, text).clicked() {
                    pick = Some(g);
                }
                if let Some(b) = &graph.ended_by {
                    // (Arrows from the emoji font: the default text font has no U+2192.)
                    ui.label("➡");
                    ui.colored_label(egui::Color32::from_rgb(240, 160, 60), format!("✂ {}", b.loc))
                        .on_hover_text(&b.reason);
                    ui.label("➡");
                }
            }
        });
        if let Some(g) = pick {
            self.select_graph((e, g));
        }
    }

    /// Shows graph `g` (entry, graph) with nothing selected in it.
    fn select_graph(&mut self, g: (usize, usize)) {
        self.graph = g;
        self.kernel = None;
        self.node = None;
        self.highlight.clear();
    }

    fn contents(&mut self, ui: &mut egui::Ui) {
        let Some((source, r)) = &self.report else {
            ui.label("Open a workload above, or a report written with KILN_REPORT=dir (drop it here).");
            return;
        };
        ui.label(source.as_str());
        ui.label(format!("compiled at {} for {}", r.function, r.backend));
        let mut pick_graph = None;
        let mut pick_kernel = None;
        for (e, entry) in r.entries.iter().enumerate() {
            for (g, graph) in entry.graphs.iter().enumerate() {
                let selected = self.graph == (e, g);
                let cached = graph.cache_level.as_ref().map_or(String::new(), |l| format!(" · from the {l} cache"));
                let text = format!(
                    "entry {e} · graph {g}: {} ops, {} kernels{cached}",
                    graph.captured.nodes.len(),
                    graph.kernels.len()
                );
                if ui.selectable_label(selected, text).clicked() {
                    pick_graph = Some((e, g));
                }
                if let Some(b) = &graph.ended_by {
                    ui.label(format!("  ✂ break at {}: {}", b.loc, b.reason));
                }
                // A training step's backward: what its partitioner keeps and computes again.
                for p in &graph.partitions {
                    ui.label(format!("  {p}"));
                }
                if selected {
                    if let (Some(total), Some(timing)) = (graph.device_ms(), &graph.profiled_with) {
                        ui.label(format!("  {total:.3} ms a run ({timing})"));
                    }
                    let total = graph.device_ms().filter(|t| *t > 0.0);
                    for (k, kr) in graph.kernels.iter().enumerate() {
                        let text = match (kr.device_ms, total) {
                            (Some(ms), Some(t)) => format!("{} — {ms:.3} ms, {:.0}%", kr.name, 100.0 * ms / t),
                            _ => kr.name.clone(),
                        };
                        if ui.selectable_label(self.kernel == Some(k), text).clicked() {
                            pick_kernel = Some(k);
                        }
                    }
                }
            }
        }
        if let Some(g) = pick_graph {
            self.select_graph(g);
        }
        if let Some(k) = pick_kernel {
            self.kernel = Some(k);
            self.tab = Tab::Kernel;
        }
    }

    fn central(&mut self, ui: &mut egui::Ui) {
        ui.horizontal(|ui| {
            ui.selectable_value(&mut self.tab, Tab::Demo, "Demo");
            ui.selectable_value(&mut self.tab, Tab::Graph, "Graph");
            ui.selectable_value(&mut self.tab, Tab::Kernel, "Kernel");
            ui.selectable_value(&mut self.tab, Tab::Source, "Source");
            ui.selectable_value(&mut self.tab, Tab::Timelines, "Timelines");
            ui.selectable_value(&mut self.tab, Tab::Run, "Run");
            ui.selectable_value(&mut self.tab, Tab::Guards, "Guards");
            ui.selectable_value(&mut self.tab, Tab::Bench, "Bench");
        });
        ui.separator();
        match self.tab {
            Tab::Demo => self.demo_tab(ui),
            Tab::Graph => self.graph_tab(ui),
            Tab::Kernel => match self.selected_kernel().cloned() {
                Some(k) => {
                    let ir = self.kernel.and_then(|i| {
                        self.selected_graph()?.compiled.as_ref()?.kernels.get(i).map(|kernel| kernel.to_string())
                    });
                    if let Some(KernelAction::ShowLine(line)) = kernel_view::show(ui, &k, ir.as_deref()) {
                        let g = self.selected_graph();
                        self.highlight = k
                            .nodes
                            .iter()
                            .copied()
                            .filter(|n| g.and_then(|g| g.captured.nodes.get(*n)).is_some_and(|x| x.loc == line))
                            .collect();
                        self.decomposed = false;
                        self.tab = Tab::Graph;
                    }
                }
                None => {
                    ui.label("Select a kernel in the list on the left.");
                }
            },
            Tab::Source => self.source_tab(ui),
            Tab::Run => self.run_tab(ui),
            Tab::Timelines => match &self.report {
                Some((_, r)) => {
                    let graphs: Vec<&kiln::graph::report::GraphReport> =
                        r.entries.iter().flat_map(|e| &e.graphs).collect();
                    crate::timelines::show(ui, &graphs, self.selected_graph());
                }
                None => {
                    ui.label("No report open.");
                }
            },
            Tab::Guards => match &self.report {
                Some((_, r)) => {
                    guards_view::try_shapes(ui, r, &mut self.shapes, &mut self.verdict);
                    ui.separator();
                    guards_view::show(ui, r);
                }
                None => {
                    ui.label("No report open.");
                }
            },
            Tab::Bench => self.bench_tab(ui),
        }
    }

    fn bench_tab(&mut self, ui: &mut egui::Ui) {
        if self.benches.is_empty() {
            ui.label("Open one or more kiln-bench JSONs (benches/results/*.json) to chart them side by side.");
            return;
        }
        let mut close = None;
        ui.horizontal_wrapped(|ui| {
            for (i, b) in self.benches.iter().enumerate() {
                ui.label(format!("{}: {} rows", b.source, b.rows.len()));
                if ui.small_button("✖").on_hover_text("close this report").clicked() {
                    close = Some(i);
                }
                ui.separator();
            }
        });
        if let Some(i) = close {
            self.benches.remove(i);
        }
        self.export_row(ui);
        self.chart_rect = Some((Tab::Bench, crate::bench::show(ui, &self.benches)));
    }

    /// A path and a button that saves the shown chart as PNG (the desktop app; a page cannot write files).
    fn export_row(&mut self, ui: &mut egui::Ui) {
        #[cfg(not(target_arch = "wasm32"))]
        ui.horizontal(|ui| {
            ui.add(egui::TextEdit::singleline(&mut self.chart_path).desired_width(220.0));
            let rect = self.chart_rect.filter(|(tab, _)| *tab == self.tab).map(|(_, r)| r);
            if ui.add_enabled(rect.is_some(), egui::Button::new("Export PNG")).clicked() {
                if let Some(rect) = rect {
                    let shot = crate::export::ChartShot { path: self.chart_path.clone().into(), rect };
                    crate::export::request(ui.ctx(), shot);
                }
            }
        });
        #[cfg(target_arch = "wasm32")]
        let _ = ui;
    }

    fn source_tab(&mut self, ui: &mut egui::Ui) {
        let Some((_, r)) = &self.report else {
            ui.label("No report open.");
            return;
        };
        let graphs: Vec<&kiln::graph::report::GraphReport> = r.entries.iter().flat_map(|e| &e.graphs).collect();
        let files = source_view::files(&graphs);
        if files.is_empty() {
            ui.label("No user source lines in this report.");
            return;
        }
        let mut file = self.source_file.clone().filter(|f| files.contains(f)).unwrap_or_else(|| files[0].clone());
        egui::ComboBox::from_label("file").selected_text(file.as_str()).show_ui(ui, |ui| {
            for f in &files {
                ui.selectable_value(&mut file, f.clone(), f.as_str());
            }
        });
        let jump = self.source_file.as_ref() != Some(&file);
        let clicked = source_view::show(ui, &file, &graphs, jump);
        self.source_file = Some(file);
        if let Some(line) = clicked {
            // The line's nodes in the selected graph light up there.
            if let Some(g) = self.selected_graph() {
                self.highlight = g
                    .captured
                    .nodes
                    .iter()
                    .enumerate()
                    .filter(|(_, n)| n.loc.file == line.file && n.loc.line == line.line)
                    .map(|(i, _)| i)
                    .collect();
                self.decomposed = false;
                self.tab = Tab::Graph;
            }
        }
    }

    fn graph_tab(&mut self, ui: &mut egui::Ui) {
        let Some(g) = self.selected_graph().cloned() else {
            ui.label("No graph: open a workload or a report.");
            return;
        };
        ui.horizontal(|ui| {
            let mut d = self.decomposed;
            ui.checkbox(&mut d, "decomposed (primitive ops)").on_hover_text("the graph after decomposition");
            ui.checkbox(&mut self.collapse, "collapse regions").on_hover_text("one box per fused kernel");
            if d != self.decomposed {
                self.decomposed = d;
                self.node = None;
                self.highlight.clear();
                self.scene_rect = egui::Rect::ZERO;
            }
            ui.add(
                egui::TextEdit::singleline(&mut self.search).hint_text("search ops or file:line").desired_width(200.0),
            );
        });
        self.trace_strip(ui);
        let graph = graph_view::shown(&g, self.decomposed);
        if !self.search.trim().is_empty() {
            let q = self.search.trim().to_lowercase();
            self.highlight = (0..graph.nodes.len())
                .filter(|&i| {
                    let n = &graph.nodes[i];
                    graph_view::node_label(graph, i).to_lowercase().contains(&q)
                        || n.loc.to_string().to_lowercase().contains(&q)
                })
                .collect();
            ui.label(format!("{} match(es) for “{}”", self.highlight.len(), self.search.trim()));
        }
        if let Some(i) = self.node.filter(|i| *i < graph.nodes.len()) {
            let n = &graph.nodes[i];
            ui.label(format!("{}: {} {} {}", graph_view::node_label(graph, i), n.dtype, n.shape, n.op.name()));
            ui.label(format!("source: {}", n.loc));
        }
        let boxes = graph_view::boxes(&g, self.decomposed, self.collapse);
        let key = (self.graph.0, self.graph.1, self.decomposed, self.collapse);
        if self.layout.as_ref().map(|(k, _)| *k) != Some(key) {
            self.layout = Some((key, layered(boxes.labels.len(), &boxes.edges)));
            self.scene_rect = egui::Rect::ZERO;
        }
        let layout = &self.layout.as_ref().expect("laid out above").1;
        if self.scene_rect == egui::Rect::ZERO {
            self.scene_rect = layout.bounds.expand(40.0);
        }
        let selected = self.node.and_then(|n| boxes.of_node.get(n).copied());
        let lit: Vec<usize> = self.highlight.iter().filter_map(|n| boxes.of_node.get(*n).copied()).collect();
        if let Some(b) = graph_view::show(ui, &boxes, layout, selected, &lit, &mut self.scene_rect) {
            match (self.collapse, boxes.regions[b]) {
                // A collapsed region opens its kernel.
                (true, Some(k)) => {
                    self.kernel = Some(k);
                    self.tab = Tab::Kernel;
                }
                _ => self.node = boxes.of_node.iter().position(|&x| x == b),
            }
        }
    }
}
