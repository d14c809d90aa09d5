//! ONNX's `GridSample` (spatial transformers, flow warping): every output position reads the input at
//! a position the grid gives in [-1, 1], by nearest, linear or cubic interpolation, with zeros,
//! border or reflection padding, over 2 or 3 spatial dims. It becomes pointwise arithmetic on the
//! grid (positions, taps, weights) and one gather a tap from the input flattened over its spatial
//! dims, all of which the compiler fuses; the grid is data, so nothing is computed on the host.

use super::{invalid, unsupported, Node, OpResult};
use crate::value::Value;
use kiln_graph::{DType, Tensor};

/// The op types this family converts.
pub(super) const OPS: &[&str] = &["GridSample"];

/// The family; `None` when `op` is not one of it.
pub(super) fn run(node: &Node, op: &str) -> Option<OpResult<Vec<Value>>> {
    (op == "GridSample").then(|| grid_sample(node))
}

#[derive(Clone, Copy, PartialEq)]
enum Padding {
    Zeros,
    Border,
    Reflection,
}

/// One spatial dim's geometry: its length and the range positions reflect within.
#[derive(Clone, Copy)]
struct Axis {
    len: usize,
    lo: f64,
    hi: f64,
}

impl Axis {
    /// `x` folded back into `[lo, hi]` as a mirror would (ONNX's `_gs_reflect`), elementwise.
    fn reflect(&self, x: &Tensor) -> kiln_graph::Result<Tensor> {
        let span = self.hi - self.lo;
        if span <= 0.0 {
            return x.mul(0.0)?.add(self.lo);
        }
        let fold = |d: &Tensor, near: f64, far: f64| -> kiln_graph::Result<Tensor> {
            let n = d.div(span)?.floor()?;
            let r = d.sub(&n.mul(span)?)?;
            let odd = n.sub(&n.div(2.0)?.floor()?.mul(2.0)?)?.gt(0.5)?;
            let toward = |from: f64, sign: f64| r.mul(sign)?.add(from);
            odd.where_(&toward(far, -sign_of(far - near))?, &toward(near, sign_of(far - near))?)
        };
        let below = fold(&x.neg()?.add(self.lo)?, self.lo, self.hi)?;
        let above = fold(&x.sub(self.hi)?, self.hi, self.lo)?;
        x.lt(self.lo)?.where_(&below, &x.gt(self.hi)?.where_(&above, x)?)
    }

    /// A continuous position outside `[lo, hi]` brought back as the padding says (zeros: left out).
    fn pad_position(&self, x: &Tensor, padding: Padding) -> kiln_graph::Result<Tensor> {
        match padding {
            Padding::Zeros => Ok(x.clone()),
            Padding::Border => {
                let out = x.lt(self.lo)?.logical_or(&x.gt(self.hi)?)?;
                out.where_(&x.maximum(0.0)?.minimum((self.len - 1) as f64)?, x)
            }
            Padding::Reflection => self.reflect(x),
        }
    }

    /// An integer tap position (as floats) as an index in range, and whether it reads the input
    /// (zeros padding reads nothing outside).
    fn tap(&self, i: &Tensor, padding: Padding) -> kiln_graph::Result<(Tensor, Option<Tensor>)> {
        let last = (self.len - 1) as f64;
        let (i, inside) = match padding {
            Padding::Zeros => (i.clone(), Some(i.ge(0.0)?.logical_and(&i.le(last)?)?)),
            Padding::Border => (i.clone(), None),
            // Reflected, then truncated toward zero as ONNX's reference does (`int()`).
            Padding::Reflection => {
                let r = self.reflect(i)?;
                (r.lt(0.0)?.where_(&r.ceil()?, &r.floor()?)?, None)
            }
        };
        Ok((i.maximum(0.0)?.minimum(last)?, inside))
    }
}

fn sign_of(v: f64) -> f64 {
    if v < 0.0 {
        -1.0
    } else {
        1.0
    }
}

