//! Ops whose output shape depends on their input's values — `Unique` and `NonZero` — computed on the
//! host from the input read back: under `compile` that read is a graph break, as `torch.unique` and
//! `nonzero` are for torch.compile, and the graph after it is traced with the exact result.

use super::{axis, invalid, unsupported, Node, OpResult};
use crate::value::Value;
use kiln_graph::{DType, Tensor};
use std::cmp::Ordering;

/// The op types this family converts.
pub(super) const OPS: &[&str] = &["NonZero", "Unique"];

/// The family; `None` when `op` is not one of it.
pub(super) fn run(node: &Node, op: &str) -> Option<OpResult<Vec<Value>>> {
    Some(match op {
        "NonZero" => non_zero(node),
        "Unique" => unique(node),
        _ => return None,
    })
}

/// The most elements kiln reads back for these ops.
const MAX_ELEMENTS: usize = 1 << 24;

/// Input 0's values and dims on the host.
fn host(node: &Node) -> OpResult<(Tensor, Vec<f64>, Vec<usize>)> {
    let x = node.tensor(0)?;
    let Some(dims) = x.shape().as_concrete() else { return unsupported("a data-shaped op over symbolic dims") };
    if dims.iter().product::<usize>() > MAX_ELEMENTS {
        return unsupported(format!("reading {dims:?} back to the host (up to {MAX_ELEMENTS} elements)"));
    }
    let values = x.to_data()?.values().to_vec();
    Ok((x, values, dims))
}

/// `NonZero`: the indices of the non-zero elements, `[rank, count]` in row-major order.
fn non_zero(node: &Node) -> OpResult<Vec<Value>> {
    let (_, values, dims) = host(node)?;
    let r = dims.len();
    let hits: Vec<usize> = values.iter().enumerate().filter(|(_, &v)| v != 0.0).map(|(i, _)| i).collect();
    let mut out = vec![0.0; r * hits.len()];
    for (k, &flat) in hits.iter().enumerate() {
        let mut rest = flat;
        for a in (0..r).rev() {
            out[a * hits.len() + k] = (rest % dims[a]) as f64;
            rest /= dims[a];
        }
    }
    Ok(vec![Value::Tensor(node.model.constant(out, &[r, hits.len()], DType::I64)?)])
}

/// `Unique`: the distinct elements (or slices along `axis`), sorted ascending (`sorted`, the default) or
/// in order of first occurrence; each one's first index, each input element's (slice's) index among
/// them, and each one's count — numpy's `unique` with every return.
fn unique(node: &Node) -> OpResult<Vec<Value>> {
    let (x, values, dims) = host(node)?;
    let (a, slice_dims) = match node.proto.attribute.iter().any(|p| p.name() == "axis") {
        true => {
            let a = axis(node.int("axis", 0), dims.len())?;
            (Some(a), dims.clone())
        }
        false => (None, vec![values.len()]),
    };
    let a0 = a.unwrap_or(0);
    let (outer, len, inner) =
        (slice_dims[..a0].iter().product::<usize>(), slice_dims[a0], slice_dims[a0 + 1..].iter().product::<usize>());
    // Slice k along the axis: its elements in row-major order of the other axes.
    let slice = |k: usize| -> Vec<f64> {
        (0..outer).flat_map(|o| (0..inner).map(move |i| (o * len + k) * inner + i)).map(|j| values[j]).collect()
    };
    let slices: Vec<Vec<f64>> = (0..len).map(slice).collect();
    if slices.iter().flatten().any(|v| v.is_nan()) {
        return invalid("Unique over NaN values (they equal nothing, so none is unique)");
    }
    let cmp = |p: &Vec<f64>, q: &Vec<f64>| p.partial_cmp(q).unwrap_or(Ordering::Equal);
    // Distinct slices in order of first occurrence, with their first index and count.
    // Slices keyed by their bits (-0 as 0, equal as floats): one hash lookup a slice, not a scan.
    let key = |s: &[f64]| -> Vec<u64> { s.iter().map(|&v| if v == 0.0 { 0 } else { v.to_bits() }).collect() };
    let mut seen: std::collections::HashMap<Vec<u64>, usize> = std::collections::HashMap::new();
    let mut firsts: Vec<usize> = Vec::new();
    let mut counts: Vec<usize> = Vec::new();
    let mut inverse = vec![0usize; len];
    for (k, s) in slices.iter().enumerate() {
        let u = *seen.entry(key(s)).or_insert_with(|| {
            firsts.push(k);
            counts.push(0);
            firsts.len() - 1
        });
        counts[u] += 1;
        inverse[k] = u;
    }
    let mut order: Vec<usize> = (0..firsts.len()).collect();
    if node.int("sorted", 1) != 0 {
        order.sort_by(|&p, &q| cmp(&slices[firsts[p]], &slices[firsts[q]]));
    }
    let mut rank = vec![0usize; order.len()];
    for (new, &old) in order.iter().enumerate() {
        rank[old] = new;
    }
    let u = order.len();
    // The distinct slices put back along the axis.
    let mut y = vec![0.0; outer * u * inner];
    for (new, &old) in order.iter().enumerate() {
        let s = &slices[firsts[old]];
        for o in 0..outer {
            for i in 0..inner {
                y[(o * u + new) * inner + i] = s[o * inner + i];
            }
        }
    }
    let mut y_dims = slice_dims.clone();
    y_dims[a0] = u;
    let ints = |v: Vec<usize>| -> OpResult<Value> {
        let n = v.len();
        Ok(Value::Tensor(node.model.constant(v.into_iter().map(|x| x as f64).collect(), &[n], DType::I64)?))
    };
    Ok(vec![
        Value::Tensor(node.model.constant(y, &y_dims, x.dtype())?),
        ints(order.iter().map(|&o| firsts[o]).collect())?,
        ints(inverse.iter().map(|&u| rank[u]).collect())?,
        ints(order.iter().map(|&o| counts[o]).collect())?,
    ])
}

