//! Training parity with torch: ten AdamW steps of a GPT, from the same initial weights and batches, give
//! kiln the losses and parameters torch gets.
//!
//! The fixture (`tests/data/parity/`) is torch's own run, written by `benches/peers/torch_train_parity.py`:
//! the initial weights by kiln's parameter names, ten batches, and torch's losses and final parameters in
//! float32 and float64. kiln's float32 step (compiled, and eager) is measured against torch's float64 run
//! and must land as close to it as torch's own float32 run does (within a small factor): an error in a
//! gradient, the loss or the optimizer moves the parameters by far more than rounding does.

mod common;

use kiln::graph::Runtime;
use kiln::nn::{Gpt, GptConfig, Module};
use kiln::optim::{AdamW, AdamWState};
use kiln::train::{adamw_step, Trainer};
use kiln::{Tensor, TensorData};
use safetensors::SafeTensors;
use std::path::PathBuf;
use std::sync::Arc;

/// A fixture file: from `KILN_PARITY_DIR` where set (a larger run written on the GPU machine by
/// `scripts/gpu.sh parity`), else the committed one.
fn fixture(name: &str) -> PathBuf {
    match std::env::var_os("KILN_PARITY_DIR") {
        Some(dir) => PathBuf::from(dir).join(name),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/parity").join(name),
    }
}

/// torch's run: the model's sizes, AdamW's hyper-parameters, the batches and what torch computed.
struct TorchRun {
    config: GptConfig,
    steps: usize,
    opt: AdamW,
    ids: TensorData,
    targets: TensorData,
    /// The loss before each step, float32 and float64.
    loss32: Vec<f64>,
    loss64: Vec<f64>,
    /// Parameters after the last step, by name: float32 and float64.
    final32: Vec<(String, Vec<f64>)>,
    final64: Vec<(String, Vec<f64>)>,
}

fn tensor(file: &SafeTensors, name: &str) -> TensorData {
    let v = file.tensor(name).unwrap_or_else(|e| panic!("the fixture has no `{name}`: {e}"));
    let dtype = match v.dtype() {
        safetensors::Dtype::F32 => kiln::DType::F32,
        safetensors::Dtype::I64 => kiln::DType::I64,
        d => panic!("`{name}` is {d:?}"),
    };
    TensorData::from_le_bytes(v.data(), v.shape(), dtype).unwrap()
}

/// A float64 tensor's values exactly (not through an f32 container).
fn values64(file: &SafeTensors, name: &str) -> Vec<f64> {
    let v = file.tensor(name).unwrap();
    assert_eq!(v.dtype(), safetensors::Dtype::F64, "`{name}` is float64");
    v.data().chunks_exact(8).map(|b| f64::from_le_bytes(b.try_into().unwrap())).collect()
}

fn metadata(bytes: &[u8]) -> (serde_json::Value, serde_json::Value) {
    let (_, meta) = SafeTensors::read_metadata(bytes).unwrap();
    let m = meta.metadata().as_ref().expect("the fixture says how torch ran");
    let json = |k: &str| serde_json::from_str::<serde_json::Value>(&m[k]).unwrap();
    (json("config"), json("adamw"))
}

fn torch_run() -> TorchRun {
    let batches = std::fs::read(fixture("gpt.batches.safetensors")).unwrap();
    let result = std::fs::read(fixture("gpt.torch.safetensors")).unwrap();
    let (config, adamw) = metadata(&result);
    let n = |k: &str| config[k].as_u64().unwrap() as usize;
    let f = |k: &str| adamw[k].as_f64().unwrap();
    let config = GptConfig {
        vocab: n("vocab"),
        context: n("context"),
        dim: n("dim"),
        heads: n("heads"),
        layers: n("layers"),
        dropout: 0.0,
    };
    let names: Vec<String> = Gpt::new(config, 0).unwrap().parameters().into_iter().map(|(n, _)| n).collect();
    let b = SafeTensors::deserialize(&batches).unwrap();
    let r = SafeTensors::deserialize(&result).unwrap();
    TorchRun {
        config,
        steps: n("steps"),
        opt: AdamW { lr: f("lr"), betas: (f("beta1"), f("beta2")), eps: f("eps"), weight_decay: f("weight_decay") },
        ids: tensor(&b, "ids"),
        targets: tensor(&b, "targets"),
        loss32: tensor(&r, "loss").values().to_vec(),
        loss64: values64(&r, "loss64"),
        final32: names.iter().map(|k| (k.clone(), tensor(&r, &format!("f32.{k}")).values().to_vec())).collect(),
        final64: names.iter().map(|k| (k.clone(), values64(&r, &format!("f64.{k}")))).collect(),
    }
}