/// Cubic convolution weights (a = -0.75) of the four taps around a position `t` past the first.
fn cubic(t: &Tensor) -> kiln_graph::Result<[Tensor; 4]> {
    let a = -0.75;
    let far = |x: &Tensor| -> kiln_graph::Result<Tensor> {
        // ((a(x) - 5a)x + 8a)x - 4a for 1 <= x <= 2
        x.mul(a)?.sub(5.0 * a)?.mul(x)?.add(8.0 * a)?.mul(x)?.sub(4.0 * a)
    };
    let near = |x: &Tensor| -> kiln_graph::Result<Tensor> {
        // ((a + 2)x - (a + 3))x² + 1 for x <= 1
        x.mul(a + 2.0)?.sub(a + 3.0)?.mul(x)?.mul(x)?.add(1.0)
    };
    let one_minus = t.neg()?.add(1.0)?;
    Ok([far(&t.add(1.0)?)?, near(t)?, near(&one_minus)?, far(&one_minus.add(1.0)?)?])
}

fn grid_sample(node: &Node) -> OpResult<Vec<Value>> {
    let (x, grid) = (node.tensor(0)?, node.tensor(1)?);
    let Some(xd) = x.shape().as_concrete() else { return unsupported("GridSample of symbolic input dims") };
    let Some(gd) = grid.shape().as_concrete() else { return unsupported("GridSample of a symbolic grid") };
    let r = xd.len().saturating_sub(2);
    if !(2..=3).contains(&r) || gd.len() != r + 2 || gd[0] != xd[0] || gd[r + 1] != r {
        return invalid(format!("a grid {gd:?} for an input {xd:?} (2 or 3 spatial dims)"));
    }
    if xd[2..].contains(&0) {
        return invalid(format!("GridSample of an input {xd:?} with an empty spatial dim"));
    }
    if !x.dtype().is_float() || !grid.dtype().is_float() {
        return invalid("GridSample of non-float tensors");
    }
    let mode = node.string("mode").unwrap_or_else(|| if node.opset() >= 20 { "linear" } else { "bilinear" }.into());
    let padding = match node.string("padding_mode").as_deref().unwrap_or("zeros") {
        "zeros" => Padding::Zeros,
        "border" => Padding::Border,
        "reflection" => Padding::Reflection,
        other => return invalid(format!("padding_mode {other:?}")),
    };
    let align = node.int("align_corners", 0) != 0;
    let (n, c) = (xd[0], xd[1]);
    let spatial = &xd[2..];
    let points: usize = gd[1..=r].iter().product();
    let axes: Vec<Axis> = spatial
        .iter()
        .map(|&len| match align {
            true => Axis { len, lo: 0.0, hi: len as f64 - 1.0 },
            false => Axis { len, lo: -0.5, hi: len as f64 - 0.5 },
        })
        .collect();
    // Positions in f32, one tensor per spatial dim in the input's order ([N, 1, points]); the grid
    // lists them innermost first (x, then y, then z).
    let g = grid.cast(DType::F32)?.reshape(&[n as isize, 1, points as isize, r as isize])?;
    let mut positions = Vec::with_capacity(r);
    for (d, axis) in axes.iter().enumerate() {
        let u = g.narrow(3, r - 1 - d, 1)?.reshape(&[n as isize, 1, points as isize])?;
        let len = axis.len as f64;
        let mut p = match align {
            true => u.add(1.0)?.mul((len - 1.0) / 2.0)?,
            false => u.add(1.0)?.mul(len)?.sub(1.0)?.div(2.0)?,
        };
        if mode == "nearest" {
            p = p.round()?;
        }
        positions.push(axis.pad_position(&p, padding)?);
    }
    // Each dim's taps: (position, weight).
    let mut taps: Vec<Vec<(Tensor, Option<Tensor>)>> = Vec::with_capacity(r);
    for p in &positions {
        taps.push(match mode.as_str() {
            "nearest" => vec![(p.clone(), None)],
            "bilinear" | "linear" => {
                let f = p.floor()?;
                let t = p.sub(&f)?;
                vec![(f.clone(), Some(t.neg()?.add(1.0)?)), (f.add(1.0)?, Some(t))]
            }
            "bicubic" | "cubic" if r == 2 => {
                let f = p.floor()?;
                let w = cubic(&p.sub(&f)?)?;
                w.into_iter()
                    .enumerate()
                    .map(|(k, w)| Ok((f.add(k as f64 - 1.0)?, Some(w))))
                    .collect::<OpResult<_>>()?
            }
            other => return unsupported(format!("GridSample mode {other:?} over {r} spatial dims")),
        });
    }
    let source = x.cast(DType::F32)?.reshape(&[n as isize, c as isize, spatial.iter().product::<usize>() as isize])?;
    let mut total: Option<Tensor> = None;
    let combos: usize = taps.iter().map(Vec::len).product();
    for combo in 0..combos {
        let (mut rest, mut flat, mut weight, mut inside): (usize, Option<Tensor>, Option<Tensor>, Option<Tensor>) =
            (combo, None, None, None);
        let mut stride = 1usize;
        for d in (0..r).rev() {
            let (pos, w) = &taps[d][rest % taps[d].len()];
            rest /= taps[d].len();
            let (index, ok) = axes[d].tap(pos, padding)?;
            let term = index.mul(stride as f64)?;
            flat = Some(match flat {
                Some(f) => f.add(&term)?,
                None => term,
            });
            stride *= axes[d].len;
            weight = match (weight, w) {
                (Some(a), Some(b)) => Some(a.mul(b)?),
                (a, b) => a.or_else(|| b.clone()),
            };
            inside = match (inside, ok) {
                (Some(a), Some(b)) => Some(a.logical_and(&b)?),
                (a, b) => a.or(b),
            };
        }
        let flat = flat.expect("a spatial dim").cast(DType::I64)?.expand(&[n as isize, c as isize, points as isize])?;
        let mut v = source.gather(2, &flat)?;
        if let Some(w) = weight {
            v = v.mul(&w)?;
        }
        if let Some(ok) = inside {
            v = ok.where_(&v, 0.0)?;
        }
        total = Some(match total {
            Some(t) => t.add(&v)?,
            None => v,
        });
    }
    let mut dims = vec![n as isize, c as isize];
    dims.extend(gd[1..=r].iter().map(|&d| d as isize));
    let out = total.expect("a tap").reshape(&dims)?.cast(x.dtype())?;
    Ok(vec![Value::Tensor(out)])
}

