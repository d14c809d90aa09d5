//! Uploads on CUDA (`kiln_ptx::staging`, `kiln_ptx::copies`) against work queued on the device. A test
//! binary of its own, its tests one at a time: each checks that an upload returns while ~100 ms of
//! products still run, and another thread's first page-locked allocation (which waits for the whole
//! device) would hold this one's driver calls until they end. Ignored without a GPU, as in
//! `conformance_cuda`; `scripts/test.sh` runs them wherever a CUDA driver exists.

mod common;

use kiln::graph::workloads::data;
use kiln::graph::{capture, compile_graph, CompiledGraph, DType, TensorSpec};
use std::sync::Arc;

/// Why every test here is ignored by default.
macro_rules! needs_gpu {
    () => {
        "needs an NVIDIA GPU: run with --include-ignored on a machine with a CUDA driver (scripts/test.sh does)"
    };
}

/// A runtime of its own (its pool and stream hold only the test's buffers and work), a 4096² product
/// (~2.7 ms of f32 work a run) with its input, and `x + 1` over a 4 MiB row.
struct Setup {
    rt: Arc<kiln::graph::runtime::Runtime>,
    heavy: Arc<CompiledGraph>,
    plus: Arc<CompiledGraph>,
    row: TensorSpec,
    x: kiln::graph::runtime::DeviceTensor,
}

fn setup() -> Setup {
    let rt = kiln_ptx::Cuda::runtime().unwrap_or_else(|e| panic!("{e}"));
    let square = TensorSpec::new(DType::F32, &[4096, 4096]);
    let heavy = capture(std::slice::from_ref(&square), |t| Ok(vec![t[0].matmul(&t[0])?])).unwrap();
    let heavy = Arc::new(compile_graph(&heavy, rt.target()).unwrap());
    let row = TensorSpec::new(DType::F32, &[1 << 20]);
    let plus = capture(std::slice::from_ref(&row), |t| Ok(vec![t[0].add(1.0)?])).unwrap();
    let plus = Arc::new(compile_graph(&plus, rt.target()).unwrap());
    let x = rt.upload(&data(&square, 1)).unwrap();
    Setup { rt, heavy, plus, row, x }
}

/// The device to this test alone (see the module docs).
fn alone() -> std::sync::MutexGuard<'static, ()> {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE.lock().unwrap_or_else(|e| e.into_inner())
}

/// The runtime's CUDA driver.
fn cuda_of(rt: &kiln::graph::runtime::Runtime) -> &kiln_ptx::Cuda {
    rt.driver().as_any().downcast_ref::<kiln_ptx::Cuda>().expect("a CUDA driver")
}

/// Two uploads of `row` dropped: the second reuses the first's buffer, which starts the marking of
/// freed buffers (uploads into them may then run on the copy stream); the marked buffer stays pooled.
fn start_marking(rt: &kiln::graph::runtime::Runtime, row: &TensorSpec) {
    drop(rt.upload(&data(row, 4)).unwrap());
    drop(rt.upload(&data(row, 5)).unwrap());
}

/// Asserts that one upload went to the copy stream since the count was `before` (unless
/// `KILN_CUDA_COPY_STREAM=0` keeps every upload in the kernels' order).
fn assert_one_upload_beside(cuda: &kiln_ptx::Cuda, before: u64) {
    if std::env::var("KILN_CUDA_COPY_STREAM").as_deref() != Ok("0") {
        assert_eq!(cuda.uploads_beside_kernels(), before + 1, "the upload did not go to the copy stream");
    }
}

