//! Renders the workload kernels (W1–W5 at full size) to PTX for sm_80 and sm_90, assembles each with
//! ptxas and reports how many it assembled. CI runs it; `cargo run --example ptxas_check`.

use kiln::graph::workloads;
use kiln::graph::{capture, compile_graph, Target};

fn main() {
    let checker = match kiln_ptx::PtxasChecked::new() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    for w in workloads::all() {
        let g = capture(&w.full, w.f).expect("workloads trace");
        let c = compile_graph(&g, &Target::cuda(90)).expect("workloads compile");
        for k in &c.kernels {
            if let Err(e) = checker.check(k) {
                eprintln!("{e}");
                std::process::exit(1);
            }
        }
    }
    println!("ptxas: assembled {} distinct workload kernels for sm_80 and sm_90, all valid", checker.assembled());
}