#[cfg(test)]
mod tests {
    use super::super::testing::{int, run_one};
    use crate::value::Value;
    use kiln_graph::Tensor;

    /// numpy's example: `unique([2, 1, 1, 3, 4, 3])` sorted and in order of first occurrence, with every
    /// return; `nonzero` of a 2 × 2 mask.
    #[test]
    fn unique_and_nonzero_as_numpy() {
        let x = Tensor::from_slice(&[2f32, 1.0, 1.0, 3.0, 4.0, 3.0], &[6]).unwrap();
        let arg = [Some(Value::Tensor(x))];
        let sorted = run_one("Unique", vec![], &arg).unwrap();
        assert_eq!(sorted[0].to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
        assert_eq!(sorted[1].to_vec::<i64>().unwrap(), vec![1, 0, 3, 4]);
        assert_eq!(sorted[2].to_vec::<i64>().unwrap(), vec![1, 0, 0, 2, 3, 2]);
        assert_eq!(sorted[3].to_vec::<i64>().unwrap(), vec![2, 1, 2, 1]);
        let first = run_one("Unique", vec![int("sorted", 0)], &arg).unwrap();
        assert_eq!(first[0].to_vec::<f32>().unwrap(), vec![2.0, 1.0, 3.0, 4.0]);
        assert_eq!(first[2].to_vec::<i64>().unwrap(), vec![0, 1, 1, 2, 3, 2]);
        let mask = Tensor::from_slice(&[1f32, 0.0, 1.0, 1.0], &[2, 2]).unwrap();
        let nz = run_one("NonZero", vec![], &[Some(Value::Tensor(mask))]).unwrap();
        assert_eq!(nz[0].to_vec::<i64>().unwrap(), vec![0, 1, 1, 0, 0, 1]);
    }

    /// A quarter-million distinct values (and -0 beside 0, one value) are found by hashing, not by a
    /// scan of everything found so far.
    #[test]
    fn many_distinct_values_and_signed_zeros() {
        let n = 1usize << 18;
        let v: Vec<f32> = (0..n).map(|i| i as f32).collect();
        let started = std::time::Instant::now();
        let out = run_one("Unique", vec![], &[Some(Value::Tensor(Tensor::from_slice(&v, &[n]).unwrap()))]).unwrap();
        assert_eq!(out[0].shape().as_concrete(), Some(vec![n]));
        assert!(started.elapsed().as_secs() < 20, "{:?}", started.elapsed());
        let zeros = Tensor::from_slice(&[0f32, -0.0, 1.0], &[3]).unwrap();
        let out = run_one("Unique", vec![], &[Some(Value::Tensor(zeros))]).unwrap();
        assert_eq!(out[3].to_vec::<i64>().unwrap(), vec![2, 1]);
    }
}
