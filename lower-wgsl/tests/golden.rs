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

/// Index divisions (session 44: NVIDIA's Vulkan compiler keeps a signed division, remainder and floor
/// correction where it meets one): a power of two is a shift and a mask, another constant an unsigned
/// division of a dividend the kernel's ranges prove non-negative (a transpose's element number), and
/// only an index of unknown sign keeps `kfloordiv`/`kmod`.
#[test]
fn index_divisions_take_the_cheap_forms() {
    let body = |src: &str| src[src.find("fn main").expect("an entry point")..].to_string();
    let pow2 = body(&wgsl(&[f32s(&[16, 8, 4])], |t| Ok(vec![t[0].permute(&[2, 0, 1])?.exp()?])));
    assert!(pow2.contains(">> ") && pow2.contains(" & "), "{pow2}");
    let odd = body(&wgsl(&[f32s(&[3, 5, 7])], |t| Ok(vec![t[0].permute(&[2, 0, 1])?.exp()?])));
    assert!(odd.contains("i32(u32("), "{odd}");
    for src in [&pow2, &odd] {
        assert!(!src.contains("kfloordiv(") && !src.contains("kmod("), "{src}");
    }
}
