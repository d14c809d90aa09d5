//! Every kernel of the workloads, rendered to WGSL, passes naga's validator (with and without f16).

use kiln_graph::{capture, compile_graph, DType, Result, Target, Tensor, TensorSpec};
use kiln_wgsl::{render, validate};

fn check(inputs: &[TensorSpec], f: impl FnOnce(&[Tensor]) -> Result<Vec<Tensor>>) {
    check_on(&Target::webgpu_default(), inputs, f);
}

fn check_on(target: &Target, inputs: &[TensorSpec], f: impl FnOnce(&[Tensor]) -> Result<Vec<Tensor>>) {
    let g = capture(inputs, f).unwrap();
    let c = compile_graph(&g, target).unwrap();
    for f16 in [false, true] {
        for k in &c.kernels {
            let s = render(k, f16).unwrap();
            if let Err(e) = validate(&k.name, &s.source) {
                panic!("{e}");
            }
        }
    }
}

fn f32s(d: &[usize]) -> TensorSpec {
    TensorSpec::new(DType::F32, d)
}

#[test]
fn workload_kernels_validate() {
    check(&[f32s(&[1 << 12])], |t| {
        let x = &t[0];
        Ok(vec![x.mul(1.5)?.add(0.5)?.gelu()?.mul(&x.sigmoid()?)?.sub(&x.tanh()?)?])
    });
    check(&[f32s(&[64, 512])], |t| Ok(vec![t[0].softmax(-1)?]));
    check(&[f32s(&[64, 512]), f32s(&[512]), f32s(&[512])], |t| {
        Ok(vec![t[0].layer_norm(1, Some(&t[1]), Some(&t[2]), 1e-5)?.gelu()?])
    });
    check(&[f32s(&[2, 8, 16]), f32s(&[32, 16]), f32s(&[32])], |t| Ok(vec![t[0].linear(&t[1], Some(&t[2]))?.relu()?]));
    check(&[f32s(&[4, 6]), TensorSpec::new(DType::I64, &[3])], |t| {
        let g = t[0].index_select(1, &t[1])?;
        Ok(vec![g.argmax(1, false)?, t[0].pad(&[(1, 1), (0, 2)], -1.0)?, Tensor::concat(&[&t[0], &t[0]], 1)?.isnan()?])
    });
    check(&[TensorSpec::new(DType::F16, &[8, 8]), TensorSpec::new(DType::BF16, &[8, 8])], |t| {
        Ok(vec![t[0].exp()?.sum(&[1], false)?, t[1].cast(DType::F32)?.softmax(0)?.cast(DType::BF16)?])
    });
}

/// i32's extremes as constants (`-2147483648i` alone is out of range in WGSL: the negation of a literal
/// one past i32::MAX).
#[test]
fn the_extreme_integers_validate() {
    check(&[TensorSpec::new(DType::I32, &[64])], |t| {
        let x = &t[0];
        let low = x.gt(0)?.where_(x, i32::MIN as f64)?;
        Ok(vec![low.maximum(i32::MAX as f64)?.max(&[0], false)?, x.maximum(i32::MIN as f64)?])
    });
}

/// On an adapter with subgroups of a fixed size (NVIDIA's 32, lavapipe's 8), row combines shuffle within
/// subgroups and short rows are packed a subgroup each: the shaders validate, read the subgroup builtins,
/// and a packed one waits at no workgroup barrier.
#[test]
fn subgroup_combines_and_packed_rows_validate() {
    for s in [32, 8] {
        let target = Target { subgroup_size: Some(s), ..Target::webgpu_default() };
        check_on(&target, &[f32s(&[64, 512])], |t| Ok(vec![t[0].softmax(-1)?]));
        check_on(&target, &[f32s(&[300, 64])], |t| Ok(vec![t[0].sum(&[1], false)?, t[0].max(&[1], false)?]));
        check_on(&target, &[TensorSpec::new(DType::I32, &[40, 700])], |t| Ok(vec![t[0].min(&[1], false)?]));
    }
    let target = Target { subgroup_size: Some(32), ..Target::webgpu_default() };
    let g = capture(&[f32s(&[300, 64])], |t| Ok(vec![t[0].sum(&[1], false)?])).unwrap();
    let c = compile_graph(&g, &target).unwrap();
    let k = &c.kernels[0];
    assert_eq!((k.launch.threads, k.launch.packed), (32, 8), "{k}");
    let source = render(k, false).unwrap().source;
    assert!(source.contains("@workgroup_size(256)") && source.contains("sg_id"), "{source}");
    assert!(source.contains("subgroupShuffleXor") && !source.contains("workgroupBarrier"), "{source}");
    let g = capture(&[f32s(&[64, 512])], |t| Ok(vec![t[0].softmax(-1)?])).unwrap();
    let c = compile_graph(&g, &target).unwrap();
    let source = render(&c.kernels[0], false).unwrap().source;
    assert!(source.contains("subgroupShuffleXor") && !source.contains("stride = stride / 2i"), "{source}");
}

/// The f32 attention on lanes validates with one thread a query, and split across 2 and 4 threads where
/// the subgroups sum their partial scores by shuffles (which the split kernel then holds), on WebGPU's
/// limits and with subgroups of 32; a split with no subgroups falls back to one thread a query.
#[test]
fn attention_on_lanes_validates_split_or_not() {
    use kiln_graph::kernel::Stmt;
    use kiln_graph::target::LaneAttention;
    let qkv = [f32s(&[2, 96, 64]), f32s(&[2, 96, 64]), f32s(&[2, 96, 64])];
    let attention = |t: &[Tensor]| {
        let s = t[0].matmul(&t[1].transpose(-1, -2)?)?.mul(0.125)?.causal_mask()?;
        Ok(vec![s.softmax(-1)?.matmul(&t[2])?])
    };
    for (subgroups, split, threads) in [(None, 2, 128), (Some(32), 1, 128), (Some(32), 2, 256), (Some(32), 4, 256)] {
        let la = LaneAttention { rows: if split == 4 { 64 } else { 128 }, keys: 32, chunk: 4, split };
        let target = Target { subgroup_size: subgroups, lane_attention: Some(la), ..Target::webgpu_default() };
        check_on(&target, &qkv, attention);
        let c = compile_graph(&capture(&qkv, attention).unwrap(), &target).unwrap();
        let k = c.kernels.iter().find(|k| matches!(k.body.as_slice(), [Stmt::Attention(_)])).expect("fused");
        assert_eq!(k.launch.threads, threads, "{subgroups:?} split {split}");
        let shuffles = render(k, false).unwrap().source.contains("subgroupShuffleXor");
        assert_eq!(shuffles, subgroups.is_some() && split > 1, "{subgroups:?} split {split}");
    }
}
