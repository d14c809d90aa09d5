//! Training: the optimizers against their definitions, `nn`'s modules and losses, and a compiled GPT
//! train step (forward, cross-entropy, backward, AdamW — one graph) against the same step run eagerly,
//! on the kernel interpreter; and a tiny GPT that learns a fixed batch.

mod common;

use kiln::graph::{KernelInterpreter, Runtime};
use kiln::loss_scale::LossScale;
use kiln::nn::{cross_entropy, Gpt, GptConfig, Init, Module};
use kiln::optim::{warmup_cosine, AdamW, AdamWState, Sgd};
use kiln::train::{adamw_step, Trainer};
use kiln::Tensor;
use std::sync::Arc;

fn vals(t: &Tensor) -> Vec<f64> {
    t.to_data().unwrap().values().to_vec()
}

fn close(a: &[f64], b: &[f64], tol: f64) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(p, q)| (p - q).abs() <= tol * (1.0 + q.abs()))
}

/// AdamW's first two steps on one parameter, against the formulas written out by hand (torch's).
#[test]
fn adamw_matches_its_definition() {
    let opt = AdamW { lr: 0.1, betas: (0.9, 0.99), eps: 1e-8, weight_decay: 0.1 };
    let p = Tensor::from_slice(&[1.0f32, -2.0], &[2]).unwrap();
    let mut st = AdamWState::new(std::slice::from_ref(&p)).unwrap();
    let (mut pv, mut m, mut v) = (vec![1.0f64, -2.0], [0.0f64; 2], [0.0f64; 2]);
    let mut cur = p.clone();
    for (k, g) in [[0.5f32, -1.0], [0.25, 2.0]].iter().enumerate() {
        let t = (k + 1) as i32;
        let grad = Tensor::from_slice(g, &[2]).unwrap();
        let s = st.scalars(&opt, 1.0, &cur).unwrap();
        let (ps, ms, vs) = opt.update(&[cur.clone()], &[grad], &st.m, &st.v, &s).unwrap();
        for i in 0..2 {
            let g = g[i] as f64;
            pv[i] -= 0.1 * 0.1 * pv[i];
            m[i] = 0.9 * m[i] + 0.1 * g;
            v[i] = 0.99 * v[i] + 0.01 * g * g;
            let (mh, vh) = (m[i] / (1.0 - 0.9f64.powi(t)), v[i] / (1.0 - 0.99f64.powi(t)));
            pv[i] -= 0.1 * mh / (vh.sqrt() + 1e-8);
        }
        assert!(close(&vals(&ps[0]), &pv, 1e-5), "step {t}: {:?} vs {pv:?}", vals(&ps[0]));
        (cur, st.m, st.v) = (ps[0].clone(), ms, vs);
    }
}

/// A compiled AdamW step reads each parameter's gradient, value and moments once and writes the three
/// updates from the same kernel (bf16 state, f32 arithmetic): one kernel per parameter, not one per
/// stored value with the f32 moments written out between them.
#[test]
fn a_compiled_adamw_update_is_one_kernel_per_parameter() {
    use kiln::graph::workloads::{f32s, with_dtype};
    use kiln::graph::{capture, compile_graph, Target};
    let specs = with_dtype((0..4).map(|_| f32s(&[64, 48])).collect(), kiln::DType::BF16);
    let step = |t: &[Tensor]| {
        let opt = AdamW::default();
        let scalars = Tensor::from_slice(&[1e-3f32, 1.5, 100.0], &[3])?;
        let (p, m, v) = opt.update(&t[..1], &t[1..2], &t[2..3], &t[3..4], &scalars)?;
        Ok([p, m, v].concat())
    };
    let c = compile_graph(&capture(&specs, step).unwrap(), &Target::cuda(90)).unwrap();
    assert_eq!(c.kernels.len(), 1, "{c}");
    let writes = c.kernels[0].buffers.iter().filter(|b| b.access == kiln::graph::kernel::Access::Write).count();
    assert_eq!(writes, 3, "{}", c.kernels[0]);
}

