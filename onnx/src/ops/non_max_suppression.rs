//! ONNX's `NonMaxSuppression`: per batch and class, boxes taken greedily by descending score, each
//! dropped when it overlaps one already taken by more than the IoU threshold. How many boxes survive
//! depends on the values, so it runs on the host from the boxes and scores read back — under `compile`
//! a graph break, as torchvision's `nms` is outside torch.compile's graph — and the selected indices
//! come back as an `[n, 3]` int64 constant (batch, class, box).

use super::{invalid, unsupported, Node, OpResult};
use crate::value::Value;
use kiln_graph::DType;

/// The op types this family converts.
pub(super) const OPS: &[&str] = &["NonMaxSuppression"];

/// The family; `None` when `op` is not one of it.
pub(super) fn run(node: &Node, op: &str) -> Option<OpResult<Vec<Value>>> {
    (op == "NonMaxSuppression").then(|| non_max_suppression(node))
}

/// The most box-and-class pairs kiln reads back and compares on the host (the greedy pass compares
/// each candidate with every box taken before it).
const MAX_CANDIDATES: usize = 1 << 20;

/// An axis-aligned box by its extent on each axis.
#[derive(Clone, Copy, Debug)]
struct Extent {
    x: (f64, f64),
    y: (f64, f64),
}

impl Extent {
    /// A box as ONNX lays it out: `[y1, x1, y2, x2]` with the corners in either order
    /// (`center_point_box` 0), or `[x_center, y_center, width, height]` (1).
    fn of(b: &[f64], center_point: bool) -> Extent {
        let span = |a: f64, b: f64| (a.min(b), a.max(b));
        match center_point {
            false => Extent { x: span(b[1], b[3]), y: span(b[0], b[2]) },
            true => Extent { x: (b[0] - b[2] / 2.0, b[0] + b[2] / 2.0), y: (b[1] - b[3] / 2.0, b[1] + b[3] / 2.0) },
        }
    }

    fn area(&self) -> f64 {
        (self.x.1 - self.x.0) * (self.y.1 - self.y.0)
    }

    /// Whether `self` and `other` overlap by more than `threshold` of their union. Boxes that only touch,
    /// and boxes of no area, overlap by nothing.
    fn overlaps(&self, other: &Extent, threshold: f64) -> bool {
        let w = self.x.1.min(other.x.1) - self.x.0.max(other.x.0);
        let h = self.y.1.min(other.y.1) - self.y.0.max(other.y.0);
        if w <= 0.0 || h <= 0.0 {
            return false;
        }
        let (a, b, inter) = (self.area(), other.area(), w * h);
        let union = a + b - inter;
        a > 0.0 && b > 0.0 && union > 0.0 && inter / union > threshold
    }
}

/// `boxes` `[B, N, 4]`, `scores` `[B, C, N]`; optional `max_output_boxes_per_class` (absent or 0: none
/// kept), `iou_threshold` (0) and `score_threshold` (absent: no box is dropped for its score, else a box
/// needs a score above it).
fn non_max_suppression(node: &Node) -> OpResult<Vec<Value>> {
    let (boxes, scores) = (node.tensor(0)?, node.tensor(1)?);
    let (Some(bd), Some(sd)) = (boxes.shape().as_concrete(), scores.shape().as_concrete()) else {
        return unsupported("NonMaxSuppression over symbolic dims");
    };
    if bd.len() != 3 || bd[2] != 4 || sd.len() != 3 || sd[0] != bd[0] || sd[2] != bd[1] {
        return invalid(format!("boxes {bd:?} and scores {sd:?} (boxes [B, N, 4], scores [B, C, N])"));
    }
    let (batches, classes, n) = (bd[0], sd[1], bd[1]);
    if batches * classes * n > MAX_CANDIDATES {
        return unsupported(format!(
            "{} box-and-class pairs on the host (up to {MAX_CANDIDATES})",
            batches * classes * n
        ));
    }
    let first = |i: usize, what: &str| -> OpResult<Option<f64>> {
        match node.host_values(i)? {
            None => Ok(None),
            Some(v) if v.len() <= 1 => Ok(v.first().copied()),
            Some(v) => invalid(format!("{what} of {} values (one, or none)", v.len())),
        }
    };
    let keep = first(2, "max_output_boxes_per_class")?.unwrap_or(0.0).max(0.0) as usize;
    let iou = first(3, "iou_threshold")?.unwrap_or(0.0);
    let score_floor = first(4, "score_threshold")?;
    let center_point = match node.int("center_point_box", 0) {
        0 => false,
        1 => true,
        other => return invalid(format!("center_point_box {other} (0 or 1)")),
    };
    let (b, s) = (boxes.to_data()?.values().to_vec(), scores.to_data()?.values().to_vec());
    let mut selected: Vec<f64> = Vec::new();
    for batch in 0..batches {
        let extents: Vec<Extent> = (0..n).map(|i| Extent::of(&b[(batch * n + i) * 4..][..4], center_point)).collect();
        for class in 0..classes {
            let score = &s[(batch * classes + class) * n..][..n];
            let mut order: Vec<usize> = (0..n).filter(|&i| score_floor.is_none_or(|f| score[i] > f)).collect();
            // Highest score first; equal scores by box index (a stable sort keeps it).
            order.sort_by(|&p, &q| score[q].total_cmp(&score[p]));
            let mut taken: Vec<usize> = Vec::new();
            for i in order {
                if taken.len() >= keep {
                    break;
                }
                if taken.iter().all(|&t| !extents[i].overlaps(&extents[t], iou)) {
                    taken.push(i);
                    selected.extend([batch as f64, class as f64, i as f64]);
                }
            }
        }
    }
    let rows = selected.len() / 3;
    Ok(vec![Value::Tensor(node.model.constant(selected, &[rows, 3], DType::I64)?)])
}

