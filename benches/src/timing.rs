//! Measuring on a device, both numbers for every configuration: the device time (a prepared plan
//! launched `--batch` times back to back between two device events, divided by the count) and the
//! public call as a user makes it (`compile(f).call(..)` on inputs already on the device, then a
//! synchronise, host wall time). Every configuration's own output, at the size it was timed, is checked
//! (`check.rs`). Written once for every [`Device`].

use crate::check::{self, Expected, Outcome, Tolerance};
use crate::device::Device;
use crate::report::ResultRow;
use crate::Cli;
use kiln_graph::runtime::Prepared;
use kiln_graph::workloads::{data, Workload};
use kiln_graph::{capture, compile_cached, compile_graph_with, DType, FusionMode, Tensor, TensorData, TensorSpec};
use std::time::Instant;

fn median(v: Vec<f64>) -> f64 {
    crate::trials::median(v)
}

/// Launches and waits for at least half a second (and three runs): a GPU that has been idle runs its
/// first milliseconds at lower clocks, which a fixed three-launch warm-up does not cover.
fn warm_up(mut once: impl FnMut() -> kiln::Result<()>) -> kiln::Result<()> {
    let t = Instant::now();
    let mut n = 0;
    while n < 3 || t.elapsed().as_secs_f64() < 0.5 {
        once()?;
        n += 1;
    }
    Ok(())
}

/// Device seconds per launch: the median of `repeat` samples of `batch` launches back to back.
fn time(dev: &Device, run: &Prepared, cli: &Cli) -> kiln::Result<f64> {
    warm_up(|| {
        dev.launch(run)?;
        dev.wait()
    })?;
    let samples = (0..cli.repeat.max(1)).map(|_| dev.rt.time_launches(run, cli.batch)).collect::<kiln::Result<_>>()?;
    Ok(median(samples))
}

/// GB/s of a plain copy kernel (a layout output: read once, written once) over 2^26 f32 (2^22 quick),
/// and of the device's own copy of the same bytes where it times itself.
pub fn copy_bandwidth(dev: &Device, cli: &Cli) -> kiln::Result<(f64, Option<f64>)> {
    let n = if cli.quick { 1 << 22 } else { 1 << 26 };
    let spec = TensorSpec::new(DType::F32, &[n]);
    let g = capture(std::slice::from_ref(&spec), |t| Ok(vec![t[0].unsqueeze(0)?]))?;
    let c = std::sync::Arc::new(compile_graph_with(&g, dev.target(), FusionMode::Fused)?);
    let x = data(&spec, 0);
    let run = dev.prepare(&c, &[&x])?;
    let s = time(dev, &run, cli)?;
    Ok(((2 * n * 4) as f64 / s / 1e9, dev.native_copy_gbps(n * 4, cli.repeat)?))
}

/// The workload id whose expected output `id` shares (the SDPA variants compute the same function).
pub fn base_id(id: &str) -> &str {
    id.trim_end_matches("-sdpa")
}

/// What `w`'s outputs at `specs` should be: torch's float64 run (`--expect DIR/<id>.expected.safetensors`,
/// written by the peer for the same seeded inputs: every output it wrote) where present, else kiln's f64
/// reference (every output).
fn expected(w: &Workload, host: &[TensorData], cli: &Cli) -> kiln::Result<Vec<Expected>> {
    let size = if cli.quick { "quick size" } else { "full size" };
    if let Some(dir) = &cli.expect {
        let path = dir.join(format!("{}.expected.safetensors", base_id(w.id)));
        if let Some(e) = check::load(&path, &format!("torch's float64 output ({size})"))? {
            return Ok(e);
        }
        eprintln!("kiln-bench: {} not found; checking {} against kiln's f64 reference", path.display(), w.id);
    }
    if !cli.quick {
        eprintln!("kiln-bench: {}: computing kiln's f64 reference at full size (no --expect outputs); large workloads take minutes on the host", w.id);
    }
    check::reference(w.f, host, &format!("kiln's f64 reference ({size})"))
}

/// One configuration's outputs against the expected ones (as many as are expected; a missing one fails).
fn judge(outputs: &[TensorData], want: &[Expected], tol: Tolerance) -> Outcome {
    let numbered: Vec<(usize, &TensorData)> = outputs.iter().enumerate().collect();
    Outcome::of_each(want, &numbered, |&(i, got), w| {
        let o = check::compare(got, w, tol);
        if !o.correct {
            // Which output, so a failure can be traced (a training step has one per parameter and moment).
            eprintln!(
                "kiln-bench: output {i} {:?}: {} elements past the rule, max rel err {:.1e}",
                w.dims, o.mismatches, o.max_rel_err
            );
        }
        o
    })
}

