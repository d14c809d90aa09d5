//! Live runs: a built-in workload or a line of the expression language on a backend the user picks,
//! eager against compiled and reduce-overhead, each mode's first result checked against kiln's f64
//! reference under the one tolerance rule, each timed as a public call (inputs already on the device,
//! call + wait, median of several calls). One async implementation for the
//! desktop app (a worker thread blocks on it) and the browser page (a task the page's event loop drives:
//! a page cannot block on the GPU, so the wait is an awaited fence and the clock is `performance.now()`).

use crate::expr::Expr;
use kiln::graph::tolerance::{self, Expected, Outcome, Tolerance};
use kiln::graph::{workloads, TensorSpec};
use kiln::{Backend, Mode, Tensor};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use web_time::Instant;

/// How live runs time a call.
pub const TIMING: &str = "call + wait for the device (in a page an awaited fence), median of the timed calls; \
     where the device times itself (CUDA events, WebGPU timestamp queries), the device's own time of each call too";

/// Untimed calls before the timed ones (compiling, recording, warming caches).
pub const WARMUP: usize = 3;

/// What a live run runs.
#[derive(Clone, Debug)]
pub enum Subject {
    /// A built-in workload at its check size, or (`quick`) its bench `--quick` size.
    Workload {
        /// `W1`…`W5`, `LG`, `W5-bf16`.
        id: String,
        /// Its quick size instead of its check size.
        quick: bool,
    },
    /// A line of the demo's expression language, on the inputs it names.
    Expression(Expr),
}

/// A function of a live run's inputs, as kiln ops.
type Function = Arc<dyn Fn(&[Tensor]) -> kiln::Result<Vec<Tensor>> + Send + Sync>;

impl Subject {
    /// What the run is called on screen.
    pub fn title(&self) -> String {
        match self {
            Subject::Workload { id, quick: false } => id.clone(),
            Subject::Workload { id, quick: true } => format!("{id} (quick size)"),
            Subject::Expression(e) => format!("`{}`", e.text),
        }
    }

    fn parts(&self) -> Result<(Vec<TensorSpec>, Function), String> {
        match self {
            Subject::Workload { id, quick } => {
                let w = workloads::all()
                    .into_iter()
                    .find(|w| w.id.eq_ignore_ascii_case(id))
                    .ok_or(format!("no built-in workload `{id}`"))?;
                let f = w.f;
                Ok((if *quick { w.quick } else { w.check }, Arc::new(f)))
            }
            Subject::Expression(e) => {
                let e = e.clone();
                Ok((e.specs(), Arc::new(move |x: &[Tensor]| Ok(vec![e.eval(x)?]))))
            }
        }
    }
}

/// One mode's time, and its first result against the reference.
#[derive(Clone, Debug, PartialEq)]
pub struct LiveTime {
    /// `eager`, `compiled` or `reduce-overhead`.
    pub mode: &'static str,
    /// Median call + wait, ms.
    pub ms: f64,
    /// Median of the device's own time of each call, ms, where it can time itself.
    pub device_ms: Option<f64>,
    /// Every output of the mode's first call against kiln's f64 reference.
    pub outcome: Outcome,
}

/// A finished live run.
#[derive(Clone, Debug)]
pub struct LiveRun {
    /// What ran (see [`Subject::title`]).
    pub title: String,
    /// The device it ran on, as its driver describes it (the adapter's name on wgpu).
    pub device: String,
    /// Every mode's time and check.
    pub times: Vec<LiveTime>,
    /// How the device timed itself (`timestamp queries`, `CUDA events`); `None` where it did not.
    pub device_timing: Option<&'static str>,
    /// The compiled function's report; natively after a profiled call (each kernel's device time on
    /// the run's backend; a page cannot profile without blocking).
    pub report: Option<kiln::CompileReport>,
    /// The bytes the computation must move (inputs read once, outputs written once; the bench's
    /// measure), where the compiled graph says.
    pub bytes: Option<u64>,
    /// A copy's rate on this device, bytes a second: `-x` moving as many bytes as the computation,
    /// called and waited for like it (so a share of 100% means "as fast as copying its data once").
    pub copy_rate: Option<f64>,
}

impl LiveRun {
    /// The share of the copy rate a mode's call reaches (its bytes over its time), where both are known.
    pub fn copy_share(&self, t: &LiveTime) -> Option<f64> {
        Some(self.bytes? as f64 / (t.ms * 1e-3) / self.copy_rate?)
    }

    /// The fastest compiled mode (compiled or reduce-overhead).
    pub fn best_compiled(&self) -> Option<&LiveTime> {
        self.times.iter().filter(|t| t.mode != "eager").min_by(|a, b| a.ms.total_cmp(&b.ms))
    }

    /// Whether every mode's result matched the reference.
    pub fn correct(&self) -> bool {
        self.times.iter().all(|t| t.outcome.correct)
    }

