//! Rows with lanes (`Kernel::row_lanes`: a thread keeps consecutive elements of its row, as CUDA
//! plans them, so its accesses move as vectors) planned for wgpu too (KILN_WGPU_VECTOR_ROWS=1) and run on
//! it: every op, the edge cases, random programs and the workloads against the reference. No WGSL target
//! plans such rows by default, so without this the planning's element mapping would only ever run on a
//! GPU machine (through the PTX renderer); here it runs in CI on lavapipe.

mod common;
mod conformance;

use kiln::graph::{compile_graph, workloads};

#[test]
fn rows_with_lanes_match_the_reference() {
    if common::wgpu_skipped() {
        return;
    }
    // Set before this binary opens its device; no other test here opens one first.
    std::env::set_var("KILN_WGPU_VECTOR_ROWS", "1");
    let rt = kiln_wgsl::Gpu::runtime().unwrap_or_else(|e| panic!("{e}"));
    assert!(rt.target().vector_rows, "{}", rt.driver().describe());
    let b: std::sync::Arc<dyn kiln::graph::Backend> = rt.clone();
    conformance::ops::every_op(&b);
    conformance::ops::edge_cases(&b, false, false);
    conformance::random_graphs(&b, 200, false, file!());
    let mut with_lanes = 0;
    for w in workloads::all().into_iter().filter(|w| ["W2", "W3", "W5"].contains(&w.id)) {
        let g = kiln::graph::capture(&w.check, w.f).unwrap();
        for k in compile_graph(&g, rt.target()).unwrap().kernels.iter().filter(|k| k.row_lanes > 1) {
            with_lanes += 1;
            // Four f32 lanes: the row's buffers are read and written a vector at a time.
            let src = kiln_wgsl::render(k, false).unwrap().source;
            if k.row_lanes == 4 {
                assert!(src.contains("array<vec4<f32>>"), "{} binds no vector buffer:\n{src}", k.name);
            }
        }
        conformance::workload_matches_the_reference(&b, &w);
    }
    // W2's softmax and W3's layer norm at least: the rows above did run with lanes.
    assert!(with_lanes >= 2, "only {with_lanes} kernels of W2, W3 and W5 planned rows with lanes");
    eprintln!("{with_lanes} kernels of W2, W3 and W5 ran rows with lanes on wgpu");
}
