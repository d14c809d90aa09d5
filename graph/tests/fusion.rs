//! Fusion on the benchmark workloads (`../shared/WORKLOADS.md`) at full size, traced on placeholders:
//! how many kernels each compiles to, of which kind, and what they fuse.

use kiln_graph::fuse::RegionKind;
use kiln_graph::kernel::{Access, RowLoad, Stmt};
use kiln_graph::{capture, compile_graph, CompiledGraph, DType, Result, Target, Tensor, TensorSpec};

use kiln_graph::workloads::{block_params, f32s, gpt_block, w4, w4_inputs};

fn compiled(inputs: &[TensorSpec], f: impl FnOnce(&[Tensor]) -> Result<Vec<Tensor>>) -> CompiledGraph {
    let g = capture(inputs, f).expect("traces");
    compile_graph(&g, &Target::cuda(90)).expect("compiles")
}

fn w1(x: &Tensor) -> Result<Tensor> {
    Ok(kiln_graph::workloads::w1(std::slice::from_ref(x))?.remove(0))
}

#[test]
fn w1_is_one_pointwise_kernel() {
    let c = compiled(&[f32s(&[1 << 26])], |t| Ok(vec![w1(&t[0])?]));
    assert_eq!(c.kernels.len(), 1, "{c}");
    assert_eq!(c.kernel_kinds(), (1, 0, 0));
    let k = &c.kernels[0];
    assert_eq!(k.buffers.len(), 2, "reads x once, writes y once: {k}");
    assert!(k.name.starts_with("k0_fused_"), "{}", k.name);
    assert_eq!(k.vector_width, 4, "contiguous f32 accesses go 16 bytes at a time");
}

/// A concatenation of many inputs, each read at its own offset, stays scalar: its loads are per lane
/// either way, and four lanes would copy them all four times (DenseNet's dense blocks: a quarter of the
/// PTX). A bias read per lane beside contiguous accesses keeps the vectors.
#[test]
fn a_many_way_concatenation_is_not_vectorised() {
    let specs: Vec<TensorSpec> = (0..12).map(|_| f32s(&[4, 32, 64])).collect();
    let c = compiled(&specs, |t| {
        let parts: Vec<&Tensor> = t.iter().collect();
        Ok(vec![Tensor::concat(&parts, 1)?.relu()?])
    });
    assert_eq!(c.kernels.len(), 1, "{c}");
    assert_eq!(c.kernels[0].vector_width, 1, "{}", c.kernels[0]);
    let c = compiled(&[f32s(&[256, 1024]), f32s(&[1024])], |t| Ok(vec![t[0].add(&t[1])?.relu()?]));
    assert_eq!(c.kernels[0].vector_width, 4, "{}", c.kernels[0]);
}

#[test]
fn w2_softmax_is_one_row_kernel() {
    let c = compiled(&[f32s(&[8192, 8192])], |t| Ok(vec![t[0].softmax(-1)?]));
    assert_eq!(c.kernels.len(), 1, "{c}");
    assert_eq!(c.kernel_kinds(), (0, 1, 0));
    assert_eq!(c.kernels[0].name, "k0_softmax");
    // A row of 8192 fits in registers: 256 threads keep 32 elements each, one pass over memory.
    assert_eq!((c.kernels[0].launch.threads, c.kernels[0].row_cache), (256, Some(32)));
    // Rows too long for registers even at the target's largest group are read once per pass instead
    // (enough of them that none is split into pieces for the device: `split_reduce`).
    let g = capture(&[f32s(&[1024, 1 << 16])], |t| Ok(vec![t[0].softmax(-1)?])).unwrap();
    let webgpu = compile_graph(&g, &Target::webgpu_default()).unwrap();
    assert_eq!((webgpu.kernels[0].launch.threads, webgpu.kernels[0].row_cache), (256, None));
}

