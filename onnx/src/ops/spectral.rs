//! ONNX's `DFT` and `STFT`: the discrete Fourier transform along one axis as two products with constant
//! cosine and sine matrices (made on the host from the signal's length), so it runs on any backend's
//! matmul; the short-time transform frames the signal with one gather first. A fast transform would take
//! `n log n` operations against `n²`; the signals ONNX models transform (audio frames, small spectra)
//! are short, and a product is one kernel the compiler already schedules well.

use super::{axis, invalid, one, unsupported, Node, OpResult};
use crate::value::Value;
use kiln_graph::Tensor;

/// The op types this family converts.
pub(super) const OPS: &[&str] = &["DFT", "STFT"];

/// The family; `None` when `op` is not one of it.
pub(super) fn run(node: &Node, op: &str) -> Option<OpResult<Vec<Value>>> {
    Some(match op {
        "DFT" => dft(node),
        "STFT" => stft(node),
        _ => return None,
    })
}

/// The largest transform length kiln builds matrices for: two `L × L` tables made on the host (64 MiB
/// of f64 at this length).
const MAX_LENGTH: usize = 2048;

/// `input` `[.., N, 1 | 2]` (real, or complex as real and imaginary parts) transformed along `axis`:
/// `X_k = Σ_n x_n e^{∓2πi kn/L}` (`inverse`: the `+` sign and a factor `1/L`), the signal cut or
/// zero-padded to `dft_length` `L`; `onesided` keeps the first `L/2 + 1` frequencies of a real signal.
fn dft(node: &Node) -> OpResult<Vec<Value>> {
    let x = node.tensor(0)?;
    let r = x.rank();
    let Some(dims) = x.shape().as_concrete() else { return unsupported("DFT over symbolic dims") };
    if r < 2 || !matches!(dims[r - 1], 1 | 2) || !x.dtype().is_float() {
        return invalid(format!("a signal of shape {dims:?} and dtype {} (the last axis 1 or 2, float)", x.dtype()));
    }
    // The axis is an attribute through opset 19 and an input (default -2) from opset 20.
    let a = if node.opset() >= 20 {
        match node.const_ints(2, "axis")? {
            Some(v) if v.len() == 1 => v[0],
            Some(_) => return invalid("axis must be one integer"),
            None => -2,
        }
    } else {
        node.int("axis", 1)
    };
    let a = axis(a, r)?;
    if a == r - 1 {
        return invalid("the axis cannot be the last one (it holds the real and imaginary parts)");
    }
    let n = dims[a];
    let len = match node.const_ints(1, "dft_length")? {
        Some(v) if v.len() == 1 && v[0] > 0 => v[0] as usize,
        Some(v) => return invalid(format!("dft_length {v:?}")),
        None => n,
    };
    let (inverse, onesided) = (node.int("inverse", 0) != 0, node.int("onesided", 0) != 0);
    one(transform(node, &x, a, len, inverse, onesided)?)
}

