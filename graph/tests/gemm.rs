//! Which matmuls go to a GEMM library and how they are described: decided in `graph` from the target,
//! so the runtimes only translate. Results are checked through the kernel interpreter, which runs a
//! library GEMM as the library computes it.

use kiln_graph::kernel::{Gemm, GemmLayout};
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
    // x is row-major (ld 128); w^T is w read column-major (ld 128), broadcast over the batch (stride 0).
    assert_eq!((g[0].a.layout, g[0].a.ld.as_const()), (GemmLayout::RowMajor, Some(128)));
    assert_eq!((g[0].b.layout, g[0].b.ld.as_const()), (GemmLayout::ColMajor, Some(128)));
    assert_eq!(g[0].batch.len(), 1);
    assert_eq!((g[0].batch[0].a.as_const(), g[0].batch[0].b.as_const()), (Some(64 * 128), Some(0)));
    // Without a library (WebGPU) the same graph is one template kernel with the epilogue fused.
    let w = close(&specs, linear, &Target::webgpu_default());
    assert!(gemms(&w).is_empty());
    assert_eq!(w.kernels.len(), 1, "{w}");
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
    let c = close(&[TensorSpec::new(DType::F32, &[2, 64, 192])], attention, &Target::cuda(90));
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
