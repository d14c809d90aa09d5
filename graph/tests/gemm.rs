//! Which matmuls go to a GEMM library and how they are described: decided in `graph` from the target,
//! so the runtimes only translate. Results are checked through the kernel interpreter, which runs a
//! library GEMM as the library computes it.

use kiln_graph::kernel::{Gemm, GemmLayout};
use kiln_graph::tolerance::{compare, Expected, Tolerance};
use kiln_graph::workloads::data;
use kiln_graph::{capture, compile_graph, interp, DType, Result, Target, Tensor, TensorSpec};

fn gemms(c: &kiln_graph::CompiledGraph) -> Vec<&Gemm> {
    c.kernels.iter().filter_map(|k| k.gemm()).collect()
}

fn close(specs: &[TensorSpec], f: fn(&[Tensor]) -> Result<Vec<Tensor>>, target: &Target) -> kiln_graph::CompiledGraph {
    let g = capture(specs, f).unwrap();
    let c = compile_graph(&g, target).unwrap();
    let inputs: Vec<_> = specs.iter().enumerate().map(|(i, s)| data(s, i)).collect();
    let refs: Vec<_> = inputs.iter().collect();
    let got = c.run_interpreted(&refs).unwrap();
    let want = interp::run(&g, &refs).unwrap();
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(g.dims(), w.dims());
        for (a, b) in g.values().iter().zip(w.values()) {
            assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "{a} vs {b}\n{c}");
        }
    }
    c
}

fn linear(t: &[Tensor]) -> Result<Vec<Tensor>> {
    Ok(vec![t[0].linear(&t[1], Some(&t[2]))?.gelu()?])
}

#[test]
fn a_large_linear_is_one_library_call_and_its_epilogue_one_kernel() {
    let specs = [
        TensorSpec::new(DType::F32, &[2, 64, 128]),
        TensorSpec::new(DType::F32, &[256, 128]),
        TensorSpec::new(DType::F32, &[256]),
    ];
    let c = close(&specs, linear, &Target::cuda(90));
    let g = gemms(&c);
    assert_eq!((g.len(), c.kernels.len()), (1, 2), "{c}");
    // x is row-major (ld 128); w^T is w read column-major (ld 128). The batch continues x's rows while
    // w^T stays put (stride 0), so it folds into m: one 128-row call.
    assert_eq!((g[0].a.layout, g[0].a.ld.as_const()), (GemmLayout::RowMajor, Some(128)));
    assert_eq!((g[0].b.layout, g[0].b.ld.as_const()), (GemmLayout::ColMajor, Some(128)));
    assert!(g[0].batch.is_empty(), "{c}");
    assert_eq!(g[0].m.as_const(), Some(128));
    // The bias is added inside the call (cuBLASLt's epilogue); the GELU is the next kernel.
    let bias = g[0].epilogue.bias.as_ref().expect("the bias in the call");
    assert_eq!((bias.buffer, bias.offset.as_const()), (2, Some(0)));
    assert!(g[0].epilogue.residual.is_none());
    // With the epilogue off, the bias joins the GELU's kernel: still two kernels, nothing added in the call.
    let separate = Target { library_epilogue: false, ..Target::cuda(90) };
    let s = close(&specs, linear, &separate);
    assert_eq!(s.kernels.len(), 2, "{s}");
    assert!(gemms(&s)[0].epilogue.is_empty());
    // Without a library (WebGPU) the same graph is one template kernel with the epilogue fused.
    let w = close(&specs, linear, &Target::webgpu_default());
    assert!(gemms(&w).is_empty());
    assert_eq!(w.kernels.len(), 1, "{w}");
}

fn residual_block(t: &[Tensor]) -> Result<Vec<Tensor>> {
    Ok(vec![t[0].add(&t[0].linear(&t[1], Some(&t[2]))?)?])
}

fn residual_specs(dtype: DType) -> [TensorSpec; 3] {
    [TensorSpec::new(dtype, &[2, 64, 128]), TensorSpec::new(dtype, &[128, 128]), TensorSpec::new(dtype, &[128])]
}