/// What a configuration measured, before it becomes a row.
struct Measured {
    mode: &'static str,
    device_s: f64,
    call_s: Option<f64>,
    outcome: Outcome,
    compile_ms: Option<f64>,
    peak: u64,
}

/// Checks and times `w` compiled (default and reduce-overhead, both public-call modes) and eager (one
/// kernel per op; its call is the user's eager tensor code on device tensors). `cold`: this process
/// started with every cache empty, so its compile times are cold ones (else warm).
pub fn measure(dev: &Device, w: &Workload, cli: &Cli, copy_gbps: f64, cold: bool) -> kiln::Result<Vec<ResultRow>> {
    let started = Instant::now();
    // Progress on stderr (a full-size workload takes tens of seconds: expected outputs, three modes).
    let phase = |what: &str| {
        eprintln!("kiln-bench: {} {}: {what} at {:.1} s", dev.name(), w.id, started.elapsed().as_secs_f64())
    };
    let specs = if cli.quick { &w.quick } else { &w.full };
    let host: Vec<TensorData> = kiln_graph::workloads::inputs(specs);
    let g = capture(specs, w.f)?;
    let tol = Tolerance::of_on(&g, dev.target())?;
    let want = expected(w, &host, cli)?;
    phase("expected output ready");
    let source = want.first().map_or("nothing", |w| w.source.as_str());
    let checked = format!("{source} ({} outputs), rtol {:.1e}, atol {:.1e}", want.len(), tol.rtol, tol.atol);
    let device_inputs: Vec<Tensor> =
        host.iter().map(|d| Tensor::from_data(d.clone()).to(dev.backend())).collect::<kiln::Result<_>>()?;
    // The plans bind the same device tensors the public calls get: one copy of the inputs on the device,
    // so the peak is the configuration's, not the bench's.
    let bound: Vec<kiln_graph::runtime::DeviceTensor> =
        device_inputs.iter().filter_map(|t| t.value().and_then(|v| v.device())).collect();
    let mut measured = Vec::new();

    // Compiled first, so its compile is the first of this workload in the process (eager kernels are
    // cached under another key; the compiled ones must not find theirs warmed by it).
    kiln_graph::cache::clear_memory();
    dev.clear();
    let t = Instant::now();
    let loading_before = dev.rt.stats().load_us;
    let c = compile_cached(&capture(specs, w.f)?, dev.target(), FusionMode::Fused)?;
    let compiled_ms = t.elapsed().as_secs_f64() * 1e3;
    let mut run = dev.rt.prepare(&c, &bound)?;
    let prepared_ms = t.elapsed().as_secs_f64() * 1e3;
    let prepare_loading_ms = (dev.rt.stats().load_us - loading_before) as f64 / 1e3;
    dev.launch(&run)?;
    dev.wait()?;
    let compile_ms = t.elapsed().as_secs_f64() * 1e3;
    let loading_ms = (dev.rt.stats().load_us - loading_before) as f64 / 1e3;
    phase(&format!(
        "first compile {compile_ms:.1} ms: trace and compile {compiled_ms:.1}, rendering and loading {} kernels {loading_ms:.1}, binding {:.1}, the first run {:.1}",
        // Kernels that run inside another's launch have no code of their own to render.
        c.kernels.iter().filter(|k| k.launched_in.is_none()).count(),
        prepared_ms - compiled_ms - prepare_loading_ms,
        compile_ms - prepared_ms - (loading_ms - prepare_loading_ms)
    ));
    // The peak from after the first run (as the peer does): the plan's buffers and the inputs count.
    dev.rt.reset_peak();
    let device_s = time(dev, &run, cli)?;
    let peak = dev.peak();
    let plan_out = outputs(dev, &run)?;
    let (call_s, call_out) = public_call(dev, w, &device_inputs, cli.repeat, Some(kiln::Mode::Default))?;
    let outcome = judge(&plan_out, &want, tol).and(judge(&call_out, &want, tol));
    let profile = if cli.profile { dev.profile(&run)? } else { None };
    phase("compiled timed and checked");
    measured.push(Measured {
        mode: "compiled",
        device_s,
        call_s: Some(call_s),
        outcome,
        compile_ms: Some(compile_ms),
        peak,
    });
    let wants = |mode: &str| cli.modes.iter().any(|m| m == mode);
    if wants("reduce-overhead") && dev.capture(&mut run)? {
        // The peak over the replays alone, as the compiled mode's and the peer's: the recording's buffers
        // and the inputs. (Read before the public call, which records a graph of its own while this one
        // still holds its buffers: a user's process holds one.)
        dev.rt.reset_peak();
        let device_s = time(dev, &run, cli)?;
        let peak = dev.peak();
        let replay_out = outputs(dev, &run)?;
        let (call_s, call_out) = public_call(dev, w, &device_inputs, cli.repeat, Some(kiln::Mode::ReduceOverhead))?;
        let outcome = judge(&replay_out, &want, tol).and(judge(&call_out, &want, tol));
        measured.push(Measured {
            mode: "reduce-overhead",
            device_s,
            call_s: Some(call_s),
            outcome,
            compile_ms: None,
            peak,
        });
    }
    let (launches, io, traffic) = (run.launches(), run.io_bytes(), run.bytes_moved());
    drop(run);
    phase("reduce-overhead timed and checked");
    if wants("max-autotune") {
        measured.push(max_autotune(dev, w, cli, specs, (&device_inputs, &bound), (&want, tol), &phase)?);
        phase("max-autotune timed and checked");
    }

    // Eager: the per-op plan's device time; the call is the user's tensor code run op by op.
    if !wants("eager") {
        return Ok(rows(
            w,
            dev,
            cli,
            specs,
            measured,
            (launches, launches, io, traffic),
            &checked,
            copy_gbps,
            cold,
            profile,
        ));
    }
    let c = compile_cached(&capture(specs, w.f)?, dev.target(), FusionMode::PerOp)?;
    let run = dev.rt.prepare(&c, &bound)?;
    dev.rt.reset_peak();
    let device_s = time(dev, &run, cli)?;
    let plan_out = outputs(dev, &run)?;
    let (call_s, call_out) = public_call(dev, w, &device_inputs, cli.repeat, None)?;
    let outcome = judge(&plan_out, &want, tol).and(judge(&call_out, &want, tol));
    let peak = dev.peak();
    measured.push(Measured { mode: "eager", device_s, call_s: Some(call_s), outcome, compile_ms: None, peak });
    let eager_launches = run.launches();
    phase("eager timed and checked");
    Ok(rows(w, dev, cli, specs, measured, (launches, eager_launches, io, traffic), &checked, copy_gbps, cold, profile))
}

