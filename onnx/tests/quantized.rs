//! A quantize–dequantize pair (the QDQ form onnxruntime's quantizer writes) over a `dim_param` batch:
//! per-channel scales and zero points need only the channel axis constant, so every batch size runs
//! from one loaded model.

use kiln_graph::{CpuReference, Tensor};
use kiln_onnx::proto::{tensor_proto::DataType, AttributeProto, TensorProto};

mod common;

use common::{model, node, value, weight};

#[test]
fn per_channel_qdq_runs_every_batch_size() {
    let zero_points = TensorProto {
        name: Some("zp".into()),
        data_type: Some(DataType::Uint8 as i32),
        dims: vec![3],
        raw_data: Some(vec![0, 128, 10]),
        ..Default::default()
    };
    let axis = |n: &mut kiln_onnx::proto::NodeProto| {
        n.attribute.push(AttributeProto { name: Some("axis".into()), i: Some(1), ..Default::default() })
    };
    let (mut q, mut dq) = (
        node("QuantizeLinear", "q", &["x", "s", "zp"], &["xq"]),
        node("DequantizeLinear", "dq", &["xq", "s", "zp"], &["y"]),
    );
    axis(&mut q);
    axis(&mut dq);
    let bytes = model(
        vec![q, dq],
        vec![value("x", &[Err("batch"), Ok(3)])],
        vec![value("y", &[Err("batch"), Ok(3)])],
        vec![weight("s", &[0.5, 0.25, 2.0], &[3]), zero_points],
        21,
    );
    let m = kiln_onnx::load_bytes(&bytes, "qdq.onnx").unwrap().backend(CpuReference);
    for batch in [2usize, 5] {
        let x: Vec<f32> = (0..batch * 3).map(|i| i as f32 * 3.3 - 20.0).collect();
        let y = m.call(vec![Tensor::from_slice(&x, &[batch, 3]).unwrap()]).unwrap();
        let want: Vec<f32> = x
            .iter()
            .enumerate()
            .map(|(i, &v)| {
                let (s, z) = ([0.5f32, 0.25, 2.0][i % 3], [0.0f32, 128.0, 10.0][i % 3]);
                (((v / s).round_ties_even() + z).clamp(0.0, 255.0) - z) * s
            })
            .collect();
        assert_eq!(y[0].to_vec::<f32>().unwrap(), want, "batch {batch}");
    }
}
