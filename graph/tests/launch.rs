//! Launch shapes `graph` plans: a grid-stride kernel whose workgroups would exceed one dimension of the
//! target's grid takes fewer that fit, each looping the same number of times (a folded 2-D grid rounds
//! up to rows of idle groups, measured slower on NVIDIA Vulkan: `benches/NOTES.md`, session 36).

use kiln_graph::sym::Bindings;
use kiln_graph::{capture, compile_graph, workloads, Target};

fn w1_groups(target: &Target) -> i64 {
    let w = workloads::all().into_iter().find(|w| w.id == "W1").expect("W1");
    let g = capture(&w.full, w.f).expect("W1 traces");
    let c = compile_graph(&g, target).expect("W1 compiles");
    assert_eq!(c.kernels.len(), 1);
    c.kernels[0].launch.groups.eval(&Bindings::new()).expect("a constant count")
}

#[test]
fn a_grid_stride_kernel_fits_one_grid_dimension() {
    // W1: 2^26 elements, vectors of four, 256 threads: 65,536 workgroups' worth.
    let webgpu = Target::webgpu_default();
    assert_eq!(webgpu.max_groups_per_dim, 65_535);
    assert_eq!(w1_groups(&webgpu), 32_768, "two rounds of 32,768 workgroups, not 65,535 × 2 folded");
    assert_eq!(w1_groups(&Target::cuda(90)), 65_536, "CUDA's grid takes them in one dimension");
    let narrow = Target { max_groups_per_dim: 1_000, ..Target::webgpu_default() };
    // 65,536 / 1,000 → 66 rounds of 993 workgroups (65,538 ≥ 65,536).
    assert_eq!(w1_groups(&narrow), 993);
}
