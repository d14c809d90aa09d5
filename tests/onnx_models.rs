//! Models exported from PyTorch by `scripts/onnx_models.py` (tests/data/onnx/: a small CNN, a ResNet
//! basic block with a strided downsample, a transformer encoder layer and the digits classifier, the
//! last two with a dynamic batch) match PyTorch's outputs on the CPU reference, the kernel interpreter,
//! wgpu (lavapipe in CI) and CUDA (on a GPU machine); so do the int8 versions of the first two that
//! onnxruntime's static quantizer makes (`scripts/onnx_quantized.py`: QuantizeLinear/DequantizeLinear
//! around every convolution), against onnxruntime's outputs. Each data set of a model runs through one loaded
//! model, so the dynamic-batch models run two batch sizes from one compile.

mod common;

use common::onnx::{run_case, Outcome};
use kiln::graph::{Backend, CpuReference, IntoBackend, KernelInterpreter};
use std::path::Path;
use std::sync::Arc;

macro_rules! needs_gpu {
    () => {
        "needs an NVIDIA GPU: run with --include-ignored on a machine with a CUDA driver (scripts/test.sh does)"
    };
}

const MODELS: [&str; 6] =
    ["small_cnn", "resnet_block", "encoder_layer", "digits", "small_cnn_int8", "resnet_block_int8"];

fn check_all(backend: Arc<dyn Backend>) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/onnx");
    for m in MODELS {
        let outcome = run_case(&root.join(m), &backend);
        assert_eq!(outcome, Outcome::Pass, "{m} on {}", backend.name());
    }
}

#[test]
fn exported_models_on_the_reference() {
    check_all(Arc::new(CpuReference));
}

#[test]
fn exported_models_on_the_kernel_interpreter() {
    check_all(KernelInterpreter::default().runtime());
}

#[test]
fn exported_models_on_wgpu() {
    if common::wgpu_skipped() {
        return;
    }
    check_all(kiln::Backend::Wgpu.into_backend().unwrap_or_else(|e| panic!("{e}")));
}

#[test]
#[ignore = needs_gpu!()]
fn exported_models_on_cuda() {
    check_all(kiln::Backend::Cuda.into_backend().unwrap_or_else(|e| panic!("{e}")));
}

/// The digits model compiles once for every batch size (its batch is a `dim_param`).
#[test]
fn a_dynamic_batch_runs_without_recompiling() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/onnx/digits/model.onnx");
    let model = kiln::onnx::load(&path).unwrap().backend(CpuReference);
    for batch in [2usize, 7, 3] {
        let x = kiln::Tensor::from_slice(&vec![0.25f32; batch * 64], &[batch, 1, 8, 8]).unwrap();
        let y = model.call(vec![x]).unwrap();
        assert_eq!(y[0].shape().as_concrete().unwrap(), [batch, 10]);
    }
    let stats = model.compiled().stats();
    assert_eq!((stats.traces, stats.recompiles), (1, 0), "{:?}", model.compiled().guards());
}

/// The onnx_classify example's model and images: each held-out digit image is classified as its digit.
#[test]
fn the_digits_classifier_reads_every_digit() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let model = kiln::onnx::load(root.join("tests/data/onnx/digits/model.onnx")).unwrap().backend(CpuReference);
    let mut pixels = vec![];
    for d in 0..10 {
        let bytes = std::fs::read(root.join(format!("examples/data/digits/digit_{d}.pgm"))).unwrap();
        assert!(bytes.starts_with(b"P5\n8 8\n255\n"), "digit_{d}.pgm");
        pixels.extend(bytes[11..].iter().map(|&p| p as f32 / 255.0));
    }
    let x = kiln::Tensor::from_slice(&pixels, &[10, 1, 8, 8]).unwrap();
    let guesses = model.call(vec![x]).unwrap()[0].argmax(-1, false).unwrap().to_vec::<i64>().unwrap();
    assert_eq!(guesses, (0..10).collect::<Vec<i64>>());
}
