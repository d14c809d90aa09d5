//! Recomputation in the backward pass (`remat`): a bf16 model's backward computes its wide
//! intermediates again from the narrow values it reads, rather than reading them back from memory; an
//! f32 model's, from the values the forward stores anyway.

use kiln_graph::autodiff::grad_graph;
use kiln_graph::ir::Graph;
use kiln_graph::workloads::{data, f32s, with_dtype};
use kiln_graph::{capture, compile_graph, interp, CompiledGraph, DType, Target, TensorSpec};

/// `mean(gelu(x) · y)` over bf16 `x`, `y`, differentiated: the GELU computes in f32, and its backward
/// needs `1 + erf(x/√2)` and `x/2`. No kernel writes or reads an f32 tensor the size of `x`: the
/// backward computes them from `x`. The gradient still matches the reference.
#[test]
fn a_bf16_gelu_backward_recomputes_its_f32_intermediates() {
    let specs = with_dtype(vec![f32s(&[64, 256]), f32s(&[64, 256])], DType::BF16);
    let g = capture(&specs, |t| Ok(vec![t[0].gelu()?.mul(&t[1])?.mean(&[0, 1], false)?])).unwrap();
    let joint = grad_graph(&g, &[0]).unwrap();
    let c = compile_graph(&joint, &Target::cuda(90)).unwrap();
    for k in &c.kernels {
        for b in &k.buffers {
            let wide = b.dtype == DType::F32 && b.len.as_const() == Some(64 * 256);
            assert!(!wide, "{:?} f32 buffer in\n{c}", b.access);
        }
    }
    matches_reference(&c, &joint, &specs, 2e-2);
}

/// `c`'s kernels, interpreted on seeded inputs, give `joint`'s reference values within `rtol`.
fn matches_reference(c: &CompiledGraph, joint: &Graph, specs: &[TensorSpec], rtol: f64) {
    let inputs: Vec<_> = specs.iter().enumerate().map(|(i, s)| data(s, i)).collect();
    let refs: Vec<_> = inputs.iter().collect();
    let (got, want) = (c.run_interpreted(&refs).unwrap(), interp::run(joint, &refs).unwrap());
    for (g, w) in got.iter().zip(&want) {
        for (a, b) in g.values().iter().zip(w.values()) {
            assert!((a - b).abs() <= rtol * (1e-3 + b.abs()), "{a} vs {b}");
        }
    }
}

/// A max's gradient compares `x` with `max(x)`: that comparison must read the forward's own `x`, not a
/// copy computed again in another kernel (which may round differently and zero a row's gradient), even
/// where `x` (here f32 from bf16) would otherwise be recomputed.
#[test]
fn a_max_gradient_compares_the_forward_values_themselves() {
    use kiln_graph::ir::{BinaryOp, Op, OpFamily};
    let specs = with_dtype(vec![f32s(&[64, 256])], DType::BF16);
    let g = capture(&specs, |t| Ok(vec![t[0].cast(DType::F32)?.mul(2.0)?.max(&[0, 1], false)?])).unwrap();
    let forward_len = kiln_graph::decompose::decompose(&g).unwrap().graph.nodes.len();
    let joint = grad_graph(&g, &[0]).unwrap();
    let eq = joint.nodes.iter().find(|n| matches!(n.op, Op::Binary { op: BinaryOp::Eq })).expect("a comparison");
    for &x in &eq.inputs {
        let mut x = x;
        while x.index() >= forward_len && joint.node(x).op.family() == OpFamily::Layout {
            x = joint.node(x).inputs[0];
        }
        assert!(x.index() < forward_len, "the comparison reads {:?}, a backward copy", joint.node(x).op);
    }
}

