//! Prints a workload's compiled graph (regions and kernel IR) for a target, and the PTX (for `webgpu` and
//! `adapter`, the WGSL) of one kernel:
//! `cargo run --example dump_kernels -- W5 cuda|webgpu|adapter [kernel-substring]`. `webgpu` plans for
//! WebGPU's default limits (8 bindings, 16 KiB of workgroup memory: a browser's); `adapter` for this
//! machine's wgpu adapter as the runtime opens it (NVIDIA's Vulkan driver on the GPU host, lavapipe
//! here), the plan the bench runs. The training steps (`W5-train`, `W5-train-bf16`) are the bench's own.

use kiln::graph::{capture, compile_graph, workloads, Target};

#[path = "../benches/src/train_step.rs"]
#[allow(dead_code)]
mod train_step;

fn main() -> kiln::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let id = args.get(1).map_or("W1", String::as_str);
    let webgpu = args.get(2).is_some_and(|b| b == "webgpu" || b == "adapter");
    let target = match args.get(2).map(String::as_str) {
        Some("webgpu") => Target::webgpu_default().tuned_by_env("WGPU"),
        Some("adapter") => kiln_wgsl::Gpu::runtime()?.target().clone(),
        _ => Target::cuda(90).tuned_by_env("CUDA"),
    };
    let w = workloads::all()
        .into_iter()
        .chain(train_step::all())
        .find(|w| w.id.eq_ignore_ascii_case(id))
        .expect("a workload id");
    let g = capture(&w.full, w.f)?;
    let c = compile_graph(&g, &target)?;
    match args.get(3) {
        None => println!("{c}"),
        Some(name) => {
            for k in c.kernels.iter().filter(|k| k.name.contains(name.as_str())).take(1) {
                println!("{k}");
                if webgpu {
                    match kiln_wgsl::render(k, false) {
                        Ok(s) => println!("{}", s.source),
                        Err(e) => println!("{e}"),
                    }
                } else {
                    match kiln_ptx::render(k, 90) {
                        Ok(p) => println!("{}", p.source),
                        Err(e) => println!("{e}"),
                    }
                }
            }
        }
    }
    Ok(())
}
