//! Guards, recompiles and dynamic shapes: one implementation for every backend (`graph/src/guard.rs`,
//! `graph/src/compile.rs`), checked here on the CPU kernel interpreter and on wgpu.

mod common;
use kiln::graph::IntoBackend;
use kiln::{compile, Backend, DType, Dynamic, Result, Tensor};

fn x(dims: &[usize]) -> Tensor {
    let n: usize = dims.iter().product();
    Tensor::from_slice(&(0..n).map(|i| ((i * 37 % 101) as f32) / 50.0 - 1.0).collect::<Vec<_>>(), dims).unwrap()
}

fn f(x: &Tensor) -> Result<Tensor> {
    x.mul(2.0)?.add(1.0)?.softmax(-1)
}

fn reference(t: &Tensor) -> Vec<f32> {
    compile(f).backend(Backend::Cpu).dynamic(Dynamic::Never).call(t).unwrap().to_vec().unwrap()
}

fn assert_close(a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len());
    for (p, q) in a.iter().zip(b) {
        assert!((p - q).abs() <= 1e-5 * (1.0 + q.abs()), "{p} vs {q}");
    }
}

#[test]
fn auto_compiles_once_recompiles_once_naming_the_dim_then_reuses() {
    let c = compile(f).backend(Backend::Kernels);
    for dims in [[8, 16], [8, 16], [8, 32], [8, 48], [8, 64], [8, 16]] {
        let t = x(&dims);
        assert_close(&c.call(&t).unwrap().to_vec::<f32>().unwrap(), &reference(&t));
    }
    // Each entry is traced once more on its first call with other tensors (the check that it does not
    // depend on which tensors it got: see `Entry`), then serves without tracing.
    let s = c.stats();
    assert_eq!((s.traces, s.recompiles, s.verifications, s.cache_hits, s.entries), (2, 1, 2, 2, 2), "{s:?}");
    assert!(s.guard_failures[0].contains("input 0 dim 1"), "{:?}", s.guard_failures);
    // The second entry is symbolic in that dim and static in the other, bounded so that the input
    // stays under 2^31 elements (its kernels may index in 32 bits; a larger call recompiles unbounded).
    let g = c.guards();
    assert!(g[1].contains("[8, s0∈[2, 268435455]]"), "{g:?}");
}

#[test]
fn auto_makes_every_dim_that_changed_symbolic_at_once() {
    // Inputs and targets share a batch dim: when it changes, both change, and one recompile serves
    // every later size (before, only the first failing guard's dim became symbolic and the other
    // recompiled again).
    let c = compile(|(a, b): (&Tensor, &Tensor)| a.sum(&[1], false)?.add(b)).backend(Backend::Kernels);
    for n in [8, 6, 5, 9] {
        let (a, b) = (x(&[n, 4]), x(&[n]));
        let got: Vec<f32> = c.call((&a, &b)).unwrap().to_vec().unwrap();
        let want: Vec<f32> = a.sum(&[1], false).unwrap().add(&b).unwrap().to_vec().unwrap();
        assert_close(&got, &want);
    }
    let s = c.stats();
    assert_eq!((s.recompiles, s.entries), (1, 2), "{s:?}");
    assert!(c.guards()[1].contains("s0"), "{:?}", c.guards());
}

#[test]
fn never_recompiles_for_every_new_shape() {
    let c = compile(f).backend(Backend::Kernels).dynamic(Dynamic::Never);
    for dims in [[8, 16], [8, 16], [8, 32], [8, 48], [8, 16]] {
        c.call::<_, Tensor>(&x(&dims)).unwrap();
    }
    let s = c.stats();
    assert_eq!((s.traces, s.recompiles, s.verifications, s.cache_hits), (3, 2, 1, 1), "{s:?}");
}

#[test]
fn mark_dynamic_compiles_once() {
    let c = compile(f).backend(Backend::Kernels).dynamic(Dynamic::Never).mark_dynamic(0, 1, 2..=4096);
    for n in [16, 32, 48, 17] {
        let t = x(&[8, n]);
        assert_close(&c.call(&t).unwrap().to_vec::<f32>().unwrap(), &reference(&t));
    }
    assert_eq!((c.stats().traces, c.stats().verifications, c.stats().cache_hits), (1, 1, 2));
    // Outside the marked range is a recompile, with the reason saying so.
    c.call::<_, Tensor>(&x(&[8, 5000])).unwrap();
    assert!(c.stats().guard_failures[0].contains("outside"), "{:?}", c.stats().guard_failures);
}

