//! ONNX's `TopK` without a sort: the `k` largest (or smallest) elements along an axis taken one at a
//! time — the extreme of what is left, then the lowest index holding it (ONNX's order for ties) — so a
//! step is two reductions and a comparison over the axis, and `k` steps are unrolled into the graph.
//! That is the right shape for the small `k` models use (a classifier's top 5, a beam's width); kiln
//! has no sort, so a larger `k` is refused with a typed error rather than traced into a huge graph.

use super::{axis, invalid, unsupported, Node, OpResult};
use crate::value::Value;
use kiln_graph::{DType, Tensor};

/// The op types this family converts.
pub(super) const OPS: &[&str] = &["TopK"];

/// The largest `k` unrolled (each element taken is a step of the graph).
pub(super) const MAX_K: i64 = 64;

/// The family; `None` when `op` is not one of it.
pub(super) fn run(node: &Node, op: &str) -> Option<OpResult<Vec<Value>>> {
    (op == "TopK").then(|| top_k(node))
}

/// A value no element is beyond, in `x`'s dtype, on the side the taken elements are hidden at.
pub(super) fn beyond(dtype: DType, largest: bool) -> f64 {
    if largest {
        dtype.min_value()
    } else {
        dtype.max_value()
    }
}

fn top_k(node: &Node) -> OpResult<Vec<Value>> {
    let x = node.tensor(0)?;
    if x.dtype() == DType::Bool {
        return invalid("TopK of booleans");
    }
    let a = axis(node.int("axis", -1), x.rank())?;
    let k = match node.opset() {
        ..=9 => node.int("k", -1),
        _ => match node.const_ints(1, "k")?.as_deref() {
            Some([k]) => *k,
            _ => return invalid("K must hold one integer"),
        },
    };
    let largest = node.int("largest", 1) != 0;
    let Some(n) = x.shape().dims()[a].as_const() else { return unsupported("TopK over a symbolic axis") };
    if k < 0 || k > n {
        return invalid(format!("k = {k} of an axis of {n}"));
    }
    if k > MAX_K {
        return unsupported(format!("TopK with k = {k} > {MAX_K} (kiln has no sort: it takes elements one by one)"));
    }
    let ax = a as isize;
    if k == 0 {
        let values = x.narrow(ax, 0, 0)?;
        let indices = values.cast(DType::I64)?;
        return Ok(vec![Value::Tensor(values), Value::Tensor(indices)]);
    }
    let mut shape = vec![1isize; x.rank()];
    shape[a] = n as isize;
    let iota = Tensor::arange(0.0, n as f64, 1.0, DType::I64)?.reshape(&shape)?;
    // NaN counts as the extreme (kiln's max and min propagate it), the lowest-indexed NaN first.
    let nan = if x.dtype().is_float() { Some(x.isnan()?) } else { None };
    let (mut taken, mut values, mut indices): (Option<Tensor>, Vec<Tensor>, Vec<Tensor>) = (None, vec![], vec![]);
    for _ in 0..k {
        let left = match &taken {
            Some(t) => t.where_(beyond(x.dtype(), largest), &x)?,
            None => x.clone(),
        };
        let extreme = if largest { left.max(&[ax], true)? } else { left.min(&[ax], true)? };
        let mut hit = x.eq(&extreme)?;
        if let Some(nan) = &nan {
            hit = hit.logical_or(&nan.logical_and(&extreme.isnan()?)?)?;
        }
        if let Some(t) = &taken {
            hit = hit.logical_and(&t.logical_not()?)?;
        }
        let at = hit.where_(&iota, n as f64)?.min(&[ax], true)?;
        let now = iota.eq(&at)?;
        taken = Some(match taken {
            Some(t) => t.logical_or(&now)?,
            None => now,
        });
        values.push(extreme);
        indices.push(at);
    }
    let join = |v: Vec<Tensor>| Tensor::concat(&v.iter().collect::<Vec<_>>(), ax);
    Ok(vec![Value::Tensor(join(values)?), Value::Tensor(join(indices)?)])
}

