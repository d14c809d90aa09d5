//! Every op, the edge cases and the bench workloads on wgpu with the device opened at WebGPU's default
//! limits (KILN_WGPU_LIMITS=webgpu: 8 storage buffers a stage, 65,535 workgroups a dimension, 128 MiB a
//! binding) — what a browser page gets unless it asks for more. The compiler must split regions that
//! would bind more buffers and fold grids that would be wider; lavapipe's own limits are far larger, so
//! without this the browser's limits are never exercised in CI.

mod common;
mod conformance;

use kiln::graph::workloads;

#[test]
fn everything_fits_webgpu_default_limits() {
    let Some(rt) = common::wgpu_runtime_with("KILN_WGPU_LIMITS", "webgpu") else { return };
    let t = rt.target();
    assert_eq!((t.max_bindings, t.max_groups_per_dim), (8, 65_535), "{}", rt.driver().describe());
    assert_eq!(rt.target().max_binding_bytes, 128 << 20);
    let b: std::sync::Arc<dyn kiln::graph::Backend> = rt.clone();
    conformance::ops::every_op(&b);
    conformance::ops::edge_cases(&b, true, false);
    // The workloads at their check sizes (W6 too: its dense blocks concatenate up to 58 tensors).
    for w in workloads::all() {
        let outputs = conformance::workload_matches_the_reference(&b, &w);
        eprintln!("{}: {} outputs match the reference at WebGPU's default limits", w.id, outputs);
    }
}