#[test]
fn w3_layernorm_gelu_is_one_row_kernel() {
    let c = compiled(&[f32s(&[8192, 4096]), f32s(&[4096]), f32s(&[4096])], |t| {
        Ok(vec![t[0].layer_norm(1, Some(&t[1]), Some(&t[2]), 1e-5)?.gelu()?])
    });
    assert_eq!(c.kernels.len(), 1, "{c}");
    assert_eq!(c.kernels[0].name, "k0_fused_layernorm_gelu");
    assert_eq!(c.kernels[0].buffers.iter().filter(|b| b.access == Access::Write).count(), 1);
    // The row is read by three passes (mean, variance, output) and kept in registers; the weight and
    // bias are read by the last pass only, so they are loaded there and hold no registers: 256 threads
    // keep 16 elements each.
    let k = &c.kernels[0];
    let Some(Stmt::Loop { body: row, .. }) = k.body.iter().find(|s| matches!(s, Stmt::Loop { .. })) else {
        panic!("a row loop: {k}")
    };
    let kept: Vec<usize> = RowLoad::of_row(row).iter().map(|l| l.buffer).collect();
    assert_eq!(kept, vec![0], "{k}");
    assert_eq!((k.launch.threads, k.row_cache), (256, Some(16)));
}

#[test]
fn a_row_invariant_divisor_is_inverted_once() {
    let c = compiled(&[f32s(&[8192, 8192])], |t| Ok(vec![t[0].softmax(-1)?]));
    let text = c.kernels[0].to_string();
    assert_eq!(text.matches("reciprocal(").count(), 1, "{text}");
    assert_eq!(text.matches("1/b =").count(), 1, "each element's quotient refined from it: {text}");
    // A divisor that varies with the element stays a plain division.
    let c = compiled(&[f32s(&[1024]), f32s(&[1024])], |t| Ok(vec![t[0].div(&t[1])?]));
    let text = c.kernels[0].to_string();
    assert!(text.contains("div(") && !text.contains("1/b ="), "{text}");
    // A softmax stored in bf16 or f16 multiplies by the row's reciprocal: the refinement would be lost
    // to the rounding and costs W2-bf16 a third of its time.
    for dtype in [DType::BF16, DType::F16] {
        let c = compiled(&[TensorSpec::new(dtype, &[64, 8192])], |t| Ok(vec![t[0].softmax(-1)?]));
        let text = c.kernels[0].to_string();
        assert_eq!(text.matches("reciprocal(").count(), 1, "{text}");
        assert!(!text.contains("div(") && text.contains("mul("), "{text}");
    }
}

#[test]
fn a_power_of_two_divisor_is_a_multiplication() {
    // W3's mean and variance divide by the row length, 4096: exactly a multiplication by 2^-12, so
    // neither needs a reciprocal nor a refined quotient.
    let c = compiled(&[f32s(&[8192, 4096]), f32s(&[4096]), f32s(&[4096])], |t| {
        Ok(vec![t[0].layer_norm(1, Some(&t[1]), Some(&t[2]), 1e-5)?.gelu()?])
    });
    let text = c.kernels[0].to_string();
    assert!(!text.contains("div(") && !text.contains("reciprocal("), "{text}");
    assert_eq!(text.matches("= 0.000244140625").count(), 2, "{text}");
    // A length that is not a power of two keeps the division's rounding.
    let c = compiled(&[f32s(&[64, 3000])], |t| Ok(vec![t[0].mean(&[1], false)?]));
    let text = c.kernels[0].to_string();
    assert!(text.contains("div("), "{text}");
}

#[test]
fn w4_layers_are_matmuls_with_fused_epilogues() {
    let c = compiled(&w4_inputs(10), w4);
    assert_eq!(c.kernels.len(), 129, "one matmul per linear and nothing else");
    assert_eq!(c.kernel_kinds(), (0, 0, 129));
    let names: std::collections::BTreeSet<String> =
        c.kernels.iter().map(|k| k.name.split_once('_').map(|x| x.1.to_string()).unwrap_or_default()).collect();
    assert!(names.contains("fused_linear_relu_sigmoid") && names.contains("fused_linear_relu"), "{names:?}");
}

/// One W5 block on inputs x followed by the block's twelve parameters.
fn w5_block(t: &[Tensor], heads: usize) -> Result<Tensor> {
    gpt_block(&t[0], &t[1..], heads)
}

fn w5_block_inputs(b: usize, s: usize, d: usize) -> Vec<TensorSpec> {
    let mut v = vec![f32s(&[b, s, d])];
    v.extend(block_params(d));
    v
}

