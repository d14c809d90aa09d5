//! Rows without lanes on wgpu (`KILN_WGPU_VECTOR_ROWS=0`: a thread keeps every `threads`-th element of
//! its row and moves one at a time), run against the reference: every op, the edge cases, random programs
//! and the workloads. Every target plans rows with lanes by default (`Target::vector_rows`), which the
//! other wgpu conformance tests run; a user can turn them off, and rows whose length no vector divides
//! take this mapping anyway, so it keeps a whole run of its own in CI, on lavapipe.

mod common;
mod conformance;

use kiln::graph::{compile_graph, workloads};

#[test]
fn rows_without_lanes_match_the_reference() {
    let Some(rt) = common::wgpu_runtime_with("KILN_WGPU_VECTOR_ROWS", "0") else { return };
    assert!(!rt.target().vector_rows, "{}", rt.driver().describe());
    let b: std::sync::Arc<dyn kiln::graph::Backend> = rt.clone();
    conformance::ops::every_op(&b);
    conformance::ops::edge_cases(&b, false, false);
    conformance::random_graphs(&b, 200, false, file!());
    let mut rows = 0;
    for w in workloads::all().into_iter().filter(|w| ["W2", "W3", "W5"].contains(&w.id)) {
        let g = kiln::graph::capture(&w.check, w.f).unwrap();
        for k in compile_graph(&g, rt.target()).unwrap().kernels.iter().filter(|k| k.row_cache.is_some()) {
            rows += 1;
            assert_eq!(k.row_lanes, 1, "{} keeps lanes with vector rows off", k.name);
        }
        conformance::workload_matches_the_reference(&b, &w);
    }
    // W2's softmax and W3's layer norm at least kept their rows, a slot at a time.
    assert!(rows >= 2, "only {rows} kernels of W2, W3 and W5 kept persistent rows");
}