#[test]
fn a_dtype_change_recompiles() {
    let c = compile(|x: &Tensor| x.exp()).backend(Backend::Kernels);
    c.call::<_, Tensor>(&x(&[4])).unwrap();
    c.call::<_, Tensor>(&x(&[4]).cast(DType::F16).unwrap()).unwrap();
    let s = c.stats();
    assert_eq!(s.traces, 2);
    assert!(s.guard_failures[0].contains("dtype changed from f32 to f16"), "{:?}", s.guard_failures);
}

#[test]
fn the_recompile_limit_falls_back_to_eager_or_errors() {
    let c = compile(f).backend(Backend::Kernels).dynamic(Dynamic::Never).recompile_limit(2);
    for n in [3, 4, 5, 6] {
        let t = x(&[2, n]);
        assert_close(&c.call(&t).unwrap().to_vec::<f32>().unwrap(), &reference(&t));
    }
    let s = c.stats();
    assert_eq!((s.entries, s.eager_fallbacks), (2, 2), "{s:?}");
    let strict =
        compile(f).backend(Backend::Kernels).dynamic(Dynamic::Never).recompile_limit(1).fail_on_recompile(true);
    strict.call::<_, Tensor>(&x(&[2, 3])).unwrap();
    let err = strict.call::<_, Tensor>(&x(&[2, 4])).unwrap_err();
    assert!(err.to_string().contains("recompile limit 1"), "{err}");
}

#[test]
fn sizes_0_and_1_are_specialised() {
    let c = compile(f).backend(Backend::Kernels).dynamic(Dynamic::Always);
    c.call::<_, Tensor>(&x(&[3, 1])).unwrap();
    c.call::<_, Tensor>(&x(&[3, 5])).unwrap();
    let g = c.guards();
    assert!(g[0].contains("[s0∈[2, 2147483647], 1]"), "{g:?}");
    assert_eq!(c.stats().traces, 2, "size 1 is its own entry");
}

#[test]
fn equal_sizes_share_a_symbol_and_are_guarded_equal() {
    let add = compile(|(a, b): (&Tensor, &Tensor)| a.add(b)).backend(Backend::Kernels).dynamic(Dynamic::Always);
    add.call::<_, Tensor>((&x(&[6]), &x(&[6]))).unwrap();
    let y: Tensor = add.call((&x(&[9]), &x(&[9]))).unwrap();
    assert_eq!(y.shape().as_concrete(), Some(vec![9]));
    assert_eq!(add.stats().traces, 1);
    // Different sizes cannot share the entry: a recompile (and then a broadcast error, as eagerly).
    let r = add.call::<_, Tensor>((&x(&[9]), &x(&[4])));
    assert!(matches!(r, Err(kiln::Error::Broadcast { .. })), "{r:?}");
    assert!(add.stats().guard_failures[0].contains("shares symbol"), "{:?}", add.stats().guard_failures);
}

/// One symbolic kernel serves 20 sizes — primes, and sizes below one workgroup — on `backend`. Rows
/// alternate between 1 (specialised) and 5; no size equals 5, so duck sizing never ties the two dims.
fn symbolic_sizes(backend: Backend) {
    let c = compile(f).backend(backend).dynamic(Dynamic::Always);
    let mut seed = 12345u64;
    let mut sizes = vec![2, 3, 7, 13, 31, 97, 251, 257, 1009];
    while sizes.len() < 20 {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let n = 6 + (seed >> 40) as usize % 3000;
        sizes.push(n);
    }
    let c5 = compile(f).backend(backend).dynamic(Dynamic::Always);
    for (k, &n) in sizes.iter().enumerate() {
        let t = x(&[5, n]);
        assert_close(&c5.call(&t).unwrap().to_vec::<f32>().unwrap(), &reference(&t));
        let t = x(&[1, n + k]);
        assert_close(&c.call(&t).unwrap().to_vec::<f32>().unwrap(), &reference(&t));
    }
    assert_eq!(c.stats().traces, 1, "one compile serves every size: {:?}", c.stats());
    assert_eq!(c5.stats().traces, 1, "one compile serves every size: {:?}", c5.stats());
}

#[test]
fn one_symbolic_kernel_serves_twenty_sizes_on_the_kernel_interpreter() {
    symbolic_sizes(Backend::Kernels);
}

