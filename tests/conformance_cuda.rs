//! The conformance suite on CUDA: every kernel rendered to PTX, JIT-compiled by the driver and run on the
//! GPU, then compared with the reference. The tests need an NVIDIA GPU, so they are marked ignored: the
//! harness counts them as ignored where there is none, and `scripts/test.sh` runs them with
//! `--include-ignored` wherever `libcuda.so.1` exists (there a missing device fails, saying so).

mod common;
mod conformance;

use kiln::graph::{capture, compile_graph, DType, TensorSpec};

/// Why every GPU test here is ignored by default.
macro_rules! needs_gpu {
    () => {
        "needs an NVIDIA GPU: run with --include-ignored on a machine with a CUDA driver (scripts/test.sh does)"
    };
}

fn cuda() -> Option<std::sync::Arc<dyn kiln::graph::Backend>> {
    use kiln::graph::IntoBackend;
    match kiln::Backend::Cuda.into_backend() {
        Ok(b) => Some(b),
        Err(e) => panic!("{e}"),
    }
}

conformance_suite!(
    #[ignore = needs_gpu!()]
    backend = cuda(),
    random_cases = 500,
    big = true,
    ieee_nan = true
);

#[test]
#[ignore = needs_gpu!()]
fn reports_the_device() {
    let rt = kiln::Backend::Cuda.runtime().unwrap_or_else(|e| panic!("{e}")).expect("CUDA has a runtime");
    eprintln!("cuda device: {}", rt.driver().describe());
}

/// A recorded run (a CUDA graph) replays to the same values; new inputs in other buffers are copied into
/// the recording's own (one re-record, then a copy per replay), never read from the old ones.
#[test]
#[ignore = needs_gpu!()]
fn a_recorded_graph_replays_and_reads_new_inputs() {
    // A runtime of its own, so no other test's recordings enter its counters.
    let rt = kiln_ptx::Cuda::runtime().unwrap_or_else(|e| panic!("{e}"));
    let spec = TensorSpec::new(DType::F32, &[64, 300]);
    let g = capture(std::slice::from_ref(&spec), |t| Ok(vec![t[0].mul(2.0)?.softmax(-1)?.add(1.0)?])).unwrap();
    let c = std::sync::Arc::new(compile_graph(&g, rt.target()).unwrap());
    let before = rt.stats();
    for salt in 0..4 {
        let x = kiln::graph::workloads::data(&spec, salt);
        let want = c.run_interpreted(&[&x]).unwrap();
        let out = rt.run_recorded(&c, &[rt.upload(&x).unwrap()]).unwrap();
        assert_eq!(out.len(), 1);
        let got = rt.download(&out[0]).unwrap();
        common::assert_close_tol(got.values(), want[0].values(), 1e-5);
    }
    let s = rt.stats();
    assert!(s.recordings - before.recordings <= 2, "{s:?}");
    assert!(s.replays - before.replays >= 4, "{s:?}");
    assert!(s.replay_input_copies - before.replay_input_copies >= 2, "{s:?}");
}

/// A recording of batched products (cuBLAS calls whose device pointer arrays were made at its first
/// run) replays right after the runtime empties its binding cache and its pool and the freed memory is
/// written over: the recording keeps what it replays with.
#[test]
#[ignore = needs_gpu!()]
fn a_recording_keeps_its_gemm_plans_when_the_caches_are_emptied() {
    let rt = kiln_ptx::Cuda::runtime().unwrap_or_else(|e| panic!("{e}"));
    let specs = [TensorSpec::new(DType::F32, &[8, 64, 96]), TensorSpec::new(DType::F32, &[8, 96, 48])];
    let g = capture(&specs, |t| Ok(vec![t[0].matmul(&t[1])?.relu()?])).unwrap();
    let c = std::sync::Arc::new(compile_graph(&g, rt.target()).unwrap());
    let data: Vec<_> = specs.iter().enumerate().map(|(i, s)| kiln::graph::workloads::data(s, i)).collect();
    let want = c.run_interpreted(&[&data[0], &data[1]]).unwrap();
    let inputs: Vec<_> = data.iter().map(|d| rt.upload(d).unwrap()).collect();
    drop(rt.run_recorded(&c, &inputs).unwrap());
    for _ in 0..3 {
        rt.trim();
        // Memory the freed pointer arrays had, handed out again and filled with other bytes.
        let junk: Vec<_> =
            (0..64).map(|k| rt.upload(&kiln::graph::workloads::data(&specs[k % 2], 9)).unwrap()).collect();
        let out = rt.run_recorded(&c, &inputs).unwrap();
        let got = rt.download(&out[0]).unwrap();
        common::assert_close_tol(got.values(), want[0].values(), 1e-4);
        drop(junk);
    }
    assert!(rt.stats().replays >= 3, "{:?}", rt.stats());
}

