//! ONNX's `RoiAlign`: each region of interest pooled to a fixed grid of bins, each bin the average (or
//! the max) of bilinear samples of the feature map. Where the samples fall depends on the regions'
//! coordinates, so the regions and their batch indices (a few numbers each) are read back to the host
//! — a graph break under `compile`, as data-dependent sizes are — and each bin's taps are tabulated
//! there: a position in the feature map and a weight. The feature map stays on the device: one gather
//! of its positions by the taps, then a weighted sum (or max) a bin.

use super::{invalid, one, unsupported, Node, OpResult};
use crate::value::Value;
use kiln_graph::{DType, Tensor};

/// The op types this family converts.
pub(super) const OPS: &[&str] = &["RoiAlign"];

/// The family; `None` when `op` is not one of it.
pub(super) fn run(node: &Node, op: &str) -> Option<OpResult<Vec<Value>>> {
    (op == "RoiAlign").then(|| roi_align(node))
}

/// The most taps (bins × samples × 4 corners) kiln tabulates on the host.
const MAX_TAPS: usize = 1 << 24;

/// A padded sample's bias in max mode: it never wins.
const NEVER: f64 = -3.0e38;

/// One region's geometry, as ONNX's reference computes it.
struct Region {
    start: (f64, f64),
    bin: (f64, f64),
    grid: (usize, usize),
}

impl Region {
    /// The region `[x1, y1, x2, y2]` in input coordinates, for `bins` `(height, width)`.
    fn new(r: &[f64], scale: f64, half_pixel: bool, bins: (usize, usize), ratio: usize) -> Region {
        let offset = if half_pixel { 0.5 } else { 0.0 };
        let (x0, y0) = (r[0] * scale - offset, r[1] * scale - offset);
        let (mut w, mut h) = (r[2] * scale - offset - x0, r[3] * scale - offset - y0);
        if !half_pixel {
            // Malformed regions count as 1 × 1.
            (w, h) = (w.max(1.0), h.max(1.0));
        }
        let bin = (h / bins.0 as f64, w / bins.1 as f64);
        let grid = |extent: f64, n: usize| if ratio > 0 { ratio } else { (extent / n as f64).ceil().max(0.0) as usize };
        Region { start: (y0, x0), bin, grid: (grid(h, bins.0), grid(w, bins.1)) }
    }

    /// Sample `(iy, ix)` of bin `(py, px)`: its four corners' positions in an `h × w` map and their
    /// weights (all zero outside the map).
    fn taps(&self, (py, px): (usize, usize), (iy, ix): (usize, usize), (h, w): (usize, usize)) -> [(usize, f64); 4] {
        let at = |start: f64, bin: f64, p: usize, i: usize, n: usize| {
            start + p as f64 * bin + (i as f64 + 0.5) * bin / n as f64
        };
        let y = at(self.start.0, self.bin.0, py, iy, self.grid.0);
        let x = at(self.start.1, self.bin.1, px, ix, self.grid.1);
        if y < -1.0 || y > h as f64 || x < -1.0 || x > w as f64 {
            return [(0, 0.0); 4];
        }
        // The low corner, the high one (the same at the last row or column), and the offset between.
        let corner = |v: f64, n: usize| {
            let v = v.max(0.0);
            let low = v.floor() as usize;
            if low >= n - 1 {
                (n - 1, n - 1, 0.0)
            } else {
                (low, low + 1, v - low as f64)
            }
        };
        let ((y0, y1, ly), (x0, x1, lx)) = (corner(y, h), corner(x, w));
        let (hy, hx) = (1.0 - ly, 1.0 - lx);
        [(y0 * w + x0, hy * hx), (y0 * w + x1, hy * lx), (y1 * w + x0, ly * hx), (y1 * w + x1, ly * lx)]
    }
}