#[cfg(test)]
mod tests {
    use super::super::testing::{int, run_one};
    use crate::value::Value;
    use kiln_graph::{DType, Tensor};

    fn t(v: &[f32], dims: &[usize]) -> Option<Value> {
        Some(Value::Tensor(Tensor::from_slice(v, dims).unwrap()))
    }

    fn selected(out: &[Tensor]) -> Vec<i64> {
        assert_eq!(out[0].dtype(), DType::I64);
        out[0].to_vec::<i64>().unwrap()
    }

    /// Three boxes: 0 and 1 overlap by 0.6 of their union, 2 stands apart.
    fn three() -> (Option<Value>, Option<Value>) {
        let boxes = [0.0, 0.0, 1.0, 1.0, 0.0, 0.25, 1.0, 1.25, 0.0, 5.0, 1.0, 6.0];
        (t(&boxes, &[1, 3, 4]), t(&[0.9, 0.95, 0.5], &[1, 1, 3]))
    }

    #[test]
    fn overlapping_boxes_are_suppressed_by_score_order() {
        let (boxes, scores) = three();
        let max = t(&[10.0], &[1]);
        let run = |iou: f32| {
            selected(
                &run_one("NonMaxSuppression", vec![], &[boxes.clone(), scores.clone(), max.clone(), t(&[iou], &[1])])
                    .unwrap(),
            )
        };
        // IoU of 0 and 1: 0.75 / 1.25 = 0.6. Box 1 scores highest and is taken first.
        assert_eq!(run(0.5), [0, 0, 1, 0, 0, 2]);
        assert_eq!(run(0.6), [0, 0, 1, 0, 0, 0, 0, 0, 2], "an overlap equal to the threshold is kept");
        let floor = t(&[0.6], &[1]);
        let out = run_one("NonMaxSuppression", vec![], &[boxes.clone(), scores.clone(), max, t(&[0.7], &[1]), floor])
            .unwrap();
        assert_eq!(selected(&out), [0, 0, 1, 0, 0, 0], "box 2's score is under the floor");
        let one = run_one("NonMaxSuppression", vec![], &[boxes, scores, t(&[1.0], &[1]), t(&[0.0], &[1])]).unwrap();
        assert_eq!(selected(&one), [0, 0, 1]);
    }

    #[test]
    fn centre_boxes_no_limit_and_bad_shapes() {
        // The same three boxes as centres and sizes ([x_c, y_c, w, h]).
        let boxes = [0.5, 0.5, 1.0, 1.0, 0.75, 0.5, 1.0, 1.0, 5.5, 0.5, 1.0, 1.0];
        let args = [t(&boxes, &[1, 3, 4]), t(&[0.9, 0.95, 0.5], &[1, 1, 3]), t(&[5.0], &[1]), t(&[0.5], &[1])];
        let out = run_one("NonMaxSuppression", vec![int("center_point_box", 1)], &args).unwrap();
        assert_eq!(selected(&out), [0, 0, 1, 0, 0, 2]);
        let (boxes, scores) = three();
        let none = run_one("NonMaxSuppression", vec![], &[boxes.clone(), scores]).unwrap();
        assert_eq!(none[0].shape().as_concrete(), Some(vec![0, 3]), "no max_output_boxes_per_class keeps none");
        let e = run_one("NonMaxSuppression", vec![], &[boxes, t(&[0.9, 0.95], &[1, 1, 2])]).unwrap_err();
        assert!(e.starts_with("invalid") && e.contains("[B, C, N]"), "{e}");
    }
}
