//! The workloads of `../shared/WORKLOADS.md`, defined once: each is a function over tensors plus its
//! input shapes at full size, at the size the bench checks correctness on, and at `--quick` size.

use kiln_graph::{DType, Result, Tensor, TensorSpec};

/// One workload.
pub struct Workload {
    /// `W1`...
    pub id: &'static str,
    /// What it is.
    pub what: &'static str,
    /// Input specs at benchmark size.
    pub full: Vec<TensorSpec>,
    /// Input specs for `--quick` runs.
    pub quick: Vec<TensorSpec>,
    /// Input specs small enough for the CPU reference.
    pub check: Vec<TensorSpec>,
    /// The computation.
    pub f: fn(&[Tensor]) -> Result<Vec<Tensor>>,
    /// Whether matmuls dominate (report FLOP/s).
    pub flops: fn(&[TensorSpec]) -> Option<f64>,
}

fn f32s(d: &[usize]) -> TensorSpec {
    TensorSpec::new(DType::F32, d)
}

fn w1(t: &[Tensor]) -> Result<Vec<Tensor>> {
    let x = &t[0];
    Ok(vec![x.mul(1.5)?.add(0.5)?.gelu()?.mul(&x.sigmoid()?)?.sub(&x.tanh()?)?])
}

fn w2(t: &[Tensor]) -> Result<Vec<Tensor>> {
    Ok(vec![t[0].softmax(-1)?])
}

fn w3(t: &[Tensor]) -> Result<Vec<Tensor>> {
    Ok(vec![t[0].layer_norm(1, Some(&t[1]), Some(&t[2]), 1e-5)?.gelu()?])
}

/// `Linear(10,10)` then 64 × [Linear → ReLU → sigmoid → Linear → ReLU]; inputs x, then (w, b) pairs.
fn w4(t: &[Tensor]) -> Result<Vec<Tensor>> {
    let mut h = t[0].linear(&t[1], Some(&t[2]))?;
    for l in 0..64 {
        let p = 3 + 4 * l;
        h = h.linear(&t[p], Some(&t[p + 1]))?.relu()?.sigmoid()?;
        h = h.linear(&t[p + 2], Some(&t[p + 3]))?.relu()?;
    }
    Ok(vec![h])
}

fn w4_inputs(batch: usize) -> Vec<TensorSpec> {
    let mut v = vec![f32s(&[batch, 10])];
    for _ in 0..129 {
        v.extend([f32s(&[10, 10]), f32s(&[10])]);
    }
    v
}

fn no_flops(_: &[TensorSpec]) -> Option<f64> {
    None
}

/// Every workload the bench knows, in order.
pub fn all() -> Vec<Workload> {
    vec![
        Workload {
            id: "W1",
            what: "gelu(x*1.5 + 0.5) * sigmoid(x) - tanh(x), 2^26 f32",
            full: vec![f32s(&[1 << 26])],
            quick: vec![f32s(&[1 << 20])],
            check: vec![f32s(&[100_003])],
            f: w1,
            flops: no_flops,
        },
        Workload {
            id: "W2",
            what: "softmax(x, -1), 8192 x 8192 f32",
            full: vec![f32s(&[8192, 8192])],
            quick: vec![f32s(&[1024, 1024])],
            check: vec![f32s(&[64, 8192])],
            f: w2,
            flops: no_flops,
        },
        Workload {
            id: "W3",
            what: "gelu(layer_norm(x)), affine, 8192 x 4096 f32",
            full: vec![f32s(&[8192, 4096]), f32s(&[4096]), f32s(&[4096])],
            quick: vec![f32s(&[1024, 1024]), f32s(&[1024]), f32s(&[1024])],
            check: vec![f32s(&[64, 4096]), f32s(&[4096]), f32s(&[4096])],
            f: w3,
            flops: no_flops,
        },
        Workload {
            id: "W4",
            what: "64-layer Linear(10,10) MLP (the regional-compilation recipe), input 10 x 10",
            full: w4_inputs(10),
            quick: w4_inputs(10),
            check: w4_inputs(10),
            f: w4,
            flops: |s| Some(129.0 * 2.0 * (s[0].shape.numel().as_const().unwrap_or(0) as f64) * 10.0),
        },
    ]
}

/// Deterministic input data for a spec: values in [-2, 2], weights scaled down so deep stacks stay finite.
pub fn data(spec: &TensorSpec, salt: usize) -> kiln_graph::TensorData {
    let dims = spec.shape.as_concrete().expect("workload shapes are static");
    let n: usize = dims.iter().product();
    let scale = if dims.len() == 2 && dims[0] == 10 && dims[1] == 10 { 0.3 } else { 1.0 };
    let values = (0..n).map(|i| (((i * 7919 + salt * 104729) % 4001) as f64 / 1000.0 - 2.0) * scale).collect();
    kiln_graph::TensorData::from_f64(values, &dims, spec.dtype).expect("sizes match")
}
