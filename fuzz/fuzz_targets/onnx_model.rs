//! ONNX models from outside: any bytes must load as a model or give a typed error, and a model that
//! loads must run (on zeros of its declared shapes, when small) or give a typed error — never panic,
//! nor allocate past the host limit it sets.
#![no_main]

use kiln_graph::{Tensor, TensorData};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // A model may ask for any size of result (a pool padded by millions): past 256 MiB a host tensor is
    // a typed error here, not an allocation the fuzzer's memory limit stops.
    std::env::set_var("KILN_HOST_MEMORY_LIMIT_MB", "256");
    let Ok(model) = kiln_onnx::load_bytes(data, "fuzz.onnx") else { return };
    let mut inputs = vec![];
    for spec in model.inputs() {
        let Some(dims) = &spec.dims else { return };
        let dims: Option<Vec<usize>> =
            dims.iter().map(|d| if let kiln_onnx::DimSpec::Fixed(n) = d { Some(*n) } else { None }).collect();
        let Some(dims) = dims else { return };
        if dims.iter().try_fold(1usize, |n, &d| n.checked_mul(d)).is_none_or(|n| n > 4096) {
            return;
        }
        let n = dims.iter().product();
        let zeros = TensorData::from_f64(vec![0.0; n], &dims, spec.dtype).expect("sizes match");
        inputs.push(Tensor::from_data(zeros));
    }
    let _ = model.model().run(&inputs);
});