/// `Mode::MaxAutotune`: the graph's kernel schedules timed on this device and the fastest kept (the
/// compiled mode's graph and modules are already in this process, so its compile figure is what tuning
/// adds: the candidates compiled, loaded and timed, then the first run); the tuned plan timed as the
/// compiled mode's is (no CUDA graph: torch's counterpart is `max-autotune-no-cudagraphs`), and the
/// public call in that mode, which reads the choices back from the tuning cache.
fn max_autotune(
    dev: &Device,
    w: &Workload,
    cli: &Cli,
    specs: &[TensorSpec],
    (inputs, bound): (&[Tensor], &[kiln_graph::runtime::DeviceTensor]),
    (want, tol): (&[Expected], Tolerance),
    phase: &dyn Fn(&str),
) -> kiln::Result<Measured> {
    let t = Instant::now();
    let graph = capture(specs, w.f)?;
    let base = compile_cached(&graph, dev.target(), FusionMode::Fused)?;
    let values: Vec<_> = inputs.iter().filter_map(Tensor::value).collect();
    let (c, tuned) = kiln_graph::tune::tune(&graph, dev.target(), dev.backend().as_ref(), &values, base)?;
    let tuning_ms = t.elapsed().as_secs_f64() * 1e3;
    let run = dev.rt.prepare(&c, bound)?;
    dev.launch(&run)?;
    dev.wait()?;
    let compile_ms = t.elapsed().as_secs_f64() * 1e3;
    phase(&format!(
        "max-autotune: tuning {tuning_ms:.1} ms ({} kernels timed, {} changed), first compile {compile_ms:.1} ms",
        tuned.measured, tuned.changed
    ));
    dev.rt.reset_peak();
    let device_s = time(dev, &run, cli)?;
    let peak = dev.peak();
    let plan_out = outputs(dev, &run)?;
    drop(run);
    let (call_s, call_out) = public_call(dev, w, inputs, cli.repeat, Some(kiln::Mode::MaxAutotune))?;
    let outcome = judge(&plan_out, want, tol).and(judge(&call_out, want, tol));
    Ok(Measured { mode: "max-autotune", device_s, call_s: Some(call_s), outcome, compile_ms: Some(compile_ms), peak })
}