#[cfg(test)]
mod tests {
    use super::super::testing::{int, run_one};
    use super::*;
    use crate::value::Ints;
    use kiln_graph::sym::Expr;

    /// TopK of `x` (a row) with `k` and `largest`: values, indices; or the conversion's message.
    fn top(x: &[f32], k: i64, largest: bool) -> Result<(Vec<f32>, Vec<i64>), String> {
        let k = Ints { dims: vec![1], dtype: DType::I64, values: vec![Expr::constant(k)] };
        let args = [Some(Value::Tensor(Tensor::from_slice(x, &[x.len()]).unwrap())), Some(Value::Ints(k))];
        let out = run_one("TopK", vec![int("largest", i64::from(largest))], &args)?;
        Ok((out[0].to_vec::<f32>().unwrap(), out[1].to_vec::<i64>().unwrap()))
    }

    #[test]
    fn ties_go_to_the_lower_index_and_both_directions_sort() {
        let x = [3.0, 1.0, 3.0, -2.0, 1.0];
        assert_eq!(top(&x, 3, true).unwrap(), (vec![3.0, 3.0, 1.0], vec![0, 2, 1]));
        assert_eq!(top(&x, 3, false).unwrap(), (vec![-2.0, 1.0, 1.0], vec![3, 1, 4]));
        assert_eq!(top(&x, 5, true).unwrap().1, vec![0, 2, 1, 4, 3]);
    }

    /// NaN is the extreme (kiln's max and min propagate it), each NaN taken once, lowest index first;
    /// infinities are values like any other (the hidden elements are not confused with them).
    #[test]
    fn nan_and_infinities() {
        let x = [1.0, f32::NAN, f32::NEG_INFINITY, f32::NAN, f32::NEG_INFINITY];
        let (v, i) = top(&x, 5, true).unwrap();
        assert_eq!(i, vec![1, 3, 0, 2, 4]);
        assert!(v[0].is_nan() && v[1].is_nan() && v[2] == 1.0 && v[3] == f32::NEG_INFINITY);
        assert_eq!(top(&[f32::INFINITY, 0.0, f32::INFINITY], 3, false).unwrap().1, vec![1, 0, 2]);
    }

    /// The k largest of negative i8 values: taken ones are hidden at i8's lowest value (`-inf` would wrap
    /// to 0 and beat them all), the smallest of u8 at its highest.
    #[test]
    fn narrow_integers_hide_taken_elements_at_their_own_ends() {
        let k = || Some(Value::Ints(Ints { dims: vec![1], dtype: DType::I64, values: vec![Expr::constant(2)] }));
        let x = Some(Value::Tensor(Tensor::from_slice(&[-5i8, -3, -9, -1], &[4]).unwrap()));
        let out = run_one("TopK", vec![], &[x, k()]).unwrap();
        assert_eq!((out[0].to_vec::<i8>().unwrap(), out[1].to_vec::<i64>().unwrap()), (vec![-1, -3], vec![3, 1]));
        let x = Some(Value::Tensor(Tensor::from_slice(&[250u8, 7, 255, 9], &[4]).unwrap()));
        let out = run_one("TopK", vec![int("largest", 0)], &[x, k()]).unwrap();
        assert_eq!((out[0].to_vec::<u8>().unwrap(), out[1].to_vec::<i64>().unwrap()), (vec![7, 9], vec![1, 3]));
    }

    #[test]
    fn a_k_beyond_the_axis_or_the_unrolling_bound_is_an_error() {
        assert!(top(&[1.0, 2.0], 3, true).unwrap_err().starts_with("invalid"));
        let long = vec![0.5; 100];
        let e = top(&long, MAX_K + 1, true).unwrap_err();
        assert!(e.starts_with("unsupported") && e.contains("no sort"), "{e}");
        assert_eq!(top(&long, MAX_K, true).unwrap().1.len(), MAX_K as usize);
    }
}
