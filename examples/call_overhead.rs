//! Host time of a public call on a tiny input (the device work is negligible), split into the call
//! itself and the synchronise after it: `cargo run --release --example call_overhead -- [wgpu|cuda] [n]`.
use kiln::{Backend, Tensor};
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let backend = match args.get(1).map_or("wgpu", String::as_str) {
        "cuda" => Backend::Cuda,
        _ => Backend::Wgpu,
    };
    let n: usize = args.get(2).map_or(Ok(256), |s| s.parse())?;
    let x = Tensor::from_data(kiln::graph::workloads::data(&kiln::graph::TensorSpec::new(kiln::DType::F32, &[n]), 0))
        .to(backend)?;
    let rt = backend.runtime()?.ok_or("no device runtime")?;
    let f = kiln::compile(|x: &Tensor| x.mul(2.0)?.add(1.0)?.tanh()).backend(backend);
    let _: Tensor = f.call(&x)?;
    rt.synchronize()?;
    let (mut call, mut sync) = (Vec::new(), Vec::new());
    for _ in 0..2000 {
        let t = Instant::now();
        let y: Tensor = f.call(&x)?;
        let c = t.elapsed().as_secs_f64() * 1e6;
        rt.synchronize()?;
        sync.push(t.elapsed().as_secs_f64() * 1e6 - c);
        call.push(c);
        drop(y);
    }
    call.sort_by(f64::total_cmp);
    sync.sort_by(f64::total_cmp);
    println!("call {:.1} µs, sync {:.1} µs (medians of 2000)", call[1000], sync[1000]);
    Ok(())
}
