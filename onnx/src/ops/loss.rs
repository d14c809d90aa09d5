//! The loss ops ONNX exports from PyTorch's `nll_loss` and `cross_entropy`: the target class's entry of
//! each row picked by a gather, weighted, masked where the target is `ignore_index`, and reduced.

use super::{invalid, Node, OpResult};
use crate::value::Value;
use kiln_graph::Tensor;

/// The op types this family converts.
pub(super) const OPS: &[&str] = &["NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"];

/// The family; `None` when `op` is not one of it.
pub(super) fn run(node: &Node, op: &str) -> Option<OpResult<Vec<Value>>> {
    Some(match op {
        "NegativeLogLikelihoodLoss" => (|| Ok(vec![Value::Tensor(nll(node, &node.tensor(0)?)?)]))(),
        "SoftmaxCrossEntropyLoss" => (|| {
            let log_prob = node.tensor(0)?.log_softmax(1)?;
            let loss = nll(node, &log_prob)?;
            Ok(vec![Value::Tensor(loss), Value::Tensor(log_prob)])
        })(),
        _ => return None,
    })
}

/// `-input[n, target[n, ...], ...] * weight[target]`, zero where the target is ignored, then reduced:
/// `none`, `sum`, or `mean` (divided by the summed weights of the targets not ignored).
fn nll(node: &Node, input: &Tensor) -> OpResult<Tensor> {
    let target = node.tensor(1)?;
    let weight = node.opt_tensor(2)?;
    if input.rank() < 2 || target.rank() + 1 != input.rank() || !target.dtype().is_int() {
        return invalid(format!("input {} and target {} {}", input.shape(), target.dtype(), target.shape()));
    }
    let ignore = node.proto.attribute.iter().find(|a| a.name() == "ignore_index").map(|a| a.i());
    let (safe, valid) = match ignore {
        Some(i) => {
            let valid = target.ne(i as f64)?;
            (valid.where_(&target, 0.0)?, Some(valid.cast(input.dtype())?))
        }
        None => (target.clone(), None),
    };
    let picked = input.gather(1, &safe.unsqueeze(1)?)?.squeeze(1)?;
    let mut w = match &weight {
        Some(w) => {
            let flat = safe.reshape(&[-1])?;
            let dims: Vec<isize> = safe.shape().view_dims();
            w.index_select(0, &flat)?.reshape(&dims)?
        }
        // Ones from the (integer, never NaN) target, not from the input: an infinite log-probability
        // times a zero weight would be NaN.
        None => safe.eq(&safe)?.cast(input.dtype())?,
    };
    if let Some(v) = &valid {
        w = w.mul(v)?;
    }
    // Ignored rows are exactly zero, whatever the input holds there.
    let loss = picked.mul(&w)?.neg()?;
    let loss = match &valid {
        Some(v) => v.gt(0.0)?.where_(&loss, 0.0)?,
        None => loss,
    };
    let all: Vec<isize> = (0..loss.rank() as isize).collect();
    Ok(match node.string("reduction").as_deref().unwrap_or("mean") {
        "none" => loss,
        "sum" => loss.sum(&all, false)?,
        "mean" => loss.sum(&all, false)?.div(&w.sum(&all, false)?)?,
        other => return invalid(format!("reduction {other:?}")),
    })
}