/// `x` `[.., N, 1 | 2]` transformed along axis `a` (not the last), fitted to length `len` (see [`dft`]).
fn transform(node: &Node, x: &Tensor, a: usize, len: usize, inverse: bool, onesided: bool) -> OpResult<Tensor> {
    let r = x.rank();
    let Some(dims) = x.shape().as_concrete() else { return unsupported("a DFT over symbolic dims") };
    let n = dims[a];
    if onesided && (inverse || dims[r - 1] == 2) {
        return unsupported("onesided with an inverse or complex input");
    }
    if len > MAX_LENGTH {
        return unsupported(format!("a DFT of length {len} (kiln builds tables up to {MAX_LENGTH})"));
    }
    let out_len = if onesided { len / 2 + 1 } else { len };
    // The signal axis moved last (and fitted to `len`), so each part is a product with a table.
    let mut perm: Vec<isize> = (0..r as isize - 1).filter(|&i| i != a as isize).collect();
    perm.push(a as isize);
    let part = |k: usize| -> OpResult<Tensor> {
        let p = x.narrow(-1, k, 1)?.squeeze(-1)?.permute(&perm)?;
        Ok(match len.cmp(&n) {
            std::cmp::Ordering::Less => p.narrow(-1, 0, len)?,
            std::cmp::Ordering::Greater => {
                let mut pads = vec![(0, 0); r - 1];
                pads[r - 2] = (0, len - n);
                p.pad(&pads, 0.0)?
            }
            std::cmp::Ordering::Equal => p,
        })
    };
    let re = part(0)?;
    let im = if dims[r - 1] == 2 { Some(part(1)?) } else { None };
    let table = |f: fn(f64) -> f64| {
        let mut v = Vec::with_capacity(len * out_len);
        for s in 0..len {
            for k in 0..out_len {
                // k·s reduced mod len first: the angle stays small, so the table is exact to f64.
                let turn = ((k * s) % len) as f64 / len as f64;
                v.push(f(2.0 * std::f64::consts::PI * turn));
            }
        }
        node.model.constant(v, &[len, out_len], x.dtype())
    };
    let (cos, sin) = (table(f64::cos)?, table(f64::sin)?);
    // (a + ib)(cos θ ∓ i sin θ): forward `a cos + b sin`, `b cos − a sin`; inverse the other signs.
    let sign = if inverse { -1.0 } else { 1.0 };
    let (mut out_re, mut out_im) = (re.matmul(&cos)?, re.matmul(&sin)?.mul(-sign)?);
    if let Some(im) = &im {
        out_re = out_re.add(&im.matmul(&sin)?.mul(sign)?)?;
        out_im = out_im.add(&im.matmul(&cos)?)?;
    }
    if inverse {
        let scale = 1.0 / len as f64;
        (out_re, out_im) = (out_re.mul(scale)?, out_im.mul(scale)?);
    }
    // The transformed axis back in its place, the parts stacked last.
    let mut back = vec![0isize; r - 1];
    for (i, &p) in perm.iter().enumerate() {
        back[p as usize] = i as isize;
    }
    let stack = |t: Tensor| -> OpResult<Tensor> { Ok(t.permute(&back)?.unsqueeze(-1)?) };
    Ok(Tensor::concat(&[&stack(out_re)?, &stack(out_im)?], -1)?)
}

/// `signal` `[batch, length, 1 | 2]` cut into frames of `frame_length` every `frame_step` samples (one
/// gather), each weighed by `window` and transformed: `[batch, frames, bins, 2]`, `bins` the first
/// `frame_length / 2 + 1` frequencies when `onesided` (the default).
fn stft(node: &Node) -> OpResult<Vec<Value>> {
    let x = node.tensor(0)?;
    let Some(dims) = x.shape().as_concrete() else { return unsupported("STFT over symbolic dims") };
    if dims.len() != 3 || !matches!(dims[2], 1 | 2) || !x.dtype().is_float() {
        return invalid(format!("a signal of shape {dims:?} and dtype {} ([batch, length, 1 or 2], float)", x.dtype()));
    }
    let step = match node.const_ints(1, "frame_step")? {
        Some(v) if v.len() == 1 && v[0] > 0 => v[0] as usize,
        v => return invalid(format!("frame_step {v:?}")),
    };
    let window = node.opt_tensor(2)?;
    let from_window = window.as_ref().and_then(|w| w.shape().as_concrete()).filter(|d| d.len() == 1).map(|d| d[0]);
    let frame = match (node.const_ints(3, "frame_length")?, from_window) {
        (Some(v), w) if v.len() == 1 && v[0] > 0 && w.is_none_or(|w| w == v[0] as usize) => v[0] as usize,
        (None, Some(w)) if w > 0 => w,
        (f, w) => return invalid(format!("frame_length {f:?} with a window of {w:?} samples")),
    };
    if frame > dims[1] {
        return invalid(format!("frames of {frame} samples from a signal of {}", dims[1]));
    }
    let frames = (dims[1] - frame) / step + 1;
    let index: Vec<f64> = (0..frames).flat_map(|f| (0..frame).map(move |j| (f * step + j) as f64)).collect();
    let index = node.model.constant(index, &[frames * frame], kiln_graph::DType::I64)?;
    let mut framed =
        x.index_select(1, &index)?.reshape(&[dims[0] as isize, frames as isize, frame as isize, dims[2] as isize])?;
    if let Some(w) = window {
        framed = framed.mul(&w.cast(x.dtype())?.reshape(&[1, 1, frame as isize, 1])?)?;
    }
    one(transform(node, &framed, 2, frame, false, node.int("onesided", 1) != 0)?)
}