    /// A mode's time.
    pub fn ms(&self, mode: &str) -> Option<f64> {
        self.times.iter().find(|t| t.mode == mode).map(|t| t.ms)
    }

    /// The run as JSON (what the browser page publishes for its test and for anyone reading the page).
    pub fn to_json(&self) -> serde_json::Value {
        let times: Vec<serde_json::Value> = self
            .times
            .iter()
            .map(|t| {
                serde_json::json!({
                    "mode": t.mode,
                    "ms": t.ms,
                    "device_ms": t.device_ms,
                    "correct": t.outcome.correct,
                    "mismatches": t.outcome.mismatches,
                    "max_rel_err": if t.outcome.max_rel_err.is_finite() { Some(t.outcome.max_rel_err) } else { None },
                    "copy_share": self.copy_share(t),
                })
            })
            .collect();
        let kernels = self.report.as_ref().map(kernel_count);
        serde_json::json!({
            "title": self.title,
            "device": self.device,
            "correct": self.correct(),
            "times": times,
            "kernels": kernels,
            "bytes": self.bytes,
            "copy_rate": self.copy_rate,
            "timing": TIMING,
            "device_timing": self.device_timing,
        })
    }
}

/// The kernels of every graph of a report.
pub fn kernel_count(r: &kiln::CompileReport) -> usize {
    r.entries.iter().flat_map(|e| &e.graphs).map(|g| g.kernels.len()).sum()
}

/// What a run reports while it works.
#[derive(Clone, Debug)]
pub enum LiveMsg {
    /// What it is doing, and how far along it is (0 to 1).
    Progress(String, f32),
    /// The times of every mode and the report, or why the run failed.
    Done(Box<Result<LiveRun, String>>),
}

/// Starts `subject` on `backend` off the UI: on a worker thread natively, as a page task in a browser.
/// Progress and the result arrive on `tx`.
pub fn start(subject: Subject, backend: Backend, calls: usize, tx: Sender<LiveMsg>) {
    crate::spawn_task(move || async move {
        let say = |what: String, done: f32| {
            let _ = tx.send(LiveMsg::Progress(what, done));
        };
        let result = run(&subject, backend, calls, &say).await;
        let _ = tx.send(LiveMsg::Done(Box::new(result)));
    });
}

