//! Live runs: a built-in workload on a backend the user picks, eager against compiled and
//! reduce-overhead, timed the way the bench times a public call (inputs already on the device, call +
//! wait, median of several calls). Runs on a worker; the UI shows its progress and charts the result.

use kiln::graph::workloads;
use kiln::{Backend, Mode, Tensor};
use std::sync::mpsc::Sender;
use std::time::Instant;

/// One mode's time.
#[derive(Clone, Debug, PartialEq)]
pub struct LiveTime {
    /// `eager`, `compiled` or `reduce-overhead`.
    pub mode: &'static str,
    /// Median call + wait, ms.
    pub ms: f64,
}

/// A finished live run.
#[derive(Clone, Debug)]
pub struct LiveRun {
    /// Every mode's time.
    pub times: Vec<LiveTime>,
    /// The compiled function's report after a profiled call: each kernel's device time on the run's
    /// backend (`None` where the backend runs graphs without kernels).
    pub report: Option<kiln::CompileReport>,
    /// The bytes the computation must move (inputs read once, outputs written once; the bench's
    /// measure), where the compiled graph says.
    pub bytes: Option<u64>,
    /// A copy's rate on this device, bytes a second: `-x` over a tensor as large as the workload's
    /// largest input, called and waited for like the workload.
    pub copy_rate: Option<f64>,
}

impl LiveRun {
    /// The share of the copy rate a mode's call reaches (its bytes over its time), where both are known.
    pub fn copy_share(&self, t: &LiveTime) -> Option<f64> {
        Some(self.bytes? as f64 / (t.ms * 1e-3) / self.copy_rate?)
    }
}

/// What the worker reports.
#[derive(Clone, Debug)]
pub enum LiveMsg {
    /// What it is doing, and how far along it is (0 to 1).
    Progress(String, f32),
    /// The times of every mode and the profiled report, or why the run failed.
    Done(Box<Result<LiveRun, String>>),
}

/// Runs workload `id` at its check size (`quick`: its `--quick` size) on `backend`, each mode in turn:
/// three warm-up calls, then `calls` timed ones; then one profiled call of the compiled function.
pub fn run(id: &str, backend: Backend, quick: bool, calls: usize, tx: &Sender<LiveMsg>) {
    let result = run_inner(id, backend, quick, calls.max(1), tx);
    let _ = tx.send(LiveMsg::Done(Box::new(result)));
}

fn run_inner(id: &str, backend: Backend, quick: bool, calls: usize, tx: &Sender<LiveMsg>) -> Result<LiveRun, String> {
    let w = workloads::all().into_iter().find(|w| w.id == id).ok_or(format!("no built-in workload `{id}`"))?;
    let say = |what: String, done: f32| {
        let _ = tx.send(LiveMsg::Progress(what, done));
    };
    say(format!("opening {backend:?}"), 0.0);
    let rt = backend.runtime().map_err(|e| e.to_string())?;
    kiln::set_eager_backend(backend).map_err(|e| e.to_string())?;
    let specs = if quick { &w.quick } else { &w.check };
    let mut inputs: Vec<Tensor> = workloads::inputs(specs).into_iter().map(Tensor::from_data).collect();
    if let Some(rt) = &rt {
        inputs = inputs.iter().map(|t| t.to(rt.clone())).collect::<kiln::Result<_>>().map_err(|e| e.to_string())?;
    }
    let wait = || rt.as_ref().map_or(Ok(()), |rt| rt.synchronize()).map_err(|e| e.to_string());
    let modes: [(&'static str, Option<Mode>); 3] =
        [("eager", None), ("compiled", Some(Mode::Default)), ("reduce-overhead", Some(Mode::ReduceOverhead))];
    let mut times = Vec::new();
    let mut report = None;
    for (m, (name, mode)) in modes.into_iter().enumerate() {
        let f = mode.map(|mode| kiln::compile(move |x: Vec<Tensor>| (w.f)(&x)).backend(backend).mode(mode));
        let call = || -> Result<(), String> {
            let out = match &f {
                Some(f) => f.call(inputs.clone()),
                None => (w.f)(&inputs),
            };
            out.map(drop).map_err(|e| e.to_string())?;
            wait()
        };
        say(format!("{id} {name}: compiling and warming up"), m as f32 / 3.0);
        let ms = median_seconds(calls, &call, &mut |i| {
            say(format!("{id} {name}: call {}/{calls}", i + 1), (m as f32 + (i + 1) as f32 / calls as f32) / 3.0)
        })? * 1e3;
        times.push(LiveTime { mode: name, ms });
        if let (Some(f), Some(Mode::Default)) = (&f, mode) {
            say(format!("{id} {name}: timing each kernel"), (m as f32 + 1.0) / 3.0);
            f.profile(inputs.clone()).map(drop).map_err(|e| e.to_string())?;
            report = Some(f.report())
                .filter(|r| r.entries.iter().flat_map(|e| &e.graphs).any(|g| g.profiled_with.is_some()));
        }
    }
    // The computation's own traffic (inputs read once, outputs written once), as the bench quotes it.
    let bytes = report.as_ref().and_then(|r| {
        r.entries.first()?.graphs.first()?.compiled.as_ref()?.io_bytes(&kiln::graph::sym::Bindings::new()).ok()
    });
    say(format!("{id}: timing a copy of the same size"), 1.0);
    let copy_rate = copy_rate(backend, specs, &inputs, calls, &wait)?;
    Ok(LiveRun { times, report, bytes, copy_rate })
}

/// Bytes a second a compiled `-x` moves over a tensor as large as the largest of `specs` (read once,
/// written once), timed like the workload's calls.
fn copy_rate(
    backend: Backend,
    specs: &[kiln::graph::TensorSpec],
    inputs: &[Tensor],
    calls: usize,
    wait: &dyn Fn() -> Result<(), String>,
) -> Result<Option<f64>, String> {
    let Some((i, n)) = specs
        .iter()
        .enumerate()
        .filter(|(_, s)| s.dtype == kiln::DType::F32)
        .filter_map(|(i, s)| Some((i, s.shape.as_concrete()?.iter().product::<usize>())))
        .max_by_key(|(_, n)| *n)
    else {
        return Ok(None);
    };
    let x = &inputs[i];
    let f = kiln::compile(|x: &Tensor| x.neg()).backend(backend);
    let call = || -> Result<(), String> {
        f.call(x).map(|_: Tensor| ()).map_err(|e| e.to_string())?;
        wait()
    };
    Ok(Some((2 * n * 4) as f64 / median_seconds(calls, &call, &mut |_| {})?))
}

/// Three warm-up calls, then the median of `calls` timed ones, seconds; `done(i)` after timed call `i`.
fn median_seconds(
    calls: usize,
    call: &dyn Fn() -> Result<(), String>,
    done: &mut dyn FnMut(usize),
) -> Result<f64, String> {
    for _ in 0..3 {
        call()?;
    }
    let mut samples = Vec::with_capacity(calls);
    for i in 0..calls {
        let t = Instant::now();
        call()?;
        samples.push(t.elapsed().as_secs_f64());
        done(i);
    }
    samples.sort_by(f64::total_cmp);
    Ok(samples[samples.len() / 2])
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
