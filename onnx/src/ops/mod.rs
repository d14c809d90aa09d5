//! ONNX nodes as kiln ops. Each node becomes calls on [`Tensor`] — so under `compile` the model is traced
//! into one kiln graph like Rust code is — or, for integer shape arithmetic, host computation on
//! symbolic sizes ([`Ints`]). One function per op family; [`SUPPORTED`] lists every op type kiln reads.

mod affine_grid;
mod attention;
mod col2im;
mod data_shaped;
mod deform_conv;
mod det;
mod elementwise;
mod grid_sample;
mod image_decoder;
mod loss;
mod max_unpool;
mod mel;
mod nn;
mod non_max_suppression;
pub(crate) mod optimizers;
mod optional;
mod quantize;
mod random;
mod recurrent;
mod resize;
mod reverse_sequence;
mod roi_align;
mod scatter;
mod shape;
mod spectral;
mod tensor_scatter;
mod tfidf;
mod top_k;

use crate::model::{node_error, Model};
use crate::proto::{AttributeProto, NodeProto};
use crate::value::{Ints, Value};
use kiln_graph::{DType, Error, Tensor, TensorData};

/// A family's converter: `None` when the op is not one of the family's.
type Dispatch = fn(&Node, &str) -> Option<OpResult<Vec<Value>>>;

/// Every op family: the op types it converts and its converter (one list for what kiln reports it
/// imports, what it dispatches, and the test holding the two to each other).
const FAMILIES: [(&[&str], Dispatch); 27] = [
    (elementwise::OPS, elementwise::run),
    (nn::OPS, nn::run),
    (shape::OPS, shape::run),
    (resize::OPS, resize::run),
    (loss::OPS, loss::run),
    (attention::OPS, attention::run),
    (top_k::OPS, top_k::run),
    (scatter::OPS, scatter::run),
    (grid_sample::OPS, grid_sample::run),
    (affine_grid::OPS, affine_grid::run),
    (recurrent::OPS, recurrent::run),
    (reverse_sequence::OPS, reverse_sequence::run),
    (spectral::OPS, spectral::run),
    (col2im::OPS, col2im::run),
    (det::OPS, det::run),
    (data_shaped::OPS, data_shaped::run),
    (max_unpool::OPS, max_unpool::run),
    (non_max_suppression::OPS, non_max_suppression::run),
    (tfidf::OPS, tfidf::run),
    (roi_align::OPS, roi_align::run),
    (tensor_scatter::OPS, tensor_scatter::run),
    (deform_conv::OPS, deform_conv::run),
    (mel::OPS, mel::run),
    (optional::OPS, optional::run),
    (random::OPS, random::run),
    (quantize::OPS, quantize::run),
    (image_decoder::OPS, image_decoder::run),
];

/// Every default-domain op type kiln imports, sorted (the coverage table in `docs/onnx.md` lists them):
/// the families' own lists, which a test holds to what their dispatch handles, and those the model
/// runs itself (`Constant`, `If`, `Loop`, `Scan`).
pub fn supported_ops() -> Vec<&'static str> {
    let mut v: Vec<&'static str> = FAMILIES.iter().flat_map(|(ops, _)| ops.iter().copied()).collect();
    v.extend(["Constant", "If", "Loop", "Scan"]);
    v.sort_unstable();
    v
}

/// Why a node did not convert.
pub(crate) enum OpError {
    /// kiln does not do this (yet).
    Unsupported(String),
    /// The node breaks the op's definition.
    Invalid(String),
    /// A kiln op refused (shape, dtype) or the device failed.
    Kiln(Error),
}

impl From<Error> for OpError {
    fn from(e: Error) -> Self {
        OpError::Kiln(e)
    }
}

pub(crate) type OpResult<T> = std::result::Result<T, OpError>;

pub(crate) fn unsupported<T>(msg: impl Into<String>) -> OpResult<T> {
    Err(OpError::Unsupported(msg.into()))
}

pub(crate) fn invalid<T>(msg: impl Into<String>) -> OpResult<T> {
    Err(OpError::Invalid(msg.into()))
}

/// One node being converted: its attributes and inputs.
pub(crate) struct Node<'a> {
    pub model: &'a Model,
    pub proto: &'a NodeProto,
    pub args: &'a [Option<Value>],
}