/// `x + linear(x)`, a transformer block's residual connection, is one call: the product, the residual
/// and the bias summed in f32 and rounded once. In bf16 the written-out graph rounds three times, so the
/// call is held to the bf16 tolerance rule against the f64 reference rather than to the rounded graph.
#[test]
fn a_residual_and_a_bias_are_added_inside_the_call() {
    let c = close(&residual_specs(DType::F32), residual_block, &Target::cuda(90));
    let g = gemms(&c);
    assert_eq!((g.len(), c.kernels.len()), (1, 1), "{c}");
    let (bias, residual) = (g[0].epilogue.bias.as_ref().unwrap(), g[0].epilogue.residual.as_ref().unwrap());
    assert_eq!((residual.buffer, bias.buffer), (0, 2), "x read twice in place: as a and as the residual");
    assert!(c.to_string().contains("+ b0[0 + RowMajor ld 128] + bias b2[0 + j]"), "{c}");

    let specs = residual_specs(DType::BF16);
    let g = capture(&specs, residual_block).unwrap();
    let c = compile_graph(&g, &Target::cuda(90)).unwrap();
    assert_eq!(c.kernels.len(), 1, "{c}");
    let inputs: Vec<_> = specs.iter().enumerate().map(|(i, s)| data(s, i)).collect();
    let refs: Vec<_> = inputs.iter().collect();
    let got = c.run_interpreted(&refs).unwrap();
    let want = interp::run(&g, &refs).unwrap();
    let tol = Tolerance::of(&g).unwrap();
    let outcome = compare(&got[0], &Expected::of(&want[0], "reference"), tol);
    assert!(outcome.correct, "{outcome:?}");
}

fn transposed_residual(t: &[Tensor]) -> Result<Vec<Tensor>> {
    Ok(vec![t[3].transpose(1, 2)?.add(&t[0].linear(&t[1], Some(&t[2]))?)?])
}

/// A residual the library cannot read as laid out like the output (a transposed view) is stored first,
/// then added inside the call; a bias narrowed at an offset that is not 16-byte aligned leaves the adds
/// to the next kernel.
#[test]
fn addends_the_library_cannot_read_in_place() {
    let mut specs = residual_specs(DType::F32).to_vec();
    specs.push(TensorSpec::new(DType::F32, &[2, 128, 64]));
    let c = close(&specs, transposed_residual, &Target::cuda(90));
    let g = gemms(&c);
    assert_eq!((g.len(), c.kernels.len()), (1, 2), "one copy, then the call: {c}");
    assert!(g[0].epilogue.residual.is_some() && g[0].epilogue.bias.is_some(), "{c}");

    fn narrowed_bias(t: &[Tensor]) -> Result<Vec<Tensor>> {
        Ok(vec![t[0].linear(&t[1], Some(&t[2].narrow(0, 1, 128)?))?])
    }
    let specs = [
        TensorSpec::new(DType::F32, &[2, 64, 128]),
        TensorSpec::new(DType::F32, &[128, 128]),
        TensorSpec::new(DType::F32, &[129]),
    ];
    let c = close(&specs, narrowed_bias, &Target::cuda(90));
    assert_eq!(c.kernels.len(), 2, "{c}");
    let g = gemms(&c);
    assert!(g.len() == 1 && g[0].epilogue.is_empty(), "still one library call, adding nothing: {c}");
}

#[test]
fn small_matmuls_keep_the_fused_template() {
    let specs = kiln_graph::workloads::w4_inputs(10);
    let c = close(&specs, kiln_graph::workloads::w4, &Target::cuda(90));
    assert!(gemms(&c).is_empty());
    assert_eq!(c.kernels.len(), 129);
}

fn attention(t: &[Tensor]) -> Result<Vec<Tensor>> {
    let heads = |i: usize| t[0].narrow(2, i * 64, 64)?.reshape(&[2, 64, 4, 16])?.permute(&[0, 2, 1, 3]);
    let (q, k, v) = (heads(0)?, heads(1)?, heads(2)?);
    Ok(vec![q.matmul(&k.transpose(-1, -2)?)?.softmax(-1)?.matmul(&v)?])
}

#[test]
fn attention_views_are_read_in_place_with_a_two_level_batch() {
    // Written out (no f32 attention template), so its products are library calls.
    let target = Target { register_attention: None, ..Target::cuda(90) };
    let c = close(&[TensorSpec::new(DType::F32, &[2, 64, 192])], attention, &target);
    let g = gemms(&c);
    assert_eq!(g.len(), 2, "{c}");
    // Heads are 16 columns apart inside a row of 192: batch strides (64 * 192, 16), not one stride.
    let strides: Vec<_> = g[0].batch.iter().map(|b| b.a.as_const()).collect();
    assert_eq!(strides, [Some(64 * 192), Some(16)]);
    assert_eq!((g[0].a.layout, g[0].b.layout), (GemmLayout::RowMajor, GemmLayout::ColMajor));
}