/// An upload goes through pinned staging (`kiln_ptx::staging`), into a reused buffer on the copy
/// stream (`kiln_ptx::copies`): it waits on the device for the last reader of its buffer only — a kernel
/// queued behind tens of milliseconds of work still reads the old bytes — and returns without waiting
/// for that work; uploads of every size, many small ones sharing a
/// chunk and one larger than all the chunks together, arrive whole, and the chunks pinned stay bounded.
#[test]
#[ignore = needs_gpu!()]
fn uploads_queue_behind_the_work_without_waiting_for_it() {
    let _alone = alone();
    let Setup { rt, heavy, plus, row, x } = setup();
    let cuda = cuda_of(&rt);
    start_marking(&rt, &row);
    let (a_host, b_host) = (data(&row, 2), data(&row, 3));
    let a = rt.upload(&a_host).unwrap();
    // Both graphs loaded before the timed part (loading a module may wait for the device); their
    // outputs kept, so the pool holds only the buffers the test means.
    let _warm = (rt.run(&heavy, &[&x]).unwrap(), rt.run(&plus, &[&a]).unwrap());
    rt.synchronize().unwrap();

    // Tens of milliseconds of products, then a kernel reading `a` behind them.
    let products: Vec<_> = (0..40).map(|_| rt.run(&heavy, &[&x]).unwrap()).collect();
    let y = rt.run(&plus, &[&a]).unwrap().remove(0);
    let a_id = a.buffer.id();
    drop(a);
    let beside = cuda.uploads_beside_kernels();
    let b = rt.upload(&b_host).unwrap();
    assert_eq!(b.buffer.id(), a_id, "the upload was to reuse the buffer the queued kernel reads");
    assert!(!cuda.idle().unwrap(), "the upload waited for the work queued before it");
    assert_one_upload_beside(cuda, beside);

    let want_y: Vec<f64> = a_host.values().iter().map(|v| v + 1.0).collect();
    // A kernel queued after the upload reads the new bytes (its stream waits for the copy there).
    let b_plus = rt.run(&plus, &[&b]).unwrap().remove(0);
    let want_b_plus: Vec<f64> = b_host.values().iter().map(|v| v + 1.0).collect();
    common::assert_close_tol(rt.download(&b_plus).unwrap().values(), &want_b_plus, 1e-6);
    common::assert_close_tol(rt.download(&y).unwrap().values(), &want_y, 1e-6);
    assert_eq!(rt.download(&b).unwrap().values(), b_host.values());
    drop(products);

    // Sizes around the chunk, many small uploads back to back, and more than the chunks hold at once.
    let chunk = kiln_ptx::staging::CHUNK_BYTES / 4;
    let all = kiln_ptx::staging::CHUNK_BYTES * kiln_ptx::staging::MAX_CHUNKS / 4;
    for (i, n) in [1, 3, chunk - 1, chunk, chunk + 3, 3 * chunk + 5, all + chunk + 7].into_iter().enumerate() {
        let host = data(&TensorSpec::new(DType::F32, &[n]), 10 + i);
        let t = rt.upload(&host).unwrap();
        assert_eq!(rt.download(&t).unwrap().values(), host.values(), "{n} elements");
    }
    let small: Vec<_> = (0..2000).map(|i| data(&TensorSpec::new(DType::F32, &[3 + i % 5]), 100 + i)).collect();
    let uploaded: Vec<_> = small.iter().map(|h| rt.upload(h).unwrap()).collect();
    for (h, t) in small.iter().zip(&uploaded) {
        assert_eq!(rt.download(t).unwrap().values(), h.values());
    }
    assert!(cuda.staged_chunks() <= kiln_ptx::staging::MAX_CHUNKS, "{} chunks pinned", cuda.staged_chunks());
}

/// An upload on the copy stream into a buffer freed before any kernel used it: the copy, still waiting
/// behind ~100 ms of products for the buffer's last reader, comes before whatever reuses the buffer (the
/// driver makes the kernels' stream wait for it when the buffer is freed), so a kernel's output written
/// there later is the kernel's, not the upload's. (With `KILN_CUDA_COPY_STREAM=0` the same sequence runs
/// in the kernels' order.)
#[test]
#[ignore = needs_gpu!()]
fn a_freed_upload_lands_before_its_buffer_is_reused() {
    let _alone = alone();
    let Setup { rt, heavy, plus, row, x } = setup();
    let cuda = cuda_of(&rt);
    let (a_host, c_host) = (data(&row, 2), data(&row, 3));
    let a = rt.upload(&a_host).unwrap();
    // Leaves one marked 4 MiB buffer pooled.
    start_marking(&rt, &row);
    let kept = rt.upload(&data(&row, 6)).unwrap();
    // Both graphs loaded before the timed part (loading a module may wait for the device); their
    // outputs kept, so the pool holds only the buffers the test means.
    let _warm = (rt.run(&heavy, &[&x]).unwrap(), rt.run(&plus, &[&a]).unwrap());
    rt.synchronize().unwrap();

    let products: Vec<_> = (0..40).map(|_| rt.run(&heavy, &[&x]).unwrap()).collect();
    drop(kept); // freed behind the products: an upload into it waits for them
    let beside = cuda.uploads_beside_kernels();
    let c = rt.upload(&c_host).unwrap();
    assert_one_upload_beside(cuda, beside);
    let c_id = c.buffer.id();
    drop(c);
    let y = rt.run(&plus, &[&a]).unwrap().remove(0);
    assert_eq!(y.buffer.id(), c_id, "the kernel's output was to reuse the freed upload's buffer");
    assert!(!cuda.idle().unwrap(), "the products were to be still running");
    let want: Vec<f64> = a_host.values().iter().map(|v| v + 1.0).collect();
    common::assert_close_tol(rt.download(&y).unwrap().values(), &want, 1e-6);
    drop(products);
}
