//! One workload through the public call on one backend: the first call (compile and load, what a
//! user waits for once), steady calls, then each kernel's device time from `Compiled::profile`, largest
//! first. How the W6 (DenseNet-121) figures in benches/NOTES.md were taken on the GPU machine.
//!
//! `cargo run --release --example profile_workload -- W6 cuda [full|quick] [--once]`; the bench's training
//! steps too (`W5-train-bf16`). With `--once` it makes one call and no profile of its own, for an outside
//! profiler (Nsight Compute) to time that call's kernels: every launch of the process is that call's.

use kiln::graph::workloads;
use kiln::{Backend, Tensor};

#[path = "../benches/src/train_step.rs"]
#[allow(dead_code)]
mod train_step;

fn main() -> kiln::Result<()> {
    let once = std::env::args().any(|a| a == "--once");
    let mut args = std::env::args().skip(1).filter(|a| a != "--once");
    let id = args.next().unwrap_or_else(|| "W6".into());
    let backend: Backend = args.next().as_deref().unwrap_or("cuda").parse()?;
    let quick = args.next().as_deref() == Some("quick");
    let Some(w) = workloads::all().into_iter().chain(train_step::all()).find(|w| w.id == id) else {
        eprintln!("unknown workload {id}");
        std::process::exit(2);
    };
    let xs: Vec<Tensor> = workloads::inputs(if quick { &w.quick } else { &w.full })
        .into_iter()
        .map(|d| Tensor::from_data(d).to(backend))
        .collect::<kiln::Result<_>>()?;
    let f = kiln::compile(|t: Vec<Tensor>| (w.f)(&t)).backend(backend);
    for i in 0..if once { 1 } else { 4 } {
        let s = std::time::Instant::now();
        let y: Vec<Tensor> = f.call(xs.clone())?;
        let first = y[0].to_vec::<f32>()?[0];
        println!("call {i}: {:.3} ms (call + read of the result; y[0] = {first})", s.elapsed().as_secs_f64() * 1e3);
    }
    if once {
        return Ok(());
    }
    let _: Vec<Tensor> = f.profile(xs)?;
    let report = f.report();
    let mut kernels: Vec<(f64, String)> = report
        .entries
        .iter()
        .flat_map(|e| e.graphs.iter())
        .flat_map(|g| g.kernels.iter())
        .filter_map(|k| k.device_ms.map(|ms| (ms, format!("{} ({})", k.name, k.kind))))
        .collect();
    let total: f64 = kernels.iter().map(|k| k.0).sum();
    kernels.sort_by(|a, b| b.0.total_cmp(&a.0));
    println!("device time {total:.3} ms over {} kernels; the largest:", kernels.len());
    for (ms, name) in kernels.iter().take(20) {
        println!("  {ms:8.4} ms {:5.1}%  {name}", 100.0 * ms / total);
    }
    Ok(())
}
