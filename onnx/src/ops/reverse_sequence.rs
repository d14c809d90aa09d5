//! ONNX's `ReverseSequence`: each batch entry's first `sequence_lens[b]` steps reversed, the rest as
//! they are — one gather along the time axis with an index computed per (step, entry).

use super::{axis, invalid, unsupported, Node, OpResult};
use crate::value::Value;
use kiln_graph::{DType, Tensor};

/// The op types this family converts.
pub(super) const OPS: &[&str] = &["ReverseSequence"];

/// The family; `None` when `op` is not one of it.
pub(super) fn run(node: &Node, op: &str) -> Option<OpResult<Vec<Value>>> {
    (op == "ReverseSequence").then(|| reverse_sequence(node))
}

fn reverse_sequence(node: &Node) -> OpResult<Vec<Value>> {
    let (x, lens) = (node.tensor(0)?, node.tensor(1)?);
    let r = x.rank();
    let (time, batch) = (axis(node.int("time_axis", 0), r)?, axis(node.int("batch_axis", 1), r)?);
    if r < 2 || time == batch || time > 1 || batch > 1 {
        return invalid(format!("time axis {time} and batch axis {batch} of a rank-{r} tensor (0 and 1, one each)"));
    }
    let Some(dims) = x.shape().as_concrete() else { return unsupported("ReverseSequence over symbolic dims") };
    let (steps, entries) = (dims[time], dims[batch]);
    if lens.shape().as_concrete() != Some(vec![entries]) {
        return invalid(format!("sequence_lens for {entries} batch entries"));
    }
    let mut shape = vec![1isize; r];
    shape[time] = steps as isize;
    let t = Tensor::arange(0.0, steps as f64, 1.0, DType::I64)?.reshape(&shape)?;
    let mut shape = vec![1isize; r];
    shape[batch] = entries as isize;
    let len = lens.cast(DType::I64)?.reshape(&shape)?;
    let index = t.lt(&len)?.where_(&len.sub(1.0)?.sub(&t)?, &t)?;
    let full: Vec<isize> = dims.iter().map(|&d| d as isize).collect();
    Ok(vec![Value::Tensor(x.gather(time as isize, &index.expand(&full)?)?)])
}
