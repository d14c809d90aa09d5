//! Models older than opset 7, read by opset 7's rules where that changes nothing: a model of opset N < 7
//! is read as opset 7 when every op it uses is defined at N as at 7 (ONNX uses, for each op, the newest
//! version at or below the model's opset). `Not`, `Conv`, `MatMul` and the reductions have not changed
//! since opset 1; `Add` and the other broadcasting ops changed at 7 (numpy broadcasting replaced the
//! `broadcast` attribute), so a model using them below 7 stays unsupported, naming the op.

use crate::proto::NodeProto;

/// For each default-domain op kiln imports that ONNX defined by opset 7, the version in force at opset
/// 7 (from the schemas of `onnx` 1.20.1: `onnx.defs.get_all_schemas_with_history()`).
const IN_FORCE_AT_7: &[(&str, i64)] = &[
    ("Abs", 6),
    ("Acos", 7),
    ("Add", 7),
    ("And", 7),
    ("ArgMax", 1),
    ("ArgMin", 1),
    ("Asin", 7),
    ("Atan", 7),
    ("AveragePool", 7),
    ("BatchNormalization", 7),
    ("Cast", 6),
    ("Ceil", 6),
    ("Clip", 6),
    ("Concat", 4),
    ("Constant", 1),
    ("Conv", 1),
    ("ConvTranspose", 1),
    ("Cos", 7),
    ("DepthToSpace", 1),
    ("Div", 7),
    ("Dropout", 7),
    ("Elu", 6),
    ("Equal", 7),
    ("Exp", 6),
    ("Flatten", 1),
    ("Floor", 6),
    ("GRU", 7),
    ("Gather", 1),
    ("Gemm", 7),
    ("GlobalAveragePool", 1),
    ("GlobalLpPool", 2),
    ("GlobalMaxPool", 1),
    ("Greater", 7),
    ("HardSigmoid", 6),
    ("Hardmax", 1),
    ("Identity", 1),
    ("If", 1),
    ("InstanceNormalization", 6),
    ("LRN", 1),
    ("LSTM", 7),
    ("LeakyRelu", 6),
    ("Less", 7),
    ("Log", 6),
    ("LogSoftmax", 1),
    ("Loop", 1),
    ("LpNormalization", 1),
    ("LpPool", 2),
    ("MatMul", 1),
    ("Max", 6),
    ("MaxPool", 1),
    ("Mean", 6),
    ("Min", 6),
    ("Mul", 7),
    ("Neg", 6),
    ("Not", 1),
    ("Or", 7),
    ("PRelu", 7),
    ("Pad", 2),
    ("Pow", 7),
    ("RNN", 7),
    ("RandomUniformLike", 1),
    ("Reciprocal", 6),
    ("ReduceLogSum", 1),
    ("ReduceLogSumExp", 1),
    ("ReduceMax", 1),
    ("ReduceMean", 1),
    ("ReduceMin", 1),
    ("ReduceProd", 1),
    ("ReduceSum", 1),
    ("ReduceSumSquare", 1),
    ("Relu", 6),
    ("Reshape", 5),
    ("Selu", 6),
    ("Shape", 1),
    ("Sigmoid", 6),
    ("Sin", 7),
    ("Size", 1),
    ("Slice", 1),
    ("Softmax", 1),
    ("Softplus", 1),
    ("Softsign", 1),
    ("SpaceToDepth", 1),
    ("Split", 2),
    ("Sqrt", 6),
    ("Squeeze", 1),
    ("Sub", 7),
    ("Sum", 6),
    ("Tan", 7),
    ("Tanh", 6),
    ("Tile", 6),
    ("TopK", 1),
    ("Transpose", 1),
    ("Unsqueeze", 1),
    ("Upsample", 7),
    ("Xor", 7),
];

/// The first default-domain op of `nodes` (subgraphs included) whose definition at `opset` differs from
/// opset 7's:
/// its type and the version opset 7 reads it by. `None` when the model reads the same as opset 7.
pub(crate) fn first_changed(nodes: &[NodeProto], opset: i64) -> Option<(String, Option<i64>)> {
    for n in nodes {
        // Another domain's ops have their own opsets (and kiln's import says what it makes of them).
        let version = IN_FORCE_AT_7.iter().find(|(op, _)| *op == n.op_type()).map(|&(_, v)| v);
        if matches!(n.domain(), "" | "ai.onnx") && version.is_none_or(|v| v > opset) {
            return Some((n.op_type().to_string(), version));
        }
        for a in &n.attribute {
            let graphs = a.g.iter().chain(&a.graphs);
            if let Some(found) = graphs.filter_map(|g| first_changed(&g.node, opset)).next() {
                return Some(found);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(op: &str) -> NodeProto {
        NodeProto { op_type: Some(op.into()), ..Default::default() }
    }

    /// `Not` and `MatMul` read alike at opset 1 and 7; `Add` changed at 6 and 7, `Relu` at 6.
    #[test]
    fn unchanged_ops_read_as_opset_7() {
        assert_eq!(first_changed(&[node("Not"), node("MatMul")], 1), None);
        assert_eq!(first_changed(&[node("Not"), node("Add")], 1), Some(("Add".into(), Some(7))));
        assert_eq!(first_changed(&[node("Relu")], 5), Some(("Relu".into(), Some(6))));
        assert_eq!(first_changed(&[node("Relu")], 6), None);
        assert_eq!(first_changed(&[node("Einsum")], 6), Some(("Einsum".into(), None)));
    }
}
