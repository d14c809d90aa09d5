//! ONNX's scatters — `ScatterElements` (and its deprecated name `Scatter`) and `ScatterND` — without a
//! scatter op. Both become rows of a matrix replaced or combined by rows of updates: each update's
//! destination is a flat row number computed from its indices, and every destination row compares
//! itself with every update's (`[rows, updates, width]`), then sums, multiplies, maxes or mins the
//! updates that hit it. That is exact and runs on every backend, at a cost of rows × updates × width:
//! right for the index bookkeeping models export (a cache's slot, a mask's entries), so larger
//! scatters are refused with a typed error rather than traced into a huge comparison. An index out of
//! range (an error by ONNX's definition) hits no row and changes nothing.

use super::shape::{float_product, wrap_negative};
use super::top_k::beyond;
use super::{axis, invalid, unsupported, Node, OpResult};
use crate::value::Value;
use kiln_graph::{DType, Tensor};

/// The op types this family converts.
pub(super) const OPS: &[&str] = &["Scatter", "ScatterElements", "ScatterND"];

/// The most (destination row, update, column) triples one scatter compares.
pub(super) const MAX_TRIPLES: usize = 1 << 24;

/// The family; `None` when `op` is not one of it.
pub(super) fn run(node: &Node, op: &str) -> Option<OpResult<Vec<Value>>> {
    Some(match op {
        "Scatter" | "ScatterElements" => elements(node),
        "ScatterND" => nd(node),
        _ => return None,
    })
}

fn concrete(t: &Tensor, what: &str) -> OpResult<Vec<usize>> {
    match t.shape().as_concrete() {
        Some(d) => Ok(d),
        None => unsupported(format!("a scatter with symbolic {what} dims")),
    }
}

/// `i` counted from the end of an axis of `n` when negative (ONNX's rule for indices).
fn from_end(i: &Tensor, n: usize) -> OpResult<Tensor> {
    wrap_negative(i, &kiln_graph::sym::Expr::constant(n as i64))
}

/// `data` (`[rows, width]`) with rows `at` (`[k]`, flat row numbers) replaced by, or combined by
/// `reduction` with, the rows of `updates` (`[k, width]`).
pub(super) fn scatter_rows(data: &Tensor, at: &Tensor, updates: &Tensor, reduction: &str) -> OpResult<Tensor> {
    let (rows, width) = match concrete(data, "data")?[..] {
        [rows, width] => (rows, width),
        _ => return invalid("scatter rows of a matrix"),
    };
    let k = concrete(at, "index")?.iter().product::<usize>();
    if rows.saturating_mul(k).saturating_mul(width) > MAX_TRIPLES {
        return unsupported(format!(
            "a scatter of {k} updates into {rows} rows of {width} (over {MAX_TRIPLES} comparisons: kiln has no scatter op)"
        ));
    }
    let dtype = data.dtype();
    let hit = Tensor::arange(0.0, rows as f64, 1.0, DType::I64)?
        .reshape(&[rows as isize, 1, 1])?
        .eq(&at.reshape(&[1, k as isize, 1])?)?;
    let updates = updates.reshape(&[1, k as isize, width as isize])?;
    let touched = hit.cast(DType::I32)?.sum(&[1], false)?.gt(0.0)?;
    let sum = || -> OpResult<Tensor> { Ok(hit.where_(&updates, 0.0)?.sum(&[1], false)?.cast(dtype)?) };
    Ok(match reduction {
        "none" => touched.where_(&sum()?, data)?,
        "add" => data.add(&sum()?)?,
        "mul" if dtype.is_float() => data.mul(&float_product(&hit.where_(&updates, 1.0)?, &[1], false)?)?,
        "max" => data.maximum(&hit.where_(&updates, beyond(dtype, true))?.max(&[1], false)?)?,
        "min" => data.minimum(&hit.where_(&updates, beyond(dtype, false))?.min(&[1], false)?)?,
        other => return unsupported(format!("reduction {other:?} of {dtype}")),
    })
}

fn reduction(node: &Node) -> String {
    node.string("reduction").unwrap_or_else(|| "none".into())
}

