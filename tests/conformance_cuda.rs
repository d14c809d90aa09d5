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

fn cuda() -> Option<std::rc::Rc<dyn kiln::graph::Backend>> {
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
    let Some(_) = cuda() else { return };
    let cuda = kiln_ptx::CudaBackend::new().unwrap();
    eprintln!("cuda device: {}", cuda.cuda().describe());
}

/// A prepared graph captured as a CUDA graph replays to the same values, and new input values uploaded
/// into the captured buffers are read by the replay (the graph holds buffers, not data).
#[test]
#[ignore = needs_gpu!()]
fn a_captured_graph_replays_and_reads_new_inputs() {
    let Some(_) = cuda() else { return };
    let be = kiln_ptx::CudaBackend::new().unwrap();
    let cuda = be.cuda();
    let spec = TensorSpec::new(DType::F32, &[64, 300]);
    let g = capture(std::slice::from_ref(&spec), |t| Ok(vec![t[0].mul(2.0)?.softmax(-1)?.add(1.0)?])).unwrap();
    let c = compile_graph(&g, cuda.target()).unwrap();
    let x = kiln::graph::workloads::data(&spec, 0);
    let want = c.run_interpreted(&[&x]).unwrap();
    let mut p = cuda.prepare(&c, &[&x]).unwrap();
    cuda.capture(&mut p).unwrap();
    assert!(p.is_captured());
    for _ in 0..3 {
        cuda.launch(&p).unwrap();
    }
    let got = cuda.read(&p).unwrap();
    common::assert_close_tol(got[0].values(), want[0].values(), 1e-5);
    let y = kiln::graph::workloads::data(&spec, 7);
    cuda.upload(&mut p, 0, &y).unwrap();
    cuda.launch(&p).unwrap();
    let got = cuda.read(&p).unwrap();
    common::assert_close_tol(got[0].values(), c.run_interpreted(&[&y]).unwrap()[0].values(), 1e-5);
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
    match kiln_ptx::CudaBackend::new() {
        Ok(b) => eprintln!("cuda present: {}", b.cuda().describe()),
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
