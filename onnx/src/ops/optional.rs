//! ONNX's optional ops over tensors: `OptionalHasElement` (whether an optional input was given) and
//! `OptionalGetElement` (the tensor itself). kiln's values are tensors, so an optional is either a
//! tensor or an absent input; optional sequences stay unsupported with sequences.

use super::{invalid, one, Node, OpResult};
use crate::value::Value;
use kiln_graph::DType;

/// The op types this family converts.
pub(super) const OPS: &[&str] = &["OptionalGetElement", "OptionalHasElement"];

/// The family; `None` when `op` is not one of it.
pub(super) fn run(node: &Node, op: &str) -> Option<OpResult<Vec<Value>>> {
    Some(match op {
        "OptionalHasElement" => has_element(node),
        "OptionalGetElement" => get_element(node),
        _ => return None,
    })
}

/// A scalar bool: whether input 0 is present.
fn has_element(node: &Node) -> OpResult<Vec<Value>> {
    let present = node.value(0).is_some();
    one(node.model.constant(vec![f64::from(u8::from(present))], &[], DType::Bool)?)
}

/// The optional's tensor; an empty optional has no element to get.
fn get_element(node: &Node) -> OpResult<Vec<Value>> {
    match node.value(0) {
        Some(v) => Ok(vec![v.clone()]),
        None => invalid("OptionalGetElement of an empty optional"),
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::run_one;
    use crate::value::Value;
    use kiln_graph::Tensor;

    #[test]
    fn an_optional_is_a_tensor_or_nothing() {
        let x = Some(Value::Tensor(Tensor::from_slice(&[1.0f32, 2.0], &[2]).unwrap()));
        let has =
            |args: &[Option<Value>]| run_one("OptionalHasElement", vec![], args).unwrap()[0].to_vec::<bool>().unwrap();
        assert_eq!(has(std::slice::from_ref(&x)), [true]);
        assert_eq!(has(&[None]), [false]);
        assert_eq!(has(&[]), [false]);
        let got = run_one("OptionalGetElement", vec![], std::slice::from_ref(&x)).unwrap();
        assert_eq!(got[0].to_vec::<f32>().unwrap(), [1.0, 2.0]);
        assert!(run_one("OptionalGetElement", vec![], &[None]).unwrap_err().starts_with("invalid"));
    }
}
