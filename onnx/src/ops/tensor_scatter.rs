//! ONNX's `TensorScatter` (opset 24): a key/value cache updated in place — each batch item's new rows
//! written into its cache at its own position along the sequence axis (`linear`), or around its end
//! (`circular`). The positions (one a batch item) are read on the host (a graph break under `compile`
//! where they are data); each item's cache is then the concatenation of its kept and new pieces.

use super::{axis, invalid, one, unsupported, Node, OpResult};
use crate::value::Value;
use kiln_graph::Tensor;

/// The op types this family converts.
pub(super) const OPS: &[&str] = &["TensorScatter"];

/// The family; `None` when `op` is not one of it.
pub(super) fn run(node: &Node, op: &str) -> Option<OpResult<Vec<Value>>> {
    (op == "TensorScatter").then(|| tensor_scatter(node))
}

/// The most batch items kiln writes one by one.
const MAX_BATCH: usize = 4096;

/// `past_cache` `[B, …, M, …]`, `update` `[B, …, S, …]` (the same but for the sequence axis), optional
/// `write_indices` `[B]` (zeros): the cache with each item's `S` rows written from its index.
fn tensor_scatter(node: &Node) -> OpResult<Vec<Value>> {
    let (past, update) = (node.tensor(0)?, node.tensor(1)?);
    let (Some(pd), Some(ud)) = (past.shape().as_concrete(), update.shape().as_concrete()) else {
        return unsupported("TensorScatter over symbolic dims");
    };
    let a = axis(node.int("axis", -2), pd.len())?;
    let same_elsewhere = pd.len() == ud.len() && (0..pd.len()).all(|i| i == a || pd[i] == ud[i]);
    if a == 0 || !same_elsewhere || ud[a] > pd[a] {
        return invalid(format!("cache {pd:?} and update {ud:?} along axis {a} (not the batch axis)"));
    }
    let (batch, m, s) = (pd[0], pd[a], ud[a]);
    if batch > MAX_BATCH {
        return unsupported(format!("a batch of {batch} written item by item (up to {MAX_BATCH})"));
    }
    let circular = match node.string("mode").as_deref().unwrap_or("linear") {
        "linear" => false,
        "circular" => true,
        other => return invalid(format!("mode {other:?} (linear or circular)")),
    };
    let at = node.host_values(2)?.unwrap_or_else(|| vec![0.0; batch]);
    if at.len() != batch {
        return invalid(format!("{} write_indices for a batch of {batch}", at.len()));
    }
    let ax = a as isize;
    let mut items = Vec::with_capacity(batch);
    for (b, &w) in at.iter().enumerate() {
        if w < 0.0 || w as usize >= m.max(1) || (!circular && w as usize + s > m) {
            return invalid(format!("write index {w} for {s} rows of a cache of {m}"));
        }
        let w = w as usize;
        let (old, new) = (past.narrow(0, b, 1)?, update.narrow(0, b, 1)?);
        // Pieces along the axis: (source, start, length); a circular write past the end wraps to the start.
        let pieces: Vec<(&Tensor, usize, usize)> = if w + s <= m {
            vec![(&old, 0, w), (&new, 0, s), (&old, w + s, m - w - s)]
        } else {
            let wrapped = w + s - m;
            vec![(&new, s - wrapped, wrapped), (&old, wrapped, m - s), (&new, 0, s - wrapped)]
        };
        let parts = pieces
            .into_iter()
            .filter(|&(_, _, len)| len > 0)
            .map(|(t, start, len)| t.narrow(ax, start, len))
            .collect::<kiln_graph::Result<Vec<_>>>()?;
        items.push(Tensor::concat(&parts.iter().collect::<Vec<_>>(), ax)?);
    }
    one(Tensor::concat(&items.iter().collect::<Vec<_>>(), 0)?)
}

#[cfg(test)]
mod tests {
    use super::super::testing::{int, run_one, string};
    use crate::value::Value;
    use kiln_graph::Tensor;

    /// Two items, a cache of 4 rows of 1, two new rows each, written at 1 and 3.
    fn run(mode: &str, at: &[i64]) -> Result<Vec<f32>, String> {
        let past = Tensor::from_slice(&[0.0f32, 1.0, 2.0, 3.0, 10.0, 11.0, 12.0, 13.0], &[2, 4, 1]).unwrap();
        let update = Tensor::from_slice(&[-1.0f32, -2.0, -3.0, -4.0], &[2, 2, 1]).unwrap();
        let idx = Tensor::from_slice(at, &[2]).unwrap();
        let args = [Some(Value::Tensor(past)), Some(Value::Tensor(update)), Some(Value::Tensor(idx))];
        let out = run_one("TensorScatter", vec![string("mode", mode), int("axis", 1)], &args)?;
        Ok(out[0].to_vec::<f32>().unwrap())
    }

    #[test]
    fn rows_are_written_at_each_items_index() {
        assert_eq!(run("linear", &[1, 2]).unwrap(), [0.0, -1.0, -2.0, 3.0, 10.0, 11.0, -3.0, -4.0]);
        assert_eq!(run("circular", &[1, 3]).unwrap(), [0.0, -1.0, -2.0, 3.0, -4.0, 11.0, 12.0, -3.0]);
        let e = run("linear", &[1, 3]).unwrap_err();
        assert!(e.contains("write index 3 for 2 rows of a cache of 4"), "{e}");
    }
}
