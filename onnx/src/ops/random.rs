//! ONNX's random ops that draw in the shape of a tensor: `Bernoulli` (1 with each element's
//! probability) and `RandomUniformLike` (its expanded form's draw). kiln draws with Philox4x32-10
//! under the node's `seed` ([`draw`]), the same numbers on every backend; numpy draws ONNX's
//! expected outputs, so the node tests check these by their contract (`tests/common/onnx.rs`).

use super::{invalid, one, Node, OpResult};
use crate::value::Value;
use kiln_graph::{DType, Tensor};

/// The op types this family converts.
pub(super) const OPS: &[&str] = &["Bernoulli", "RandomUniformLike"];

/// The family; `None` when `op` is not one of it.
pub(super) fn run(node: &Node, op: &str) -> Option<OpResult<Vec<Value>>> {
    Some(match op {
        "Bernoulli" => bernoulli(node),
        "RandomUniformLike" => uniform_like(node),
        _ => return None,
    })
}

/// The key and stream a random node draws with: its `seed` attribute (an int for `Dropout`, a float
/// for the others: its integer part) in stream 0; unseeded, key 0 in a stream of its own (FNV-1a of its
/// first output's name), so two unseeded nodes of one model draw unrelated numbers, the same each run.
pub(super) fn draw(node: &Node) -> (Tensor, u32) {
    match node.proto.attribute.iter().find(|a| a.name() == "seed") {
        Some(a) => {
            let seed = if a.f.is_some() { a.f() as i64 } else { a.i() };
            (Tensor::rng_key(seed as u32, 0), 0)
        }
        None => {
            let name = node.proto.output.first().map_or("", String::as_str);
            let stream = name.bytes().fold(0x811c_9dc5u32, |h, b| (h ^ u32::from(b)).wrapping_mul(0x0100_0193));
            (Tensor::rng_key(0, 0), stream)
        }
    }
}

/// The output dtype a `dtype` attribute asks for, else `default`.
fn dtype(node: &Node, default: DType) -> OpResult<DType> {
    match node.proto.attribute.iter().find(|a| a.name() == "dtype") {
        Some(a) => crate::tensor::dtype_of(a.i() as i32).map_err(super::OpError::Unsupported),
        None => Ok(default),
    }
}

/// 1 where a uniform draw falls below the input's probability, else 0, in `dtype` (the input's).
fn bernoulli(node: &Node) -> OpResult<Vec<Value>> {
    let p = node.tensor(0)?;
    if !p.dtype().is_float() {
        return invalid(format!("probabilities of {}", p.dtype()));
    }
    let out = dtype(node, p.dtype())?;
    let (key, stream) = draw(node);
    one(p.rand_like_in(&key, stream)?.lt(&p.cast(DType::F32)?)?.cast(out)?)
}

/// Uniform numbers in `[low, high)` in the input's shape, in `dtype` (the input's).
fn uniform_like(node: &Node) -> OpResult<Vec<Value>> {
    let x = node.tensor(0)?;
    let (low, high) = (node.float("low", 0.0), node.float("high", 1.0));
    if high < low {
        return invalid(format!("low {low} above high {high}"));
    }
    let out = dtype(node, x.dtype())?;
    let (key, stream) = draw(node);
    one(x.rand_like_in(&key, stream)?.mul(high - low)?.add(low)?.cast(out)?)
}

#[cfg(test)]
mod tests {
    use super::super::testing::run_one;
    use crate::value::Value;
    use kiln_graph::Tensor;

    #[test]
    fn draws_follow_their_probabilities_and_ranges() {
        let n = 4096;
        let p: Vec<f32> = (0..n).map(|i| [0.0, 1.0, 0.25][i % 3]).collect();
        let x = Some(Value::Tensor(Tensor::from_slice(&p, &[n]).unwrap()));
        let b = run_one("Bernoulli", vec![], std::slice::from_ref(&x)).unwrap()[0].to_vec::<f32>().unwrap();
        assert!(b
            .iter()
            .zip(&p)
            .all(|(&v, &q)| (q == 0.0 && v == 0.0) || (q == 1.0 && v == 1.0) || (q == 0.25 && (v == 0.0 || v == 1.0))));
        let quarter = b.iter().zip(&p).filter(|(_, &q)| q == 0.25).map(|(&v, _)| f64::from(v)).sum::<f64>();
        let draws = (n / 3) as f64;
        assert!((quarter - draws / 4.0).abs() < 5.0 * (draws * 0.1875).sqrt(), "{quarter} of {draws}");
        let u = run_one(
            "RandomUniformLike",
            vec![super::super::testing::float("low", -2.0), super::super::testing::float("high", 3.0)],
            &[x],
        )
        .unwrap();
        let u = u[0].to_vec::<f32>().unwrap();
        assert!(u.iter().all(|&v| (-2.0..3.0).contains(&v)), "a draw outside [-2, 3)");
        assert!(u.iter().any(|&v| v < -1.0) && u.iter().any(|&v| v > 2.0), "the draws span the range");
    }
}
