//! Small helpers shared by the integration tests.
#![allow(dead_code)]

pub mod classifier;
pub mod onnx;

use kiln::{Result, Tensor};

/// An f32 tensor from values and dims.
#[track_caller]
pub fn f32s(values: &[f32], dims: &[usize]) -> Tensor {
    Tensor::from_slice(values, dims).expect("test data matches its shape")
}

/// An i64 tensor.
#[track_caller]
pub fn i64s(values: &[i64], dims: &[usize]) -> Tensor {
    Tensor::from_slice(values, dims).expect("test data matches its shape")
}

/// A bool tensor.
#[track_caller]
pub fn bools(values: &[bool], dims: &[usize]) -> Tensor {
    Tensor::from_slice(values, dims).expect("test data matches its shape")
}

/// The values of a tensor as f64, with its dims.
pub fn read(t: &Result<Tensor>) -> (Vec<f64>, Vec<usize>) {
    let t = t.as_ref().expect("op succeeds");
    let d = t.to_data().expect("readable");
    (d.values().to_vec(), d.dims().to_vec())
}

/// Asserts elementwise closeness (relative 1e-6, absolute 1e-6), NaN equal to NaN.
#[track_caller]
pub fn assert_close(got: &[f64], want: &[f64]) {
    assert_close_tol(got, want, 1e-6);
}

/// Asserts elementwise closeness within `tol` (relative, absolute below 1), NaN equal to NaN.
#[track_caller]
pub fn assert_close_tol(got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "length: got {got:?}, want {want:?}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let ok = (g.is_nan() && w.is_nan()) || g == w || (g - w).abs() <= tol * w.abs().max(1.0);
        assert!(ok, "element {i}: got {g}, want {w} (all: {got:?} vs {want:?})");
    }
}

/// Whether this run opted out of wgpu tests (`KILN_WGPU_TESTS=skip`); says so when it did. Without the
/// opt-out a missing adapter is a failure, never a silent pass.
pub fn wgpu_skipped() -> bool {
    let skip = std::env::var("KILN_WGPU_TESTS").as_deref() == Ok("skip");
    if skip {
        eprintln!("KILN_WGPU_TESTS=skip: wgpu tests skipped on request");
    }
    skip
}

/// The wgpu runtime of a test binary that runs under one knob, `var=value`, set before its device opens
/// (the binary's tests open no other first); `None` where the run opted out of wgpu tests. With no
/// adapter and no opt-out, a failure saying what to install.
pub fn wgpu_runtime_with(var: &str, value: &str) -> Option<std::sync::Arc<kiln::Runtime>> {
    if wgpu_skipped() {
        return None;
    }
    std::env::set_var(var, value);
    Some(kiln_wgsl::Gpu::runtime().unwrap_or_else(|e| panic!("{e}")))
}

/// The devices kernels run on in every test run: the kernel interpreter, and wgpu (lavapipe where there
/// is no GPU) unless opted out; with no adapter and no opt-out, a failure saying what to install.
pub fn kernel_devices() -> Vec<std::sync::Arc<kiln::Runtime>> {
    let mut v = vec![kiln::graph::KernelInterpreter::default().runtime()];
    if !wgpu_skipped() {
        match kiln::Backend::Wgpu.runtime() {
            Ok(Some(rt)) => v.push(rt),
            Ok(None) => panic!(
                "no wgpu adapter: install Mesa's Vulkan drivers (mesa-vulkan-drivers), or set KILN_WGPU_TESTS=skip"
            ),
            Err(e) => panic!("{e}"),
        }
    }
    v
}