/// SGD with momentum, plain and Nesterov, with weight decay, against torch's formulas.
#[test]
fn sgd_matches_its_definition() {
    for nesterov in [false, true] {
        let opt = Sgd { lr: 0.5, momentum: 0.9, weight_decay: 0.1, nesterov };
        let mut p = Tensor::from_slice(&[1.0f32], &[1]).unwrap();
        let mut b = Tensor::from_slice(&[0.0f32], &[1]).unwrap();
        let (mut pv, mut bv) = (1.0f64, 0.0f64);
        for g in [2.0f32, -1.0, 0.5] {
            let (ps, bs) = opt.update(&[p.clone()], &[Tensor::from_slice(&[g], &[1]).unwrap()], &[b.clone()]).unwrap();
            let gd = g as f64 + 0.1 * pv;
            bv = 0.9 * bv + gd;
            pv -= 0.5 * if nesterov { gd + 0.9 * bv } else { bv };
            assert!(close(&vals(&ps[0]), &[pv], 1e-5), "nesterov {nesterov}: {:?} vs {pv}", vals(&ps[0]));
            (p, b) = (ps[0].clone(), bs[0].clone());
        }
    }
}

#[test]
fn warmup_then_cosine() {
    assert_eq!(warmup_cosine(5, 10, 100, 0.1), 0.5);
    assert_eq!(warmup_cosine(10, 10, 100, 0.1), 1.0);
    assert!((warmup_cosine(55, 10, 100, 0.1) - 0.55).abs() < 1e-12, "half-way down");
    assert!((warmup_cosine(100, 10, 100, 0.1) - 0.1).abs() < 1e-12);
}

/// Cross-entropy's value against log-sum-exp by hand, and its gradient (through log-softmax and the
/// gather of the targets) against the closed form softmax − one-hot, over n rows.
#[test]
fn cross_entropy_value_and_gradient() {
    let logits = [0.5f32, -1.0, 2.0, 0.0, 1.5, -0.5];
    let x = Tensor::from_slice(&logits, &[2, 3]).unwrap();
    let y = Tensor::from_slice(&[2i64, 0], &[2]).unwrap();
    let (loss, g) = kiln::value_and_grad(|t| cross_entropy(&t[0], &t[1]), &[x, y], &[0]).unwrap();
    let row = |r: usize| -> (f64, Vec<f64>) {
        let l: Vec<f64> = logits[3 * r..3 * r + 3].iter().map(|&v| v as f64).collect();
        let lse = l.iter().map(|v| v.exp()).sum::<f64>().ln();
        (lse, l.iter().map(|v| (v - lse).exp()).collect())
    };
    let ((lse0, p0), (lse1, p1)) = (row(0), row(1));
    let want = ((lse0 - 2.0) + (lse1 - 0.0)) / 2.0;
    assert!((vals(&loss)[0] - want).abs() < 1e-6, "{:?} vs {want}", vals(&loss));
    let mut grad: Vec<f64> = p0.iter().chain(&p1).map(|p| p / 2.0).collect();
    grad[2] -= 0.5;
    grad[3] -= 0.5;
    assert!(close(&vals(&g[0]), &grad, 1e-6), "{:?} vs {grad:?}", vals(&g[0]));
}

fn tiny() -> GptConfig {
    GptConfig { vocab: 11, context: 8, dim: 16, heads: 2, layers: 1, dropout: 0.0 }
}

#[test]
fn modules_name_and_reload_their_parameters() {
    let gpt = Gpt::new(tiny(), 1).unwrap();
    let names: Vec<String> = gpt.parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names.len(), 2 + 12 + 2 + 1);
    assert_eq!(names[0], "tokens.weight");
    assert_eq!(names[2], "blocks.0.ln1.weight");
    assert_eq!(names.last().unwrap(), "head.weight");
    let again = gpt.load(&gpt.tensors()).unwrap();
    assert_eq!(again.tensors().len(), names.len());
    assert!(gpt.load(&gpt.tensors()[1..]).is_err(), "too few parameters is an error");
    let mut more = gpt.tensors();
    more.push(more[0].clone());
    assert!(gpt.load(&more).is_err(), "too many is one too");
    let same = Gpt::new(tiny(), 1).unwrap();
    assert_eq!(vals(&same.tensors()[4]), vals(&gpt.tensors()[4]), "a seed gives the same weights");
}