impl Node<'_> {
    pub fn opset(&self) -> i64 {
        self.model.opset
    }

    fn attr(&self, name: &str) -> Option<&AttributeProto> {
        self.proto.attribute.iter().find(|a| a.name() == name)
    }

    /// An int attribute, or `default`.
    pub fn int(&self, name: &str, default: i64) -> i64 {
        self.attr(name).map_or(default, |a| a.i())
    }

    /// A float attribute, or `default`.
    pub fn float(&self, name: &str, default: f64) -> f64 {
        self.attr(name).map_or(default, |a| a.f() as f64)
    }

    /// An ints attribute.
    pub fn ints(&self, name: &str) -> Option<Vec<i64>> {
        self.attr(name).map(|a| a.ints.clone())
    }

    /// A floats attribute.
    pub fn floats(&self, name: &str) -> Option<Vec<f32>> {
        self.attr(name).map(|a| a.floats.clone())
    }

    /// How many strings a strings attribute holds (kiln's tensors hold numbers; an op that takes strings
    /// only needs to know whether it was given some).
    pub fn string_count(&self, name: &str) -> Option<usize> {
        self.attr(name).map(|a| a.strings.len())
    }

    /// The dtype an `output_datatype` attribute asks for (f32 when absent).
    pub fn output_datatype(&self) -> OpResult<DType> {
        match self.attr("output_datatype") {
            Some(a) => crate::tensor::dtype_of(a.i() as i32).map_err(OpError::Unsupported),
            None => Ok(DType::F32),
        }
    }

    /// A string attribute.
    pub fn string(&self, name: &str) -> Option<String> {
        self.attr(name).map(|a| String::from_utf8_lossy(a.s()).into_owned())
    }

    /// Input `i` if given.
    pub fn value(&self, i: usize) -> Option<&Value> {
        self.args.get(i).and_then(Option::as_ref)
    }

    /// Input `i` as a kiln tensor (required).
    pub fn tensor(&self, i: usize) -> OpResult<Tensor> {
        match self.value(i) {
            Some(v) => Ok(v.clone().into_tensor(self.model)?),
            None => invalid(format!("input {i} is required")),
        }
    }

    /// Input `i` as a kiln tensor, if given.
    pub fn opt_tensor(&self, i: usize) -> OpResult<Option<Tensor>> {
        self.value(i).map(|v| v.clone().into_tensor(self.model)).transpose().map_err(OpError::from)
    }

    /// Input `i` as integers known while tracing (shapes, axes, pads), if given; `what` names it in the
    /// error when it is data computed on the device.
    pub fn known_ints(&self, i: usize, what: &str) -> OpResult<Option<Ints>> {
        match self.value(i) {
            None => Ok(None),
            Some(Value::Ints(v)) => Ok(Some(v.clone())),
            // Data the model computes (or is given) that kiln needs while tracing: read on the host,
            // which under `compile` is a graph break (as `tolist()` is for torch.compile), so the value
            // is exact for every call and the graph after it is traced with it.
            Some(Value::Tensor(t)) if t.dtype().is_int() => {
                let values = t.to_vec::<i64>()?.into_iter().map(kiln_graph::sym::Expr::constant).collect();
                let dims = t.shape().as_concrete().unwrap_or_default();
                Ok(Some(Ints { dims, dtype: t.dtype(), values }))
            }
            Some(Value::Tensor(t)) => invalid(format!("a {what} of {} elements", t.dtype())),
        }
    }

    /// Input `i` as constant integers, if given.
    pub fn const_ints(&self, i: usize, what: &str) -> OpResult<Option<Vec<i64>>> {
        match self.known_ints(i, what)? {
            None => Ok(None),
            Some(v) => match v.consts() {
                Some(c) => Ok(Some(c)),
                None => unsupported(format!("a symbolic {what}")),
            },
        }
    }

    /// Input `i` as host floats when it is a model constant (scales, bounds).
    pub fn const_floats(&self, i: usize) -> Option<Vec<f64>> {
        let name = self.proto.input.get(i)?;
        self.model.constants.get(name).map(|c| c.data.values().to_vec())
    }

    /// Input `i`'s values on the host, if given: a constant's, folded integers, or the tensor read back
    /// (a graph break under `compile`, as in [`Node::known_ints`]).
    pub fn host_values(&self, i: usize) -> OpResult<Option<Vec<f64>>> {
        if let Some(v) = self.const_floats(i) {
            return Ok(Some(v));
        }
        match self.value(i) {
            None => Ok(None),
            Some(Value::Ints(v)) => match v.consts() {
                Some(c) => Ok(Some(c.into_iter().map(|x| x as f64).collect())),
                None => unsupported("a symbolic size used as a number"),
            },
            Some(Value::Tensor(t)) => Ok(Some(t.to_data()?.values().to_vec())),
        }
    }
}

