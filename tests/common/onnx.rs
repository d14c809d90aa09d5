//! Running ONNX test cases in the backend-test layout (`model.onnx`, `test_data_set_N/input_K.pb`,
//! `output_K.pb`): the node tests of the `onnx` package and the models `scripts/onnx_models.py` exports
//! from PyTorch share this runner and its tolerance.

use kiln::graph::Backend;
use kiln::onnx::proto::TensorProto;
use kiln::{Error, Tensor, TensorData};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// How one node test went on one backend.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    Pass,
    /// kiln says it does not do this, and why.
    Unsupported(String),
    /// A wrong answer, or an error other than "unsupported".
    Fail(String),
}

/// Reads a `.pb` tensor; `Err` says why it is not one kiln reads (a sequence, an optional, a dtype).
pub fn read_pb(path: &Path) -> Result<TensorData, String> {
    use prost::Message;
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let t =
        TensorProto::decode(bytes.as_slice()).map_err(|_| "a non-tensor value (sequence or optional)".to_string())?;
    if t.data_type.is_none() {
        return Err("a non-tensor value (sequence or optional)".into());
    }
    kiln::onnx::tensor::to_data(&t, None)
}

pub fn unsupported_reason(e: &Error) -> Option<String> {
    match e {
        Error::Import { unsupported: true, op_type, msg, .. } => Some(format!("{op_type}: {msg}")),
        Error::Unsupported { what, .. } => {
            // The model's path is noise in the table.
            Some(what.split_once(": ").map_or(what.as_str(), |(_, w)| w).to_string())
        }
        _ => None,
    }
}

/// `|got - want| <= 1e-3 |want| + atol` (ONNX's backend-test rule, with kiln's absolute floor), same
/// NaNs and infinities; integers and booleans exactly, or within `levels` where the case says (a JPEG's
/// pixels). `tf32`: the model's f32 convolutions ran in TF32 (f16's 10-bit mantissa), so f32 is held to
/// the f16 rule.
pub fn compare(got: &TensorData, want: &TensorData, tf32: bool, levels: f64) -> Result<(), String> {
    if got.dims() != want.dims() {
        return Err(format!("shape {:?}, expected {:?}", got.dims(), want.dims()));
    }
    if got.dtype() != want.dtype() {
        return Err(format!("dtype {}, expected {}", got.dtype(), want.dtype()));
    }
    // Small (8- and 4-bit) floats exactly, but NaN as NaN.
    let float = want.dtype().is_float() || want.dtype().minifloat().is_some();
    let (rtol, atol) = match want.dtype() {
        kiln::DType::F32 | kiln::DType::F64 if !tf32 => (1e-3, 1e-5),
        kiln::DType::F32 | kiln::DType::F64 => (1e-2, 1e-3),
        kiln::DType::F16 | kiln::DType::BF16 => (1e-2, 1e-3),
        _ => (0.0, 0.0),
    };
    for (i, (&a, &b)) in got.values().iter().zip(want.values()).enumerate() {
        let ok = if !float {
            (a - b).abs() <= levels
        } else if b.is_nan() {
            a.is_nan()
        } else if b.is_infinite() {
            a == b
        } else {
            (a - b).abs() <= rtol * b.abs() + atol
        };
        if !ok {
            return Err(format!("element {i}: {a}, expected {b}"));
        }
    }
    Ok(())
}

/// How far a decoded JPEG's pixels may be from the expected ones: 2 levels. JPEG decoders agree only
/// that far — the standard leaves the inverse DCT's rounding and the chroma upsampling to each one —
/// and ONNX's expected pixels are Pillow's (libjpeg), kiln's the `image` crate's (measured: grey
/// within 1 on 3% of pixels, colour within 2 on 24%). Every other image format exactly.
fn jpeg_levels(dir: &Path) -> f64 {
    let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    if name.starts_with("test_image_decoder_decode_jpeg_") {
        2.0
    } else {
        0.0
    }
}