/// One report row per measured mode. `counts`: launches compiled and eager, I/O and traffic bytes.
#[allow(clippy::too_many_arguments)]
fn rows(
    w: &Workload,
    dev: &Device,
    cli: &Cli,
    specs: &[TensorSpec],
    measured: Vec<Measured>,
    counts: (usize, usize, u64, u64),
    checked: &str,
    copy_gbps: f64,
    cold: bool,
    profile: Option<Vec<kiln_graph::runtime::LaunchTime>>,
) -> Vec<ResultRow> {
    let (launches, eager_launches, io, traffic) = counts;
    measured
        .into_iter()
        .map(|m| {
            let mut row = ResultRow::timed(w.id, dev.name(), m.mode, m.device_s * 1e3, dev.timing());
            row.timing = format!("{}, {} back to back", dev.timing(), cli.batch);
            row.call_ms = m.call_s.map(|s| s * 1e3);
            row.max_rel_err = Some(m.outcome.max_rel_err);
            row.correct = Some(m.outcome.correct);
            row.checked = Some(checked.to_string());
            row.kernels = Some(if m.mode == "eager" { eager_launches } else { launches });
            row.bytes = io;
            row.traffic_bytes = traffic;
            row.gbps = io as f64 / m.device_s / 1e9;
            row.frac_copy = row.gbps / copy_gbps;
            row.tflops = (w.flops)(specs).map(|f| f / m.device_s / 1e12);
            if cold {
                row.cold_compile_ms = m.compile_ms;
            } else {
                row.warm_compile_ms = m.compile_ms;
            }
            row.peak_bytes = Some(m.peak);
            if m.mode == "compiled" {
                row.profile = profile
                    .clone()
                    .map(|p| p.into_iter().map(|l| crate::report::KernelTime { kernel: l.name, ms: l.ms }).collect());
            }
            row
        })
        .collect()
}

/// The outputs a prepared plan's last launch left, read back (after timing).
fn outputs(dev: &Device, run: &Prepared) -> kiln::Result<Vec<TensorData>> {
    dev.wait()?;
    dev.rt.outputs(run, &[]).iter().map(|t| dev.rt.download(t)).collect()
}

/// Seconds of the user's call (`mode`: `compile(f)` in that mode; `None`: the eager tensor code itself)
/// on inputs already on the device, then a wait — host wall time, median of `repeat` after a half-second
/// warm-up — and the last call's outputs. Nothing crosses to the host while timed (the transfer
/// counters are checked to say so).
fn public_call(
    dev: &Device,
    w: &Workload,
    inputs: &[Tensor],
    repeat: usize,
    mode: Option<kiln::Mode>,
) -> kiln::Result<(f64, Vec<TensorData>)> {
    let f = mode.map(|m| kiln::compile(|x: Vec<Tensor>| (w.f)(&x)).backend(dev.backend()).mode(m));
    let call = || -> kiln::Result<Vec<Tensor>> {
        match &f {
            Some(f) => f.call(inputs.to_vec()),
            None => (w.f)(inputs),
        }
    };
    warm_up(|| {
        call()?;
        dev.wait()
    })?;
    dev.rt.reset_transfers();
    let mut samples = Vec::with_capacity(repeat);
    let mut last = Vec::new();
    for i in 0..repeat.max(1) {
        let t = Instant::now();
        let out = call()?;
        dev.wait()?;
        samples.push(t.elapsed().as_secs_f64());
        // Each call's outputs die before the next call, as a loop body's locals do: kiln's reduce-overhead
        // mode then hands out its recorded buffers instead of copies.
        if i + 1 == repeat.max(1) {
            last = out;
        }
    }
    let moved = dev.rt.memory_stats();
    if moved.uploaded + moved.downloaded > 0 {
        return Err(kiln::Error::Backend {
            backend: dev.name().into(),
            msg: format!(
                "a call on device inputs moved {} bytes to and from the host",
                moved.uploaded + moved.downloaded
            ),
        });
    }
    let out = last.iter().map(|t| t.to_data().map(|d| (*d).clone())).collect::<kiln::Result<_>>()?;
    Ok((median(samples), out))
}

