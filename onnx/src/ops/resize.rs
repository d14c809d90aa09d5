//! `Resize` and `Upsample`: nearest and linear resampling as an index selection per resized axis
//! (nearest) or a blend of two selections (linear), with source positions and weights computed on the
//! host from ONNX's coordinate rules and held as model constants, so the traced graph is gathers and
//! pointwise math the compiler fuses.

use super::{invalid, one, unsupported, Node, OpError, OpResult};
use crate::value::Value;
use kiln_graph::DType;

/// The op types this family converts.
pub(super) const OPS: &[&str] = &["Resize", "Upsample"];

/// The family; `None` when `op` is not one of it.
pub(super) fn run(node: &Node, op: &str) -> Option<OpResult<Vec<Value>>> {
    Some(match op {
        "Resize" | "Upsample" => resize(node, op == "Upsample"),
        _ => return None,
    })
}

/// Where output position `o` of an axis resized from `len` to `out` (scale `scale`) samples the input.
/// ONNX's formulas read the resized length as `len * scale` before rounding (its reference does).
fn source(mode: &str, o: usize, len: usize, out: usize, scale: f64) -> OpResult<f64> {
    let o = o as f64;
    let resized = len as f64 * scale;
    Ok(match mode {
        "half_pixel" => (o + 0.5) / scale - 0.5,
        "pytorch_half_pixel" => {
            if resized > 1.0 {
                (o + 0.5) / scale - 0.5
            } else {
                0.0
            }
        }
        "align_corners" => {
            if resized > 1.0 {
                o * (len as f64 - 1.0) / (resized - 1.0)
            } else {
                0.0
            }
        }
        "asymmetric" => o / scale,
        "half_pixel_symmetric" => {
            let adjustment = out as f64 / (scale * len as f64);
            let center = len as f64 / 2.0;
            center * (1.0 - adjustment) + (o + 0.5) / scale - 0.5
        }
        other => return unsupported(format!("coordinate_transformation_mode {other:?}")),
    })
}

fn round_nearest(x: f64, mode: &str) -> OpResult<f64> {
    let half = (x - x.floor() - 0.5).abs() < 1e-9;
    Ok(match mode {
        "round_prefer_floor" if half => x.floor(),
        "round_prefer_ceil" if half => x.ceil(),
        "round_prefer_floor" | "round_prefer_ceil" => x.round(),
        "floor" => x.floor(),
        "ceil" => x.ceil(),
        other => return invalid(format!("nearest_mode {other:?}")),
    })
}

fn resize(node: &Node, upsample: bool) -> OpResult<Vec<Value>> {
    let x = node.tensor(0)?;
    let dims = x.shape().as_concrete().ok_or(OpError::Unsupported("resizing a tensor of symbolic shape".into()))?;
    let r = dims.len();
    let mode = node.string("mode").unwrap_or_else(|| "nearest".into());
    let old = upsample || node.opset() < 11;
    let coords = if old {
        "asymmetric".to_string()
    } else {
        node.string("coordinate_transformation_mode").unwrap_or_else(|| "half_pixel".into())
    };
    let nearest_mode = if old {
        "floor".to_string()
    } else {
        node.string("nearest_mode").unwrap_or_else(|| "round_prefer_floor".into())
    };
    if node.int("antialias", 0) != 0 {
        return unsupported("antialias = 1");
    }
    if !matches!(mode.as_str(), "nearest" | "linear" | "bilinear") {
        return unsupported(format!("mode {mode:?}"));
    }
    if mode != "nearest" && !x.dtype().is_float() {
        return unsupported(format!("linear resizing of {} tensors", x.dtype()));
    }
    if node.string("keep_aspect_ratio_policy").is_some_and(|p| p != "stretch") {
        return unsupported("keep_aspect_ratio_policy other than stretch");
    }
    // Scales and sizes, per axis of `axes` (all axes by default).
    let (scales, sizes) = if upsample && node.opset() < 9 {
        (
            node.proto
                .attribute
                .iter()
                .find(|a| a.name() == "scales")
                .map(|a| a.floats.iter().map(|&v| v as f64).collect()),
            None,
        )
    } else if old {
        (node.host_values(1)?, None)
    } else {
        let s = node.host_values(2)?.filter(|v| !v.is_empty());
        let z = node.host_values(3)?.filter(|v| !v.is_empty());
        (s, z)
    };
    let axes: Vec<usize> = match node.ints("axes") {
        Some(a) => a.iter().map(|&a| super::axis(a, r)).collect::<OpResult<_>>()?,
        None => (0..r).collect(),
    };
    let mut out = dims.clone();
    let mut scale = vec![1.0; r];
    match (scales, sizes) {
        (_, Some(z)) if z.len() == axes.len() => {
            for (k, &a) in axes.iter().enumerate() {
                out[a] = z[k].max(0.0) as usize;
                scale[a] = out[a] as f64 / dims[a] as f64;
            }
        }
        (Some(s), None) if s.len() == axes.len() => {
            for (k, &a) in axes.iter().enumerate() {
                if s[k] <= 0.0 {
                    return invalid(format!("scale {}", s[k]));
                }
                scale[a] = s[k];
                out[a] = (dims[a] as f64 * s[k]).floor() as usize;
            }
        }
        _ => return invalid("needs scales or sizes for each resized axis"),
    }
    let mut y = x;
    for a in 0..r {
        if out[a] == dims[a] && scale[a] == 1.0 {
            continue;
        }
        let len = dims[a];
        if len == 0 {
            return invalid(format!("resizing an empty axis {a} to {}", out[a]));
        }
        let pos: Vec<f64> = (0..out[a]).map(|o| source(&coords, o, len, out[a], scale[a])).collect::<OpResult<_>>()?;
        let clamp = |v: f64| v.clamp(0.0, len as f64 - 1.0);
        if mode == "nearest" {
            let idx: Vec<f64> =
                pos.iter().map(|&p| round_nearest(p, &nearest_mode).map(clamp)).collect::<OpResult<_>>()?;
            let idx = node.model.constant(idx, &[out[a]], DType::I64)?;
            y = y.index_select(a as isize, &idx)?;
        } else {
            let p: Vec<f64> = pos.into_iter().map(clamp).collect();
            let lo: Vec<f64> = p.iter().map(|v| v.floor()).collect();
            let hi: Vec<f64> = lo.iter().map(|v| (v + 1.0).min(len as f64 - 1.0)).collect();
            let w: Vec<f64> = p.iter().zip(&lo).map(|(v, l)| v - l).collect();
            let mut wd = vec![1usize; r];
            wd[a] = out[a];
            let a_lo = y.index_select(a as isize, &node.model.constant(lo, &[out[a]], DType::I64)?)?;
            let a_hi = y.index_select(a as isize, &node.model.constant(hi, &[out[a]], DType::I64)?)?;
            let w = node.model.constant(w, &wd, y.dtype())?;
            y = a_lo.add(&a_hi.sub(&a_lo)?.mul(&w)?)?;
        }
    }
    one(y)
}