/// With its own matmul template (no GEMM library) and its attention written out (no f32 attention
/// template), each matmul fuses its epilogue.
#[test]
fn w5_block_is_six_matmuls_one_softmax_two_layernorms() {
    let (b, s, d) = (8, 512, 768);
    let inputs = w5_block_inputs(b, s, d);
    let g = capture(&inputs, |t| Ok(vec![w5_block(t, 12)?])).expect("traces");
    let target = Target { library_gemm: false, register_attention: None, ..Target::cuda(90) };
    let c = compile_graph(&g, &target).expect("compiles");
    assert_eq!(c.kernel_kinds(), (0, 3, 6), "{:#?}", c.fusion.regions.iter().map(|r| &r.name).collect::<Vec<_>>());
    let rows: Vec<&str> = c
        .fusion
        .regions
        .iter()
        .filter(|r| matches!(r.kind, RegionKind::Rows { .. }))
        .map(|r| r.name.as_str())
        .collect();
    assert!(rows.iter().filter(|n| n.contains("layernorm")).count() == 2, "{rows:?}");
    let attention = rows.iter().find(|n| n.contains("softmax")).expect("a softmax kernel");
    assert!(attention.contains("causalmask") && attention.contains("mul"), "scale and mask fused: {attention}");
}

#[test]
fn a_binding_limited_target_splits_wide_regions() {
    let inputs: Vec<TensorSpec> = (0..10).map(|_| f32s(&[33])).collect();
    let g = capture(&inputs, |t| {
        let mut acc = t[0].exp()?;
        for x in &t[1..] {
            acc = acc.add(&x.mul(2.0)?)?;
        }
        Ok(vec![acc])
    })
    .unwrap();
    let target = Target::webgpu_default().with_max_bindings(4);
    let c = compile_graph(&g, &target).unwrap();
    assert!(c.kernels.len() > 1, "10 inputs cannot share one 4-binding kernel");
    for k in &c.kernels {
        assert!(k.buffers.len() <= 4, "{k}");
    }
}

#[test]
fn dot_colours_nodes_by_region() {
    let c = compiled(&[f32s(&[64, 32])], |t| Ok(vec![t[0].softmax(-1)?.mul(2.0)?.sum(&[0], false)?]));
    let dot = kiln_graph::export::to_dot_regions(&c.primitive.graph, &c.fusion);
    for r in &c.fusion.regions {
        assert!(dot.contains(&format!("[{}]", r.name)), "{dot}");
    }
    assert!(dot.contains("#8dd3c7") && dot.contains("#ffffb3"), "two regions, two colours: {dot}");
}

