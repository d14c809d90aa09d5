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

/// `value`, declared as i8.
fn int8(v: kiln_onnx::proto::ValueInfoProto) -> kiln_onnx::proto::ValueInfoProto {
    use kiln_onnx::proto::type_proto;
    let mut v = v;
    if let Some(type_proto::Value::TensorType(t)) = v.r#type.as_mut().and_then(|t| t.value.as_mut()) {
        t.elem_type = Some(DataType::Int8 as i32);
    }
    v
}

/// MaxPool's indices over i8 values all below 0, with padding: the padding is i8's lowest value, which
/// no window's max is below (`-inf` would have wrapped to 0 and been every window's max).
#[test]
fn max_pool_indices_of_negative_bytes_never_point_into_the_padding() {
    let mut pool = node("MaxPool", "p", &["x"], &["y", "i"]);
    let ints = |name: &str, v: Vec<i64>| AttributeProto { name: Some(name.into()), ints: v, ..Default::default() };
    pool.attribute.extend([ints("kernel_shape", vec![3]), ints("pads", vec![1, 1])]);
    let mut index = value("i", &[Ok(1), Ok(1), Ok(4)]);
    if let Some(kiln_onnx::proto::type_proto::Value::TensorType(t)) =
        index.r#type.as_mut().and_then(|t| t.value.as_mut())
    {
        t.elem_type = Some(DataType::Int64 as i32);
    }
    let bytes = model(
        vec![pool],
        vec![int8(value("x", &[Ok(1), Ok(1), Ok(4)]))],
        vec![int8(value("y", &[Ok(1), Ok(1), Ok(4)])), index],
        vec![],
        12,
    );
    let m = kiln_onnx::load_bytes(&bytes, "pool.onnx").unwrap().backend(CpuReference);
    let out = m.call(vec![Tensor::from_slice(&[-7i8, -3, -120, -50], &[1, 1, 4]).unwrap()]).unwrap();
    assert_eq!(out[0].to_vec::<i8>().unwrap(), [-3, -3, -3, -50]);
    assert_eq!(out[1].to_vec::<i64>().unwrap(), [1, 1, 1, 3]);
}