/// Step `k`'s batch (`[batch, seq]` i64 ids and targets) on `rt`.
fn batch(run: &TorchRun, k: usize, rt: &Arc<Runtime>) -> [Tensor; 2] {
    [&run.ids, &run.targets].map(|d| {
        let t = Tensor::from_data(d.clone()).narrow(0, k, 1).unwrap();
        let dims = t.shape().as_concrete().unwrap();
        t.reshape(&[dims[1] as isize, dims[2] as isize]).unwrap().to(rt.clone()).unwrap()
    })
}

/// The model with torch's initial weights, on `rt`.
fn initial_model(run_config: GptConfig, rt: &Arc<Runtime>) -> Gpt {
    let shape = Gpt::new(run_config, 0).unwrap();
    kiln::nn::load(&shape, &fixture("gpt.init.safetensors")).unwrap().to(rt).unwrap()
}

fn vals(t: &Tensor) -> Vec<f64> {
    t.to_data().unwrap().values().to_vec()
}

/// ‖a − b‖₂ over every parameter.
fn distance(a: &[(String, Vec<f64>)], b: &[(String, Vec<f64>)]) -> f64 {
    a.iter().zip(b).flat_map(|((_, x), (_, y))| x.iter().zip(y).map(|(p, q)| (p - q) * (p - q))).sum::<f64>().sqrt()
}

/// What one kiln run must show against torch's: its losses and its final parameters as close to the
/// float64 run as torch's float32 run is, within `FACTOR` (or a floor for when torch's rounding happens to
/// be tiny), and each parameter tensor's update (final − initial) in torch's direction.
const FACTOR: f64 = 8.0;

fn check(on: &str, run: &TorchRun, initial: &[(String, Vec<f64>)], losses: &[f64], finals: &[(String, Vec<f64>)]) {
    let worst = |a: &[f64]| a.iter().zip(&run.loss64).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
    let (kiln_loss, torch_loss) = (worst(losses), worst(&run.loss32));
    eprintln!(
        "{on}: losses {losses:.6?}; worst loss error vs torch f64 {kiln_loss:.3e} (torch f32's {torch_loss:.3e})"
    );
    assert!(
        kiln_loss <= FACTOR * torch_loss + 1e-6,
        "{on}: losses {losses:?} against torch's float64 {:?} (torch float32 {:?})",
        run.loss64,
        run.loss32
    );
    let (kiln_params, torch_params) = (distance(finals, &run.final64), distance(&run.final32, &run.final64));
    let moved = distance(initial, &run.final64);
    eprintln!(
        "{on}: parameters {kiln_params:.3e} from torch f64 (torch f32: {torch_params:.3e}; ten steps moved them {moved:.3e})"
    );
    assert!(
        kiln_params <= FACTOR * torch_params + 1e-6 * moved,
        "{on}: final parameters {kiln_params:.3e} from torch's float64 run, torch's float32 {torch_params:.3e}"
    );
    for (((name, p), (_, want)), (_, start)) in finals.iter().zip(&run.final64).zip(initial) {
        let dot: f64 = p.iter().zip(want).zip(start).map(|((p, w), s)| (p - s) * (w - s)).sum();
        let norm = |a: &[f64]| a.iter().zip(start).map(|(x, s)| (x - s) * (x - s)).sum::<f64>().sqrt();
        let cosine = dot / (norm(p) * norm(want)).max(f64::MIN_POSITIVE);
        assert!(cosine > 0.999, "{on}: `{name}` moved in another direction than torch's (cosine {cosine})");
    }
}

