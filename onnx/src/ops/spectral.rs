//! ONNX's `DFT`: the discrete Fourier transform along one axis as two products with constant cosine and
//! sine matrices (made on the host from the signal's length), so it runs on any backend's matmul. A
//! fast transform would take `n log n` operations against `n²`; the signals ONNX models transform (audio
//! frames, small spectra) are short, and a product is one kernel the compiler already schedules well.

use super::{axis, invalid, one, unsupported, Node, OpResult};
use crate::value::Value;
use kiln_graph::Tensor;

/// The op types this family converts.
pub(super) const OPS: &[&str] = &["DFT"];

/// The family; `None` when `op` is not one of it.
pub(super) fn run(node: &Node, op: &str) -> Option<OpResult<Vec<Value>>> {
    (op == "DFT").then(|| dft(node))
}

/// The largest transform length kiln builds matrices for: two `L × L` f64 tables on the host.
const MAX_LENGTH: usize = 4096;

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
    let inverse = node.int("inverse", 0) != 0;
    let onesided = node.int("onesided", 0) != 0;
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
    one(Tensor::concat(&[&stack(out_re)?, &stack(out_im)?], -1)?)
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
}
