//! ONNX's `MaxUnpool`: each value written back where `MaxPool`'s indices say it came from, zeros
//! elsewhere — a scatter of rows one element wide (`scatter::scatter_rows`) into the flat output.

use super::scatter::scatter_rows;
use super::{invalid, one, unsupported, Node, OpResult};
use crate::value::Value;
use kiln_graph::Tensor;

/// The op types this family converts.
pub(super) const OPS: &[&str] = &["MaxUnpool"];

/// The family; `None` when `op` is not one of it.
pub(super) fn run(node: &Node, op: &str) -> Option<OpResult<Vec<Value>>> {
    (op == "MaxUnpool").then(|| max_unpool(node))
}

/// `x` `[N, C, *in]` and its indices (flat over the inferred output) into `[N, C, *out]`.
fn max_unpool(node: &Node) -> OpResult<Vec<Value>> {
    let (x, indices) = (node.tensor(0)?, node.tensor(1)?);
    let (Some(xd), Some(id)) = (x.shape().as_concrete(), indices.shape().as_concrete()) else {
        return unsupported("MaxUnpool over symbolic dims");
    };
    if xd.len() < 3 || id != xd {
        return invalid(format!("values {xd:?} and indices {id:?} (the same shape, [N, C, ...])"));
    }
    let s = xd.len() - 2;
    let kernel = node.ints("kernel_shape").filter(|k| k.len() == s && k.iter().all(|&v| v > 0));
    let Some(kernel) = kernel else { return invalid(format!("kernel_shape for {s} spatial axes")) };
    let strides = node.ints("strides").unwrap_or_else(|| vec![1; s]);
    let pads = node.ints("pads").unwrap_or_else(|| vec![0; 2 * s]);
    if strides.len() != s || pads.len() != 2 * s || strides.iter().any(|&v| v < 1) || pads.iter().any(|&v| v < 0) {
        return invalid(format!("strides {strides:?} and pads {pads:?} for {s} spatial axes"));
    }
    // The indices address the inferred shape, `(in − 1)·stride + kernel − pads` per spatial axis; a
    // larger `output_shape` pads that result at the end (ONNX's reference).
    let mut out = xd[..2].to_vec();
    for a in 0..s {
        let len = (xd[2 + a] as i64 - 1) * strides[a] + kernel[a] - pads[a] - pads[s + a];
        if len < 0 {
            return invalid(format!("a negative output length on spatial axis {a}"));
        }
        out.push(len as usize);
    }
    let wanted: Vec<usize> = match node.const_ints(2, "output_shape")? {
        Some(shape) if shape.len() == xd.len() && shape.iter().zip(&out).all(|(&w, &o)| w >= o as i64) => {
            shape.into_iter().map(|v| v as usize).collect()
        }
        Some(shape) => return invalid(format!("output_shape {shape:?} smaller than the inferred {out:?}")),
        None => out.clone(),
    };
    let total: usize = out.iter().product();
    let count: usize = xd.iter().product();
    let zeros = Tensor::full(0.0, &[total, 1], x.dtype())?;
    let flat = scatter_rows(&zeros, &indices.reshape(&[count as isize])?, &x.reshape(&[count as isize, 1])?, "none")?;
    let dims: Vec<isize> = out.iter().map(|&d| d as isize).collect();
    let y = flat.reshape(&dims)?;
    if wanted == out {
        return one(y);
    }
    let pads: Vec<(usize, usize)> = wanted.iter().zip(&out).map(|(&w, &o)| (0, w - o)).collect();
    one(y.pad(&pads, 0.0)?)
}

#[cfg(test)]
mod tests {
    use super::super::testing::{ints, run_one};
    use crate::value::Value;
    use kiln_graph::{DType, Tensor};

    /// A 2 × 2 pool's maxima of a 4 × 4 plane put back where they were; mismatched indices are an error.
    #[test]
    fn values_go_back_where_they_came_from() {
        let x = Tensor::from_slice(&[5f32, 6.0, 7.0, 8.0], &[1, 1, 2, 2]).unwrap();
        let idx = Tensor::from_slice(&[5i64, 7, 13, 15], &[1, 1, 2, 2]).unwrap();
        let attrs = vec![ints("kernel_shape", &[2, 2]), ints("strides", &[2, 2])];
        let out = run_one("MaxUnpool", attrs.clone(), &[Some(Value::Tensor(x.clone())), Some(Value::Tensor(idx))]);
        let out = out.unwrap();
        assert_eq!(out[0].shape().as_concrete(), Some(vec![1, 1, 4, 4]));
        let mut want = vec![0f32; 16];
        (want[5], want[7], want[13], want[15]) = (5.0, 6.0, 7.0, 8.0);
        assert_eq!(out[0].to_vec::<f32>().unwrap(), want);
        let bad = Tensor::full(0.0, &[1, 1, 3], DType::I64).unwrap();
        let e = run_one("MaxUnpool", attrs, &[Some(Value::Tensor(x)), Some(Value::Tensor(bad))]).unwrap_err();
        assert!(e.starts_with("invalid"), "{e}");
    }
}
