//! ONNX's `DeformConv` (torchvision's `deform_conv2d`): a 2-D convolution whose every kernel tap reads
//! the input at its usual place moved by a learned offset (one per output position, tap and offset
//! group), bilinearly, optionally scaled by a mask. All on the device: the sampling positions are the
//! taps' places plus the offsets, each of the four bilinear corners a gather of the flattened map
//! (corners outside it read zero), and the convolution a batched matrix product of the weights with
//! the sampled columns, as im2col would give.

use super::{invalid, one, unsupported, Node, OpResult};
use crate::value::Value;
use kiln_graph::{DType, Tensor};

/// The op types this family converts.
pub(super) const OPS: &[&str] = &["DeformConv"];

/// The family; `None` when `op` is not one of it.
pub(super) fn run(node: &Node, op: &str) -> Option<OpResult<Vec<Value>>> {
    (op == "DeformConv").then(|| deform_conv(node))
}

/// `X` `[N, C, H, W]`, `W` `[OC, C/group, KH, KW]`, `offset` `[N, offset_group·2·KH·KW, OH, OW]` (each
/// tap's y then x), optional `B` `[OC]` and `mask` `[N, offset_group·KH·KW, OH, OW]`.
fn deform_conv(node: &Node) -> OpResult<Vec<Value>> {
    let (x, w, offset) = (node.tensor(0)?, node.tensor(1)?, node.tensor(2)?);
    let (bias, mask) = (node.opt_tensor(3)?, node.opt_tensor(4)?);
    let dims = |t: &Tensor| t.shape().as_concrete();
    let (Some(xd), Some(wd), Some(od)) = (dims(&x), dims(&w), dims(&offset)) else {
        return unsupported("DeformConv over symbolic dims");
    };
    let (&[n, c, h, wi], &[oc, cg, kh, kw]) = (&xd[..], &wd[..]) else {
        return invalid(format!("input {xd:?} and weight {wd:?} (2-D: [N, C, H, W], [OC, C/group, KH, KW])"));
    };
    let pair = |name: &str, default: usize| -> OpResult<(usize, usize)> {
        match node.ints(name) {
            None => Ok((default, default)),
            Some(v) if v.len() == 2 && v.iter().all(|&s| s >= 1) => Ok((v[0] as usize, v[1] as usize)),
            Some(v) => invalid(format!("{name} {v:?} (two, 1 or more)")),
        }
    };
    let ((sh, sw), (dh, dw)) = (pair("strides", 1)?, pair("dilations", 1)?);
    let pads = match node.ints("pads") {
        None => [0; 4],
        Some(p) if p.len() == 4 && p.iter().all(|&v| v >= 0) => [p[0], p[1], p[2], p[3]].map(|v| v as usize),
        Some(p) => return invalid(format!("pads {p:?} (four, 0 or more)")),
    };
    let (groups, og) = (node.int("group", 1), node.int("offset_group", 1));
    if groups < 1 || og < 1 {
        return invalid(format!("group {groups}, offset_group {og}"));
    }
    let (g, og) = (groups as usize, og as usize);
    let (span_h, span_w) = (dh * (kh.max(1) - 1) + 1, dw * (kw.max(1) - 1) + 1);
    if c != g * cg
        || oc % g != 0
        || c % og != 0
        || kh == 0
        || kw == 0
        || h + pads[0] + pads[2] < span_h
        || wi + pads[1] + pads[3] < span_w
    {
        return invalid(format!("input {xd:?}, weight {wd:?}, group {g}, offset_group {og}, pads {pads:?}"));
    }
    let (oh, ow) = ((h + pads[0] + pads[2] - span_h) / sh + 1, (wi + pads[1] + pads[3] - span_w) / sw + 1);
    let (k, p) = (kh * kw, oh * ow);
    if od != [n, og * 2 * k, oh, ow] {
        return invalid(format!("offset {od:?} (expected {:?})", [n, og * 2 * k, oh, ow]));
    }
    // Each tap's place before its offset, [1, 1, K, P]: y, then x.
    let place = |along_y: bool| -> Vec<f64> {
        let mut v = Vec::with_capacity(k * p);
        for (ky, kx) in (0..kh).flat_map(|a| (0..kw).map(move |b| (a, b))) {
            for (y, x) in (0..oh).flat_map(|a| (0..ow).map(move |b| (a, b))) {
                v.push(match along_y {
                    true => (y * sh + ky * dh) as f64 - pads[0] as f64,
                    false => (x * sw + kx * dw) as f64 - pads[1] as f64,
                });
            }
        }
        v
    };
    let off = offset.cast(DType::F32)?.reshape(&[n as isize, og as isize, k as isize, 2, p as isize])?;
    let at = |i: usize, along_y: bool| -> OpResult<Tensor> {
        let base = node.model.constant(place(along_y), &[1, 1, k, p], DType::F32)?;
        Ok(off.narrow(3, i, 1)?.reshape(&[n as isize, og as isize, k as isize, p as isize])?.add(&base)?)
    };
    let (y, xs) = (at(0, true)?, at(1, false)?);
    let (y0, x0) = (y.floor()?, xs.floor()?);
    let (fy, fx) = (y.sub(&y0)?, xs.sub(&x0)?);
    let per_group = c / og;
    let map = x.cast(DType::F32)?.reshape(&[n as isize, og as isize, per_group as isize, (h * wi) as isize])?;
    let spread = [n as isize, og as isize, per_group as isize, (k * p) as isize];
    let flat_taps = [n as isize, og as isize, 1, (k * p) as isize];
    let mut sampled: Option<Tensor> = None;
    for (cy, cx) in [(0.0, 0.0), (0.0, 1.0), (1.0, 0.0), (1.0, 1.0)] {
        let (ry, rx) = (y0.add(cy)?, x0.add(cx)?);
        let wy = if cy == 0.0 { fy.neg()?.add(1.0)? } else { fy.clone() };
        let wx = if cx == 0.0 { fx.neg()?.add(1.0)? } else { fx.clone() };
        let inside = ry.ge(0.0)?.logical_and(&ry.le((h - 1) as f64)?)?;
        let inside = inside.logical_and(&rx.ge(0.0)?)?.logical_and(&rx.le((wi - 1) as f64)?)?;
        let index = ry.clamp(Some(0.0), Some((h - 1) as f64))?.mul(wi as f64)?;
        let index = index.add(&rx.clamp(Some(0.0), Some((wi - 1) as f64))?)?.cast(DType::I64)?;
        let index = index.reshape(&flat_taps)?.expand(&spread)?;
        let weight = inside.where_(&wy.mul(&wx)?, 0.0)?.reshape(&flat_taps)?;
        let v = map.gather(3, &index)?.mul(&weight)?;
        sampled = Some(match sampled {
            Some(s) => s.add(&v)?,
            None => v,
        });
    }
    let mut sampled = sampled.expect("four corners");
    if let Some(m) = mask {
        if dims(&m).as_deref() != Some(&[n, og * k, oh, ow][..]) {
            return invalid(format!("mask {:?} (expected {:?})", dims(&m), [n, og * k, oh, ow]));
        }
        sampled = sampled.mul(&m.cast(DType::F32)?.reshape(&flat_taps)?)?;
    }
    // Columns [N, G, C/G·K, P] against weights [G, OC/G, C/G·K].
    let columns = sampled.reshape(&[n as isize, g as isize, (cg * k) as isize, p as isize])?;
    let weights = w.cast(DType::F32)?.reshape(&[1, g as isize, (oc / g) as isize, (cg * k) as isize])?;
    let mut y = weights.matmul(&columns)?.reshape(&[n as isize, oc as isize, oh as isize, ow as isize])?;
    if let Some(b) = bias {
        y = y.add(&b.cast(DType::F32)?.reshape(&[1, oc as isize, 1, 1])?)?;
    }
    one(y.cast(x.dtype())?)
}

