//! ONNX's `AffineGrid`: the sampling grid `GridSample` reads for an affine transform — every output
//! position's normalized coordinates (x innermost) times each batch entry's `theta`. The base
//! coordinates depend on the sizes alone and are made on the host as a constant; the product with
//! `theta` is one batched matmul on the device.

use super::{invalid, unsupported, Node, OpResult};
use crate::value::Value;
use kiln_graph::Tensor;

/// The op types this family converts.
pub(super) const OPS: &[&str] = &["AffineGrid"];

/// The most grid positions one node makes (their base coordinates are host memory).
pub(super) const MAX_POINTS: usize = 1 << 26;

/// The family; `None` when `op` is not one of it.
pub(super) fn run(node: &Node, op: &str) -> Option<OpResult<Vec<Value>>> {
    (op == "AffineGrid").then(|| affine_grid(node))
}

/// The normalized coordinates of `len` positions along a dim: pixel centres, or the corners at ±1.
fn coordinates(len: usize, align_corners: bool) -> Vec<f32> {
    (0..len)
        .map(|i| match (align_corners, len) {
            (true, 1) => 0.0,
            (true, _) => -1.0 + 2.0 * i as f32 / (len - 1) as f32,
            (false, _) => (2 * i + 1) as f32 / len as f32 - 1.0,
        })
        .collect()
}

fn affine_grid(node: &Node) -> OpResult<Vec<Value>> {
    let theta = node.tensor(0)?;
    let Some(size) = node.const_ints(1, "size")? else { return invalid("AffineGrid without a size") };
    let Some(td) = theta.shape().as_concrete() else { return unsupported("AffineGrid of a symbolic theta") };
    let r = size.len().saturating_sub(2);
    if !(2..=3).contains(&r) || td != [size[0].max(0) as usize, r, r + 1] || size.iter().any(|&d| d < 0) {
        return invalid(format!("theta {td:?} for a size {size:?} (2 or 3 spatial dims)"));
    }
    if !theta.dtype().is_float() {
        return invalid("AffineGrid of a non-float theta");
    }
    let align = node.int("align_corners", 0) != 0;
    let spatial: Vec<usize> = size[2..].iter().map(|&d| d as usize).collect();
    // The base coordinates are made on the host: a size from a file is bounded before they are.
    let points = spatial.iter().try_fold(1usize, |p, &d| p.checked_mul(d)).filter(|&p| p <= MAX_POINTS);
    let Some(points) = points else {
        return unsupported(format!("AffineGrid of {size:?}: over {MAX_POINTS} positions"));
    };
    // [points, r + 1]: each position's coordinates, x (the last dim's) first, then a 1.
    let axes: Vec<Vec<f32>> = spatial.iter().map(|&len| coordinates(len, align)).collect();
    let mut base = Vec::with_capacity(points * (r + 1));
    for p in 0..points {
        let (mut rest, mut coords) = (p, vec![0f32; r]);
        for d in (0..r).rev() {
            coords[d] = axes[d][rest % spatial[d]];
            rest /= spatial[d];
        }
        base.extend(coords.iter().rev());
        base.push(1.0);
    }
    let base = Tensor::from_slice(&base, &[points, r + 1])?.cast(theta.dtype())?;
    let grid = base.matmul(&theta.transpose(1, 2)?)?;
    let mut dims = vec![td[0] as isize];
    dims.extend(spatial.iter().map(|&d| d as isize));
    dims.push(r as isize);
    Ok(vec![Value::Tensor(grid.reshape(&dims)?)])
}

#[cfg(test)]
mod tests {
    use super::super::testing::run_one;
    use super::*;
    use crate::value::Ints;
    use kiln_graph::sym::Expr;

    fn size(v: &[i64]) -> Option<Value> {
        let values = v.iter().map(|&d| Expr::constant(d)).collect();
        Some(Value::Ints(Ints { dims: vec![v.len()], dtype: kiln_graph::DType::I64, values }))
    }

    /// The identity transform gives the base grid itself; a theta of the wrong shape is an error.
    #[test]
    fn identity_and_a_mismatched_theta() {
        let identity = Tensor::from_slice(&[1f32, 0.0, 0.0, 0.0, 1.0, 0.0], &[1, 2, 3]).unwrap();
        let out = run_one("AffineGrid", vec![], &[Some(Value::Tensor(identity)), size(&[1, 1, 2, 2])]).unwrap();
        assert_eq!(out[0].to_vec::<f32>().unwrap(), vec![-0.5, -0.5, 0.5, -0.5, -0.5, 0.5, 0.5, 0.5]);
        let bad = Tensor::from_slice(&[0f32; 6], &[1, 3, 2]).unwrap();
        let e = run_one("AffineGrid", vec![], &[Some(Value::Tensor(bad)), size(&[1, 1, 2, 2])]).unwrap_err();
        assert!(e.starts_with("invalid"), "{e}");
        // A hostile size is refused before the host makes its coordinates.
        let theta = Tensor::from_slice(&[0f32; 6], &[1, 2, 3]).unwrap();
        let huge = size(&[1, 1, 1 << 20, 1 << 20]);
        let e = run_one("AffineGrid", vec![], &[Some(Value::Tensor(theta)), huge]).unwrap_err();
        assert!(e.starts_with("unsupported") && e.contains("positions"), "{e}");
    }
}