fn folded(t: &[Tensor]) -> Result<Vec<Tensor>> {
    Ok(vec![t[0].permute(&[1, 0, 2])?.reshape(&[48, 64])?.matmul(&t[1])?])
}

/// Rows gathered from two dims that are not adjacent in memory are no strided view: the view is stored
/// first (one copy kernel, as `.contiguous()` would), then read in place.
#[test]
fn a_view_no_library_reads_in_place_is_stored_first() {
    let specs = [TensorSpec::new(DType::F32, &[8, 6, 64]), TensorSpec::new(DType::F32, &[64, 96])];
    let c = close(&specs, folded, &Target::cuda(90));
    assert_eq!((gemms(&c).len(), c.kernels.len()), (1, 2), "{c}");
    assert_eq!(gemms(&c)[0].a.ld.as_const(), Some(64));
}

/// One compile with symbolic batch and sequence serves several sizes: the description's offsets, strides
/// and extents are expressions the runtime evaluates per call.
#[test]
fn symbolic_sizes_give_a_symbolic_description() {
    use kiln_graph::{compile, Dynamic, KernelInterpreter};
    let f =
        compile(|t: Vec<Tensor>| linear(&t)).backend(KernelInterpreter::new(Target::cuda(90))).dynamic(Dynamic::Always);
    let r = compile(|t: Vec<Tensor>| linear(&t)).backend(kiln_graph::CpuReference);
    for (b, s) in [(2, 64), (3, 90), (5, 17)] {
        let specs = [
            TensorSpec::new(DType::F32, &[b, s, 128]),
            TensorSpec::new(DType::F32, &[256, 128]),
            TensorSpec::new(DType::F32, &[256]),
        ];
        let x: Vec<Tensor> = specs.iter().enumerate().map(|(i, s)| Tensor::from_data(data(s, i))).collect();
        let (got, ex) = f.call_explained::<_, Vec<Tensor>>(x.clone()).unwrap();
        assert!(ex.to_string().contains("gemm library"), "{ex}");
        let want: Vec<Tensor> = r.call(x).unwrap();
        assert_eq!(got.len(), want.len());
        let (g, w) = (got[0].to_data().unwrap(), want[0].to_data().unwrap());
        assert_eq!(g.dims(), w.dims());
        for (a, b) in g.values().iter().zip(w.values()) {
            assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "{a} vs {b}");
        }
    }
    assert_eq!(f.stats().traces, 1, "{:?}", f.stats());
}

fn linear_gradients(t: &[Tensor]) -> Result<Vec<Tensor>> {
    let (loss, grads) = kiln_graph::autodiff::value_and_grad(
        |a| a[0].linear(&a[1], Some(&a[2]))?.mul(&a[3])?.sum(&[0, 1, 2], false),
        t,
        &[1, 2],
    )?;
    Ok(vec![loss, grads[0].clone(), grads[1].clone()])
}

/// A linear layer's weight gradient sums one product per batch entry (the weight is broadcast over the
/// batch): it is computed as one product over the batch folded into the reduction, with no batched product
/// written out and no separate sum (as torch's linear backward does), and in the weight's own layout,
/// `[out, b·s] @ [b·s, in]`, so nothing reads it at a stride or copies it into place.
#[test]
fn a_weight_gradient_is_one_product_over_the_folded_batch() {
    let specs = [
        TensorSpec::new(DType::F32, &[2, 64, 96]),
        TensorSpec::new(DType::F32, &[256, 96]),
        TensorSpec::new(DType::F32, &[256]),
        TensorSpec::new(DType::F32, &[2, 64, 256]),
    ];
    let c = close(&specs, linear_gradients, &Target::cuda(90));
    let g = gemms(&c);
    assert_eq!(g.len(), 2, "{c}");
    assert!(g.iter().all(|g| g.batch.is_empty()), "{c}");
    let shapes: Vec<_> = g.iter().map(|g| [&g.m, &g.n, &g.k].map(|e| e.as_const())).collect();
    // Forward: 128 rows (the folded batch) of 96 inputs; weight gradient: 256 x 96 over 128 rows.
    assert!(shapes.contains(&[Some(128), Some(256), Some(96)]), "{c}");
    assert!(shapes.contains(&[Some(256), Some(96), Some(128)]), "{c}");
    // The weight gradient the graph returns is the product itself: written by the GEMM, copied by nothing.
    let g = &c.primitive.graph;
    assert!(g.outputs.iter().any(|&o| g.node(o).op == kiln_graph::Op::MatMul), "{c}");
    // The same gradients without the library (the template) agree too.
    close(&specs, linear_gradients, &Target::webgpu_default());
}