pub fn run_case(dir: &Path, backend: &Arc<dyn Backend>) -> Outcome {
    let model = match kiln::onnx::load(dir.join("model.onnx")) {
        Ok(m) => m.backend(backend.clone()),
        Err(e) => return unsupported_reason(&e).map_or_else(|| Outcome::Fail(e.to_string()), Outcome::Unsupported),
    };
    // A transposed convolution is traced as a convolution over its dilated input: TF32 on such targets too.
    let convolves = ["Conv", "ConvTranspose"].iter().any(|op| model.model().has_op(op));
    let tf32 = backend.target().is_some_and(|t| t.tf32_convolutions) && convolves;
    let mut sets: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|r| r.flatten().map(|e| e.path()).filter(|p| p.is_dir()).collect())
        .unwrap_or_default();
    sets.sort();
    if sets.is_empty() {
        return Outcome::Fail(format!("{}: no test_data_set_* folder", dir.display()));
    }
    for set in sets {
        let read_all = |prefix: &str| -> Result<Vec<TensorData>, String> {
            (0..)
                .map(|i| set.join(format!("{prefix}_{i}.pb")))
                .take_while(|p| p.exists())
                .map(|p| read_pb(&p))
                .collect()
        };
        let (inputs, want) = match (read_all("input"), read_all("output")) {
            (Ok(i), Ok(o)) => (i, o),
            (Err(e), _) | (_, Err(e)) => return Outcome::Unsupported(e),
        };
        let ratio = inputs.get(1).and_then(|r| r.values().first().copied());
        let x = inputs.first().map(|x| x.values().to_vec()).unwrap_or_default();
        let inputs: Vec<Tensor> = inputs.into_iter().map(Tensor::from_data).collect();
        let got = match model.call(inputs) {
            Ok(g) => g,
            Err(e) => return unsupported_reason(&e).map_or_else(|| Outcome::Fail(e.to_string()), Outcome::Unsupported),
        };
        if want.is_empty() {
            return Outcome::Fail(format!("{}: no expected output", set.display()));
        }
        if got.len() < want.len() {
            return Outcome::Fail(format!("{} outputs, expected {}", got.len(), want.len()));
        }
        if let Some(contract) = drawn_by_numpy(dir) {
            let checked = match contract {
                Contract::Dropout => check_dropout(&x, ratio.unwrap_or(0.5), &got),
                Contract::Bernoulli => check_bernoulli(&x, &got),
            };
            if let Err(m) = checked {
                return Outcome::Fail(m);
            }
            continue;
        }
        for (k, (g, w)) in got.iter().zip(&want).enumerate() {
            let g = match g.to_data() {
                Ok(g) => g,
                Err(e) => return Outcome::Fail(e.to_string()),
            };
            if let Err(m) = compare(&g, w, tf32, jpeg_levels(dir)) {
                return Outcome::Fail(format!("output {k}: {m}"));
            }
        }
    }
    Outcome::Pass
}

/// What a test whose expected outputs are numpy's random draw is checked by instead.
enum Contract {
    Dropout,
    Bernoulli,
}

/// Tests whose expected outputs are numpy's random draw (training-mode dropout's mask, Bernoulli's
/// samples): kiln draws its own (Philox, the same on every backend), so these are checked by what the op
/// means rather than element by element.
fn drawn_by_numpy(dir: &Path) -> Option<Contract> {
    let name = dir.file_name().unwrap_or_default().to_string_lossy();
    if name.starts_with("test_training_dropout") && !name.contains("zero_ratio") {
        return Some(Contract::Dropout);
    }
    name.starts_with("test_bernoulli").then_some(Contract::Bernoulli)
}

/// Bernoulli's contract: every sample is 0 or 1 (0 where the probability is 0, 1 where it is 1), and
/// the count of ones is the probabilities' sum within five standard deviations.
fn check_bernoulli(p: &[f64], got: &[Tensor]) -> Result<(), String> {
    let y = got.first().ok_or("no output")?.to_data().map_err(|e| e.to_string())?;
    for (i, (&v, &q)) in y.values().iter().zip(p).enumerate() {
        if !(v == 0.0 || v == 1.0) || (q == 0.0 && v != 0.0) || (q == 1.0 && v != 1.0) {
            return Err(format!("element {i}: {v} drawn with probability {q}"));
        }
    }
    let ones: f64 = y.values().iter().sum();
    let (mean, var) = p.iter().fold((0.0, 0.0), |(m, v), &q| (m + q, v + q * (1.0 - q)));
    if (ones - mean).abs() > 5.0 * var.sqrt() + 1.0 {
        return Err(format!("{ones} ones, expected about {mean}"));
    }
    Ok(())
}

/// Dropout's contract: every output element is 0 or `x / (1 − ratio)`, the mask (when returned) says
/// which, and the kept fraction is `1 − ratio` within five standard deviations.
fn check_dropout(x: &[f64], ratio: f64, got: &[Tensor]) -> Result<(), String> {
    let y = got.first().ok_or("no output")?.to_data().map_err(|e| e.to_string())?;
    let mask = match got.get(1) {
        Some(m) => Some(m.to_data().map_err(|e| e.to_string())?.values().to_vec()),
        None => None,
    };
    let scale = 1.0 / (1.0 - ratio);
    let mut kept = 0usize;
    for (i, (&v, &xi)) in y.values().iter().zip(x).enumerate() {
        let keep = v != 0.0 || xi == 0.0;
        let want = if keep { xi * scale } else { 0.0 };
        if (v - want).abs() > 1e-5 * (1.0 + want.abs()) {
            return Err(format!("element {i}: {v}, neither 0 nor {}", xi * scale));
        }
        if let Some(m) = &mask {
            if xi != 0.0 && (m[i] != 0.0) != keep {
                return Err(format!("element {i}: the mask says {} but the output is {v}", m[i]));
            }
        }
        kept += usize::from(keep);
    }
    let n = x.len() as f64;
    let sd = (n * ratio * (1.0 - ratio)).sqrt();
    if (kept as f64 - n * (1.0 - ratio)).abs() > 5.0 * sd + 1.0 {
        return Err(format!("kept {kept} of {n}, expected about {}", n * (1.0 - ratio)));
    }
    Ok(())
}