/// Runs `subject` on `backend`, each mode in turn: [`WARMUP`] untimed calls, then `calls` timed ones, the
/// first result and one after the timed calls checked against the reference; then (natively) one profiled call of the compiled
/// function, and a copy moving as many bytes for the copy rate. `say` hears what it is doing.
pub async fn run(
    subject: &Subject,
    backend: Backend,
    calls: usize,
    say: &dyn Fn(String, f32),
) -> Result<LiveRun, String> {
    let calls = calls.max(1);
    let title = subject.title();
    let (specs, f) = subject.parts()?;
    let s = |e: kiln::Error| e.to_string();
    say(format!("{title}: the f64 reference"), 0.0);
    let data = workloads::inputs(&specs);
    let want = reference(&specs, &data, &f)?;
    say(format!("opening {}", backend_label(backend)), 0.0);
    let rt = backend.runtime().map_err(s)?;
    let device =
        rt.as_ref().map_or("the CPU reference (f64)".into(), |rt| format!("{}: {}", rt.name(), rt.driver().describe()));
    kiln::set_eager_backend(backend).map_err(s)?;
    let mut inputs: Vec<Tensor> = data.into_iter().map(Tensor::from_data).collect();
    if let Some(rt) = &rt {
        inputs = inputs.iter().map(|t| t.to(rt.clone())).collect::<kiln::Result<_>>().map_err(s)?;
    }
    let fence = Fence(rt.clone());
    let modes: [(&'static str, Option<Mode>); 3] =
        [("eager", None), ("compiled", Some(Mode::Default)), ("reduce-overhead", Some(Mode::ReduceOverhead))];
    let mut times = Vec::new();
    let mut report = None;
    for (m, (name, mode)) in modes.into_iter().enumerate() {
        let g = f.clone();
        let compiled = mode.map(|mode| kiln::compile(move |x: Vec<Tensor>| g(&x)).backend(backend).mode(mode));
        let call = || -> Result<Vec<Tensor>, String> {
            match &compiled {
                Some(c) => c.call(inputs.clone()),
                None => f(&inputs),
            }
            .map_err(s)
        };
        say(format!("{title} {name}: compiling and checking"), m as f32 / 3.0);
        let outcome = check(&call()?, &want).await?;
        let (ms, device_ms) = median_ms(calls, &fence, &|| call().map(drop), &|i| {
            say(format!("{title} {name}: call {}/{calls}", i + 1), (m as f32 + (i + 1) as f32 / calls as f32) / 3.0)
        })
        .await?;
        // The timed calls' path too: in reduce-overhead the first call records and the rest replay.
        let outcome = outcome.and(check(&call()?, &want).await?);
        times.push(LiveTime { mode: name, ms, device_ms, outcome });
        if let (Some(c), Some(Mode::Default)) = (&compiled, mode) {
            // Timing each kernel needs a blocking wait per launch: desktop only.
            #[cfg(not(target_arch = "wasm32"))]
            {
                say(format!("{title} {name}: timing each kernel"), (m as f32 + 1.0) / 3.0);
                c.profile(inputs.clone()).map(|_: Vec<Tensor>| ()).map_err(s)?;
            }
            report = Some(c.report());
        }
    }
    // The computation's own traffic (inputs read once, outputs written once), as the bench quotes it.
    let bytes = report.as_ref().and_then(|r| {
        r.entries.first()?.graphs.first()?.compiled.as_ref()?.io_bytes(&kiln::graph::sym::Bindings::new()).ok()
    });
    say(format!("{title}: timing a copy that moves as many bytes"), 1.0);
    let copy_rate = match bytes {
        Some(b) => copy_rate(backend, b, calls, &fence).await?,
        None => None,
    };
    let device_timing =
        times.iter().any(|t| t.device_ms.is_some()).then(|| rt.as_ref().map(|rt| rt.timing())).flatten();
    Ok(LiveRun { title, device, times, device_timing, report, bytes, copy_rate })
}

/// The reference's outputs of `f` on `data` (kiln's f64 interpreter over the traced graph) and the
/// tolerance each is held to.
fn reference(
    specs: &[TensorSpec],
    data: &[kiln::TensorData],
    f: &Function,
) -> Result<(Vec<Expected>, Vec<Tolerance>), String> {
    let s = |e: kiln::Error| e.to_string();
    let graph = kiln::graph::trace::capture(specs, |x| f(x)).map_err(s)?;
    let refs: Vec<&kiln::TensorData> = data.iter().collect();
    let out = kiln::graph::interp::run(&graph, &refs).map_err(s)?;
    let depth = tolerance::depth(&graph).map_err(s)?;
    let tol = graph.outputs.iter().map(|o| Tolerance::rule(graph.node(*o).dtype, depth)).collect();
    Ok((out.iter().map(|t| Expected::of(t, "kiln's f64 reference")).collect(), tol))
}

/// Every output against the reference (read back without blocking).
async fn check(got: &[Tensor], want: &(Vec<Expected>, Vec<Tolerance>)) -> Result<Outcome, String> {
    if got.len() != want.0.len() {
        return Ok(Outcome::MISSING);
    }
    let mut outcome: Option<Outcome> = None;
    for ((g, w), tol) in got.iter().zip(&want.0).zip(&want.1) {
        let data = g.to_data_async().await.map_err(|e| e.to_string())?;
        let o = tolerance::compare(&data, w, *tol);
        outcome = Some(outcome.map_or(o, |x| x.and(o)));
    }
    Ok(outcome.unwrap_or(Outcome::MISSING))
}

/// Waits for the device without blocking (nothing to wait for on the CPU reference).
struct Fence(Option<Arc<kiln::Runtime>>);

impl Fence {
    /// Runs `call` and waits for its work; returns the device's own time of that work, ms, where the
    /// device times itself (its timing's readback is then the wait), else after a plain [`Fence::wait`].
    async fn timed(&self, call: &dyn Fn() -> Result<(), String>) -> Result<Option<f64>, String> {
        let Some(rt) = &self.0 else { return call().map(|()| None) };
        let mut called = Ok(());
        let timing = rt.time_async(&mut || {
            called = call();
            Ok(())
        });
        let seconds = timing.await.map_err(|e| e.to_string());
        called?;
        match seconds? {
            Some(s) => Ok(Some(s * 1e3)),
            None => self.wait().await.map(|()| None),
        }
    }

    async fn wait(&self) -> Result<(), String> {
        if let Some(rt) = &self.0 {
            // Natively the bench's wait (a worker thread may block); a page awaits a fence instead.
            #[cfg(not(target_arch = "wasm32"))]
            rt.synchronize().map_err(|e| e.to_string())?;
            #[cfg(target_arch = "wasm32")]
            rt.synchronize_async().await.map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

/// Bytes a second a compiled `-x` moves when it moves `bytes` (a tensor of `bytes / 8` f32 elements read
/// once and written once: the same traffic as the computation), timed like the computation's calls.
async fn copy_rate(backend: Backend, bytes: u64, calls: usize, fence: &Fence) -> Result<Option<f64>, String> {
    let n = (bytes / 8) as usize;
    if n == 0 {
        return Ok(None);
    }
    let s = |e: kiln::Error| e.to_string();
    let mut x = Tensor::from_data(workloads::data(&workloads::f32s(&[n]), 0));
    if let Some(rt) = &fence.0 {
        x = x.to(rt.clone()).map_err(s)?;
    }
    let f = kiln::compile(|x: &Tensor| x.neg()).backend(backend);
    let call = || -> Result<(), String> { f.call(&x).map(|_: Tensor| ()).map_err(s) };
    Ok(Some((8 * n) as f64 / (median_ms(calls, fence, &call, &|_| {}).await?.0 * 1e-3)))
}

/// [`WARMUP`] untimed calls, then the median of `calls` timed ones (each call, then the fence), ms, and
/// the median of the device's own times of them where it timed itself; `done(i)` after timed call `i`.
async fn median_ms(
    calls: usize,
    fence: &Fence,
    call: &dyn Fn() -> Result<(), String>,
    done: &dyn Fn(usize),
) -> Result<(f64, Option<f64>), String> {
    for _ in 0..WARMUP {
        call()?;
        fence.wait().await?;
        crate::yield_to_page().await;
    }
    let (mut wall, mut device) = (Vec::with_capacity(calls), Vec::with_capacity(calls));
    for i in 0..calls {
        let t = Instant::now();
        device.extend(fence.timed(call).await?);
        wall.push(t.elapsed().as_secs_f64() * 1e3);
        done(i);
        // Outside the timed span: the page repaints (its progress bar) between calls.
        crate::yield_to_page().await;
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied()
    };
    // Device times only when every call was timed (a timing can be refused while another is pending).
    let device = if device.len() == calls { median(device) } else { None };
    Ok((median(wall).unwrap_or(f64::NAN), device))
}

/// The backends a live run can choose, best first, each with its label: `Wgpu` (the default adapter)
/// and, on native builds, every wgpu adapter on its own; a page has its one WebGPU device.
pub fn run_backends() -> Vec<(Backend, String)> {
    let adapters = kiln::wgpu_adapters();
    Backend::available()
        .into_iter()
        .flat_map(|b| match b {
            Backend::Wgpu => std::iter::once(b).chain((0..adapters.len()).map(Backend::WgpuAdapter)).collect(),
            b => vec![b],
        })
        .map(|b| (b, backend_label(b)))
        .collect()
}

/// A backend in words: an adapter by its name, the others by theirs.
pub fn backend_label(b: Backend) -> String {
    match b {
        Backend::WgpuAdapter(n) => match kiln::wgpu_adapters().get(n) {
            Some(name) => format!("wgpu:{n} {name}"),
            None => format!("wgpu:{n}"),
        },
        b => format!("{b:?}"),
    }
}

/// A combo box choosing `backend` among `backends` (labelled; the labels are made once, not per frame).
pub fn backend_combo(ui: &mut egui::Ui, id: &str, backend: &mut Backend, backends: &[(Backend, String)]) {
    let shown = backends.iter().find(|(b, _)| b == backend).map_or_else(|| backend_label(*backend), |(_, l)| l.clone());
    egui::ComboBox::from_id_salt(id).selected_text(shown).show_ui(ui, |ui| {
        for (b, label) in backends {
            ui.selectable_value(backend, *b, label.as_str());
        }
    });
}

/// The chart of a run: one bar per mode, with its speed-up over eager and the share of the device's
/// copy rate it reaches. Returns the plot's rectangle.
pub fn show(ui: &mut egui::Ui, title: &str, run: &LiveRun) -> egui::Rect {
    let times = &run.times;
    let eager = times.iter().find(|t| t.mode == "eager").map(|t| t.ms);
    for t in times {
        let speedup = eager.map_or(String::new(), |e| format!(" ({:.2}× eager)", e / t.ms));
        let share = run.copy_share(t).map_or(String::new(), |s| format!(", {:.0}% of the copy rate", 100.0 * s));
        ui.label(format!("{title} {}: {:.3} ms a call{speedup}{share}", t.mode, t.ms));
    }
    if let Some(rate) = run.copy_rate {
        ui.label(format!(
            "copy rate here: {:.2} GB/s; the computation moves {} (inputs read once, outputs written once)",
            rate / 1e9,
            run.bytes.map_or("an unknown number of bytes".into(), |b| format!("{b} bytes"))
        ));
    }
    let bars = times.iter().enumerate().map(|(i, t)| egui_plot::Bar::new(i as f64, t.ms).name(t.mode)).collect();
    let names: Vec<String> = times.iter().map(|t| t.mode.to_string()).collect();
    egui_plot::Plot::new("live run")
        .height(220.0)
        .y_axis_label("ms a call")
        .x_axis_formatter(crate::bench::label_axis(names))
        .show(ui, |p| p.bar_chart(egui_plot::BarChart::new("call + wait", bars)))
        .response
        .rect
}
