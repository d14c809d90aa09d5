//! What a workload's cold compile costs on CUDA before any GPU is involved: each kernel's PTX size, the
//! time `ptxas -arch=sm_90` takes to assemble it (the CUDA driver's JIT does the same work on a cold
//! first call) and the registers it uses and spills, slowest first. `cargo run --release --example ptx_cost -- W6 [count]`
//! (the bench's training steps too: `W5-train-bf16`).
//! With `KILN_PTX_DUMP=dir`, each distinct kernel's PTX is also written there (`<name>.ptx`), for SASS
//! counts with NVIDIA's `cuobjdump -sass`.

use kiln::graph::{capture, compile_graph, workloads, Target};
use std::time::Instant;

#[path = "../benches/src/train_step.rs"]
#[allow(dead_code)]
mod train_step;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let id = args.get(1).map_or("W6", String::as_str);
    let show: usize = args.get(2).map_or(Ok(10), |s| s.parse())?;
    let w = workloads::all()
        .into_iter()
        .chain(train_step::all())
        .find(|w| w.id.eq_ignore_ascii_case(id))
        .ok_or("no such workload")?;
    let started = Instant::now();
    let c = compile_graph(&capture(&w.full, w.f)?, &Target::cuda(90).tuned_by_env("CUDA"))?;
    let compile_s = started.elapsed().as_secs_f64();
    let ptxas = kiln_ptx::ptxas::find().ok_or(kiln_ptx::ptxas::INSTALL_HINT)?;
    let mut rows = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut library = 0;
    for k in &c.kernels {
        if k.gemm().is_some() {
            library += 1; // a cuBLAS call: no PTX
            continue;
        }
        let ptx = kiln_ptx::render(k, 90)?;
        if !seen.insert(ptx.source.replace(&k.name, "kernel")) {
            continue;
        }
        if let Ok(dir) = std::env::var("KILN_PTX_DUMP") {
            std::fs::create_dir_all(&dir)?;
            std::fs::write(std::path::Path::new(&dir).join(format!("{}.ptx", k.name)), &ptx.source)?;
        }
        let t = Instant::now();
        let used = kiln_ptx::ptxas::resources(&ptxas, &k.name, &ptx.source, 90)?;
        rows.push((k.name.clone(), ptx.source.len(), t.elapsed().as_secs_f64(), used));
    }
    let (bytes, secs): (usize, f64) = rows.iter().fold((0, 0.0), |(b, s), r| (b + r.1, s + r.2));
    let spilling = rows.iter().filter(|r| r.3.spill_stores > 0).count();
    println!(
        "{id}: {} kernels ({library} library GEMMs, {} distinct PTX), {:.2} MB of PTX, ptxas -arch=sm_90 {secs:.1} s in all, {spilling} spilling registers; kiln's compile {compile_s:.2} s",
        c.kernels.len(),
        rows.len(),
        bytes as f64 / 1e6
    );
    rows.sort_by(|a, b| b.2.total_cmp(&a.2));
    for (name, size, s, used) in rows.iter().take(show) {
        println!(
            "  {s:7.2} s  {:8.1} KB  {:3} registers  {:6} B spilled  {name}",
            *size as f64 / 1e3,
            used.registers,
            used.spill_stores
        );
    }
    Ok(())
}
