//! The host's share of a call: every workload compiled for CUDA's target and called on a driver that does
//! nothing (no memory, no kernels), so what is left is the facade (guards, argument handling) and the
//! runtime core (binding, pooling, replay bookkeeping). On a GPU the call costs this plus the driver's
//! own launch costs, so it bounds how close a public call can come to device time — W4's 259 weight
//! inputs make it the workload where the host shows. Runs anywhere; no GPU needed.
//!
//! `cargo run --release -p kiln-bench --bin call_overhead [-- W4 W1 …]`

use kiln::graph::device::{Driver, Launch, Module, Raw, Recording};
use kiln::graph::kernel::Kernel;
use kiln::graph::target::Target;
use kiln::graph::workloads;
use kiln::graph::Runtime;
use kiln::{Mode, Tensor};
use std::sync::Arc;
use std::time::Instant;

/// A device that accepts everything and does nothing; reads return zeros.
struct NullDriver {
    target: Target,
}

impl Driver for NullDriver {
    fn name(&self) -> &'static str {
        "null"
    }
    fn target(&self) -> &Target {
        &self.target
    }
    fn describe(&self) -> String {
        "a null device (nothing is stored or run)".into()
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
    fn alloc(&self, _bytes: u64) -> kiln::Result<Raw> {
        Ok(Box::new(()))
    }
    fn write(&self, _dst: &Raw, _bytes: &[u8]) -> kiln::Result<()> {
        Ok(())
    }
    fn read(&self, _src: &Raw, bytes: u64) -> kiln::Result<Vec<u8>> {
        Ok(vec![0; bytes as usize])
    }
    fn zero(&self, _dst: &Raw, _offset: u64, _bytes: u64) -> kiln::Result<()> {
        Ok(())
    }
    fn copy(&self, _src: &Raw, _dst: &Raw, _bytes: u64) -> kiln::Result<()> {
        Ok(())
    }
    fn load(&self, _kernel: &Kernel) -> kiln::Result<Module> {
        Ok(Arc::new(()))
    }
    fn launch(&self, _kernel: &Kernel, _launch: &Launch) -> kiln::Result<()> {
        Ok(())
    }
    fn synchronize(&self) -> kiln::Result<()> {
        Ok(())
    }
    fn record(&self, enqueue: &mut dyn FnMut() -> kiln::Result<()>) -> kiln::Result<Option<Recording>> {
        enqueue()?;
        Ok(Some(Box::new(())))
    }
    fn replay(&self, _recording: &Recording) -> kiln::Result<()> {
        Ok(())
    }
}

/// Microseconds of one call, (median, fastest) over 30 batches of `n` calls, after a warm-up. The
/// fastest batch is the steadier figure on a shared machine; both are printed.
fn per_call_us(mut call: impl FnMut() -> kiln::Result<()>, n: usize) -> kiln::Result<(f64, f64)> {
    for _ in 0..n {
        call()?;
    }
    let mut batches = Vec::with_capacity(30);
    for _ in 0..30 {
        let t = Instant::now();
        for _ in 0..n {
            call()?;
        }
        batches.push(t.elapsed().as_secs_f64() * 1e6 / n as f64);
    }
    batches.sort_by(f64::total_cmp);
    Ok((batches[batches.len() / 2], batches[0]))
}

fn main() -> kiln::Result<()> {
    let wanted: Vec<String> = std::env::args().skip(1).collect();
    let rt = Runtime::new(NullDriver { target: Target::cuda(90) });
    println!("| id | inputs | default call (µs, median / fastest) | reduce-overhead call (µs, median / fastest) |");
    println!("|---|---:|---:|---:|");
    for w in workloads::all() {
        if !wanted.is_empty() && !wanted.iter().any(|id| id == w.id) {
            continue;
        }
        let inputs: Vec<Tensor> = w
            .full
            .iter()
            .enumerate()
            .map(|(i, s)| Tensor::from_data(workloads::data(s, i)).to(rt.clone()))
            .collect::<kiln::Result<_>>()?;
        let mut row = Vec::new();
        for mode in [Mode::Default, Mode::ReduceOverhead] {
            let f = kiln::compile(|x: Vec<Tensor>| (w.f)(&x)).backend(rt.clone()).mode(mode);
            row.push(per_call_us(|| f.call(inputs.clone()).map(drop), 200)?);
        }
        let us = |(m, f): (f64, f64)| format!("{m:.1} / {f:.1}");
        println!("| {} | {} | {} | {} |", w.id, inputs.len(), us(row[0]), us(row[1]));
    }
    Ok(())
}