#[cfg(test)]
mod tests {
    use super::super::testing::{ints, run_one};
    use crate::value::Value;
    use kiln_graph::Tensor;

    fn t(v: &[f32], dims: &[usize]) -> Option<Value> {
        Some(Value::Tensor(Tensor::from_slice(v, dims).unwrap()))
    }

    /// The map 0..9 (3 × 3), a 2 × 2 kernel of ones: with zero offsets a plain convolution; moved by
    /// half a pixel down-right, each tap reads the average of four neighbours, and past the edge zeros.
    #[test]
    fn taps_read_at_their_offsets_bilinearly() {
        let x: Vec<f32> = (0..9).map(|i| i as f32).collect();
        let w = [1.0f32; 4];
        let run = |offset: &[f32], mask: Option<&[f32]>| {
            let mut args = vec![t(&x, &[1, 1, 3, 3]), t(&w, &[1, 1, 2, 2]), t(offset, &[1, 8, 2, 2]), t(&[0.5], &[1])];
            args.push(mask.and_then(|m| t(m, &[1, 4, 2, 2])));
            run_one("DeformConv", vec![ints("kernel_shape", &[2, 2])], &args).unwrap()[0].to_vec::<f32>().unwrap()
        };
        // Plain: windows summing 0+1+3+4 = 8, 12, 20, 24, plus the bias.
        assert_eq!(run(&[0.0; 32], None), [8.5, 12.5, 20.5, 24.5]);
        // Half a pixel down-right: the first window's taps read 2, 3, 5, 6 (each a mean of four);
        // the last window's taps fall partly out of the map, reading zeros there: 6 + (5 + 8) / 4 +
        // (7 + 8) / 4 + 8 / 4.
        let half = [0.5f32; 32];
        let moved = run(&half, None);
        assert!((moved[0] - 16.5).abs() < 1e-5, "{moved:?}");
        assert!((moved[3] - (6.0 + 3.25 + 3.75 + 2.0 + 0.5)).abs() < 1e-5, "{moved:?}");
        // A mask of 0.5 halves every tap.
        assert_eq!(run(&[0.0; 32], Some(&[0.5; 16])), [4.5, 6.5, 10.5, 12.5]);
    }
}
