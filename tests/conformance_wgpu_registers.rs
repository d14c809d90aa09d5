//! f32 attention on the registers template over wgpu (`KILN_WGPU_REGISTER_ATTENTION_ROWS=4`; WGSL targets
//! plan the lanes template unless asked), run against the reference on lavapipe in CI: every attention
//! shape of the conformance suite, with a head dim the adapter's workgroup memory takes on registers
//! checked to be planned there.

mod common;
mod conformance;

use kiln::graph::kernel::{AttentionUnits, Stmt};
use kiln::graph::{capture, compile_graph, DType, Tensor, TensorSpec};

fn attention(t: &[Tensor]) -> kiln::Result<Vec<Tensor>> {
    let s = t[0].matmul(&t[1].transpose(-1, -2)?)?.mul(0.125)?.causal_mask()?;
    Ok(vec![s.softmax(-1)?.matmul(&t[2])?])
}

#[test]
fn f32_attention_on_registers_matches_the_reference() {
    let Some(rt) = common::wgpu_runtime_with("KILN_WGPU_REGISTER_ATTENTION_ROWS", "4") else { return };
    assert!(rt.target().register_attention.is_some(), "{}", rt.driver().describe());
    // Head dim 16: 4 · (64·16 + 64·64 + 64·16) = 24 KiB of workgroup memory, within any Vulkan adapter's.
    let specs = [[2, 70, 16], [2, 90, 16], [2, 90, 16]].map(|d| TensorSpec::new(DType::F32, &d));
    let c = compile_graph(&capture(&specs, attention).unwrap(), rt.target()).unwrap();
    let units: Vec<_> = c
        .kernels
        .iter()
        .filter_map(|k| match k.body.as_slice() {
            [Stmt::Attention(a)] => Some(a.tile.units),
            _ => None,
        })
        .collect();
    assert_eq!(units, [AttentionUnits::Registers], "{c}");
    let b: std::sync::Arc<dyn kiln::graph::Backend> = rt.clone();
    conformance::user_cases::attention(&b);
}