/// The sizes (indices into [`DYNAMIC_ROWS`]) whose outputs the dynamic row checks against the f64
/// reference: the recompiled symbolic entry (977 rows) and its reuse at the smallest size (811); the
/// static first entry is the W3 row's, checked there. Small ones, since the reference runs on the host.
const CHECKED_SIZES: [usize; 2] = [1, 8];

/// The row counts the dynamic-shape row runs W3 at, in this order (the peer uses the same list).
pub const DYNAMIC_ROWS: [usize; 20] = [
    4133, 977, 6211, 2048, 7001, 1500, 3333, 5120, 811, 6007, 2719, 4409, 7777, 1234, 5001, 3001, 6553, 999, 4096, 8000,
];

/// W3 over [`DYNAMIC_ROWS`] through one `compile(w3)` (`Dynamic::Auto`, torch's `dynamic=None`): graphs
/// compiled, total compile time (each size's first call less its steady call) and the time per call
/// (median over sizes of each size's median call + sync). Outputs are checked at [`CHECKED_SIZES`].
pub fn measure_dynamic(dev: &Device, cli: &Cli, cold: bool) -> kiln::Result<ResultRow> {
    let cols = if cli.quick { 1024 } else { 4096 };
    let f = kiln::compile(|x: Vec<Tensor>| kiln_graph::workloads::w3(&x)).backend(dev.backend());
    let (mut compile_ms, mut per_size, mut outcome) = (0.0, Vec::new(), None::<Outcome>);
    let mut checked = String::new();
    for (i, &rows) in DYNAMIC_ROWS.iter().enumerate() {
        let rows = if cli.quick { rows / 8 } else { rows };
        let specs = [
            TensorSpec::new(DType::F32, &[rows, cols]),
            TensorSpec::new(DType::F32, &[cols]),
            TensorSpec::new(DType::F32, &[cols]),
        ];
        let host: Vec<TensorData> = kiln_graph::workloads::inputs(&specs);
        let inputs: Vec<Tensor> =
            host.iter().map(|d| Tensor::from_data(d.clone()).to(dev.backend())).collect::<kiln::Result<_>>()?;
        let t = Instant::now();
        let out = f.call(inputs.clone())?;
        dev.wait()?;
        let first = t.elapsed().as_secs_f64();
        let mut samples = Vec::new();
        for _ in 0..cli.repeat.max(1) {
            let t = Instant::now();
            f.call(inputs.clone())?;
            dev.wait()?;
            samples.push(t.elapsed().as_secs_f64());
        }
        let steady = median(samples);
        compile_ms += (first - steady).max(0.0) * 1e3;
        per_size.push(steady);
        if CHECKED_SIZES.contains(&i) {
            let tol = Tolerance::of(&capture(&specs, kiln_graph::workloads::w3)?)?;
            let want = check::reference(kiln_graph::workloads::w3, &host, "kiln's f64 reference")?;
            let o = check::compare(&*out[0].to_data()?, &want[0], tol);
            outcome = Some(outcome.map_or(o, |x| x.and(o)));
            checked = format!(
                "kiln's f64 reference (the 2nd and 9th row counts: the recompiled symbolic entry and its reuse), rtol {:.1e}, atol {:.1e}",
                tol.rtol, tol.atol
            );
        }
    }
    eprintln!("kiln-bench: {} W3 over 20 row counts: done", dev.name());
    let ms = median(per_size) * 1e3;
    let mut row = ResultRow::timed(
        "W3-dynamic",
        dev.name(),
        "compiled, Dynamic::Auto",
        ms,
        "host wall time, call + sync, 20 row counts",
    );
    row.call_ms = Some(ms);
    let stats = f.stats();
    row.compiles = Some(stats.entries);
    if cold {
        row.cold_compile_ms = Some(compile_ms);
    } else {
        row.warm_compile_ms = Some(compile_ms);
    }
    row.max_rel_err = outcome.map(|o| o.max_rel_err);
    row.correct = outcome.map(|o| o.correct);
    row.checked = Some(checked);
    Ok(row)
}