fn conv_and_matmul(t: &[Tensor]) -> Result<Vec<Tensor>> {
    let window = kiln_graph::conv::Window::uniform(2, 1, 1, 1);
    let y = t[0].conv(&t[1], None, &window, 1)?;
    Ok(vec![y.clone(), y.reshape(&[2, 64 * 256])?.reshape(&[2, 64, 256])?.matmul(&t[2])?])
}

/// The f32 convolutions a GEMM library runs round their operands to TF32, as PyTorch's convolutions do
/// by default; an f32 matmul keeps full precision, and a target without the policy rounds nothing. The
/// kernel interpreter rounds as the matrix units do, so its values are the f64 reference's for
/// TF32-rounded inputs, not the f32 ones.
#[test]
fn f32_convolutions_round_to_tf32_and_matmuls_do_not() {
    let specs = [
        TensorSpec::new(DType::F32, &[2, 32, 16, 16]),
        TensorSpec::new(DType::F32, &[64, 32, 3, 3]),
        TensorSpec::new(DType::F32, &[256, 256]),
    ];
    let g = capture(&specs, conv_and_matmul).unwrap();
    let c = compile_graph(&g, &Target::cuda(90)).unwrap();
    let tf32: Vec<bool> = gemms(&c).iter().map(|g| g.tf32).collect();
    assert_eq!(tf32, [true, false], "the convolution's call, then the matmul's: {c}");
    assert!(c.to_string().contains("f32 as tf32"), "{c}");
    let ieee = compile_graph(&g, &Target { tf32_convolutions: false, ..Target::cuda(90) }).unwrap();
    assert!(gemms(&ieee).iter().all(|g| !g.tf32), "{ieee}");

    let inputs: Vec<_> = specs.iter().enumerate().map(|(i, s)| data(s, i)).collect();
    let refs: Vec<_> = inputs.iter().collect();
    let got = &c.run_interpreted(&refs).unwrap()[0];
    let rounded: Vec<_> = inputs[..2]
        .iter()
        .map(|t| {
            let values = t.values().iter().map(|&v| kiln_graph::gemm::tf32(v)).collect();
            kiln_graph::TensorData::from_f64(values, t.dims(), DType::F32).unwrap()
        })
        .collect();
    let conv_only = capture(&specs[..2], |t| {
        Ok(vec![t[0].conv(&t[1], None, &kiln_graph::conv::Window::uniform(2, 1, 1, 1), 1)?])
    })
    .unwrap();
    let exact = &interp::run(&conv_only, &refs[..2]).unwrap()[0];
    let as_tf32 = &interp::run(&conv_only, &rounded.iter().collect::<Vec<_>>()).unwrap()[0];
    let worst = |want: &kiln_graph::TensorData| {
        got.values().iter().zip(want.values()).map(|(a, b)| (a - b).abs() / (1.0 + b.abs())).fold(0.0, f64::max)
    };
    assert!(worst(as_tf32) < 1e-5, "against TF32-rounded inputs: {}", worst(as_tf32));
    assert!(worst(exact) > 1e-4, "the rounding shows against the f32 inputs: {}", worst(exact));
    // Within the f32 tolerance of the rounded inputs' result, not of the exact one's.
    let tol = Tolerance::of(&conv_only).unwrap();
    assert!(compare(got, &Expected::of(as_tf32, "tf32 reference"), tol).correct);
}

#[test]
fn tf32_rounds_to_nearest_with_ties_away_from_zero() {
    use kiln_graph::gemm::tf32;
    let ulp = 2f64.powi(-10);
    assert_eq!(tf32(1.0 + ulp), 1.0 + ulp, "representable: unchanged");
    assert_eq!(tf32(1.0 + ulp / 2.0), 1.0 + ulp, "a tie rounds away from zero");
    assert_eq!(tf32(-(1.0 + ulp / 2.0)), -(1.0 + ulp));
    assert_eq!(tf32(1.0 + ulp * 0.49), 1.0);
    assert_eq!(tf32(f64::from(f32::MAX)), f64::INFINITY, "the largest f32 rounds up past TF32's range");
    assert!(tf32(f64::NAN).is_nan());
}