/// Two f32 layers `gelu(x·Wᵀ + b)` and a third, under a squared error, differentiated for the weights
/// and biases as a training step is. Every value is f32, so nothing is narrower, but each GELU's
/// intermediates (`x/√2`, `1 + erf(x/√2)`, `x/2`) are still recomputed in the backward from the library
/// GEMM's output (stored anyway): the forward's GELU is one kernel that reads the product once and
/// writes the activation once, and its backward reads the product and the incoming gradient only —
/// where they were four forward kernels and a backward that read four tensors. Gradients match the
/// reference.
#[test]
fn an_f32_gelu_after_a_linear_layer_writes_only_its_activation() {
    let step = |rows: usize, width: usize| {
        let (m, v) = (f32s(&[width, width]), f32s(&[width]));
        let specs = vec![f32s(&[rows, width]), m.clone(), v.clone(), m.clone(), v.clone(), m, v, f32s(&[rows, width])];
        let g = capture(&specs, |t| {
            let mut h = t[0].clone();
            for l in 0..3 {
                h = h.linear(&t[1 + 2 * l], Some(&t[2 + 2 * l]))?;
                if l < 2 {
                    h = h.gelu()?;
                }
            }
            let d = h.sub(&t[7])?;
            Ok(vec![d.mul(&d)?.mean(&[0, 1], false)?])
        })
        .unwrap();
        (specs, grad_graph(&g, &[1, 2, 3, 4, 5, 6]).unwrap())
    };
    // At a size the GEMMs go to the library: the structure.
    let (rows, width) = (8192, 1024);
    let (_, joint) = step(rows, width);
    let c = compile_graph(&joint, &Target::cuda(90)).unwrap();
    let full = |k: &kiln_graph::kernel::Kernel, write: bool| {
        let n = k.buffers.iter().filter(|b| b.len.as_const() == Some((rows * width) as i64));
        n.filter(|b| (b.access == kiln_graph::kernel::Access::Write) == write).count()
    };
    let gelu: Vec<_> = c.kernels.iter().filter(|k| k.name.contains("erf")).collect();
    let (forward, backward): (Vec<_>, Vec<_>) = gelu.iter().partition(|k| !k.name.contains("exp"));
    assert_eq!((forward.len(), backward.len()), (2, 2), "{c}");
    for k in forward {
        assert_eq!((full(k, false), full(k, true)), (1, 1), "{}\n{c}", k.name);
    }
    for k in backward {
        assert_eq!((full(k, false), full(k, true)), (2, 1), "{}\n{c}", k.name);
    }
    // Small enough to interpret: the gradients.
    let (specs, joint) = step(48, 32);
    let c = compile_graph(&joint, &Target::cuda(90)).unwrap();
    matches_reference(&c, &joint, &specs, 1e-4);
}

/// A layer norm whose f32 input is a long pointwise chain of its own (fused into the norm's row kernel,
/// so never stored): recomputing its normalised values in the backward would need that input stored, a
/// write more, so they are not — the value a reduction reads is not "stored anyway". The step writes at
/// most the three full-size tensors it wrote before recomputation at equal width existed.
#[test]
fn a_layer_norm_of_a_fused_chain_gains_no_write() {
    let (rows, width) = (4096, 768);
    let specs = vec![f32s(&[rows, width]), f32s(&[width]), f32s(&[width]), f32s(&[rows, width])];
    let g = capture(&specs, |t| {
        let mut h = t[0].clone();
        for _ in 0..8 {
            h = h.mul(1.01)?.add(0.1)?;
        }
        let y = h.layer_norm(1, Some(&t[1]), Some(&t[2]), 1e-5)?;
        Ok(vec![y.mul(&t[3])?.mean(&[0, 1], false)?])
    })
    .unwrap();
    let joint = grad_graph(&g, &[0, 1, 2]).unwrap();
    let c = compile_graph(&joint, &Target::cuda(90)).unwrap();
    let full = Some((rows * width) as i64);
    let writes = c.kernels.iter().flat_map(|k| &k.buffers);
    let writes = writes.filter(|b| b.access == kiln_graph::kernel::Access::Write && b.len.as_const() == full).count();
    assert!(writes <= 3, "{writes} full-size tensors written:\n{c}");
}

