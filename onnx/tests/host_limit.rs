//! A model asking for a result past the host's limit (`KILN_HOST_MEMORY_LIMIT_MB`) gets a typed
//! out-of-memory error, not an allocation: a max pool padded by millions, as the ONNX fuzz target found
//! it (the reference had allocated 1.6 GB). Its own test binary: the limit is read once a process.

use kiln_graph::{CpuReference, DType, Error, Tensor};
use kiln_onnx::proto::AttributeProto;

mod common;

use common::{model, node, value};

#[test]
fn a_result_past_the_host_limit_is_a_typed_error() {
    std::env::set_var("KILN_HOST_MEMORY_LIMIT_MB", "64");
    let mut pool = node("MaxPool", "wide_pool", &["x"], &["y"]);
    let ints = |name: &str, v: Vec<i64>| AttributeProto { name: Some(name.into()), ints: v, ..Default::default() };
    pool.attribute.extend([ints("kernel_shape", vec![1, 5]), ints("pads", vec![2, 2, 0, 14_680_063])]);
    let bytes = model(
        vec![pool],
        vec![value("x", &[Ok(1), Ok(1), Ok(5), Ok(5)])],
        vec![value("y", &[Ok(1), Ok(1), Err("h"), Err("w")])],
        vec![],
        18,
    );
    let m = kiln_onnx::load_bytes(&bytes, "wide.onnx").unwrap().backend(CpuReference);
    let e = m.call(vec![Tensor::zeros(&[1, 1, 5, 5], DType::F32).unwrap()]).expect_err("past the limit");
    assert!(matches!(e, Error::OutOfMemory { limit: Some(l), .. } if l == 64 << 20), "{e}");
    // A result within the limit still runs.
    let small = model(
        vec![node("Relu", "r", &["x"], &["y"])],
        vec![value("x", &[Ok(4)])],
        vec![value("y", &[Ok(4)])],
        vec![],
        18,
    );
    let m = kiln_onnx::load_bytes(&small, "small.onnx").unwrap().backend(CpuReference);
    assert!(m.call(vec![Tensor::from_slice(&[-1.0f32, 2.0, -3.0, 4.0], &[4]).unwrap()]).is_ok());
}
