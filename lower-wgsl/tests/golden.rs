//! Golden WGSL for the workload kernels (W1 pointwise, W2 softmax, W3 layer norm + GELU) and a matmul with
//! a fused epilogue. A codegen change shows up here as a reviewed snapshot diff (`cargo insta review`).

use kiln_graph::{capture, compile_graph, DType, Result, Target, Tensor, TensorSpec};
use kiln_wgsl::render;

fn wgsl(inputs: &[TensorSpec], f: impl FnOnce(&[Tensor]) -> Result<Vec<Tensor>>) -> String {
    let g = capture(inputs, f).unwrap();
    let c = compile_graph(&g, &Target::webgpu_default()).unwrap();
    c.kernels.iter().map(|k| render(k, false).unwrap().source).collect::<Vec<_>>().join("\n")
}

fn f32s(d: &[usize]) -> TensorSpec {
    TensorSpec::new(DType::F32, d)
}

#[test]
fn w1_pointwise() {
    insta::assert_snapshot!(wgsl(&[f32s(&[1 << 20])], |t| {
        let x = &t[0];
        Ok(vec![x.mul(1.5)?.add(0.5)?.gelu()?.mul(&x.sigmoid()?)?.sub(&x.tanh()?)?])
    }));
}

#[test]
fn w2_softmax() {
    insta::assert_snapshot!(wgsl(&[f32s(&[1024, 1024])], |t| Ok(vec![t[0].softmax(-1)?])));
}

#[test]
fn w3_layernorm_gelu() {
    insta::assert_snapshot!(wgsl(&[f32s(&[1024, 512]), f32s(&[512]), f32s(&[512])], |t| {
        Ok(vec![t[0].layer_norm(1, Some(&t[1]), Some(&t[2]), 1e-5)?.gelu()?])
    }));
}

#[test]
fn matmul_with_epilogue() {
    insta::assert_snapshot!(wgsl(&[f32s(&[64, 128]), f32s(&[256, 128]), f32s(&[256])], |t| {
        Ok(vec![t[0].linear(&t[1], Some(&t[2]))?.relu()?])
    }));
}

/// GPT-2's causal attention over one head of 64 in f32: the lanes template (one query a thread, key and
/// value tiles of 32 rows in WebGPU's 16 KiB of workgroup memory).
#[test]
fn causal_attention_on_lanes() {
    insta::assert_snapshot!(wgsl(&[f32s(&[8, 256, 64]), f32s(&[8, 256, 64]), f32s(&[8, 256, 64])], |t| {
        let s = t[0].matmul(&t[1].transpose(-1, -2)?)?.mul(0.125)?.causal_mask()?;
        Ok(vec![s.softmax(-1)?.matmul(&t[2])?])
    }));
}