/// A checkpoint round-trips by name; a corrupt file, a missing name or another shape is a format error.
#[test]
fn checkpoints_save_and_load_by_name() {
    let dir = std::env::temp_dir().join(format!("kiln-ckpt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("gpt.safetensors");
    let trained = Gpt::new(tiny(), 1).unwrap();
    kiln::nn::save(&trained, &path).unwrap();
    let fresh = Gpt::new(tiny(), 2).unwrap();
    assert_ne!(vals(&fresh.tensors()[4]), vals(&trained.tensors()[4]), "another seed, other weights");
    let loaded = kiln::nn::load(&fresh, &path).unwrap();
    for (a, b) in loaded.tensors().iter().zip(trained.tensors()) {
        assert_eq!(vals(a), vals(&b));
    }
    let wider = Gpt::new(GptConfig { dim: 32, ..tiny() }, 1).unwrap();
    let e = kiln::nn::load(&wider, &path).unwrap_err();
    assert!(matches!(e, kiln::Error::Format { .. }) && e.to_string().contains("tokens.weight"), "{e}");
    let deeper = Gpt::new(GptConfig { layers: 2, ..tiny() }, 1).unwrap();
    assert!(kiln::nn::load(&deeper, &path).unwrap_err().to_string().contains("blocks.1"), "a missing name");
    std::fs::write(&path, b"not a checkpoint").unwrap();
    assert!(matches!(kiln::nn::load(&fresh, &path), Err(kiln::Error::Format { .. })));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// safetensors holds no 4- or 2-bit tensor a byte an element: saving one is a format error naming the
/// parameter, and no file is written.
#[test]
fn a_checkpoint_of_a_four_bit_parameter_is_a_format_error() {
    struct Codes(Tensor);
    impl Module for Codes {
        fn parameters(&self) -> Vec<(String, Tensor)> {
            vec![("codes".into(), self.0.clone())]
        }
        fn with_parameters(&self, next: &mut dyn Iterator<Item = Tensor>) -> kiln::Result<Self> {
            Ok(Codes(next.next().unwrap_or_else(|| self.0.clone())))
        }
    }
    let data = kiln::TensorData::from_f64(vec![-8.0, 7.0, 0.0, -1.0], &[4], kiln::DType::I4).unwrap();
    let path = std::env::temp_dir().join(format!("kiln-ckpt-i4-{}.safetensors", std::process::id()));
    let e = kiln::nn::save(&Codes(Tensor::from_data(data)), &path).unwrap_err();
    assert!(matches!(e, kiln::Error::Format { .. }) && e.to_string().contains("`codes`"), "{e}");
    assert!(e.to_string().contains("i4"), "{e}");
    assert!(!path.exists());
}

fn batch(seed: u64) -> (Tensor, Tensor) {
    let mut init = Init::new(seed);
    let ids = init.ints(&[2, 8], 11).unwrap();
    let targets = init.ints(&[2, 8], 11).unwrap();
    (ids, targets)
}

/// The compiled train step (one graph: forward, cross-entropy, backward, AdamW) gives the loss and the
/// parameters the same step gives run eagerly (the joint graph and the update compiled apart), for three
/// steps, on the kernel interpreter and on wgpu.
#[test]
fn a_compiled_gpt_step_matches_the_eager_step() {
    for rt in common::kernel_devices() {
        compiled_step_matches_eager(&rt);
    }
}

fn compiled_step_matches_eager(rt: &Arc<Runtime>) {
    let model = Gpt::new(tiny(), 7).unwrap().to(rt).unwrap();
    let opt = AdamW { lr: 1e-2, ..AdamW::default() };
    let loss = |m: &Gpt, b: &[Tensor]| m.loss(&b[0], &b[1]);
    let (ids, targets) = batch(3);
    let (ids, targets) = (ids.to(rt.clone()).unwrap(), targets.to(rt.clone()).unwrap());
    let eager = adamw_step(&model, opt, loss);
    let mut trainer = Trainer::new(model.clone(), opt, loss, rt.clone()).unwrap();
    let mut state = AdamWState::new(&model.tensors()).unwrap();
    let mut params = model.tensors();
    let n = params.len();
    for k in 0..3 {
        let s = state.scalars(&opt, 1.0, &params[0]).unwrap();
        let args = [params.clone(), state.m.clone(), state.v.clone(), vec![s, ids.clone(), targets.clone()]].concat();
        let out = eager(args).unwrap();
        let got = trainer.step(&[ids.clone(), targets.clone()], 1.0).unwrap();
        let on = rt.name();
        assert!(
            close(&vals(&got), &vals(&out[0]), 1e-4),
            "{on} step {k}: loss {:?} vs {:?}",
            vals(&got),
            vals(&out[0])
        );
        for (i, (a, b)) in trainer.model().tensors().iter().zip(&out[1..1 + n]).enumerate() {
            assert!(close(&vals(a), &vals(b), 1e-4), "{on} step {k}: parameter {i}");
        }
        params = out[1..1 + n].to_vec();
        (state.m, state.v) = (out[1 + n..1 + 2 * n].to_vec(), out[1 + 2 * n..].to_vec());
    }
    let s = trainer.stats();
    assert_eq!(s.recompiles, 0, "the step never recompiles: {s:?}");
    assert_eq!(trainer.model().tensors()[0].device_name(), Some(rt.name()), "parameters stay on the device");
}

/// A trainer whose step replays a recording (reduce-overhead) trains as the launched one does, bit for
/// bit, and once its recordings are made copies none of its state (bf16 parameters, f32 masters and
/// moments: the step's outputs are its next inputs) in or out: at most the batch and the step's
/// scalars, new buffers each step, are copied in. On the kernel interpreter, where a replay is a launch
/// over the same buffers.
#[test]
fn a_reduce_overhead_trainer_keeps_its_state_in_place() {
    let train = |mode: kiln::Mode| {
        let rt = KernelInterpreter::default().runtime();
        let model = Gpt::new(tiny(), 11).unwrap().cast(kiln::DType::BF16).unwrap().to(&rt).unwrap();
        let opt = AdamW { lr: 2e-2, ..AdamW::default() };
        let options = kiln::train::StepOptions { mode, ..Default::default() };
        let loss = |m: &Gpt, b: &[Tensor]| m.loss(&b[0], &b[1]);
        let mut trainer = Trainer::with_options(model, opt, options, loss, rt.clone()).unwrap();
        let mut steps = Vec::new();
        for k in 0..8 {
            let (ids, targets) = batch(k);
            let b = [ids.to(rt.clone()).unwrap(), targets.to(rt.clone()).unwrap()];
            let before = rt.stats();
            let loss = trainer.step(&b, 1.0).unwrap().item::<f32>().unwrap();
            let s = rt.stats();
            steps.push((
                loss,
                s.replay_input_copies - before.replay_input_copies,
                s.replay_output_copies - before.replay_output_copies,
            ));
        }
        (steps, vals(&trainer.model().tensors()[4]))
    };
    let (launched, launched_w) = train(kiln::Mode::Default);
    let (replayed, replayed_w) = train(kiln::Mode::ReduceOverhead);
    let losses = |s: &[(f32, u64, u64)]| s.iter().map(|x| x.0).collect::<Vec<_>>();
    assert_eq!(losses(&replayed), losses(&launched));
    assert_eq!(replayed_w, launched_w);
    for (k, &(_, copied_in, copied_out)) in replayed.iter().enumerate().skip(5) {
        assert!(copied_in <= 3 && copied_out == 0, "step {k} copied its state: {replayed:?}");
    }
}

/// A tiny GPT memorises one batch: the loss falls from ~ln(11) to well below it in 40 steps.
#[test]
fn a_tiny_gpt_learns_a_batch() {
    let rt = KernelInterpreter::default().runtime();
    let model = Gpt::new(tiny(), 11).unwrap().to(&rt).unwrap();
    let opt = AdamW { lr: 2e-2, weight_decay: 0.0, ..AdamW::default() };
    let mut trainer = Trainer::new(model, opt, |m: &Gpt, b: &[Tensor]| m.loss(&b[0], &b[1]), rt.clone()).unwrap();
    let (ids, targets) = batch(5);
    let b = [ids.to(rt.clone()).unwrap(), targets.to(rt.clone()).unwrap()];
    let first = trainer.step(&b, 1.0).unwrap().item::<f32>().unwrap();
    assert!((first - 11f32.ln()).abs() < 0.2, "an untrained model guesses uniformly: {first}");
    let mut last = first;
    for _ in 0..39 {
        last = trainer.step(&b, 1.0).unwrap().item::<f32>().unwrap();
    }
    assert!(last < 0.5 * first, "loss {first} → {last} after 40 steps");
    assert_eq!(trainer.steps(), 40);
}

/// Ten steps of the tiny GPT cast to `dtype` on one batch (lr 2e-2, no weight decay), on the kernel
/// interpreter: the last loss and the trainer.
fn ten_steps_in(dtype: kiln::DType) -> (f32, Trainer<Gpt, impl kiln::train::StepFn>) {
    let rt = KernelInterpreter::default().runtime();
    let opt = AdamW { lr: 2e-2, weight_decay: 0.0, ..AdamW::default() };
    let (ids, targets) = batch(5);
    let b = [ids.to(rt.clone()).unwrap(), targets.to(rt.clone()).unwrap()];
    let model = Gpt::new(tiny(), 11).unwrap().cast(dtype).unwrap().to(&rt).unwrap();
    let mut trainer = Trainer::new(model, opt, |m: &Gpt, b: &[Tensor]| m.loss(&b[0], &b[1]), rt.clone()).unwrap();
    let mut loss = 0.0;
    for _ in 0..10 {
        loss = trainer.step(&b, 1.0).unwrap().item::<f32>().unwrap();
    }
    assert_eq!(trainer.model().tensors()[4].dtype(), dtype, "the model keeps its dtype");
    (loss, trainer)
}

/// Ten steps of an f32 model and of the same model in `half`: the half model learns and its loss follows
/// the f32 one's within 5%; `check` sees each run's dtype, masters and loss-scale state.
fn half_follows_f32(
    half: kiln::DType,
    check: impl Fn(kiln::DType, Option<&[Tensor]>, Option<kiln::loss_scale::LossScaleState>),
) {
    let mut last = Vec::new();
    for dtype in [kiln::DType::F32, half] {
        let (loss, trainer) = ten_steps_in(dtype);
        check(dtype, trainer.masters(), trainer.loss_scale().unwrap());
        last.push(loss);
    }
    eprintln!("losses after 10 steps, f32 and {half}: {last:?}");
    assert!(last[1] < 0.8 * 11f32.ln(), "the {half} model learns: {last:?}");
    assert!((last[0] - last[1]).abs() < 0.05 * last[0], "and follows the f32 one: {last:?}");
}

/// A bf16 model trains on f32 master weights: its parameters stay bf16, the masters f32, and its loss
/// follows the f32 model's (within 5%) over 10 steps on one batch, while it is still falling.
#[test]
fn a_bf16_gpt_trains_on_f32_masters() {
    half_follows_f32(kiln::DType::BF16, |dtype, masters, scale| {
        match masters {
            Some(m) => assert!(dtype == kiln::DType::BF16 && m[4].dtype() == kiln::DType::F32, "f32 masters"),
            None => assert_eq!(dtype, kiln::DType::F32),
        }
        assert!(scale.is_none(), "bf16 needs no loss scaling");
    });
}

/// An f16 model trains with dynamic loss scaling: parameters stay f16 on f32 masters, no step overflows
/// at the default scale (the loss is f32, so 2¹⁶ meets f16 only after the mean divides it), and the loss
/// follows the f32 model's within 5% over 10 steps.
#[test]
fn an_f16_gpt_trains_with_dynamic_loss_scaling() {
    half_follows_f32(kiln::DType::F16, |dtype, _, scale| {
        if dtype == kiln::DType::F16 {
            let s = scale.expect("an f16 model scales its loss");
            assert_eq!((s.scale, s.updates, s.good_steps), (65536.0, 10, 10), "{s:?}");
        } else {
            assert!(scale.is_none(), "an f32 model does not");
        }
    });
}

/// A step whose gradients overflow f16 is skipped on the device — masters and moments keep their values
/// bit for bit — and the scale halves until steps fit; the loss it returns is still the unscaled loss.
#[test]
fn an_overflowing_loss_scale_skips_steps_and_backs_off() {
    let rt = KernelInterpreter::default().runtime();
    let opt = AdamW { lr: 2e-2, ..AdamW::default() };
    let (ids, targets) = batch(5);
    let b = [ids.to(rt.clone()).unwrap(), targets.to(rt.clone()).unwrap()];
    let model = Gpt::new(tiny(), 11).unwrap().cast(kiln::DType::F16).unwrap().to(&rt).unwrap();
    let initial: Vec<Vec<f64>> = model.tensors().iter().map(|t| vals(&t.cast(kiln::DType::F32).unwrap())).collect();
    let scaling = Some(LossScale { init: 2f64.powi(40), ..LossScale::default() });
    let loss = |m: &Gpt, b: &[Tensor]| m.loss(&b[0], &b[1]);
    let mut trainer = Trainer::with_loss_scale(model, opt, scaling, loss, rt.clone()).unwrap();
    let first = trainer.step(&b, 1.0).unwrap().item::<f32>().unwrap();
    assert!((first - 11f32.ln()).abs() < 0.2, "the unscaled loss: {first}");
    let s = trainer.loss_scale().unwrap().unwrap();
    assert_eq!((s.scale, s.updates, s.good_steps), (2f64.powi(39), 0, 0), "skipped and backed off: {s:?}");
    for (m, want) in trainer.masters().unwrap().iter().zip(&initial) {
        assert_eq!(&vals(m), want, "a skipped step leaves the masters as they were");
    }
    let mut calls = 1;
    while trainer.loss_scale().unwrap().unwrap().updates == 0 {
        assert!(calls < 40, "the scale never came down to where steps fit");
        trainer.step(&b, 1.0).unwrap();
        calls += 1;
    }
    let s = trainer.loss_scale().unwrap().unwrap();
    assert_eq!(s.scale, 2f64.powi(40 - (calls - 1)), "one halving per skipped step: {s:?} after {calls} calls");
    assert!(s.scale >= 1024.0, "steps fit well before the scale is small: {s:?}");
    assert_ne!(vals(&trainer.masters().unwrap()[4]), initial[4], "the applied step moved the weights");
    assert_eq!(trainer.steps(), calls as u64, "every call counts as a step");
}

/// After `interval` good steps in a row the scale doubles, and the count starts again.
#[test]
fn the_loss_scale_grows_after_an_interval_of_good_steps() {
    let rt = KernelInterpreter::default().runtime();
    let (ids, targets) = batch(5);
    let b = [ids.to(rt.clone()).unwrap(), targets.to(rt.clone()).unwrap()];
    let model = Gpt::new(tiny(), 11).unwrap().cast(kiln::DType::F16).unwrap().to(&rt).unwrap();
    let scaling = Some(LossScale { init: 256.0, interval: 3, ..LossScale::default() });
    let loss = |m: &Gpt, b: &[Tensor]| m.loss(&b[0], &b[1]);
    let mut trainer = Trainer::with_loss_scale(model, AdamW::default(), scaling, loss, rt.clone()).unwrap();
    let mut seen = Vec::new();
    for _ in 0..7 {
        trainer.step(&b, 1.0).unwrap();
        let s = trainer.loss_scale().unwrap().unwrap();
        seen.push((s.scale, s.good_steps));
    }
    let want = [(256.0, 1), (256.0, 2), (512.0, 0), (512.0, 1), (512.0, 2), (1024.0, 0), (1024.0, 1)];
    assert_eq!(seen, want);
    assert_eq!(trainer.stats().recompiles, 0, "the scale is a device tensor, never a constant");
}

/// A loss-scaled step with nothing to overflow follows the unscaled one: with scaling on an f32 model
/// (by a power of two, exact in f32) the parameters after three steps agree with the unscaled run's.
#[test]
fn loss_scaling_an_f32_model_changes_nothing_but_the_exponent() {
    let rt = KernelInterpreter::default().runtime();
    let (ids, targets) = batch(5);
    let b = [ids.to(rt.clone()).unwrap(), targets.to(rt.clone()).unwrap()];
    let opt = AdamW { lr: 1e-2, ..AdamW::default() };
    let loss = |m: &Gpt, b: &[Tensor]| m.loss(&b[0], &b[1]);
    let mut runs = Vec::new();
    for scaling in [None, Some(LossScale { init: 1024.0, ..LossScale::default() })] {
        let model = Gpt::new(tiny(), 3).unwrap().to(&rt).unwrap();
        let mut trainer = Trainer::with_loss_scale(model, opt, scaling, loss, rt.clone()).unwrap();
        let losses: Vec<f64> = (0..3).map(|_| vals(&trainer.step(&b, 1.0).unwrap())[0]).collect();
        runs.push((losses, trainer.model().tensors().iter().map(vals).collect::<Vec<_>>()));
    }
    assert!(close(&runs[0].0, &runs[1].0, 1e-6), "losses {:?} vs {:?}", runs[0].0, runs[1].0);
    for (i, (a, b)) in runs[0].1.iter().zip(&runs[1].1).enumerate() {
        assert!(close(a, b, 1e-4), "parameter {i}");
    }
}

/// A GPT with dropout: evaluation ignores it (the logits of p = 0); training draws its masks from the
/// step's key — the same key, the same loss, eager or compiled, on the kernel interpreter and on wgpu
/// alike; another key, another loss — and the compiled step takes a new key each step without
/// recompiling.
#[test]
fn a_gpt_with_dropout_draws_its_masks_from_the_step_key() {
    let cfg = GptConfig { dropout: 0.2, ..tiny() };
    let (ids, targets) = batch(5);
    let mut curves = Vec::new();
    for rt in common::kernel_devices() {
        let on = rt.name();
        let model = Gpt::new(cfg, 11).unwrap().to(&rt).unwrap();
        let plain = Gpt::new(tiny(), 11).unwrap().to(&rt).unwrap();
        let (ids, targets) = (ids.to(rt.clone()).unwrap(), targets.to(rt.clone()).unwrap());
        let key = |s: u32| Tensor::rng_key(9, s).to(rt.clone()).unwrap();
        let eval = vals(&model.loss(&ids, &targets).unwrap())[0];
        assert_eq!(eval, vals(&plain.loss(&ids, &targets).unwrap())[0], "{on}: evaluation has no dropout");
        let train = |s: u32| vals(&model.loss_train(&ids, &targets, &key(s)).unwrap())[0];
        let (a, again, other) = (train(0), train(0), train(1));
        assert_eq!(a, again, "{on}: one key, one mask");
        assert!(a != other && a != eval, "{on}: another key or none, another loss ({a}, {other}, {eval})");
        let loss = |m: &Gpt, b: &[Tensor]| m.loss_train(&b[0], &b[1], &b[2]);
        let mut trainer = Trainer::new(model.clone(), AdamW::default(), loss, rt.clone()).unwrap();
        let curve: Vec<f64> =
            (0..4).map(|s| vals(&trainer.step(&[ids.clone(), targets.clone(), key(s)], 1.0).unwrap())[0]).collect();
        assert!((curve[0] - a).abs() < 1e-5 * a, "{on}: the compiled step draws the eager masks: {} vs {a}", curve[0]);
        assert_eq!(trainer.stats().recompiles, 0, "{on}: a new key is data, not a new graph");
        curves.push(curve);
    }
    for c in &curves[1..] {
        assert!(close(c, &curves[0], 1e-4), "every backend draws the same masks: {curves:?}");
    }
}