fn params_of(model: &Gpt) -> Vec<(String, Vec<f64>)> {
    model.parameters().into_iter().map(|(n, t)| (n, vals(&t))).collect()
}

/// The compiled train step (one graph: forward, cross-entropy, backward, AdamW), ten steps.
fn compiled(run: &TorchRun, rt: &Arc<Runtime>) -> (Vec<f64>, Vec<(String, Vec<f64>)>) {
    let model = initial_model(run.config, rt);
    let loss = |m: &Gpt, b: &[Tensor]| m.loss(&b[0], &b[1]);
    let mut trainer = Trainer::new(model, run.opt, loss, rt.clone()).unwrap();
    let losses = (0..run.steps).map(|k| trainer.step(&batch(run, k, rt), 1.0).unwrap().item::<f32>().unwrap() as f64);
    let losses: Vec<f64> = losses.collect();
    assert_eq!(trainer.stats().recompiles, 0, "ten steps, one compile: {:?}", trainer.stats());
    (losses, params_of(trainer.model()))
}

/// The same step run eagerly (op by op), ten steps.
fn eager(run: &TorchRun, rt: &Arc<Runtime>) -> (Vec<f64>, Vec<(String, Vec<f64>)>) {
    let model = initial_model(run.config, rt);
    let step = adamw_step(&model, run.opt, |m: &Gpt, b: &[Tensor]| m.loss(&b[0], &b[1]));
    let mut params = model.tensors();
    let n = params.len();
    let mut state = AdamWState::new(&params).unwrap();
    let mut losses = Vec::new();
    for k in 0..run.steps {
        let s = state.scalars(&run.opt, 1.0, &params[0]).unwrap();
        let out =
            step([params.clone(), state.m.clone(), state.v.clone(), vec![s], batch(run, k, rt).to_vec()].concat())
                .unwrap();
        losses.push(vals(&out[0])[0]);
        params = out[1..1 + n].to_vec();
        (state.m, state.v) = (out[1 + n..1 + 2 * n].to_vec(), out[1 + 2 * n..].to_vec());
    }
    (losses, params_of(&model.load(&params).unwrap()))
}

fn parity_on(rt: &Arc<Runtime>, with_eager: bool) {
    let run = torch_run();
    let initial = params_of(&initial_model(run.config, rt));
    let (losses, finals) = compiled(&run, rt);
    check(&format!("{} compiled", rt.name()), &run, &initial, &losses, &finals);
    if with_eager {
        let (losses, finals) = eager(&run, rt);
        check(&format!("{} eager", rt.name()), &run, &initial, &losses, &finals);
    }
}

/// Compiled on the kernel interpreter and on wgpu (lavapipe in CI); eager on the interpreter (eager on
/// lavapipe is a kernel per op: a minute of CI for what the interpreter already shows).
#[test]
fn ten_adamw_steps_train_as_torch_does() {
    for (i, rt) in common::kernel_devices().iter().enumerate() {
        parity_on(rt, i == 0);
    }
}

/// The same on CUDA (the GPU machine; `scripts/test.sh` includes ignored tests where a driver exists).
#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored on a machine with a CUDA driver (scripts/test.sh does)"]
fn ten_adamw_steps_train_as_torch_does_on_cuda() {
    let rt = kiln::Backend::Cuda.runtime().unwrap_or_else(|e| panic!("{e}")).expect("CUDA has a runtime");
    parity_on(&rt, true);
}

/// The check has teeth: a wrong learning rate (1% off) is a different training run.
#[test]
fn a_one_percent_learning_rate_error_fails_the_check() {
    let rt = kiln::graph::KernelInterpreter::default().runtime();
    let mut run = torch_run();
    let initial = params_of(&initial_model(run.config, &rt));
    run.opt.lr *= 1.01;
    let (losses, finals) = compiled(&run, &rt);
    let caught = std::panic::catch_unwind(|| check("interpreter, lr × 1.01", &run, &initial, &losses, &finals));
    assert!(caught.is_err(), "a 1% learning-rate error passed the parity check");
}
