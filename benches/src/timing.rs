//! Measuring on a device: each graph is prepared once (buffers, kernels, parameters) and each sample is
//! one launch timed as the device does best (CUDA events; fenced wall time on wgpu), so host transfers
//! never enter the numbers. Written once for every [`Device`].

use crate::device::Device;
use crate::report::ResultRow;
use crate::Cli;
use kiln_graph::runtime::Prepared;
use kiln_graph::workloads::{data, Workload};
use kiln_graph::{capture, compile_cached, compile_graph_with, DType, FusionMode, Tensor, TensorSpec};
use std::time::Instant;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Median seconds of `repeat` samples, after warm-up launches filling at least half a second: a GPU that
/// has been idle runs its first milliseconds at lower clocks, which a fixed three-launch warm-up does
/// not cover (runs of identical kernels differed 2.5x before this).
fn time(dev: &Device, run: &Prepared, repeat: usize) -> kiln::Result<f64> {
    let warm = Instant::now();
    let mut n = 0;
    while n < 3 || warm.elapsed().as_secs_f64() < 0.5 {
        dev.launch(run)?;
        dev.wait()?;
        n += 1;
    }
    let mut samples = Vec::with_capacity(repeat);
    for _ in 0..repeat.max(1) {
        samples.push(dev.sample(run)?);
    }
    Ok(median(samples))
}

/// GB/s of a plain copy kernel (a layout output: read once, written once) over 2^26 f32 (2^22 quick),
/// and of the runtime's own memcpy of the same bytes where it has one.
pub fn copy_bandwidth(dev: &Device, cli: &Cli) -> kiln::Result<(f64, Option<f64>)> {
    let n = if cli.quick { 1 << 22 } else { 1 << 26 };
    let spec = TensorSpec::new(DType::F32, &[n]);
    let g = capture(std::slice::from_ref(&spec), |t| Ok(vec![t[0].unsqueeze(0)?]))?;
    let c = std::sync::Arc::new(compile_graph_with(&g, dev.target(), FusionMode::Fused)?);
    let x = data(&spec, 0);
    let run = dev.prepare(&c, &[&x])?;
    let s = time(dev, &run, cli.repeat)?;
    Ok(((2 * n * 4) as f64 / s / 1e9, dev.native_copy_gbps(n * 4, cli.repeat)?))
}

/// Largest relative error of `w` on the device against the reference, at the check sizes.
fn check(dev: &Device, w: &Workload) -> kiln::Result<f64> {
    let inputs: Vec<Tensor> = w.check.iter().enumerate().map(|(i, s)| Tensor::from_data(data(s, i))).collect();
    let got = kiln::compile(|x: Vec<Tensor>| (w.f)(&x)).backend(dev.backend()).call(inputs.clone())?;
    let want = kiln::compile(|x: Vec<Tensor>| (w.f)(&x)).backend(kiln::Backend::Cpu).call(inputs)?;
    let mut worst = 0.0f64;
    if got.len() != want.len() {
        return Ok(f64::INFINITY);
    }
    for (g, r) in got.iter().zip(&want) {
        let (g, r) = (g.to_data()?, r.to_data()?);
        if g.dims() != r.dims() {
            return Ok(f64::INFINITY);
        }
        for (a, b) in g.values().iter().zip(r.values()) {
            let e = if a.is_nan() && b.is_nan() { 0.0 } else { (a - b).abs() / (1.0 + b.abs()) };
            worst = worst.max(if e.is_nan() { f64::INFINITY } else { e });
        }
    }
    Ok(worst)
}