/// `op` on `node` by the family that converts it.
fn dispatch(node: &Node, op: &str) -> OpResult<Vec<Value>> {
    if let Some(why) = unknown(node.proto.domain(), op) {
        return unsupported(why);
    }
    let found = match node.proto.domain() {
        optimizers::DOMAIN => optimizers::run(node, op),
        _ => FAMILIES.iter().find_map(|(_, run)| run(node, op)),
    };
    found.unwrap_or_else(|| unsupported(format!("op {op}")))
}

/// Why kiln does not import op `op` of `domain`, or `None` when it does: the default domain's
/// [`supported_ops`] and the training domain's optimizers (`optimizers::OPS`).
pub(crate) fn unknown(domain: &str, op: &str) -> Option<String> {
    match domain {
        "" | "ai.onnx" => (!supported_ops().contains(&op)).then(|| format!("op {op}")),
        optimizers::DOMAIN => (!optimizers::OPS.contains(&op)).then(|| format!("op {op} of {domain}")),
        other => Some(format!("domain {other:?}")),
    }
}

/// Runs single nodes outside a model file, for the families' unit tests.
#[cfg(test)]
pub(crate) mod testing {
    use super::{dispatch, Node, OpError};
    use crate::model::Model;
    use crate::proto::{AttributeProto, NodeProto};
    use crate::value::Value;
    use kiln_graph::Tensor;

    /// An int attribute.
    pub(crate) fn int(name: &str, v: i64) -> AttributeProto {
        AttributeProto { name: Some(name.into()), i: Some(v), ..Default::default() }
    }

    /// A float attribute.
    pub(crate) fn float(name: &str, v: f32) -> AttributeProto {
        AttributeProto { name: Some(name.into()), f: Some(v), ..Default::default() }
    }

    /// An ints attribute.
    pub(crate) fn ints(name: &str, v: &[i64]) -> AttributeProto {
        AttributeProto { name: Some(name.into()), ints: v.to_vec(), ..Default::default() }
    }

    /// A string attribute.
    pub(crate) fn string(name: &str, v: &str) -> AttributeProto {
        AttributeProto { name: Some(name.into()), s: Some(v.as_bytes().to_vec()), ..Default::default() }
    }

    /// One node of `op` with `attrs` on `args` (opset 18), run eagerly on the CPU reference: its
    /// tensor outputs, or the conversion's message.
    pub(crate) fn run_one(op: &str, attrs: Vec<AttributeProto>, args: &[Option<Value>]) -> Result<Vec<Tensor>, String> {
        use prost::Message;
        let bytes = crate::proto::ModelProto {
            opset_import: vec![crate::proto::OperatorSetIdProto { domain: Some(String::new()), version: Some(18) }],
            graph: Some(crate::proto::GraphProto::default()),
            ..Default::default()
        }
        .encode_to_vec();
        let model = Model::parse(&bytes, "one node", None).map_err(|e| e.to_string())?;
        let proto = NodeProto { op_type: Some(op.into()), attribute: attrs, ..Default::default() };
        match dispatch(&Node { model: &model, proto: &proto, args }, op) {
            Ok(out) => Ok(out
                .into_iter()
                .map(|v| match v {
                    Value::Tensor(t) => t,
                    other => other.into_tensor(&model).expect("a value as a tensor"),
                })
                .collect()),
            Err(OpError::Unsupported(m)) => Err(format!("unsupported: {m}")),
            Err(OpError::Invalid(m)) => Err(format!("invalid: {m}")),
            Err(_) => Err("failed".into()),
        }
    }
}

/// Converts one node given its inputs (absent optional inputs are `None`); returns its outputs.
pub(crate) fn run_node(model: &Model, proto: &NodeProto, args: &[Option<Value>]) -> kiln_graph::Result<Vec<Value>> {
    let fail = |unsupported: bool, msg: String| node_error(&model.name, model.opset, proto, unsupported, msg);
    let node = Node { model, proto, args };
    let op = proto.op_type();
    match dispatch(&node, op) {
        Ok(v) => Ok(v),
        Err(OpError::Unsupported(m)) => Err(fail(true, m)),
        Err(OpError::Invalid(m)) => Err(fail(false, m)),
        Err(OpError::Kiln(e @ (Error::Backend { .. } | Error::DeviceLost { .. } | Error::OutOfMemory { .. }))) => {
            Err(e)
        }
        Err(OpError::Kiln(e @ Error::Import { .. })) => Err(e),
        Err(OpError::Kiln(Error::Unsupported { what, .. })) => Err(fail(true, what)),
        Err(OpError::Kiln(e)) => Err(fail(false, e.to_string())),
    }
}