#[cfg(test)]
mod tests {
    use super::super::testing::{run_one, string};
    use super::*;

    fn t(dims: &[usize]) -> Option<Value> {
        let n = dims.iter().product();
        Some(Value::Tensor(Tensor::from_slice(&vec![0.25f32; n], dims).unwrap()))
    }

    #[test]
    fn a_grid_that_does_not_fit_or_a_cubic_volume_is_an_error() {
        let e = run_one("GridSample", vec![], &[t(&[1, 2, 4, 4]), t(&[1, 3, 3, 3])]).unwrap_err();
        assert!(e.starts_with("invalid"), "{e}");
        let e = run_one("GridSample", vec![], &[t(&[1, 1, 0, 4]), t(&[1, 2, 2, 2])]).unwrap_err();
        assert!(e.starts_with("invalid") && e.contains("empty"), "{e}");
        let cubic = vec![string("mode", "bicubic")];
        let e = run_one("GridSample", cubic, &[t(&[1, 1, 2, 2, 2]), t(&[1, 1, 1, 1, 3])]).unwrap_err();
        assert!(e.starts_with("unsupported"), "{e}");
    }

    /// Zeros padding reads nothing outside; border padding reads the edge.
    #[test]
    fn outside_the_input_zeros_and_border() {
        let x = Some(Value::Tensor(Tensor::from_slice(&[1f32, 2.0, 3.0, 4.0], &[1, 1, 2, 2]).unwrap()));
        let grid = Some(Value::Tensor(Tensor::from_slice(&[5f32, 5.0], &[1, 1, 1, 2]).unwrap()));
        let at = |padding: &str| {
            let out = run_one("GridSample", vec![string("padding_mode", padding)], &[x.clone(), grid.clone()]);
            out.unwrap()[0].to_vec::<f32>().unwrap()
        };
        assert_eq!(at("zeros"), vec![0.0]);
        assert_eq!(at("border"), vec![4.0]);
    }
}
