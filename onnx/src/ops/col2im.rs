//! ONNX's `Col2Im`: columns of image blocks (what `unfold` / im2col makes) summed back into an image —
//! the adjoint of im2col. Each of the block's taps is one slice of the columns, spread over the padded
//! image at its offset and stride (interleaved with zeros, then padded into place), and the taps added;
//! the padding is cut off at the end. The compiler fuses the sum into one kernel.

use super::{invalid, one, unsupported, Node, OpResult};
use crate::value::Value;
use kiln_graph::Tensor;

/// The op types this family converts.
pub(super) const OPS: &[&str] = &["Col2Im"];

/// The family; `None` when `op` is not one of it.
pub(super) fn run(node: &Node, op: &str) -> Option<OpResult<Vec<Value>>> {
    (op == "Col2Im").then(|| col2im(node))
}

/// The most taps a block may have: each is a slice and a sum in the traced graph.
const MAX_TAPS: usize = 1024;

/// `input` `[N, C·∏block, L]` summed into `[N, C, *image_shape]`, `L` the blocks' positions in row-major
/// order over the image's padded, strided, dilated grid.
fn col2im(node: &Node) -> OpResult<Vec<Value>> {
    let x = node.tensor(0)?;
    let image = sizes(node, 1, "image_shape")?;
    let block = sizes(node, 2, "block_shape")?;
    let s = image.len();
    if s == 0 || block.len() != s {
        return invalid(format!("image_shape {image:?} and block_shape {block:?} of different or no rank"));
    }
    let attr = |name: &str, n: usize, default: usize| -> OpResult<Vec<usize>> {
        match node.ints(name) {
            None => Ok(vec![default; n]),
            Some(v) if v.len() == n && v.iter().all(|&x| x >= 0) => Ok(v.into_iter().map(|x| x as usize).collect()),
            Some(v) => invalid(format!("{name} {v:?} for {s} spatial axes")),
        }
    };
    let (dil, pads, strides) = (attr("dilations", s, 1)?, attr("pads", 2 * s, 0)?, attr("strides", s, 1)?);
    if dil.contains(&0) || strides.contains(&0) {
        return invalid(format!("dilations {dil:?} and strides {strides:?} must be positive"));
    }
    let Some(dims) = x.shape().as_concrete() else { return unsupported("Col2Im over symbolic dims") };
    let taps: usize = block.iter().product();
    if dims.len() != 3 || taps == 0 || dims[1] % taps != 0 {
        return invalid(format!("input {dims:?} for blocks of {block:?} ([N, C·{taps}, L])"));
    }
    if taps > MAX_TAPS {
        return unsupported(format!("blocks of {taps} taps (kiln sums up to {MAX_TAPS})"));
    }
    // Each axis's padded length and block positions.
    let padded: Vec<usize> = (0..s).map(|a| image[a] + pads[a] + pads[s + a]).collect();
    let mut grid = Vec::with_capacity(s);
    for a in 0..s {
        let reach = dil[a] * (block[a] - 1) + 1;
        if block[a] == 0 || reach > padded[a] {
            return invalid(format!(
                "a block of {} (dilation {}) past the padded image's {}",
                block[a], dil[a], padded[a]
            ));
        }
        grid.push((padded[a] - reach) / strides[a] + 1);
    }
    if grid.iter().product::<usize>() != dims[2] {
        return invalid(format!("{} block positions where the image holds {grid:?}", dims[2]));
    }
    let c = dims[1] / taps;
    let mut shape = vec![dims[0] as isize, c as isize, taps as isize];
    shape.extend(grid.iter().map(|&g| g as isize));
    let cols = x.reshape(&shape)?;
    let mut total: Option<Tensor> = None;
    for t in 0..taps {
        let mut placed = cols.narrow(2, t, 1)?.squeeze(2)?;
        // The tap's position in the block, row-major.
        let mut rest = t;
        let mut at = vec![0; s];
        for a in (0..s).rev() {
            at[a] = rest % block[a];
            rest /= block[a];
        }
        for a in 0..s {
            placed = spread(&placed, 2 + a, at[a] * dil[a], strides[a], padded[a])?;
        }
        total = Some(match total {
            Some(sum) => sum.add(&placed)?,
            None => placed,
        });
    }
    let mut y = total.ok_or_else(|| super::OpError::Invalid("a block with no taps".into()))?;
    for a in 0..s {
        if pads[a] > 0 || pads[s + a] > 0 {
            y = y.narrow(2 + a as isize, pads[a], image[a])?;
        }
    }
    one(y)
}

