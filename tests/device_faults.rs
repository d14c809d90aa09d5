//! Work a device rejects is a typed error naming the kernels involved — never a panic — and the device
//! goes on running the next work (wgpu's default for such errors is to abort the process).

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