#[test]
fn one_symbolic_kernel_serves_twenty_sizes_on_wgpu() {
    if common::wgpu_skipped() {
        return;
    }
    if let Err(e) = Backend::Wgpu.into_backend() {
        panic!("{e}");
    }
    symbolic_sizes(Backend::Wgpu);
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored on a machine with a CUDA driver (scripts/test.sh does)"]
fn one_symbolic_kernel_serves_twenty_sizes_on_cuda() {
    if let Err(e) = Backend::Cuda.into_backend() {
        panic!("{e}");
    }
    symbolic_sizes(Backend::Cuda);
}

#[test]
fn a_cached_call_does_not_trace_and_reads_new_argument_values() {
    let c = compile(|x: &Tensor| x.mul(3.0)).backend(Backend::Kernels);
    let a: Vec<f32> = c.call(&x(&[5])).unwrap().to_vec().unwrap();
    let b: Vec<f32> = c.call(&x(&[5]).add(1.0).unwrap()).unwrap().to_vec().unwrap();
    assert_eq!(a.len(), b.len());
    for (p, q) in a.iter().zip(&b) {
        assert!((q - p - 3.0).abs() < 1e-5);
    }
    // The second call (other tensors) verifies the entry by tracing once more; the third is a pure hit.
    assert_eq!((c.stats().traces, c.stats().verifications, c.stats().cache_hits), (1, 1, 0));
    let third: Vec<f32> = c.call(&x(&[5]).add(2.0).unwrap()).unwrap().to_vec().unwrap();
    assert_eq!(third.len(), a.len());
    assert_eq!((c.stats().traces, c.stats().verifications, c.stats().cache_hits), (1, 1, 1));
}

/// The PTX of every kernel of `r`'s newest entry.
fn newest_ptx(r: &kiln::graph::report::CompileReport) -> String {
    let entry = r.entries.last().expect("an entry");
    let kernels = entry.graphs.iter().flat_map(|g| &g.kernels);
    kernels.map(|k| k.source("ptx").expect("PTX rendered").to_string()).collect::<Vec<_>>().join("\n")
}

/// A dim made symbolic is bounded so that its argument stays under 2^31 elements: index arithmetic over
/// the symbol is then provably 32-bit and the PTX divides in 32 bits alone; an unbounded symbol (here a
/// `mark_dynamic` to `usize::MAX`) keeps the run-time choice with its 64-bit fallback.
#[test]
fn a_bounded_symbol_indexes_in_32_bits() {
    let bias = x(&[1000]);
    let add_bias = |x: &Tensor| x.add(&bias);
    let auto = compile(add_bias).backend(Backend::Kernels);
    for rows in [300, 301] {
        let _: Tensor = auto.call(&x(&[rows, 1000])).unwrap();
    }
    let g = auto.guards();
    assert!(g[1].contains("[s0∈[2, 2147483], 1000]"), "(2^31 - 1) / 1000 rows: {g:?}");
    let bounded = newest_ptx(&auto.report());
    assert!(bounded.contains("rem.u32") && !bounded.contains("div.s64"), "{bounded}");

    let unbounded = compile(add_bias).backend(Backend::Kernels).mark_dynamic(0, 0, 2..=usize::MAX);
    let _: Tensor = unbounded.call(&x(&[300, 1000])).unwrap();
    assert!(unbounded.guards()[0].contains("s0∈[2, ∞]"), "{:?}", unbounded.guards());
    assert!(newest_ptx(&unbounded.report()).contains("div.s64"), "an unbounded flat index may pass 2^32");
}

#[test]
fn an_empty_mark_dynamic_range_is_an_error() {
    #[allow(clippy::reversed_empty_ranges)]
    let c = compile(f).backend(Backend::Kernels).mark_dynamic(0, 1, 9..=3);
    let err = c.call::<_, Tensor>(&x(&[2, 5])).unwrap_err();
    assert!(err.to_string().contains("mark_dynamic") && err.to_string().contains("empty"), "{err}");
}

/// A keepdim reduction over the leading axis of duck-sized symbolic dims (`[s0, s0, s0]`): its row index
/// unflattens to `r // s0`, which the simplifier must know lies below `s0` (without it, lowering refused
/// the kernel: found by the random programs traced with symbolic dims).
#[test]
fn a_symbolic_keepdim_sum_over_the_leading_axis() {
    let sum = |x: &Tensor| x.sum(&[0], true);
    let c = compile(sum).backend(Backend::Kernels).dynamic(Dynamic::Always);
    for n in [2, 3] {
        let t = x(&[n, n, n]);
        let want: Vec<f32> = compile(sum).backend(Backend::Cpu).call(&t).unwrap().to_vec().unwrap();
        assert_close(&c.call(&t).unwrap().to_vec::<f32>().unwrap(), &want);
    }
    assert_eq!(c.stats().entries, 1, "one symbolic entry serves both sizes");
}