/// Input `i`, a 1-D list of positive sizes known while tracing.
fn sizes(node: &Node, i: usize, what: &str) -> OpResult<Vec<usize>> {
    match node.const_ints(i, what)? {
        Some(v) if v.iter().all(|&x| x > 0) => Ok(v.into_iter().map(|x| x as usize).collect()),
        Some(v) => invalid(format!("{what} {v:?}")),
        None => invalid(format!("{what} is required")),
    }
}

/// `x` along axis `a` (length `n`) placed at `offset + i·stride` of an axis of length `len`, zeros
/// elsewhere (`offset + (n - 1)·stride < len`).
fn spread(x: &Tensor, a: usize, offset: usize, stride: usize, len: usize) -> OpResult<Tensor> {
    let mut dims: Vec<isize> = x.shape().as_concrete().unwrap_or_default().iter().map(|&d| d as isize).collect();
    let n = dims[a] as usize;
    let mut y = x.clone();
    if stride > 1 {
        // Each element followed by `stride - 1` zeros.
        let mut pads = vec![(0, 0); a + 2];
        pads[a + 1] = (0, stride - 1);
        y = y.unsqueeze(a as isize + 1)?.pad(&pads, 0.0)?;
        dims[a] = (n * stride) as isize;
        y = y.reshape(&dims)?;
    }
    let end = offset + n * stride;
    let mut pads = vec![(0, 0); a + 1];
    pads[a] = (offset, len.saturating_sub(end));
    y = y.pad(&pads, 0.0)?;
    if end > len {
        y = y.narrow(a as isize, 0, len)?;
    }
    Ok(y)
}

#[cfg(test)]
mod tests {
    use super::super::testing::run_one;
    use crate::value::{Ints, Value};
    use kiln_graph::sym::Expr;
    use kiln_graph::Tensor;

    fn ints(v: &[i64]) -> Option<Value> {
        Some(Value::Ints(Ints::vector(v.iter().map(|&x| Expr::constant(x)).collect())))
    }

    /// Overlapping 2 × 2 blocks of a 3 × 3 image (stride 1): each pixel is the sum of its copies, the
    /// centre in all four blocks; columns that do not fill the image's block grid are an error.
    #[test]
    fn overlapping_blocks_add_up() {
        // Four block positions, each of four taps, every value 1.
        let cols = Tensor::from_slice(&[1f32; 16], &[1, 4, 4]).unwrap();
        let out = run_one("Col2Im", vec![], &[Some(Value::Tensor(cols)), ints(&[3, 3]), ints(&[2, 2])]).unwrap();
        assert_eq!(out[0].shape().as_concrete(), Some(vec![1, 1, 3, 3]));
        assert_eq!(out[0].to_vec::<f32>().unwrap(), vec![1.0, 2.0, 1.0, 2.0, 4.0, 2.0, 1.0, 2.0, 1.0]);
        let short = Tensor::from_slice(&[1f32; 12], &[1, 4, 3]).unwrap();
        let e = run_one("Col2Im", vec![], &[Some(Value::Tensor(short)), ints(&[3, 3]), ints(&[2, 2])]).unwrap_err();
        assert!(e.starts_with("invalid"), "{e}");
    }
}
