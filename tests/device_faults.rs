//! Work a device rejects is a typed error naming the kernels involved — never a panic — and the device
//! goes on running the next work (wgpu's default for such errors is to abort the process); a CUDA fault,
//! after which NVIDIA's driver serves the process no more work, is a typed `DeviceLost` that says so.

mod common;

use kiln::graph::device::{BindingCache, Bound, Driver, Launch};
use kiln::graph::{capture, DType, TensorSpec};

#[test]
fn a_rejected_dispatch_is_a_typed_error_naming_its_kernel_and_the_device_goes_on() {
    if common::wgpu_skipped() {
        return;
    }
    let gpu = kiln_wgsl::Gpu::new().unwrap_or_else(|e| panic!("{e}"));
    let g = capture(&[TensorSpec::new(DType::F32, &[64])], |t| Ok(vec![t[0].tanh()?])).unwrap();
    let c = kiln::graph::pipeline::compile_graph(&g, gpu.target()).unwrap();
    let k = &c.kernels[0];
    assert_eq!(k.buffers.len(), 2, "reads x, writes tanh(x)");
    let raw = gpu.alloc(256).unwrap();
    let module = gpu.load(k).unwrap();
    // One buffer bound as both the kernel's input and its output: WebGPU forbids it in one dispatch.
    let bound = [Bound { raw: &raw, id: 1, bytes: 256, offset: 0 }, Bound { raw: &raw, id: 1, bytes: 256, offset: 0 }];
    let bindings = Default::default();
    let cache = BindingCache::default();
    let launch = Launch {
        buffers: &bound,
        symbols: &[],
        bindings: &bindings,
        fault: None,
        groups: 1,
        module: &module,
        cache: &cache,
        wait: false,
    };
    gpu.launch(k, &launch).unwrap();
    let e = gpu.synchronize().expect_err("the device rejects the dispatch");
    assert!(matches!(e, kiln::Error::Backend { .. }), "{e:?}");
    assert!(e.to_string().contains(&k.name), "names the kernel: {e}");
    // Told once; the device runs what comes next.
    gpu.write(&raw, &[7u8; 256]).unwrap();
    gpu.synchronize().unwrap();
    assert_eq!(gpu.read(&raw, 256).unwrap(), vec![7u8; 256]);
}

/// A device lost mid-session (a driver reset, an unplugged GPU) is opened again at the next call: the
/// compiled function goes on (its weight uploaded again, its recording made again), while a tensor
/// that lived only on the lost device is a typed `DeviceLost` error wherever it is used.
#[test]
fn a_lost_device_is_opened_again_at_the_next_call() {
    if common::wgpu_skipped() {
        return;
    }
    use kiln::{compile, Backend, Mode, Tensor};
    let rt = Backend::Wgpu.runtime().unwrap_or_else(|e| panic!("{e}")).expect("wgpu has a runtime");
    let w = common::f32s(&[0.5, -1.0, 2.0], &[3]);
    let weight = w.clone();
    let f = compile(move |x: &Tensor| x.mul(&weight)?.tanh()).backend(rt.clone());
    let weight = w.clone();
    let g = compile(move |x: &Tensor| x.add(&weight)?.sin()).backend(rt.clone()).mode(Mode::ReduceOverhead);
    let x = common::f32s(&[1.0, 2.0, 3.0], &[3]);
    let want_f: Vec<f64> = [0.5f64, -2.0, 6.0].iter().map(|v| v.tanh()).collect();
    let want_g: Vec<f64> = [1.5f64, 1.0, 5.0].iter().map(|v| v.sin()).collect();
    let read = |t: &Tensor| t.to_vec::<f32>().expect("reads").iter().map(|&v| f64::from(v)).collect::<Vec<_>>();
    common::assert_close_tol(&read(&f.call(&x).expect("runs")), &want_f, 1e-6);
    for _ in 0..2 {
        common::assert_close_tol(&read(&g.call(&x).expect("replays")), &want_g, 1e-6);
    }
    let on_device: Tensor = f.call(&x).expect("runs");
    let reopens = rt.stats().reopens;

    let gpu = rt.driver().as_any().downcast_ref::<kiln_wgsl::Gpu>().expect("a wgpu runtime");
    gpu.lose_device("lost on purpose by a test");
    // The next call opens the device again and runs on it.
    common::assert_close_tol(&read(&f.call(&x).expect("runs after the loss")), &want_f, 1e-6);
    assert_eq!(rt.stats().reopens, reopens + 1);
    for _ in 0..2 {
        common::assert_close_tol(&read(&g.call(&x).expect("records again")), &want_g, 1e-6);
    }
    // What lived only on the lost device is gone, and says so.
    let e = on_device.to_vec::<f32>().expect_err("its data went with the device");
    assert!(matches!(e, kiln::Error::DeviceLost { .. }), "{e:?}");
    let e = f.call(&on_device).expect_err("an input from the lost device");
    assert!(matches!(e, kiln::Error::DeviceLost { .. }), "{e:?}");
    // Its memory is counted as the lost device's until it is dropped.
    let lost = rt.memory_stats().lost;
    assert!(lost > 0, "{:?}", rt.memory_stats());
    drop(on_device);
    assert!(rt.memory_stats().lost < lost, "{:?}", rt.memory_stats());
    // Made again, it runs.
    let again = x.to(rt.clone()).expect("uploads");
    common::assert_close_tol(&read(&f.call(&again).expect("runs")), &want_f, 1e-6);
    assert_eq!(rt.stats().reopens, reopens + 1, "opened once");
}

/// A kernel that faults on the GPU (here: its buffer bound 1 TiB past the allocation, an illegal address)
/// is a typed `DeviceLost` error naming the kernel when launches are waited for, and saying that the
/// process must restart; every later call is the same error, not a hang or a panic. (Run in this test
/// binary, whose other tests use wgpu: the fault ends CUDA for the whole process.)
#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored on a machine with a CUDA driver (scripts/test.sh does)"]
fn a_faulting_cuda_kernel_is_a_typed_error_naming_it() {
    let cuda = kiln_ptx::Cuda::new().unwrap_or_else(|e| panic!("{e}")).synchronous();
    let g = capture(&[TensorSpec::new(DType::F32, &[1 << 20])], |t| Ok(vec![t[0].tanh()?])).unwrap();
    let c = kiln::graph::pipeline::compile_graph(&g, cuda.target()).unwrap();
    let k = &c.kernels[0];
    let raw = cuda.alloc(4 << 20).unwrap();
    let module = cuda.load(k).unwrap();
    let far = Bound { raw: &raw, id: 1, bytes: 4 << 20, offset: 1 << 40 };
    let bound = [far, Bound { raw: &raw, id: 1, bytes: 4 << 20, offset: 0 }];
    let (bindings, cache) = (Default::default(), BindingCache::default());
    let launch = Launch {
        buffers: &bound,
        symbols: &[],
        bindings: &bindings,
        fault: None,
        groups: 64,
        module: &module,
        cache: &cache,
        wait: false,
    };
    let e = cuda.launch(k, &launch).expect_err("an illegal address");
    assert!(matches!(e, kiln::Error::DeviceLost { .. }), "{e:?}");
    assert!(e.to_string().contains(&k.name) && e.to_string().contains("restart"), "{e}");
    let again = cuda.synchronize().expect_err("the fault is sticky");
    assert!(matches!(again, kiln::Error::DeviceLost { .. }), "{again:?}");
}