#[test]
fn explain_shows_the_w3_region_and_its_kernel_ir() {
    let c = compiled(&[f32s(&[8192, 4096]), f32s(&[4096]), f32s(&[4096])], |t| {
        Ok(vec![t[0].layer_norm(1, Some(&t[1]), Some(&t[2]), 1e-5)?.gelu()?])
    });
    let text = c.to_string();
    for needle in ["region k0_fused_layernorm_gelu", "fuses:", "reads:", "writes:", "reduce Sum over", "(Group", "erf("]
    {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
}

#[test]
fn fusion_never_raises_peak_memory() {
    use kiln_graph::{compile_graph_with, FusionMode};
    let b = kiln_graph::sym::Bindings::new();
    let (bsz, s, d) = (2, 64, 96);
    let w5 = w5_block_inputs(bsz, s, d);
    let graphs = [
        capture(&[f32s(&[4096])], |t| Ok(vec![w1(&t[0])?])).unwrap(),
        capture(&[f32s(&[64, 512]), f32s(&[512]), f32s(&[512])], |t| {
            Ok(vec![t[0].layer_norm(1, Some(&t[1]), Some(&t[2]), 1e-5)?.gelu()?])
        })
        .unwrap(),
        capture(&w5, |t| Ok(vec![w5_block(t, 4)?])).unwrap(),
    ];
    for g in &graphs {
        let target = Target::cuda(90);
        let fused = compile_graph_with(g, &target, FusionMode::Fused).unwrap();
        let per_op = compile_graph_with(g, &target, FusionMode::PerOp).unwrap();
        let (pf, pe) = (fused.plan.peak_bytes(&b).unwrap(), per_op.plan.peak_bytes(&b).unwrap());
        assert!(pf <= pe, "fused peak {pf} > one-kernel-per-op peak {pe}");
        assert!(fused.kernels.len() < per_op.kernels.len() || fused.kernels.len() == 1);
    }
}

/// With cuBLAS and the attention written out, the six matmuls are library calls; the attention output,
/// whose heads the projection reads back as rows, is stored once; bias, GELU and the residuals fuse
/// into the kernels between. With the f32 attention template (CUDA's), the two attention products and
/// the softmax are one kernel beside the four linear layers' calls.
#[test]
fn w5_block_on_a_gemm_library() {
    let g = capture(&w5_block_inputs(8, 512, 768), |t| Ok(vec![w5_block(t, 12)?])).expect("traces");
    let written = compile_graph(&g, &Target { register_attention: None, ..Target::cuda(90) }).expect("compiles");
    let gemms = |c: &CompiledGraph| c.kernels.iter().filter(|k| k.gemm().is_some()).count();
    assert_eq!(gemms(&written), 6, "{written}");
    assert_eq!(written.kernel_kinds().1, 3, "two layer norms and the softmax stay row kernels");
    assert!(written.kernels.len() <= 14, "{} kernels:\n{written}", written.kernels.len());
    let c = compiled(&w5_block_inputs(8, 512, 768), |t| Ok(vec![w5_block(t, 12)?]));
    assert_eq!(gemms(&c), 4, "{c}");
    assert_eq!(c.kernel_kinds().1, 2, "two layer norms stay row kernels; the softmax is the attention's");
    let attentions = c.kernels.iter().filter(|k| matches!(k.body.as_slice(), [Stmt::Attention(_)])).count();
    assert_eq!(attentions, 1, "{c}");
    assert!(c.kernels.len() < written.kernels.len(), "{c}");
}

/// A full reduction of 2^32 elements or more (and of 2^31..2^32) lowers with 64-bit extents: a chain of
/// rows (split for the device where the length has divisors) whose reduction loops together cover every
/// element, a thread count within the target, and no panic (the row length once went through a `u32`
/// and wrapped, so the kernel summed a fraction of the input).
#[test]
fn reductions_past_two_to_the_32_cover_every_element() {
    use kiln_graph::kernel::Stmt;
    fn extents(body: &[Stmt], out: &mut Vec<i64>) {
        for s in body {
            match s {
                Stmt::Reduce { extent, body, .. } => {
                    out.extend(extent.as_const());
                    extents(body, out);
                }
                Stmt::Loop { body, .. } => extents(body, out),
                _ => {}
            }
        }
    }
    for n in [(1usize << 32) + 8, (1 << 31) + 5, (1 << 33) + 1] {
        for target in [Target::cuda(90), Target::interpreter()] {
            let g = capture(&[f32s(&[n])], |t| Ok(vec![t[0].sum(&[0], false)?])).unwrap();
            let c = compile_graph(&g, &target).expect("compiles");
            let mut e = Vec::new();
            for k in &c.kernels {
                extents(&k.body, &mut e);
                assert!(k.launch.threads >= 1 && k.launch.threads <= target.max_threads_per_group, "{k}");
            }
            assert_eq!(e.iter().product::<i64>(), n as i64, "{n}: reduction extents {e:?} in\n{c}");
            let c = compile_graph(&capture(&[f32s(&[n])], |t| Ok(vec![t[0].max(&[0], false)?])).unwrap(), &target)
                .expect("compiles");
            assert!(c.kernels.iter().all(|k| k.launch.threads <= target.max_threads_per_group));
        }
    }
}

/// A bf16 value converted to f32 and read by three kernels (a bias gradient's column sum, a row sum and
/// a pointwise product, as a bf16 training step's gradient is): each kernel loads the bf16 value and
/// converts it, and no kernel writes an f32 copy; the eager baseline runs the conversion as its own
/// kernel, as the user wrote it. Both compute the reference's values (through the kernel interpreter).
#[test]
fn a_widening_conversion_is_computed_where_it_is_read() {
    use kiln_graph::tolerance::{compare, Expected, Tolerance};
    let specs = [TensorSpec::new(DType::BF16, &[64, 48])];
    let f = |t: &[Tensor]| -> Result<Vec<Tensor>> {
        let g = t[0].cast(DType::F32)?;
        Ok(vec![g.sum(&[0], false)?, g.sum(&[1], false)?, g.mul(&g)?.cast(DType::BF16)?])
    };
    let g = capture(&specs, f).unwrap();
    let inputs: Vec<_> = specs.iter().enumerate().map(|(i, s)| kiln_graph::workloads::data(s, i)).collect();
    let refs: Vec<_> = inputs.iter().collect();
    let want = kiln_graph::interp::run_unrounded(&g, &refs).unwrap();
    // f32 copies of the whole value (64 × 48 elements) written by any kernel.
    let f32_copies = |c: &CompiledGraph| {
        let copy = |b: &&kiln_graph::kernel::BufferParam| {
            b.access == Access::Write && b.dtype == DType::F32 && b.len.as_const() == Some(64 * 48)
        };
        c.kernels.iter().flat_map(|k| &k.buffers).filter(copy).count()
    };
    // Kernels launched alone, so each reader is a kernel of its own (`combine` would launch the small
    // ones together).
    let target = Target { combined_launch_threads: 0, ..Target::cuda(90) };
    for mode in [kiln_graph::FusionMode::Fused, kiln_graph::FusionMode::PerOp] {
        let c = kiln_graph::compile_graph_with(&g, &target, mode).unwrap();
        let got = c.run_interpreted(&refs).unwrap();
        for (got, want) in got.iter().zip(&want) {
            let outcome = compare(got, &Expected::of(want, "reference"), Tolerance::of(&g).unwrap());
            assert!(outcome.correct, "{mode:?}: {outcome:?}\n{c}");
        }
        // Eager: the conversion's f32 copy, read by the three ops, and the product before its conversion
        // back. Fused: none.
        let copies = if mode == kiln_graph::FusionMode::PerOp { 2 } else { 0 };
        assert_eq!(f32_copies(&c), copies, "{mode:?}\n{c}");
        let reads_bf16 =
            c.kernels.iter().filter(|k| k.buffers.iter().any(|b| b.access == Access::Read && b.dtype == DType::BF16));
        if mode == kiln_graph::FusionMode::Fused {
            assert_eq!(reads_bf16.count(), 3, "each reader loads the bf16 value\n{c}");
        }
    }
}

/// A value a row region computes over its elements for one reader elsewhere that reduces otherwise (here
/// `exp(x - max)` of each row, summed down the columns) is computed by that reader, from the input and
/// the row's max, not written by the row region and read back: as a training step's layer norm leaves
/// `(x - mean) · rstd` to its weight gradient's column sum instead of storing it in f32 across the step.
#[test]
fn a_row_regions_value_read_once_elsewhere_is_computed_there() {
    use kiln_graph::tolerance::{compare, Expected, Tolerance};
    let specs = [TensorSpec::new(DType::BF16, &[64, 96])];
    let f = |t: &[Tensor]| -> Result<Vec<Tensor>> {
        let x = t[0].cast(DType::F32)?;
        let shifted = x.sub(&x.max(&[1], true)?)?.exp()?;
        Ok(vec![x.softmax(-1)?.cast(DType::BF16)?, shifted.sum(&[0], false)?])
    };
    let g = capture(&specs, f).unwrap();
    let c = compile_graph(&g, &Target::cuda(90)).unwrap();
    let f32_copies = c
        .kernels
        .iter()
        .flat_map(|k| &k.buffers)
        .filter(|b| b.access == Access::Write && b.dtype == DType::F32 && b.len.as_const() == Some(64 * 96))
        .count();
    assert_eq!(f32_copies, 0, "{c}");
    let inputs: Vec<_> = specs.iter().enumerate().map(|(i, s)| kiln_graph::workloads::data(s, i)).collect();
    let refs: Vec<_> = inputs.iter().collect();
    let want = kiln_graph::interp::run_unrounded(&g, &refs).unwrap();
    for (got, want) in c.run_interpreted(&refs).unwrap().iter().zip(&want) {
        let outcome = compare(got, &Expected::of(want, "reference"), Tolerance::of(&g).unwrap());
        assert!(outcome.correct, "{outcome:?}\n{c}");
    }
}

/// A layer norm's weight and bias gradients are two column sums of the same incoming gradient (`Σ dy·x̂`
/// and `Σ dy`), split alike: they are one kernel reading it once, not two kernels each reading it.
/// Checked as a property of the whole step: no two kernels that reduce (write only buffers smaller than
/// the tensor) read the same full-size tensor and write partial sums of the same length.
#[test]
fn sibling_column_sums_of_one_gradient_are_one_kernel() {
    use kiln_graph::autodiff::grad_graph;
    use std::collections::BTreeMap;
    let (rows, width) = (4096, 768);
    let specs = vec![f32s(&[rows, width]), f32s(&[width]), f32s(&[width]), f32s(&[rows, width])];
    let g = capture(&specs, |t| {
        let y = t[0].layer_norm(1, Some(&t[1]), Some(&t[2]), 1e-5)?;
        Ok(vec![y.mul(&t[3])?.mean(&[0, 1], false)?])
    })
    .unwrap();
    let joint = grad_graph(&g, &[1, 2]).unwrap();
    let c = compile_graph(&joint, &Target::cuda(90)).unwrap();
    let full = Some((rows * width) as i64);
    let mut seen: BTreeMap<(u32, Option<i64>), std::collections::BTreeSet<String>> = BTreeMap::new();
    let mut reducing = 0;
    for k in &c.kernels {
        let writes: Vec<_> = k.buffers.iter().filter(|b| b.access == Access::Write).collect();
        if writes.is_empty() || writes.iter().any(|b| b.len.as_const() == full) {
            continue;
        }
        reducing += 1;
        for r in k.buffers.iter().filter(|b| b.access == Access::Read && b.len.as_const() == full) {
            for w in &writes {
                seen.entry((r.node.0, w.len.as_const())).or_default().insert(k.name.clone());
            }
        }
    }
    assert!(reducing > 0, "no reducing kernel in\n{c}");
    for ((node, len), kernels) in seen {
        assert!(kernels.len() == 1, "kernels {kernels:?} each read value {node} and write {len:?} partials\n{c}");
    }
}

/// A batch norm's ReLU before a convolution the matmul template runs (DenseNet's pre-activation) is
/// computed in the product's operand loads, per-channel scale and all: one kernel, where with the
/// prologue off (`Target::matmul_prologue`) the activated map is written by a kernel of its own and
/// read back. Both give the reference's values through the kernel interpreter.
#[test]
fn a_pre_activation_is_computed_in_the_convolution_operand() {
    let specs = [
        TensorSpec::new(DType::F32, &[2, 16, 6, 6]),
        TensorSpec::new(DType::F32, &[16]),
        TensorSpec::new(DType::F32, &[16]),
        TensorSpec::new(DType::F32, &[8, 16, 3, 3]),
    ];
    let f = |t: &[Tensor]| {
        let (scale, shift) = (t[1].reshape(&[1, 16, 1, 1])?, t[2].reshape(&[1, 16, 1, 1])?);
        let h = t[0].mul(&scale.abs()?.add(1e-5)?.rsqrt()?)?.add(&shift)?.relu()?;
        Ok(vec![h.conv(&t[3], None, &kiln_graph::conv::Window::uniform(2, 1, 1, 1), 1)?])
    };
    let g = capture(&specs, f).unwrap();
    let inputs: Vec<_> = specs.iter().enumerate().map(|(i, s)| kiln_graph::workloads::data(s, i)).collect();
    let refs: Vec<_> = inputs.iter().collect();
    let want = kiln_graph::interp::run(&g, &refs).unwrap();
    // Besides the product: the result's permutation back to `[N, O, H, W]`, written by a copy kernel.
    for (prologue, kernels) in [(true, 2), (false, 3)] {
        let target = Target { matmul_prologue: prologue, ..Target::webgpu_default() };
        let c = compile_graph(&g, &target).unwrap();
        assert_eq!(c.kernels.len(), kernels, "prologue {prologue}\n{c}");
        let product = c.fusion.regions.iter().find(|r| matches!(r.kind, RegionKind::MatMul { .. })).unwrap();
        let relu = product.members.iter().any(|&m| c.primitive.graph.node(m).op.name() == "relu");
        assert_eq!(relu, prologue, "{c}");
        let got = c.run_interpreted(&refs).unwrap();
        let worst = (got[0].values().iter().zip(want[0].values()))
            .map(|(a, b)| (a - b).abs() / (1.0 + b.abs()))
            .fold(0.0, f64::max);
        assert!(worst < 1e-5, "prologue {prologue}: {worst}\n{c}");
    }
}