/// Checks `w`, then times it eager (one kernel per op), compiled, and compiled with reduce-overhead
/// where the device has it.
pub fn measure(dev: &Device, w: &Workload, cli: &Cli, copy_gbps: f64) -> kiln::Result<Vec<ResultRow>> {
    let err = check(dev, w)?;
    let specs = if cli.quick { &w.quick } else { &w.full };
    let host: Vec<kiln_graph::TensorData> = specs.iter().enumerate().map(|(i, s)| data(s, i)).collect();
    let refs: Vec<&kiln_graph::TensorData> = host.iter().collect();
    let mut rows = Vec::new();
    for (mode, name) in [(FusionMode::PerOp, "eager"), (FusionMode::Fused, "compiled")] {
        // Cold: nothing cached anywhere in kiln (the bench's cache directory starts empty).
        kiln_graph::cache::clear_memory();
        dev.clear();
        let t = Instant::now();
        let g = capture(specs, w.f)?;
        let c = compile_cached(&g, dev.target(), mode)?;
        let run = dev.prepare(&c, &refs)?;
        let cold = t.elapsed().as_secs_f64() * 1e3;
        drop(run);
        // Warm: a new process with the persistent cache filled (memory caches cleared, disk kept).
        kiln_graph::cache::clear_memory();
        dev.clear();
        let t = Instant::now();
        let g = capture(specs, w.f)?;
        let c = compile_cached(&g, dev.target(), mode)?;
        let mut run = dev.prepare(&c, &refs)?;
        let warm = t.elapsed().as_secs_f64() * 1e3;
        let mut variants = vec![(name, time(dev, &run, cli.repeat)?)];
        let profile = if cli.profile && mode == FusionMode::Fused { dev.profile(&run)? } else { None };
        if mode == FusionMode::Fused && dev.capture(&mut run)? {
            variants.push(("reduce-overhead", time(dev, &run, cli.repeat)?));
        }
        if mode == FusionMode::Fused {
            variants.push(("public call", public_call(dev, w, &host, cli.repeat, kiln::Mode::Default)?));
            if dev.capture(&mut dev.prepare(&c, &refs)?)? {
                let s = public_call(dev, w, &host, cli.repeat, kiln::Mode::ReduceOverhead)?;
                variants.push(("public call, reduce-overhead", s));
            }
        }
        let (io, traffic) = (run.io_bytes(), run.bytes_moved());
        for (name, s) in variants {
            let gbps = io as f64 / s / 1e9;
            rows.push(ResultRow {
                workload: w.id.into(),
                backend: dev.name().into(),
                mode: name.into(),
                median_ms: s * 1e3,
                timing: if name.starts_with("public call") {
                    "host wall time, call + sync".into()
                } else {
                    dev.timing().into()
                },
                max_rel_err: err,
                // f32 within 1e-4 (reductions and matmuls sum thousands of terms); half precision 3e-2.
                correct: err <= if specs.iter().any(|s| s.dtype != DType::F32) { 3e-2 } else { 1e-4 },
                kernels: Some(run.launches()),
                bytes: io,
                traffic_bytes: traffic,
                gbps,
                frac_copy: gbps / copy_gbps,
                tflops: (w.flops)(specs).map(|f| f / s / 1e12),
                cold_compile_ms: cold,
                warm_compile_ms: Some(warm),
                profile: (name == "compiled")
                    .then(|| profile.clone())
                    .flatten()
                    .map(|p| p.into_iter().map(|(kernel, ms)| crate::report::KernelTime { kernel, ms }).collect()),
                trials: 1,
                min_ms: None,
                max_ms: None,
            });
        }
    }
    Ok(rows)
}

/// Seconds of the user's call as a user makes it: `compile(f).call(..)` on inputs already on the device,
/// then a wait for the device — host wall time, median of `repeat` after a half-second warm-up. Nothing
/// crosses to the host (the transfer counters are checked to say so).
fn public_call(
    dev: &Device,
    w: &Workload,
    host: &[kiln_graph::TensorData],
    repeat: usize,
    mode: kiln::Mode,
) -> kiln::Result<f64> {
    let backend = dev.backend();
    let inputs: Vec<Tensor> =
        host.iter().map(|d| Tensor::from_data(d.clone()).to(backend.clone())).collect::<kiln::Result<_>>()?;
    let f = kiln::compile(|x: Vec<Tensor>| (w.f)(&x)).backend(backend).mode(mode);
    let warm = Instant::now();
    let mut n = 0;
    while n < 3 || warm.elapsed().as_secs_f64() < 0.5 {
        let _: Vec<Tensor> = f.call(inputs.clone())?;
        dev.wait()?;
        n += 1;
    }
    dev.rt.reset_transfers();
    let mut samples = Vec::with_capacity(repeat);
    for _ in 0..repeat.max(1) {
        let t = Instant::now();
        let out: Vec<Tensor> = f.call(inputs.clone())?;
        dev.wait()?;
        samples.push(t.elapsed().as_secs_f64());
        drop(out);
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
    Ok(median(samples))
}