/// A `Constant` node's value (read once, at load).
pub(crate) fn constant_node(node: &NodeProto) -> std::result::Result<TensorData, (bool, String)> {
    let a = node.attribute.first().ok_or((false, "a Constant without a value".to_string()))?;
    let data = |v: Vec<f64>, dims: &[usize], d| TensorData::from_f64(v, dims, d).map_err(|e| (false, e.to_string()));
    match a.name() {
        "value" => {
            let t = a.t.as_ref().ok_or((false, "`value` holds no tensor".to_string()))?;
            crate::tensor::to_data(t, None).map_err(|m| (crate::tensor::dtype_of(t.data_type()).is_err(), m))
        }
        "value_float" => data(vec![a.f() as f64], &[], kiln_graph::DType::F32),
        "value_floats" => data(a.floats.iter().map(|&v| v as f64).collect(), &[a.floats.len()], kiln_graph::DType::F32),
        "value_int" => data(vec![a.i() as f64], &[], kiln_graph::DType::I64),
        "value_ints" => data(a.ints.iter().map(|&v| v as f64).collect(), &[a.ints.len()], kiln_graph::DType::I64),
        other => Err((true, format!("a Constant given as `{other}`"))),
    }
}

/// Output lists.
pub(crate) fn one(t: Tensor) -> OpResult<Vec<Value>> {
    Ok(vec![Value::Tensor(t)])
}

/// An ONNX axis (negative counts from the end) in `0..rank`.
pub(crate) fn axis(a: i64, rank: usize) -> OpResult<usize> {
    let r = rank as i64;
    if a < -r || a >= r {
        return invalid(format!("axis {a} of a rank-{rank} tensor"));
    }
    Ok(if a < 0 { (a + r) as usize } else { a as usize })
}

/// Reshapes `x` to `dims`, where at most one dim may be symbolic (it is inferred, as `-1`).
pub(crate) fn reshape_to(x: &Tensor, dims: &[kiln_graph::sym::Expr]) -> OpResult<Tensor> {
    if x.shape().dims() == dims {
        return Ok(x.clone());
    }
    let symbolic = dims.iter().filter(|d| d.as_const().is_none()).count();
    if symbolic > 1 {
        return unsupported(format!("a reshape to {} symbolic sizes", symbolic));
    }
    let target: Vec<isize> = dims.iter().map(|d| d.as_const().map_or(-1, |c| c as isize)).collect();
    Ok(x.reshape(&target)?)
}

/// The product of sizes, or an error when it leaves i64 (a malformed file can ask for that).
pub(crate) fn product(dims: &[kiln_graph::sym::Expr]) -> OpResult<kiln_graph::sym::Expr> {
    dims.iter().try_fold(kiln_graph::sym::Expr::constant(1), |p, d| {
        p.checked_mul(d).map_err(|e| OpError::Invalid(format!("sizes {dims:?} multiply past i64: {e}")))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each family's list and its dispatch agree: every listed op is handled (here it fails for want of
    /// inputs, which is still an answer), and an unlisted name is not.
    #[test]
    fn every_listed_op_is_dispatched() {
        let bytes = {
            use prost::Message;
            let g = crate::proto::GraphProto::default();
            crate::proto::ModelProto {
                opset_import: vec![crate::proto::OperatorSetIdProto { domain: Some(String::new()), version: Some(18) }],
                graph: Some(g),
                ..Default::default()
            }
            .encode_to_vec()
        };
        let model = Model::parse(&bytes, "empty", None).unwrap();
        for (ops, run) in FAMILIES {
            for op in ops {
                let proto = NodeProto { op_type: Some(op.to_string()), ..Default::default() };
                let node = Node { model: &model, proto: &proto, args: &[] };
                assert!(run(&node, op).is_some(), "{op} is listed but not dispatched");
            }
            let proto = NodeProto::default();
            let node = Node { model: &model, proto: &proto, args: &[] };
            assert!(run(&node, "NotAnOp").is_none());
        }
        let all = supported_ops();
        let mut unique = all.clone();
        unique.dedup();
        assert_eq!(all, unique, "an op is listed by two families");
    }
}