#[test]
#[ignore = needs_gpu!()]
fn eager_ops_run_as_kernels_on_cuda() {
    let Some(_) = cuda() else { return };
    kiln::set_eager_backend(kiln::Backend::Cuda).unwrap();
    let x = kiln::Tensor::from_slice(&[0.5f32, -1.0, 2.0, 3.5], &[2, 2]).unwrap();
    let y: Vec<f32> = x.exp().unwrap().sum(&[1], false).unwrap().to_vec().unwrap();
    kiln::set_eager_backend(kiln::Backend::Cpu).unwrap();
    let want = [0.5f32.exp() + (-1.0f32).exp(), 2.0f32.exp() + 3.5f32.exp()];
    assert_eq!(y.len(), want.len());
    for (a, b) in y.iter().zip(want) {
        assert!((a - b).abs() <= 1e-5 * b.abs(), "{a} vs {b}");
    }
}

/// Opening CUDA is an error, never a panic, where there is no driver or device (CI has none).
#[test]
fn opening_cuda_is_a_typed_result() {
    match kiln_ptx::Cuda::new() {
        Ok(b) => eprintln!("cuda present: {}", kiln::graph::device::Driver::describe(&b)),
        Err(e) => assert!(e.to_string().starts_with("cuda: "), "{e}"),
    }
}

/// `Mode::ReduceOverhead` through `kiln::compile`: the first call records a CUDA graph, later calls with
/// the same sizes replay it on new values, other sizes (symbolic) record again; every result matches
/// the reference.
#[test]
#[ignore = needs_gpu!()]
fn reduce_overhead_mode_replays_and_rerecords() {
    let Some(_) = cuda() else { return };
    let f = |x: &kiln::Tensor| x.mul(2.0)?.softmax(-1)?.add(1.0);
    let c =
        kiln::compile(f).backend(kiln::Backend::Cuda).mode(kiln::Mode::ReduceOverhead).dynamic(kiln::Dynamic::Always);
    let r = kiln::compile(f).backend(kiln::Backend::Cpu);
    for (rows, salt) in [(64, 0), (64, 1), (64, 2), (37, 3), (64, 4)] {
        let x = kiln::Tensor::from_data(kiln::graph::workloads::data(&TensorSpec::new(DType::F32, &[rows, 300]), salt));
        let got: kiln::Tensor = c.call(&x).unwrap();
        let want: kiln::Tensor = r.call(&x).unwrap();
        common::assert_close_tol(got.to_data().unwrap().values(), want.to_data().unwrap().values(), 1e-5);
    }
    assert_eq!(c.stats().traces, 1, "{:?}", c.stats());
}

/// The tests below each hold tens of GiB on the device: run in parallel they would fail for memory.
static BIG: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A full reduction over 2^32 + 8 elements (17 GB of f32) sums all of them: the row length once went
/// through a `u32` and the kernel summed a fraction of the input.
#[test]
#[ignore = needs_gpu!()]
fn a_sum_over_more_than_two_to_the_32_elements() {
    let _one_at_a_time = BIG.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let rt = kiln::Backend::Cuda.runtime().unwrap_or_else(|e| panic!("{e}")).expect("CUDA has a runtime");
    let n = (1usize << 32) + 8;
    let f = kiln::compile(|x: &kiln::Tensor| kiln::Tensor::ones(&[n], DType::F32)?.add(x)?.sum(&[0], false))
        .backend(rt.clone());
    let zero = kiln::Tensor::from_slice(&[0.0f32], &[1]).unwrap().to(rt.clone()).unwrap();
    let s: f32 = f.call(&zero).unwrap().item().unwrap();
    assert_eq!(s as f64, n as f32 as f64, "every element counted once");
}

/// 3·2^30-element tensors through W1, a row softmax and a full sum give the reference's values where
/// 32-bit indexing would wrap (issue: 64-bit indexing on both paths).
#[test]
#[ignore = needs_gpu!()]
fn tensors_of_three_times_two_to_the_30_elements() {
    let _one_at_a_time = BIG.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let b = cuda().expect("a CUDA backend");
    conformance::user_cases::three_times_two_to_the_30(&b).unwrap_or_else(|e| panic!("{e}"));
}

/// A symbolic dim bounded for 32-bit indexing, then a call past the bound: an unbounded entry, right
/// past 2^31 elements (issue: 64-bit indexing chosen by a guard).
#[test]
#[ignore = needs_gpu!()]
fn a_dynamic_dim_past_the_32_bit_bound() {
    let _one_at_a_time = BIG.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let b = cuda().expect("a CUDA backend");
    conformance::user_cases::dynamic_dims_past_the_32_bit_bound(&b).unwrap_or_else(|e| panic!("{e}"));
}

/// 5·2^30-element tensors (20 GiB of f32 each): the same checks, now also at and past 2^32 elements, where
/// an unsigned 32-bit index would wrap to the tensor's start.
#[test]
#[ignore = needs_gpu!()]
fn tensors_of_five_times_two_to_the_30_elements() {
    let _one_at_a_time = BIG.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let b = cuda().expect("a CUDA backend");
    conformance::user_cases::big_tensors(&b, 5 << 30).unwrap_or_else(|e| panic!("{e}"));
}