fn elements(node: &Node) -> OpResult<Vec<Value>> {
    let (data, indices, updates) = (node.tensor(0)?, node.tensor(1)?, node.tensor(2)?);
    let a = axis(node.int("axis", 0), data.rank())?;
    let (dd, ud) = (concrete(&data, "data")?, concrete(&updates, "update")?);
    if concrete(&indices, "index")? != ud || ud.len() != dd.len() {
        return invalid("indices and updates must have one shape, of data's rank");
    }
    if ud.iter().zip(&dd).enumerate().any(|(d, (u, n))| d != a && u > n) {
        return invalid("updates reach past data off the scatter axis");
    }
    // Each update's flat position in data: its own coordinates, the index's along the axis.
    let mut at = from_end(&indices.cast(DType::I64)?, dd[a])?;
    let mut stride = 1usize;
    for d in (0..dd.len()).rev() {
        if d == a {
            at = at.mul(stride as f64)?;
        }
        stride *= dd[d];
    }
    let mut stride = 1usize;
    for d in (0..dd.len()).rev() {
        if d != a {
            let mut shape = vec![1isize; dd.len()];
            shape[d] = ud[d] as isize;
            let c = Tensor::arange(0.0, ud[d] as f64, 1.0, DType::I64)?.reshape(&shape)?;
            at = at.add(&c.mul(stride as f64)?)?;
        }
        stride *= dd[d];
    }
    let (total, k) = (dd.iter().product::<usize>() as isize, ud.iter().product::<usize>() as isize);
    let flat =
        scatter_rows(&data.reshape(&[total, 1])?, &at.reshape(&[k])?, &updates.reshape(&[k, 1])?, &reduction(node))?;
    let dims: Vec<isize> = dd.iter().map(|&d| d as isize).collect();
    Ok(vec![Value::Tensor(flat.reshape(&dims)?)])
}

fn nd(node: &Node) -> OpResult<Vec<Value>> {
    let (data, indices, updates) = (node.tensor(0)?, node.tensor(1)?, node.tensor(2)?);
    let (dd, id) = (concrete(&data, "data")?, concrete(&indices, "index")?);
    let Some((&q, lead)) = id.split_last() else { return invalid("indices of rank 0") };
    if q > dd.len() {
        return invalid(format!("index tuples of {q} into data of rank {}", dd.len()));
    }
    let want: Vec<usize> = lead.iter().chain(&dd[q..]).copied().collect();
    if concrete(&updates, "update")? != want {
        return invalid(format!("updates must be {want:?}"));
    }
    let (rows, width, k) =
        (dd[..q].iter().product::<usize>(), dd[q..].iter().product::<usize>(), lead.iter().product::<usize>());
    // Each index tuple's flat row over data's first `q` dims.
    let tuples = indices.cast(DType::I64)?.reshape(&[k as isize, q as isize])?;
    let mut at = Tensor::zeros(&[k, 1], DType::I64)?;
    let mut stride = 1usize;
    for j in (0..q).rev() {
        let c = from_end(&tuples.narrow(1, j, 1)?, dd[j])?;
        at = at.add(&c.mul(stride as f64)?)?;
        stride *= dd[j];
    }
    let data2 = data.reshape(&[rows as isize, width as isize])?;
    let upd2 = updates.reshape(&[k as isize, width as isize])?;
    let out = scatter_rows(&data2, &at.reshape(&[k as isize])?, &upd2, &reduction(node))?;
    let dims: Vec<isize> = dd.iter().map(|&d| d as isize).collect();
    Ok(vec![Value::Tensor(out.reshape(&dims)?)])
}

#[cfg(test)]
mod tests {
    use super::super::testing::{int, run_one, string};
    use super::*;

    fn t<T: kiln_graph::Element>(v: &[T], dims: &[usize]) -> Option<Value> {
        Some(Value::Tensor(Tensor::from_slice(v, dims).unwrap()))
    }

    /// Integer data summed into (duplicates add up); an index from the end; an index out of range
    /// hits no row.
    #[test]
    fn integer_adds_negative_and_out_of_range_indices() {
        let args = [t(&[1i32, 2, 3, 4], &[4]), t(&[1i64, -1, 1, 9], &[4]), t(&[10i32, 20, 30, 40], &[4])];
        let out = run_one("ScatterElements", vec![string("reduction", "add")], &args).unwrap();
        assert_eq!(out[0].to_vec::<i32>().unwrap(), vec![1, 42, 3, 24]);
        let out = run_one("ScatterElements", vec![int("axis", 0)], &args[..]).unwrap();
        assert_eq!(out[0].to_vec::<i32>().unwrap()[0], 1, "row 0 is hit by nothing");
    }

    #[test]
    fn a_scatter_past_the_comparison_bound_is_an_error() {
        let n = 1 << 13;
        let args =
            [t(&vec![0f32; n * n / 8], &[n * n / 8]), t(&vec![0i64; 8192], &[8192]), t(&vec![1f32; 8192], &[8192])];
        let e = run_one("ScatterElements", vec![], &args).unwrap_err();
        assert!(e.starts_with("unsupported") && e.contains("no scatter op"), "{e}");
    }
}
