//! f32 attention on the registers template over wgpu (`KILN_WGPU_REGISTER_ATTENTION_ROWS=4`; WGSL targets
//! plan the lanes template unless asked), run against the reference on lavapipe in CI: every attention
//! shape of the conformance suite, with a row's threads meeting by subgroup shuffles where the adapter
//! has subgroups and through workgroup memory with them off (`KILN_WGPU_SUBGROUPS=0`), a head dim the
//! adapter's workgroup memory takes on registers checked to be planned there each time.

mod common;
mod conformance;

use kiln::graph::kernel::{AttentionTile, AttentionUnits, Stmt};
use kiln::graph::{capture, compile_graph, DType, Tensor, TensorSpec};

fn attention(t: &[Tensor]) -> kiln::Result<Vec<Tensor>> {
    let s = t[0].matmul(&t[1].transpose(-1, -2)?)?.mul(0.125)?.causal_mask()?;
    Ok(vec![s.softmax(-1)?.matmul(&t[2])?])
}

#[test]
fn f32_attention_on_registers_matches_the_reference() {
    // One test, the two runtimes one after the other: both read the process's environment.
    let mut seen = Vec::new();
    for subgroups in ["1", "0"] {
        std::env::set_var("KILN_WGPU_SUBGROUPS", subgroups);
        let Some(rt) = common::wgpu_runtime_with("KILN_WGPU_REGISTER_ATTENTION_ROWS", "4") else { return };
        assert!(rt.target().register_attention.is_some(), "{}", rt.driver().describe());
        // Head dim 16: 4 · (64·16 + 64·64 + 64·16) = 24 KiB of workgroup memory, within any Vulkan adapter's.
        let specs = [[2, 70, 16], [2, 90, 16], [2, 90, 16]].map(|d| TensorSpec::new(DType::F32, &d));
        let c = compile_graph(&capture(&specs, attention).unwrap(), rt.target()).unwrap();
        let tiles: Vec<AttentionTile> = c
            .kernels
            .iter()
            .filter_map(|k| match k.body.as_slice() {
                [Stmt::Attention(a)] => Some(a.tile),
                _ => None,
            })
            .collect();
        assert!(tiles.len() == 1 && tiles[0].units == AttentionUnits::Registers, "{c}");
        let eights = rt.target().subgroup_size.is_some_and(|s| s % 8 == 0);
        assert_eq!(tiles[0].row_shuffles, eights, "{:?}", rt.target().subgroup_size);
        seen.push(tiles[0].row_shuffles);
        let b: std::sync::Arc<dyn kiln::graph::Backend> = rt.clone();
        conformance::user_cases::attention(&b);
    }
    assert_eq!(seen.last(), Some(&false), "subgroups off: rows met through workgroup memory");
}