/// The partition is in the compile report: for the bf16 GELU above, the backward reads nothing the
/// forward computed in f32 (x is an input), where keeping every value its rules use would read the three
/// f32 intermediates; the GELU's nodes are computed again.
#[test]
fn the_partition_is_reported() {
    use kiln_graph::{autodiff::value_and_grad, compile, Tensor};
    let specs = with_dtype(vec![f32s(&[64, 256]), f32s(&[64, 256])], DType::BF16);
    let (x, y) = (Tensor::from_data(data(&specs[0], 0)), Tensor::from_data(data(&specs[1], 1)));
    let f = compile(|(x, y): (&Tensor, &Tensor)| {
        let (_, grads) =
            value_and_grad(|a| a[0].gelu()?.mul(&a[1])?.mean(&[0, 1], false), &[x.clone(), y.clone()], &[0])?;
        Ok(grads[0].clone())
    });
    let ex = f.explain((&x, &y)).unwrap();
    let p = &ex.graphs[0].partitions[0];
    let (saved, all) = (p.saved_bytes.as_const().unwrap(), p.all_bytes.as_const().unwrap());
    assert!(all >= 3 * 64 * 256 * 4, "{p:?}");
    assert!(saved < 64 * 256 * 4 && p.recomputed >= 3, "{p:?}");
    assert!(ex.to_string().contains("backward: reads"), "{ex}");
}

/// A bf16 layer norm whose output a mean-square loss reduces (W5-train's last block): the loss's
/// residual is kept for the backward (the layer norm's kernel writes it for the loss's kernel anyway),
/// so no kernel writes the layer norm's f32 `x − mean` for the loss's kernel to read — what the cut chose
/// when it priced that residual as written only for the backward (W5-train-bf16 +0.45% on an H200).
#[test]
fn a_loss_over_a_layer_norm_reads_the_residual_not_an_f32_intermediate() {
    let (rows, width) = (4096, 768);
    let specs = with_dtype(
        vec![f32s(&[rows, width]), f32s(&[width]), f32s(&[width]), f32s(&[rows, width]), f32s(&[rows, width])],
        DType::BF16,
    );
    let g = capture(&specs, |t| {
        let h = t[0].add(&t[4])?;
        let y = h.layer_norm(1, Some(&t[1]), Some(&t[2]), 1e-5)?;
        let d = y.sub(&t[3])?;
        Ok(vec![d.mul(&d)?.mean(&[0, 1], false)?])
    })
    .unwrap();
    let joint = grad_graph(&g, &[0, 1, 2]).unwrap();
    let c = compile_graph(&joint, &Target::cuda(90)).unwrap();
    let wide = c.kernels.iter().flat_map(|k| &k.buffers).filter(|b| {
        b.access == kiln_graph::kernel::Access::Write
            && b.dtype == DType::F32
            && b.len.as_const() == Some((rows * width) as i64)
    });
    assert_eq!(wide.count(), 0, "an f32 tensor of the layer norm's size is written:\n{c}");
}

/// A concatenation the backward reads counts at its own bytes, all its parts', not as a view of its
/// first part: here the backward uses `c = [exp(x); exp(y)]` (twice exp(x)'s bytes) and exp(x).
#[test]
fn a_concatenation_counts_all_its_parts() {
    use kiln_graph::{autodiff::value_and_grad, compile, Tensor};
    let specs = [f32s(&[64, 256]), f32s(&[64, 256])];
    let (x, y) = (Tensor::from_data(data(&specs[0], 0)), Tensor::from_data(data(&specs[1], 1)));
    let f = compile(|(x, y): (&Tensor, &Tensor)| {
        let (_, grads) = value_and_grad(
            |a| {
                let c = Tensor::concat(&[&a[0].exp()?, &a[1].exp()?], 0)?;
                c.mul(&c)?.mean(&[0, 1], false)
            },
            &[x.clone(), y.clone()],
            &[0],
        )?;
        Ok(grads[0].clone())
    });
    let ex = f.explain((&x, &y)).unwrap();
    let p = &ex.graphs[0].partitions[0];
    let all = p.all_bytes.as_const().unwrap();
    assert!(all >= 3 * 64 * 256 * 4, "the concatenation (2 × 64 KiB) and exp(x) (64 KiB): {p:?}");
}