/// `X` `[N, C, H, W]`, `rois` `[R, 4]`, `batch_indices` `[R]` into `[R, C, output_height, output_width]`.
fn roi_align(node: &Node) -> OpResult<Vec<Value>> {
    let x = node.tensor(0)?;
    let Some(xd) = x.shape().as_concrete() else { return unsupported("RoiAlign over symbolic dims") };
    let [n, c, h, w] = xd[..] else { return invalid(format!("features {xd:?} ([N, C, H, W])")) };
    if !x.dtype().is_float() || h == 0 || w == 0 {
        return invalid(format!("features {xd:?} of {} (float, a non-empty map)", x.dtype()));
    }
    let (rois, batch) = match (node.host_values(1)?, node.host_values(2)?) {
        (Some(r), Some(b)) if r.len() == 4 * b.len() => (r, b),
        _ => return invalid("rois [R, 4] and batch_indices [R]"),
    };
    let avg = match node.string("mode").as_deref().unwrap_or("avg") {
        "avg" => true,
        "max" => false,
        other => return invalid(format!("mode {other:?} (avg or max)")),
    };
    let half_pixel = match node.string("coordinate_transformation_mode").as_deref() {
        Some("half_pixel") => true,
        Some("output_half_pixel") => false,
        // Opset 16 added the attribute, `half_pixel` by default; opset 10's regions are as
        // `output_half_pixel`.
        None => node.opset() >= 16,
        Some(other) => return invalid(format!("coordinate_transformation_mode {other:?}")),
    };
    let (ph, pw) = (node.int("output_height", 1), node.int("output_width", 1));
    let ratio = node.int("sampling_ratio", 0);
    if ph < 1 || pw < 1 || ratio < 0 {
        return invalid(format!("output {ph} × {pw}, sampling_ratio {ratio}"));
    }
    let (bins, ratio, scale) = ((ph as usize, pw as usize), ratio as usize, node.float("spatial_scale", 1.0));
    if batch.is_empty() {
        return one(Tensor::full(0.0, &[0, c, ph as usize, pw as usize], x.dtype())?);
    }
    let regions: Vec<Region> = rois.chunks(4).map(|r| Region::new(r, scale, half_pixel, bins, ratio)).collect();
    let samples = regions.iter().map(|r| r.grid.0.saturating_mul(r.grid.1)).max().unwrap_or(0).max(1);
    let (r_count, per_region) = (regions.len(), bins.0.saturating_mul(bins.1));
    let taps = [per_region, samples, 4].iter().fold(r_count, |a, &b| a.saturating_mul(b));
    if taps > MAX_TAPS {
        return unsupported(format!("{taps} taps tabulated on the host (up to {MAX_TAPS})"));
    }
    let (mut index, mut weight, mut bias) = (Vec::with_capacity(taps), Vec::with_capacity(taps), Vec::new());
    for (region, &b) in regions.iter().zip(&batch) {
        if b < 0.0 || b as usize >= n {
            return invalid(format!("batch index {b} of {n} images"));
        }
        let base = b as usize * h * w;
        let count = (region.grid.0 * region.grid.1).max(1) as f64;
        for bin in (0..bins.0).flat_map(|py| (0..bins.1).map(move |px| (py, px))) {
            for s in 0..samples {
                let real = s < region.grid.0 * region.grid.1;
                let corners =
                    if real { region.taps(bin, (s / region.grid.1, s % region.grid.1), (h, w)) } else { [(0, 0.0); 4] };
                for (pos, wt) in corners {
                    index.push((base + pos) as f64);
                    weight.push(if avg { wt / count } else { wt });
                }
                // A region of no samples pools to 0, as its first padded sample gives.
                bias.push(if real || s == 0 { 0.0 } else { NEVER });
            }
        }
    }
    let bins_total = r_count * per_region;
    let rows =
        x.reshape(&[n as isize, c as isize, (h * w) as isize])?.permute(&[0, 2, 1])?.reshape(&[-1, c as isize])?;
    let gathered = rows.index_select(0, &node.model.constant(index, &[taps], DType::I64)?)?.reshape(&[
        bins_total as isize,
        (samples * 4) as isize,
        c as isize,
    ])?;
    let weighted = gathered.mul(&node.model.constant(weight, &[bins_total, samples * 4, 1], x.dtype())?)?;
    let pooled = if avg {
        weighted.sum(&[1], false)?
    } else {
        let corners = weighted.reshape(&[bins_total as isize, samples as isize, 4, c as isize])?.max(&[2], false)?;
        corners.add(&node.model.constant(bias, &[bins_total, samples, 1], x.dtype())?)?.max(&[1], false)?
    };
    one(pooled.reshape(&[r_count as isize, bins.0 as isize, bins.1 as isize, c as isize])?.permute(&[0, 3, 1, 2])?)
}

#[cfg(test)]
mod tests {
    use super::super::testing::{int, run_one, string};
    use crate::value::Value;
    use kiln_graph::Tensor;

    fn args(rois: &[f32], batch: &[i64]) -> Vec<Option<Value>> {
        let x: Vec<f32> = (0..16).map(|i| i as f32).collect();
        let t = |v: Tensor| Some(Value::Tensor(v));
        vec![
            t(Tensor::from_slice(&x, &[1, 1, 4, 4]).unwrap()),
            t(Tensor::from_slice(rois, &[batch.len(), 4]).unwrap()),
            t(Tensor::from_slice(batch, &[batch.len()]).unwrap()),
        ]
    }

    fn close(got: &[f32], want: &[f32]) {
        assert_eq!(got.len(), want.len());
        assert!(got.iter().zip(want).all(|(g, w)| (g - w).abs() < 1e-5), "{got:?} vs {want:?}");
    }

    /// Values from a port of ONNX's reference on the map 0..16 (4 × 4).
    #[test]
    fn bins_average_or_take_the_max_of_their_samples() {
        let a = args(&[0.5, 0.5, 2.5, 3.0], &[0]);
        let attrs = |mode: &str| {
            vec![string("mode", mode), int("output_height", 2), int("output_width", 2), int("sampling_ratio", 2)]
        };
        let avg = run_one("RoiAlign", attrs("avg"), &a).unwrap();
        assert_eq!(avg[0].shape().as_concrete(), Some(vec![1, 1, 2, 2]));
        close(&avg[0].to_vec::<f32>().unwrap(), &[3.0, 4.0, 8.0, 9.0]);
        let max = run_one("RoiAlign", attrs("max"), &a).unwrap();
        close(&max[0].to_vec::<f32>().unwrap(), &[3.515625, 4.21875, 5.484375, 6.09375]);
        // Opset 10's coordinates, a sample grid from each region's size (16 samples, then 1).
        let two = args(&[0.0, 0.0, 4.0, 4.0, 1.0, 1.0, 2.0, 2.0], &[0, 0]);
        let out =
            run_one("RoiAlign", vec![string("coordinate_transformation_mode", "output_half_pixel")], &two).unwrap();
        close(&out[0].to_vec::<f32>().unwrap(), &[9.375, 7.5]);
    }

    #[test]
    fn bad_modes_and_batch_indices_are_typed_errors() {
        let e = run_one("RoiAlign", vec![string("mode", "sum")], &args(&[0.0, 0.0, 1.0, 1.0], &[0])).unwrap_err();
        assert!(e.starts_with("invalid") && e.contains("avg or max"), "{e}");
        let e = run_one("RoiAlign", vec![], &args(&[0.0, 0.0, 1.0, 1.0], &[3])).unwrap_err();
        assert!(e.contains("batch index 3 of 1"), "{e}");
    }
}
