//! Shapes whose dims are symbolic expressions, PyTorch broadcasting, and the small view algebra (axis
//! normalisation, strides) that the IR, the reference and later the index expressions of kernels share.

use crate::sym::{Bindings, Expr, SymError};
use serde::{Deserialize, Serialize};
use std::fmt;

/// One dimension: a constant or an integer expression over symbols.
pub type Dim = Expr;

/// A tensor shape, outermost dim first.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub struct Shape(pub Vec<Dim>);

impl Shape {
    /// A shape of constant dims.
    pub fn from_dims(dims: &[usize]) -> Self {
        Shape(dims.iter().map(|&d| Expr::from(d)).collect())
    }

    /// The rank-0 shape of a scalar.
    pub fn scalar() -> Self {
        Shape(Vec::new())
    }

    /// The dims as a reshape target: constants as they are, a symbolic one as `-1` (a reshape infers
    /// one; two are its error).
    pub fn view_dims(&self) -> Vec<isize> {
        self.0.iter().map(|d| d.as_const().map_or(-1, |v| v as isize)).collect()
    }

    /// Number of dims.
    pub fn rank(&self) -> usize {
        self.0.len()
    }

    /// The dims.
    pub fn dims(&self) -> &[Dim] {
        &self.0
    }

    /// Element count, as an expression.
    pub fn numel(&self) -> Expr {
        self.0.iter().fold(Expr::from(1usize), |acc, d| acc * d.clone())
    }

    /// The number of elements, or an error when it overflows i64 or passes [`MAX_ELEMENTS`].
    pub fn checked_numel(&self) -> Result<Expr, crate::sym::SymError> {
        let mut n = Expr::from(1usize);
        for d in &self.0 {
            n = n.checked_mul(d)?;
        }
        if n.as_const().is_some_and(|c| c > MAX_ELEMENTS) {
            return Err(crate::sym::SymError::Overflow { expr: format!("{n} elements (more than 2^60)") });
        }
        Ok(n)
    }

    /// The dims as numbers when every dim is constant.
    pub fn as_concrete(&self) -> Option<Vec<usize>> {
        self.0.iter().map(|d| d.as_const().and_then(|c| usize::try_from(c).ok())).collect()
    }

    /// The dims under symbol values.
    pub fn eval(&self, bindings: &Bindings) -> Result<Vec<usize>, SymError> {
        self.0.iter().map(|d| d.eval(bindings).map(|v| v.max(0) as usize)).collect()
    }

    /// Row-major strides of a contiguous tensor of this shape, in elements.
    pub fn contiguous_strides(&self) -> Vec<Expr> {
        let mut strides = vec![Expr::from(1usize); self.rank()];
        for i in (0..self.rank().saturating_sub(1)).rev() {
            strides[i] = strides[i + 1].clone() * self.0[i + 1].clone();
        }
        strides
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

/// Why two dims cannot be broadcast.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BroadcastMismatch;

/// The shape that PyTorch's broadcasting rules give for two shapes: align at the right, a dim of 1
/// stretches, equal dims stay. Two symbolic dims broadcast only when they are the same expression:
/// kiln never guesses that `s0 == s1`.
pub fn broadcast_shapes(a: &Shape, b: &Shape) -> Result<Shape, BroadcastMismatch> {
    let rank = a.rank().max(b.rank());
    let one = Expr::from(1usize);
    let mut out = Vec::with_capacity(rank);
    for i in 0..rank {
        let da = dim_from_right(a, rank - 1 - i).unwrap_or(&one);
        let db = dim_from_right(b, rank - 1 - i).unwrap_or(&one);
        let d = if da == db || *db == one {
            da.clone()
        } else if *da == one {
            db.clone()
        } else {
            return Err(BroadcastMismatch);
        };
        out.push(d);
    }
    Ok(Shape(out))
}

fn dim_from_right(s: &Shape, from_right: usize) -> Option<&Dim> {
    s.rank().checked_sub(1 + from_right).map(|i| &s.0[i])
}

/// The shape left after reducing `axes` (kept as size 1 with `keepdim`).
pub fn reduced_shape(s: &Shape, axes: &[usize], keepdim: bool) -> Shape {
    let mut out = Vec::with_capacity(s.rank());
    for (i, d) in s.dims().iter().enumerate() {
        if !axes.contains(&i) {
            out.push(d.clone());
        } else if keepdim {
            out.push(Expr::from(1usize));
        }
    }
    Shape(out)
}

/// The most elements one tensor may have: its bytes and every index into it stay far inside i64.
pub const MAX_ELEMENTS: i64 = 1 << 60;

/// Turns a possibly negative axis into an index, or `None` when it is out of range.
pub fn normalize_axis(axis: isize, rank: usize) -> Option<usize> {
    let r = rank as isize;
    let a = if axis < 0 { axis + r } else { axis };
    (0..r).contains(&a).then_some(a as usize)
}

/// Row-major strides for concrete dims (the reference's layout).
pub fn concrete_strides(dims: &[usize]) -> Vec<usize> {
    let mut strides = vec![1usize; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * dims[i + 1];
    }
    strides
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcast_follows_pytorch() {
        let a = Shape::from_dims(&[8, 1, 3]);
        let b = Shape::from_dims(&[4, 1]);
        assert_eq!(broadcast_shapes(&a, &b).unwrap(), Shape::from_dims(&[8, 4, 3]));
        assert!(broadcast_shapes(&Shape::from_dims(&[3]), &Shape::from_dims(&[4])).is_err());
        assert_eq!(broadcast_shapes(&Shape::scalar(), &a).unwrap(), a);
    }

    #[test]
    fn strides_are_row_major() {
        assert_eq!(concrete_strides(&[2, 3, 4]), vec![12, 4, 1]);
        assert_eq!(
            Shape::from_dims(&[2, 3, 4]).contiguous_strides(),
            vec![Expr::from(12usize), Expr::from(4usize), Expr::from(1usize)]
        );
    }

    #[test]
    fn axes_normalize() {
        assert_eq!(normalize_axis(-1, 3), Some(2));
        assert_eq!(normalize_axis(3, 3), None);
        assert_eq!(normalize_axis(-4, 3), None);
        assert_eq!(normalize_axis(0, 0), None);
    }
}
