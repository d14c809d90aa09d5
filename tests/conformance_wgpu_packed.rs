//! Every op on wgpu with f16 stored packed two per word (as on adapters without `shader-f16`): the
//! adapter's native f16 is ignored (KILN_WGPU_NO_F16), so this path runs on every machine.

mod common;
mod conformance;

#[test]
fn every_op_matches_the_reference_with_packed_halves() {
    let Some(b) = common::wgpu_runtime_with("KILN_WGPU_NO_F16", "1") else { return };
    let b: std::sync::Arc<dyn kiln::graph::Backend> = b;
    conformance::ops::every_op(&b);
    conformance::ops::edge_cases(&b, false, false);
}