#[cfg(test)]
mod tests {
    use super::super::testing::{int, run_one};
    use crate::value::Value;
    use kiln_graph::Tensor;

    /// A real signal's transform, forward then inverse, is the signal again; the forward of an impulse
    /// is flat, and onesided keeps the first half of the frequencies.
    #[test]
    fn a_transform_and_its_inverse_give_the_signal_back() {
        let v = [1f32, -2.0, 0.5, 3.0, 0.0, 1.5];
        let x = Tensor::from_slice(&v, &[1, 6, 1]).unwrap();
        let f = run_one("DFT", vec![int("axis", 1)], &[Some(Value::Tensor(x))]).expect("forward");
        assert_eq!(f[0].shape().as_concrete(), Some(vec![1, 6, 2]));
        let attrs = vec![int("axis", 1), int("inverse", 1)];
        let back = run_one("DFT", attrs, &[Some(Value::Tensor(f[0].clone()))]).expect("inverse");
        let got = back[0].to_vec::<f32>().unwrap();
        for (i, &want) in v.iter().enumerate() {
            assert!((got[2 * i] - want).abs() < 1e-5 && got[2 * i + 1].abs() < 1e-5, "{got:?}");
        }
        let impulse = Tensor::from_slice(&[1f32, 0.0, 0.0, 0.0], &[1, 4, 1]).unwrap();
        let attrs = vec![int("axis", 1), int("onesided", 1)];
        let half = run_one("DFT", attrs, &[Some(Value::Tensor(impulse))]).expect("onesided");
        assert_eq!(half[0].to_vec::<f32>().unwrap(), vec![1.0, 0.0, 1.0, 0.0, 1.0, 0.0]);
        let e = run_one(
            "DFT",
            vec![int("axis", 2)],
            &[Some(Value::Tensor(Tensor::from_slice(&[0f32; 4], &[1, 4, 1]).unwrap()))],
        );
        assert!(e.unwrap_err().starts_with("invalid"), "the last axis holds the parts");
    }

    /// Frames of a short-time transform: two frames of four samples every two from six, each a
    /// four-point transform with three onesided bins; frames longer than the signal are an error.
    #[test]
    fn a_short_time_transform_frames_then_transforms() {
        let signal = Tensor::from_slice(&[1f32, 0.0, 0.0, 0.0, 0.0, 0.0], &[1, 6, 1]).unwrap();
        let ints = |v: i64| Some(Value::Ints(crate::value::Ints::vector(vec![kiln_graph::sym::Expr::constant(v)])));
        let args = [Some(Value::Tensor(signal.clone())), ints(2), None, ints(4)];
        let out = run_one("STFT", vec![], &args).expect("stft");
        assert_eq!(out[0].shape().as_concrete(), Some(vec![1, 2, 3, 2]));
        // The first frame holds the impulse (a flat spectrum), the second none of it.
        assert_eq!(out[0].to_vec::<f32>().unwrap(), vec![1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
        let args = [Some(Value::Tensor(signal)), ints(2), None, ints(8)];
        assert!(run_one("STFT", vec![], &args).unwrap_err().starts_with("invalid"));
    }
}
