//! Eager mode on a kernel backend: every op outside `compile` runs at once as its own kernel, through the
//! same pipeline and runtime, and agrees with the reference.

mod common;
use kiln::{set_eager_backend, Backend, Tensor};

fn program(x: &Tensor) -> Vec<f32> {
    let y = x.mul(1.5).unwrap().add(0.5).unwrap().gelu().unwrap();
    let z = y.softmax(-1).unwrap().sum(&[0], false).unwrap();
    z.to_vec().unwrap()
}

fn check(backend: Backend) {
    let x = Tensor::from_slice(&(0..60).map(|i| (i as f32 * 0.3).sin()).collect::<Vec<_>>(), &[6, 10]).unwrap();
    set_eager_backend(Backend::Cpu).unwrap();
    let want = program(&x);
    set_eager_backend(backend).unwrap();
    let got = program(&x);
    set_eager_backend(Backend::Cpu).unwrap();
    assert_eq!(got.len(), want.len(), "every element comes back");
    for (a, b) in got.iter().zip(&want) {
        assert!((a - b).abs() <= 1e-5 * (1.0 + b.abs()), "{a} vs {b}");
    }
}

#[test]
fn eager_ops_run_as_kernels_on_the_kernel_interpreter() {
    check(Backend::Kernels);
}

#[test]
fn eager_ops_run_as_kernels_on_wgpu() {
    if !common::wgpu_skipped() {
        check(Backend::Wgpu);
    }
}
