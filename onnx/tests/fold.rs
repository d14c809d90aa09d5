//! An inference batch norm after a convolution is folded into it at load (one convolution with a
//! scaled weight and a shifted bias) and gives the unfolded model's results; a pair that cannot fold
//! (the convolution's output read elsewhere, statistics that are inputs) stays as written.

mod common;

use common::{model, node, value, weight};
use kiln_graph::{CpuReference, Tensor, TensorData};
use kiln_onnx::proto::AttributeProto;

/// Conv (2 → 3 channels, 3x3, bias) then BatchNormalization with ε = 1e-3, on a 1x2x5x5 input;
/// `between` (an op type) sits between them when given, which keeps them apart.
fn conv_bn(between: Option<&str>, extra_output: bool) -> Vec<u8> {
    let w: Vec<f32> = (0..54).map(|i| ((i * 7 % 11) as f32 - 5.0) / 8.0).collect();
    let mut bn = node("BatchNormalization", "bn", &["c", "gamma", "beta", "mean", "var"], &["y"]);
    bn.attribute.push(AttributeProto {
        name: Some("epsilon".into()),
        f: Some(1e-3),
        r#type: Some(1),
        ..Default::default()
    });
    let mut nodes = vec![node("Conv", "conv", &["x", "w", "b"], &["c0"])];
    match between {
        Some(op) => nodes.push(node(op, "between", &["c0"], &["c"])),
        None => nodes[0].output = vec!["c".into()],
    }
    nodes.push(bn);
    let mut outputs = vec![value("y", &[Ok(1), Ok(3), Ok(3), Ok(3)])];
    if extra_output {
        outputs.push(value("c", &[Ok(1), Ok(3), Ok(3), Ok(3)]));
    }
    model(
        nodes,
        vec![value("x", &[Ok(1), Ok(2), Ok(5), Ok(5)])],
        outputs,
        vec![
            weight("w", &w, &[3, 2, 3, 3]),
            weight("b", &[0.1, -0.2, 0.3], &[3]),
            weight("gamma", &[1.5, 0.5, -2.0], &[3]),
            weight("beta", &[0.25, 0.0, -0.5], &[3]),
            weight("mean", &[0.2, -0.1, 0.05], &[3]),
            weight("var", &[0.9, 2.5, 0.3], &[3]),
        ],
        17,
    )
}

fn run(bytes: &[u8]) -> (bool, Vec<f64>) {
    let m = kiln_onnx::load_bytes(bytes, "conv_bn.onnx").unwrap().backend(CpuReference);
    let x: Vec<f64> = (0..50).map(|i| ((i * 13 % 17) as f64 - 8.0) / 4.0).collect();
    let x = Tensor::from_data(TensorData::from_f64(x, &[1, 2, 5, 5], kiln_graph::DType::F32).unwrap());
    let y = m.call(vec![x]).unwrap()[0].to_data().unwrap().values().to_vec();
    (m.model().has_op("BatchNormalization"), y)
}

#[test]
fn a_batch_norm_after_a_convolution_folds_into_it() {
    let (kept, folded) = run(&conv_bn(None, false));
    assert!(!kept, "the batch norm was folded away");
    // An Identity between them keeps the pair apart: the same model, unfolded.
    let (kept, unfolded) = run(&conv_bn(Some("Identity"), false));
    assert!(kept);
    assert_eq!(folded.len(), 27);
    for (a, b) in folded.iter().zip(&unfolded) {
        assert!((a - b).abs() <= 1e-5 * (1.0 + b.abs()), "folded {a} vs unfolded {b}");
    }
    // The folded weights are not the original ones: the results would differ by the scale otherwise.
    assert!(folded.iter().any(|v| v.abs() > 1e-3));
}

#[test]
fn a_convolution_output_read_elsewhere_is_not_folded() {
    let (kept, _) = run_outputs(&conv_bn(None, true));
    assert!(kept, "the convolution's output is a model output too");
}

fn run_outputs(bytes: &[u8]) -> (bool, usize) {
    let m = kiln_onnx::load_bytes(bytes, "conv_bn.onnx").unwrap().backend(CpuReference);
    let x = Tensor::from_data(TensorData::from_f64(vec![0.5; 50], &[1, 2, 5, 5], kiln_graph::DType::F32).unwrap());
    (m.model().has_op("BatchNormalization"), m.call(vec![x]).unwrap().len())
}
