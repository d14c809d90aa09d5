//! The conformance suite on wgpu. In CI it runs on lavapipe (Mesa's CPU Vulkan driver); on the lent GPU
//! on NVIDIA Vulkan. With no adapter it fails saying what to install — unless KILN_WGPU_TESTS=skip says,
//! explicitly, that this machine has none.

mod common;
mod conformance;

fn wgpu() -> Option<std::rc::Rc<dyn kiln::graph::Backend>> {
    if common::wgpu_skipped() {
        return None;
    }
    use kiln::graph::IntoBackend;
    match kiln::Backend::Wgpu.into_backend() {
        Ok(b) => Some(b),
        Err(e) => panic!("{e}"),
    }
}

conformance_suite!(wgpu(), random_cases = 500, big = true, ieee_nan = false);

#[test]
fn reports_the_adapter() {
    let Some(_) = wgpu() else { return };
    let gpu = kiln_wgsl::WgpuBackend::new().unwrap();
    eprintln!("wgpu adapter: {}", gpu.gpu().describe());
}
