//! W5's training step as a bench workload (WORKLOADS.md: forward, mean-square loss, backward, AdamW):
//! one compiled function over the model's parameters, the batch and the optimizer state that returns the
//! loss, the updated parameters and the updated moments, so every mode times and checks all of it.
//!
//! Inputs: x `[b, s, d]`, W5's 50 parameters, the target `[b, s, d]`, the first moments, and the second
//! moments given by their roots (`v = r²`: the seeded inputs are uniform in ±2, and a second moment is
//! never negative; one fused multiply). The step is AdamW's tenth (bias corrections for t = 10, torch's
//! default hyper-parameters, lr 1e-3). Its bf16 variant holds everything in bf16 (inputs, parameters,
//! moments: torch's AdamW on bf16 parameters keeps bf16 state) and updates in f32, rounding back.

use kiln::graph::workloads::{w5, w5_inputs, with_dtype, Workload};
use kiln::graph::TensorSpec;
use kiln::optim::AdamW;
use kiln::{DType, Result, Tensor};

/// W5's parameters (everything after x).
const PARAMS: usize = 50;

/// The step's inputs for a batch of `b` sequences of `s` tokens of width `d`.
fn inputs(b: usize, s: usize, d: usize) -> Vec<TensorSpec> {
    let w5 = w5_inputs(b, s, d);
    let params = &w5[1..];
    let mut v = w5.clone();
    v.push(w5[0].clone());
    v.extend(params.iter().cloned());
    v.extend(params.iter().cloned());
    v
}

/// One AdamW step of W5 against a mean-square loss.
fn w5_train(t: &[Tensor]) -> Result<Vec<Tensor>> {
    let n = PARAMS;
    let (model, rest) = t.split_at(1 + n);
    let (y, rest) = rest.split_at(1);
    let (m, r) = rest.split_at(n);
    let mut args = model.to_vec();
    args.push(y[0].clone());
    let wrt: Vec<usize> = (1..=n).collect();
    let (loss, grads) = kiln::value_and_grad(
        |a| {
            let out = w5(&a[..1 + n])?.swap_remove(0);
            kiln::nn::mse_loss(&out, &a[1 + n])
        },
        &args,
        &wrt,
    )?;
    let opt = AdamW::default();
    let steps = 10;
    // Constants of the graph (not inputs; eagerly made where the loss lives): the step number is fixed.
    // f32 whatever the model's dtype (a bf16 learning rate would be another learning rate).
    let like = loss.cast(DType::F32)?;
    let lr_and_corrections = [opt.lr, 1.0 / (1.0 - opt.betas.0.powi(steps)), 1.0 / (1.0 - opt.betas.1.powi(steps))]
        .map(|v| like.new_full(&[1], v));
    let [a, b, c] = lr_and_corrections;
    let scalars = Tensor::concat(&[&a?, &b?, &c?], 0)?;
    let v: Vec<Tensor> = r.iter().map(|r| r.mul(r)).collect::<Result<_>>()?;
    let (p, m, v) = opt.update(&model[1..], &grads, m, &v, &scalars)?;
    Ok([vec![loss], p, m, v].concat())
}

/// FLOPs of one step: the forward's three times over (forward, and backward's two matmuls per matmul).
fn flops(s: &[TensorSpec]) -> Option<f64> {
    kiln::graph::workloads::all()
        .into_iter()
        .find(|w| w.id == "W5")
        .and_then(|w| (w.flops)(&s[..1 + PARAMS]))
        .map(|f| 3.0 * f)
}

/// The training-step workloads.
pub fn all() -> Vec<Workload> {
    let bf16 = |v| with_dtype(v, DType::BF16);
    vec![
        Workload {
            id: "W5-train",
            what: "one W5 training step: forward, mean-square loss, backward, AdamW (f32)",
            full: inputs(8, 512, 768),
            quick: inputs(2, 64, 128),
            check: inputs(1, 16, 128),
            f: w5_train,
            flops,
        },
        Workload {
            id: "W5-train-bf16",
            what: "the W5 training step in bf16 (inputs, parameters and moments bf16; the update in f32)",
            full: bf16(inputs(8, 512, 768)),
            quick: bf16(inputs(2, 64, 128)),
            check: bf16(inputs(1, 16, 128)),
            f: w5_train,
            flops,
        },
    ]
}
