//! Every op on wgpu with f16 stored packed two per word (as on adapters without `shader-f16`): the
//! adapter's native f16 is ignored (KILN_WGPU_NO_F16), so this path runs on every machine.

mod common;
mod conformance;

#[test]
fn every_op_matches_the_reference_with_packed_halves() {
    if common::wgpu_skipped() {
        return;
    }
    // Set before this binary opens its device; no other test here opens one first.
    std::env::set_var("KILN_WGPU_NO_F16", "1");
    let b = kiln_wgsl::Gpu::runtime().unwrap_or_else(|e| panic!("{e}"));
    let b: std::sync::Arc<dyn kiln::graph::Backend> = b;
    conformance::ops::every_op(&b);
    conformance::ops::edge_cases(&b, false, false);
}
