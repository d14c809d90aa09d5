//! `Resize` and `Upsample`: resampling one axis at a time, as an index selection (nearest), a blend of
//! two selections (linear), or a weighted sum of a fixed number of selections a position — "taps" —
//! (cubic, antialiased downsampling, crops with an extrapolation value), with source positions and
//! weights computed on the host from ONNX's coordinate rules and held as model constants, so the
//! traced graph is gathers and pointwise math the compiler fuses.

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

/// Where output position `o` of an axis resized from `len` to `out` (scale `scale`) samples the input;
/// `roi` is the axis's crop (`tf_crop_and_resize`), as fractions of the axis. ONNX's formulas read the
/// resized length as `len * scale` before rounding (its reference does).
fn source(mode: &str, o: usize, len: usize, out: usize, scale: f64, roi: (f64, f64)) -> OpResult<f64> {
    let o = o as f64;
    let resized = len as f64 * scale;
    let last = len as f64 - 1.0;
    Ok(match mode {
        "half_pixel" => (o + 0.5) / scale - 0.5,
        "pytorch_half_pixel" => {
            if resized > 1.0 {
                (o + 0.5) / scale - 0.5
            } else {
                -0.5
            }
        }
        "align_corners" => {
            if resized > 1.0 {
                o * last / (resized - 1.0)
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
        "tf_crop_and_resize" => {
            let span = (roi.1 - roi.0) * last;
            roi.0 * last + if resized == 1.0 { span / 2.0 } else { o * span / (resized - 1.0) }
        }
        other => return unsupported(format!("coordinate_transformation_mode {other:?}")),
    })
}

/// How a resize weighs its taps (see [`taps`]).
#[derive(Clone, Copy)]
enum Kernel {
    /// One tap, the nearest position (`nearest_mode`).
    Nearest,
    /// Two taps, or with antialiasing a triangle stretched by `1 / scale` when downsampling.
    Linear { antialias: bool },
    /// Four taps of Keys' cubic with coefficient `a`, or with antialiasing the same stretched.
    Cubic { a: f64, antialias: bool },
}

/// Keys' cubic convolution kernel at distance `x`, coefficient `a`.
fn cubic(a: f64, x: f64) -> f64 {
    let x = x.abs();
    if x <= 1.0 {
        ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a
    } else {
        0.0
    }
}

/// The input positions output position `x` (at source position `x_ori` of an axis of `len`, scale
/// `scale`) reads and their weights, as ONNX's reference computes them: the `n` positions nearest `x_ori`
/// (the one on its left preferred), read at the edge where they fall outside the axis, or with
/// `exclude_outside` weighed 0 and the rest renormalised.
fn taps(
    kernel: Kernel,
    x_ori: f64,
    len: usize,
    scale: f64,
    nearest_mode: &str,
    exclude_outside: bool,
) -> OpResult<Vec<(f64, f64)>> {
    let last = len as f64 - 1.0;
    if let Kernel::Nearest = kernel {
        return Ok(vec![(round_nearest(x_ori, nearest_mode)?.clamp(0.0, last), 1.0)]);
    }
    // The distance past the tap on the left, in (0, 1]: an exact position counts as 1 past its left
    // neighbour.
    let ratio = if x_ori.fract() == 0.0 { 1.0 } else { x_ori - x_ori.floor() };
    let shrink = scale.min(1.0);
    let weights: Vec<f64> = match kernel {
        Kernel::Nearest => unreachable!("returned above"),
        Kernel::Linear { antialias: false } => vec![1.0 - ratio, ratio],
        Kernel::Cubic { a, antialias: false } => (-1..3).map(|i| cubic(a, i as f64 - ratio)).collect(),
        Kernel::Linear { antialias: true } => {
            let start = (-1.0 / shrink).floor() as i64 + 1;
            (start..2 - start).map(|i| (1.0 - ((i as f64 - ratio) * shrink).abs()).clamp(0.0, 1.0)).collect()
        }
        Kernel::Cubic { a, antialias: true } => {
            let start = (-2.0 / shrink).floor() as i64 + 1;
            (start..2 - start).map(|i| cubic(a, (i as f64 - ratio) * shrink)).collect()
        }
    };
    let first = x_ori - ratio - (weights.len() / 2) as f64 + 1.0;
    let mut t: Vec<(f64, f64)> = weights.into_iter().enumerate().map(|(k, w)| (first + k as f64, w)).collect();
    if exclude_outside {
        for (i, w) in &mut t {
            if *i < 0.0 || *i > last {
                *w = 0.0;
            }
        }
    }
    let total: f64 = t.iter().map(|(_, w)| w).sum();
    let antialiased = matches!(kernel, Kernel::Linear { antialias: true } | Kernel::Cubic { antialias: true, .. });
    if (exclude_outside || antialiased) && total != 0.0 {
        t.iter_mut().for_each(|(_, w)| *w /= total);
    }
    Ok(t.into_iter().map(|(i, w)| (i.clamp(0.0, last), w)).collect())
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
    let antialias = node.int("antialias", 0) != 0;
    let kernel = match mode.as_str() {
        "nearest" => Kernel::Nearest,
        "linear" | "bilinear" => Kernel::Linear { antialias },
        "cubic" | "bicubic" => Kernel::Cubic { a: node.float("cubic_coeff_a", -0.75), antialias },
        other => return unsupported(format!("mode {other:?}")),
    };
    if mode != "nearest" && !x.dtype().is_float() {
        return unsupported(format!("{mode} resizing of {} tensors", x.dtype()));
    }
    let exclude_outside = node.int("exclude_outside", 0) != 0;
    let extrapolation = node.float("extrapolation_value", 0.0);
    let policy = node.string("keep_aspect_ratio_policy").unwrap_or_else(|| "stretch".into());
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
        (_, Some(z)) if z.len() == axes.len() && policy != "stretch" => {
            // One scale for every resized axis: the largest that fits the sizes, or the smallest that
            // covers them; each size rounded from it.
            let ratios = axes.iter().enumerate().map(|(k, &a)| z[k].max(0.0) / dims[a] as f64);
            let s = match policy.as_str() {
                "not_larger" => ratios.fold(f64::INFINITY, f64::min),
                "not_smaller" => ratios.fold(0.0, f64::max),
                other => return invalid(format!("keep_aspect_ratio_policy {other:?}")),
            };
            for &a in &axes {
                scale[a] = s;
                out[a] = (s * dims[a] as f64 + 0.5).floor() as usize;
            }
        }
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
    // The crop of each axis (`tf_crop_and_resize`): starts then ends, per axis of `axes`.
    let crop = coords == "tf_crop_and_resize";
    let mut roi = vec![(0.0, 1.0); r];
    if crop {
        match node.host_values(1)? {
            Some(v) if v.len() == 2 * axes.len() => {
                for (k, &a) in axes.iter().enumerate() {
                    roi[a] = (v[k], v[axes.len() + k]);
                }
            }
            _ => return invalid("tf_crop_and_resize needs a roi of a start and an end per resized axis"),
        }
    }
    let mut y = x;
    // Innermost axis first, as ONNX's reference nests them (a crop's extrapolated values then blend as
    // it blends them).
    for a in (0..r).rev() {
        if out[a] == dims[a] && scale[a] == 1.0 && roi[a] == (0.0, 1.0) {
            continue;
        }
        let len = dims[a];
        if len == 0 {
            return invalid(format!("resizing an empty axis {a} to {}", out[a]));
        }
        let pos: Vec<f64> =
            (0..out[a]).map(|o| source(&coords, o, len, out[a], scale[a], roi[a])).collect::<OpResult<_>>()?;
        let clamp = |v: f64| v.clamp(0.0, len as f64 - 1.0);
        let plain = !crop && !matches!(kernel, Kernel::Cubic { .. } | Kernel::Linear { antialias: true });
        y = if plain && mode == "nearest" {
            let idx: Vec<f64> =
                pos.iter().map(|&p| round_nearest(p, &nearest_mode).map(clamp)).collect::<OpResult<_>>()?;
            let idx = node.model.constant(idx, &[out[a]], DType::I64)?;
            y.index_select(a as isize, &idx)?
        } else if plain {
            let p: Vec<f64> = pos.into_iter().map(clamp).collect();
            let lo: Vec<f64> = p.iter().map(|v| v.floor()).collect();
            let hi: Vec<f64> = lo.iter().map(|v| (v + 1.0).min(len as f64 - 1.0)).collect();
            let w: Vec<f64> = p.iter().zip(&lo).map(|(v, l)| v - l).collect();
            let mut wd = vec![1usize; r];
            wd[a] = out[a];
            let a_lo = y.index_select(a as isize, &node.model.constant(lo, &[out[a]], DType::I64)?)?;
            let a_hi = y.index_select(a as isize, &node.model.constant(hi, &[out[a]], DType::I64)?)?;
            let w = node.model.constant(w, &wd, y.dtype())?;
            a_lo.add(&a_hi.sub(&a_lo)?.mul(&w)?)?
        } else {
            resample(
                node,
                &y,
                a,
                &pos,
                |p| {
                    // A crop's position outside the input takes the extrapolation value.
                    if crop && !(0.0..=len as f64 - 1.0).contains(&p) {
                        return Ok(None);
                    }
                    taps(kernel, p, len, scale[a], &nearest_mode, exclude_outside).map(Some)
                },
                extrapolation,
            )?
        };
    }
    one(y)
}

/// The most taps a resampled position may read: each is a gather of the whole tensor in the graph.
const MAX_TAPS: usize = 64;

/// `y` resampled along axis `a` at positions `pos`: each position's taps (`taps_of`; `None`: the
/// `extrapolation` value) as a sum of index selections weighted by model constants, one selection
/// per tap (positions with fewer taps weigh the rest 0).
fn resample(
    node: &Node,
    y: &kiln_graph::Tensor,
    a: usize,
    pos: &[f64],
    taps_of: impl Fn(f64) -> OpResult<Option<Vec<(f64, f64)>>>,
    extrapolation: f64,
) -> OpResult<kiln_graph::Tensor> {
    let each: Vec<Option<Vec<(f64, f64)>>> = pos.iter().map(|&p| taps_of(p)).collect::<OpResult<_>>()?;
    let n = each.iter().flatten().map(Vec::len).max().unwrap_or(0);
    if n > MAX_TAPS {
        return unsupported(format!(
            "resampling with {n} taps a position (antialiasing a steep downscale; up to {MAX_TAPS})"
        ));
    }
    let mut wd = vec![1usize; y.rank()];
    wd[a] = pos.len();
    let mut sum: Option<kiln_graph::Tensor> = None;
    for k in 0..n {
        let tap = |t: &Option<Vec<(f64, f64)>>| t.as_ref().and_then(|t| t.get(k)).copied().unwrap_or((0.0, 0.0));
        let idx: Vec<f64> = each.iter().map(|t| tap(t).0).collect();
        let w: Vec<f64> = each.iter().map(|t| tap(t).1).collect();
        let picked = y.index_select(a as isize, &node.model.constant(idx, &[pos.len()], DType::I64)?)?;
        let term = picked.mul(&node.model.constant(w, &wd, y.dtype())?)?;
        sum = Some(match sum {
            Some(s) => s.add(&term)?,
            None => term,
        });
    }
    let outside: Vec<f64> = each.iter().map(|t| if t.is_none() { extrapolation } else { 0.0 }).collect();
    let sum = match sum {
        Some(s) => s,
        None => return invalid("resampling with no taps"),
    };
    if outside.iter().any(|&v| v != 0.0) {
        return Ok(sum.add(&node.model.constant(outside, &wd, y.dtype())?)?);
    }
    Ok(sum)
}

#[cfg(test)]
mod tests {
    use super::super::testing::{int, run_one, string};
    use crate::value::Value;
    use kiln_graph::Tensor;

    /// Antialiasing a 100× downscale would read 200 taps a position (a gather each): refused with a
    /// typed error; a 2× downscale (four taps) runs, each output the mean of its window.
    #[test]
    fn steep_antialiased_downscales_are_refused() {
        let x = Tensor::from_slice(&(0..1000).map(|i| i as f32).collect::<Vec<_>>(), &[1, 1, 1000]).unwrap();
        let scales = |s: f32| Some(Value::Tensor(Tensor::from_slice(&[1f32, 1.0, s], &[3]).unwrap()));
        let attrs = vec![string("mode", "linear"), int("antialias", 1)];
        let args = [Some(Value::Tensor(x.clone())), None, scales(0.01)];
        let e = run_one("Resize", attrs.clone(), &args).unwrap_err();
        assert!(e.starts_with("unsupported") && e.contains("taps"), "{e}");
        let out = run_one("Resize", attrs, &[Some(Value::Tensor(x)), None, scales(0.5)]).unwrap();
        assert_eq!(out[0].shape().as_concrete(), Some(vec![1, 1, 500]));
        // Output 10 is centred on input 20.5: the triangle over 19..22 weighs 20 and 21 alike.
        assert!((out[0].to_vec::<f32>().unwrap()[10] - 20.5).abs() < 1e-4);
    }
}
