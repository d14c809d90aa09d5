//! The training loop as a user runs it: `fit` over a dataset whose size is not a multiple of the batch,
//! validating every epoch — each step function compiled exactly once (the batch dim symbolic), the loss
//! falling; stopped and resumed from its checkpoint, it continues bit for bit as if never stopped;
//! accumulated micro-batches give the big batch's step. On the kernel interpreter and on wgpu.

mod common;

use common::classifier::{blobs, Mlp};
use kiln::data::{features, labels, Loader, Sampler, TensorDataset};
use kiln::fit::{fit, FitConfig, Fitted, Monitor, Stop};
use kiln::nn::Module;
use kiln::optim::AdamW;
use kiln::{Backend, Tensor};

/// Held by every test for its whole run: the tests share each backend's runtime, whose counters one of
/// them reads (how many recordings a replayed fit makes), so none runs beside another.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn config(out: Option<std::path::PathBuf>) -> FitConfig {
    FitConfig { max_epochs: 4, seed: 7, out, checkpoint_every: Some(3), ..FitConfig::default() }
}

fn run(backend: Backend, cfg: &FitConfig, batch: usize) -> Fitted<Mlp> {
    // 100 training samples in batches of 16: six full batches and one of 4. 30 validation samples: 16 + 14.
    let train = Loader::new(blobs(100, 1), batch).shuffle(Some(11));
    let val = Loader::new(blobs(30, 2), 16).shuffle(None);
    let opt = AdamW { lr: 3e-2, ..AdamW::default() };
    fit(Mlp::new(4, 16, 3, 5), opt, |m: &Mlp, b| m.loss(b), |m: &Mlp, b| m.loss(b), &train, Some(&val), backend, cfg)
        .unwrap()
}

fn bits(h: &kiln::fit::History) -> Vec<(u64, u64, Option<u64>)> {
    let steps = h.steps.iter().map(|s| (s.step, s.loss.to_bits(), None));
    steps.chain(h.epochs.iter().map(|e| (e.step, e.train_loss.to_bits(), e.val_loss.map(f64::to_bits)))).collect()
}

fn params(m: &Mlp) -> Vec<Vec<u32>> {
    m.tensors().iter().map(|t| t.to_vec::<f32>().unwrap().iter().map(|v| v.to_bits()).collect()).collect()
}

/// Compiles each step once (a symbolic batch dim serves the full and the short batches), whatever the
/// epochs; learns;
/// writes its metrics, curves and checkpoints.
fn fit_compiles_once_and_learns(backend: Backend) {
    let out = tempfile_dir("fit");
    let f = run(backend, &FitConfig { report: true, ..config(Some(out.clone())) }, 16);
    assert_eq!(f.stopped, Stop::MaxEpochs);
    assert_eq!(f.history.steps.len(), 4 * 7, "seven steps an epoch");
    assert_eq!(f.history.epochs.len(), 4);
    let t = &f.train_stats;
    assert_eq!((t.traces, t.entries, t.recompiles, t.eager_fallbacks), (1, 1, 0, 0), "train step: {t:?}");
    assert_eq!(t.calls, 28);
    let v = f.val_stats.as_ref().unwrap();
    assert_eq!((v.traces, v.entries, v.recompiles, v.eager_fallbacks), (1, 1, 0, 0), "validation step: {v:?}");
    assert_eq!(v.calls, 8);
    let (first, last) = (&f.history.epochs[0], &f.history.epochs[3]);
    assert!(last.train_loss < 0.5 * first.train_loss, "{:?}", f.history.epochs);
    assert!(last.val_loss.unwrap() < 0.5 * first.val_loss.unwrap(), "{:?}", f.history.epochs);
    for file in ["steps.csv", "epochs.csv", "metrics.json", "loss.png", "loss.svg"] {
        assert!(out.join(file).is_file(), "{file} written");
    }
    for file in ["model.safetensors", "optimizer.safetensors", "state.json"] {
        assert!(out.join("checkpoints/last").join(file).is_file(), "last/{file} written");
    }
    let csv = std::fs::read_to_string(out.join("steps.csv")).unwrap();
    assert_eq!(csv.lines().count(), 1 + 28);
    // The run's compile report (asked for): each step function's one entry, its kernels with sources.
    for (name, stats) in [("train_step", t), ("val_step", v)] {
        let text = std::fs::read_to_string(out.join("compile").join(format!("{name}.json"))).unwrap();
        let report = kiln::CompileReport::from_json(&text).unwrap();
        assert_eq!(report.entries.len(), stats.entries, "{name}");
        let kernels: usize = report.entries.iter().flat_map(|e| &e.graphs).map(|g| g.kernels.len()).sum();
        assert!(kernels > 0, "{name}: no kernels in {text}");
    }
    let _ = std::fs::remove_dir_all(out);
}

/// Stopped after step 10 (inside the second epoch) and resumed from its checkpoint in a new `fit`, the
/// run's losses, validation losses and final parameters are bit-identical to a run that never stopped.
fn resume_is_bit_identical(backend: Backend) {
    let whole = run(backend, &config(None), 16);
    let out = tempfile_dir("resume");
    let first = run(backend, &FitConfig { max_steps: Some(10), ..config(Some(out.clone())) }, 16);
    assert_eq!(first.stopped, Stop::MaxSteps);
    assert_eq!(first.history.steps.len(), 10);
    let resumed = run(backend, &FitConfig { resume: Some(out.join("checkpoints/last")), ..config(None) }, 16);
    assert_eq!(bits(&resumed.history), bits(&whole.history), "the resumed run's history is the uninterrupted one's");
    assert_eq!(params(&resumed.model), params(&whole.model));
    let _ = std::fs::remove_dir_all(out);
}

/// Batches of 8 accumulated two at a time make the same steps (same samples, same weighting) as
/// batches of 16, up to rounding; early stopping and the best checkpoint follow the monitor.
fn accumulation_matches_the_big_batch(backend: Backend) {
    let big = run(backend, &config(None), 16);
    let out = tempfile_dir("accumulate");
    let small = run(backend, &FitConfig { accumulate: 2, report: true, ..config(Some(out.clone())) }, 8);
    // Split steps report both halves.
    for name in ["accumulate", "apply", "val_step"] {
        let text = std::fs::read_to_string(out.join("compile").join(format!("{name}.json"))).unwrap();
        assert_eq!(kiln::CompileReport::from_json(&text).unwrap().entries.len(), 1, "{name}");
    }
    assert!(!out.join("compile/train_step.json").exists());
    let _ = std::fs::remove_dir_all(&out);
    assert_eq!(small.history.steps.len(), big.history.steps.len());
    for (a, b) in small.history.steps.iter().zip(&big.history.steps) {
        assert!((a.loss - b.loss).abs() <= 1e-4 * b.loss.abs().max(1.0), "step {}: {} vs {}", a.step, a.loss, b.loss);
    }
    let (a, b) = (small.model.tensors(), big.model.tensors());
    for (x, y) in a.iter().zip(&b) {
        let (x, y) = (x.to_vec::<f32>().unwrap(), y.to_vec::<f32>().unwrap());
        assert!(x.iter().zip(&y).all(|(p, q)| (p - q).abs() <= 1e-3), "{x:?} vs {y:?}");
    }
}

/// Every step replayed from a recording (reduce-overhead: the train step, its accumulated halves and
/// the validation step, each over the full and the short batch) trains bit for bit as launched.
fn reduce_overhead_trains_as_launched(backend: Backend) {
    for (batch, accumulate) in [(16, 1), (8, 2)] {
        let cfg = FitConfig { accumulate, ..config(None) };
        let launched = run(backend, &cfg, batch);
        let rt = backend.runtime().unwrap().expect("a device backend");
        let before = rt.stats().replay_input_copies;
        let replayed = run(backend, &FitConfig { mode: kiln::Mode::ReduceOverhead, ..cfg }, batch);
        // Each step's new batch is copied into a recording's buffers: the steps were replayed.
        assert!(rt.stats().replay_input_copies > before, "{:?}", rt.stats());
        assert_eq!(bits(&replayed.history), bits(&launched.history), "batch {batch}, accumulate {accumulate}");
        assert_eq!(params(&replayed.model), params(&launched.model));
    }
    // The recordings are made in the first epochs (the full and the short batch's steps feed each other
    // in place, each pair once): a run twice as long records nothing more. A recording's first run is
    // a run beside the calls'.
    let recorded = |epochs: u64| {
        let rt = backend.runtime().unwrap().expect("a device backend");
        let before = rt.stats().runs;
        let cfg = FitConfig { max_epochs: epochs, mode: kiln::Mode::ReduceOverhead, ..config(None) };
        let f = run(backend, &cfg, 16);
        let calls = f.train_stats.calls + f.val_stats.as_ref().map_or(0, |v| v.calls);
        rt.stats().runs - before - calls as u64
    };
    let (four, eight) = (recorded(4), recorded(8));
    assert!(four <= 10 && eight == four, "recordings over 4 epochs {four}, over 8 {eight}");
}

fn tempfile_dir(what: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("kiln-{what}-{}-{:?}", std::process::id(), std::thread::current().id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn kernels_fit_compiles_once_and_learns() {
    let _serial = one_at_a_time();
    fit_compiles_once_and_learns(Backend::Kernels);
}

#[test]
fn kernels_resume_is_bit_identical() {
    let _serial = one_at_a_time();
    resume_is_bit_identical(Backend::Kernels);
}

#[test]
fn kernels_accumulation_matches_the_big_batch() {
    let _serial = one_at_a_time();
    accumulation_matches_the_big_batch(Backend::Kernels);
}

#[test]
fn kernels_reduce_overhead_trains_as_launched() {
    let _serial = one_at_a_time();
    reduce_overhead_trains_as_launched(Backend::Kernels);
}

#[test]
fn wgpu_reduce_overhead_trains_as_launched() {
    let _serial = one_at_a_time();
    if !common::wgpu_skipped() {
        reduce_overhead_trains_as_launched(Backend::Wgpu);
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored on a machine with a CUDA driver (scripts/test.sh does)"]
fn cuda_reduce_overhead_trains_as_launched() {
    let _serial = one_at_a_time();
    reduce_overhead_trains_as_launched(Backend::Cuda);
}

#[test]
fn wgpu_fit_compiles_once_and_learns() {
    let _serial = one_at_a_time();
    if !common::wgpu_skipped() {
        fit_compiles_once_and_learns(Backend::Wgpu);
    }
}

#[test]
fn wgpu_accumulation_matches_the_big_batch() {
    let _serial = one_at_a_time();
    if !common::wgpu_skipped() {
        accumulation_matches_the_big_batch(Backend::Wgpu);
    }
}

#[test]
fn wgpu_resume_is_bit_identical() {
    let _serial = one_at_a_time();
    if !common::wgpu_skipped() {
        resume_is_bit_identical(Backend::Wgpu);
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored on a machine with a CUDA driver (scripts/test.sh does)"]
fn cuda_fit_compiles_once_and_learns() {
    let _serial = one_at_a_time();
    fit_compiles_once_and_learns(Backend::Cuda);
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored on a machine with a CUDA driver (scripts/test.sh does)"]
fn cuda_resume_is_bit_identical() {
    let _serial = one_at_a_time();
    resume_is_bit_identical(Backend::Cuda);
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored on a machine with a CUDA driver (scripts/test.sh does)"]
fn cuda_accumulation_matches_the_big_batch() {
    let _serial = one_at_a_time();
    accumulation_matches_the_big_batch(Backend::Cuda);
}

#[test]
fn early_stopping_stops_and_keeps_the_best() {
    let _serial = one_at_a_time();
    // No later epoch improves on the first by the margin: two stale epochs, then the stop.
    let out = tempfile_dir("early");
    let monitor = Monitor { min_delta: 10.0, ..Monitor::val_loss().patience(2) };
    let cfg = FitConfig { max_epochs: 30, monitor: Some(monitor), ..config(Some(out.clone())) };
    let f = run(Backend::Kernels, &cfg, 16);
    assert_eq!(f.stopped, Stop::EarlyStopping);
    assert_eq!(f.history.epochs.len(), 3);
    let first = f.history.epochs[0].val_loss.unwrap();
    let state = std::fs::read_to_string(out.join("checkpoints/best/state.json")).unwrap();
    let json: serde_json::Value = serde_json::from_str(&state).unwrap();
    assert_eq!(json["best"][0].as_f64(), Some(first), "{state}");
    assert_eq!(json["epoch"].as_u64(), Some(1), "the best checkpoint is the first epoch's end: {state}");
    let _ = std::fs::remove_dir_all(out);
}

#[test]
fn the_loader_shuffles_per_epoch_and_shards_by_rank() {
    let _serial = one_at_a_time();
    let s = |rank, world| Sampler { shuffle: true, seed: 3, rank, world, pad: true };
    let (e0, e1) = (s(0, 1).order(10, 0), s(0, 1).order(10, 1));
    assert_ne!(e0, e1, "another order each epoch");
    assert_eq!(e0, s(0, 1).order(10, 0), "the same order for the same epoch");
    let mut sorted = e0.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..10).collect::<Vec<_>>());
    // Three ranks of ten samples: four each, the order wrapped around for the last two.
    let ranks: Vec<Vec<usize>> = (0..3).map(|r| s(r, 3).order(10, 0)).collect();
    assert!(ranks.iter().all(|r| r.len() == 4), "{ranks:?}");
    let mut all: Vec<usize> = ranks.concat();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), 10, "every sample on some rank");
    // Unpadded (evaluation): every sample exactly once, shares of 4, 3 and 3.
    let exact: Vec<Vec<usize>> = (0..3).map(|r| Sampler { pad: false, ..s(r, 3) }.order(10, 0)).collect();
    assert_eq!(exact.iter().map(Vec::len).collect::<Vec<_>>(), [4, 3, 3]);
    let mut once = exact.concat();
    once.sort_unstable();
    assert_eq!(once, (0..10).collect::<Vec<_>>());
    let shares: Vec<Vec<usize>> =
        (0..3).map(|r| Loader::new(blobs(10, 1), 2).shard_exactly(r, 3).batch_sizes()).collect();
    assert_eq!(shares, [vec![2, 2], vec![2, 1], vec![2, 1]]);
    let loader = Loader::new(blobs(10, 1), 4).shuffle(Some(3));
    assert_eq!(loader.batch_sizes(), [4, 4, 2]);
    let batches: Vec<_> = loader.epoch_from(0, 1).map(|b| b.unwrap()).collect();
    assert_eq!(batches.iter().map(|b| (b.index, b.size)).collect::<Vec<_>>(), [(1, 4), (2, 2)]);
    assert_eq!(batches[1].tensors[0].shape().as_concrete(), Some(vec![2, 4]));
    let ids: Vec<i64> = batches[1].tensors[1].to_vec().unwrap();
    let want: Vec<i64> = e0[8..].iter().map(|&i| (i % 3) as i64).collect();
    assert_eq!(ids, want, "the batch holds the shuffled samples' labels");
}

/// A run killed (SIGKILL, mid-epoch, possibly mid-checkpoint) and resumed from its last checkpoint in
/// another process ends with the losses and parameters of a run that was never killed.
#[test]
fn a_killed_run_resumes_bit_identically() {
    let _serial = one_at_a_time();
    use std::process::{Command, Stdio};
    if let Some(out) = std::env::var_os("KILN_FIT_CHILD_OUT") {
        // This test binary started again as the child: train, checkpointing every step, until killed.
        let cfg = FitConfig { max_epochs: 100_000, checkpoint_every: Some(1), ..config(Some(out.into())) };
        run(Backend::Kernels, &cfg, 16);
        panic!("the child finished 100000 epochs without being killed");
    }
    let whole = run(Backend::Kernels, &config(None), 16);
    let out = tempfile_dir("killed");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "a_killed_run_resumes_bit_identically", "--test-threads", "1"])
        .env("KILN_FIT_CHILD_OUT", &out)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let state = out.join("checkpoints/last/state.json");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    let step = loop {
        let read = std::fs::read_to_string(&state).ok();
        let step =
            read.and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok()).and_then(|v| v["step"].as_u64());
        if step.is_some_and(|s| s >= 9) {
            break step.unwrap();
        }
        assert!(child.try_wait().unwrap().is_none(), "the child ended before it was killed");
        assert!(std::time::Instant::now() < deadline, "no checkpoint past step 9 within five minutes");
        std::thread::sleep(std::time::Duration::from_millis(2));
    };
    child.kill().unwrap();
    child.wait().unwrap();
    eprintln!("killed the child after its checkpoint of step {step}");
    assert!(step < 28, "killed at step {step}, past the compared run's end");
    let resumed = run(Backend::Kernels, &FitConfig { resume: Some(out.join("checkpoints/last")), ..config(None) }, 16);
    assert_eq!(bits(&resumed.history), bits(&whole.history), "killed near step {step}");
    assert_eq!(params(&resumed.model), params(&whole.model));
    let _ = std::fs::remove_dir_all(out);
}

/// A GPT's train step compiled with a symbolic batch (what `fit` does for a shorter last batch) gives the
/// loss and updates of the step compiled for the batch's static size: embedding, attention and
/// cross-entropy gradients over a batch of unknown size.
fn a_symbolic_batch_step_matches_the_static_one(backend: Backend) {
    symbolic_batch_step_matches_static_in(backend, kiln::DType::F32);
    // A bf16 model steps on f32 masters and takes its own parameters as arguments too: the batch
    // stays the symbolic argument.
    symbolic_batch_step_matches_static_in(backend, kiln::DType::BF16);
}

fn symbolic_batch_step_matches_static_in(backend: Backend, dtype: kiln::DType) {
    use kiln::nn::{Gpt, GptConfig};
    use kiln::train::{DynamicBatch, StepOptions, Trainer};
    let config = GptConfig { vocab: 11, context: 8, dim: 16, heads: 2, layers: 1, dropout: 0.0 };
    let rt = backend.runtime().unwrap();
    let place = |t: Tensor| match &rt {
        Some(rt) => t.to(rt.clone()).unwrap(),
        None => t,
    };
    let ids: Vec<i64> = (0..24).map(|i| (i * 7 % 11) as i64).collect();
    let targets: Vec<i64> = (0..24).map(|i| (i * 5 % 11) as i64).collect();
    let batch =
        vec![place(Tensor::from_slice(&ids, &[3, 8]).unwrap()), place(Tensor::from_slice(&targets, &[3, 8]).unwrap())];
    let step = |dynamic: Option<DynamicBatch>| {
        let mut model = Gpt::new(config, 3).unwrap().cast(dtype).unwrap();
        if let Some(rt) = &rt {
            model = model.to(rt).unwrap();
        }
        let options = StepOptions { dynamic_batch: dynamic, ..StepOptions::default() };
        let loss = |m: &Gpt, b: &[Tensor]| m.loss(&b[0], &b[1]);
        let mut t = Trainer::with_options(model, AdamW::default(), options, loss, backend).unwrap();
        let l: f32 = t.step(&batch, 1.0).unwrap().cast(kiln::DType::F32).unwrap().item().unwrap();
        let params: Vec<Vec<f32>> =
            t.model().tensors().iter().map(|p| p.cast(kiln::DType::F32).unwrap().to_vec::<f32>().unwrap()).collect();
        (l, params, t)
    };
    let (l_static, p_static, _) = step(None);
    let (l_sym, p_sym, mut t) = step(Some(DynamicBatch { columns: 2, max: 4 }));
    // A shorter batch reuses the symbolic step.
    let short: Vec<Tensor> = batch.iter().map(|b| b.narrow(0, 0, 2).unwrap()).collect();
    t.step(&short, 1.0).unwrap().cast(kiln::DType::F32).unwrap().item::<f32>().unwrap();
    assert_eq!(t.stats().traces, 1, "{dtype:?}");
    let tol = if dtype == kiln::DType::F32 { 1e-5 } else { 1e-2 };
    assert!((l_static - l_sym).abs() <= tol * l_static.abs(), "{dtype:?}: {l_static} vs {l_sym}");
    for (a, b) in p_static.iter().zip(&p_sym) {
        assert!(a.iter().zip(b).all(|(x, y)| (x - y).abs() <= tol), "{dtype:?}: {a:?} vs {b:?}");
    }
}

#[test]
fn kernels_a_symbolic_batch_step_matches_the_static_one() {
    let _serial = one_at_a_time();
    a_symbolic_batch_step_matches_the_static_one(Backend::Kernels);
}

#[test]
fn wgpu_a_symbolic_batch_step_matches_the_static_one() {
    let _serial = one_at_a_time();
    if !common::wgpu_skipped() {
        a_symbolic_batch_step_matches_the_static_one(Backend::Wgpu);
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored on a machine with a CUDA driver (scripts/test.sh does)"]
fn cuda_a_symbolic_batch_step_matches_the_static_one() {
    let _serial = one_at_a_time();
    a_symbolic_batch_step_matches_the_static_one(Backend::Cuda);
}

/// Gradient clipping in the one-graph step and in the accumulated one equals clipping the whole batch's
/// gradients by hand before AdamW's update (eps 1 makes the update follow the gradient's size, so the clip
/// shows: without it the update is several times larger).
#[test]
fn clipping_in_the_step_and_accumulated_matches_clipping_by_hand() {
    let _serial = one_at_a_time();
    use kiln::optim::{clip_grad_norm, AdamWState};
    use kiln::train::{StepOptions, Trainer};
    let rt = Backend::Kernels.runtime().unwrap().unwrap();
    let model = Mlp::new(4, 8, 3, 9).to(&rt).unwrap();
    let data = blobs(8, 4);
    let cols = |idx: &[usize]| -> Vec<Tensor> {
        use kiln::data::Dataset;
        data.batch(idx).unwrap().into_iter().map(|d| Tensor::from_data(d).to(rt.clone()).unwrap()).collect()
    };
    let (all, first, second) = (cols(&[0, 1, 2, 3, 4, 5, 6, 7]), cols(&[0, 1, 2, 3]), cols(&[4, 5, 6, 7]));
    let opt = AdamW { lr: 0.1, eps: 1.0, weight_decay: 0.0, ..AdamW::default() };
    let max_norm = 0.05;
    // By hand: the full batch's gradients, clipped, one update.
    let params = model.tensors();
    let n = params.len();
    let args: Vec<Tensor> = params.iter().chain(&all).cloned().collect();
    let (_, grads) =
        kiln::value_and_grad(|a| model.load(&a[..n])?.loss(&a[n..]), &args, &(0..n).collect::<Vec<_>>()).unwrap();
    let update = |grads: &[Tensor]| -> Vec<Vec<f32>> {
        let mut state = AdamWState::new(&params).unwrap();
        let scalars = state.scalars(&opt, 1.0, &params[0]).unwrap();
        let (w, _, _) = opt.update(&params, grads, &state.m, &state.v, &scalars).unwrap();
        w.iter().map(|t| t.to_vec().unwrap()).collect()
    };
    let (clipped, norm) = clip_grad_norm(&grads, max_norm).unwrap();
    assert!(norm.item::<f32>().unwrap() > 4.0 * max_norm as f32, "the clip must bite");
    let want = update(&clipped);
    let unclipped = update(&grads);
    let close = |got: &[Vec<f32>], want: &[Vec<f32>], tol: f32| {
        got.iter().flatten().zip(want.iter().flatten()).all(|(a, b)| (a - b).abs() <= tol)
    };
    assert!(!close(&unclipped, &want, 1e-3), "clipping changes the update");
    for accumulate in [1, 2] {
        let options = StepOptions { clip_grad_norm: Some(max_norm), accumulate, ..StepOptions::default() };
        let mut t =
            Trainer::with_options(model.clone(), opt, options, |m: &Mlp, b: &[Tensor]| m.loss(b), Backend::Kernels)
                .unwrap();
        if accumulate == 1 {
            t.step(&all, 1.0).unwrap();
        } else {
            t.step_group(&[first.clone(), second.clone()], &[0.5, 0.5], 1.0).unwrap();
        }
        let got: Vec<Vec<f32>> = t.model().tensors().iter().map(|p| p.to_vec().unwrap()).collect();
        assert!(close(&got, &want, 1e-5), "accumulate {accumulate}: {got:?} vs {want:?}");
    }
}

/// A last batch of a single sample runs on the symbolic entry too (the batch dim's range starts at 1),
/// and an empty validation set is an error rather than a loss of 0.
#[test]
fn a_last_batch_of_one_and_an_empty_validation_set() {
    let _serial = one_at_a_time();
    let train = Loader::new(blobs(33, 1), 16).shuffle(Some(11));
    assert_eq!(train.batch_sizes(), [16, 16, 1]);
    let opt = AdamW { lr: 3e-2, ..AdamW::default() };
    let cfg = FitConfig { max_epochs: 2, ..FitConfig::default() };
    let loss = |m: &Mlp, b: &[Tensor]| m.loss(b);
    let f = fit(Mlp::new(4, 16, 3, 5), opt, loss, loss, &train, None, Backend::Kernels, &cfg).unwrap();
    assert_eq!((f.train_stats.traces, f.train_stats.calls), (1, 6));
    assert!(f.history.steps.iter().all(|s| s.loss.is_finite()), "{:?}", f.history.steps);
    let empty = Loader::new(TensorDataset::new(vec![features(&[], 4).unwrap(), labels(&[]).unwrap()]).unwrap(), 4);
    let e = fit(Mlp::new(4, 16, 3, 5), opt, loss, loss, &train, Some(&empty), Backend::Kernels, &cfg).err().unwrap();
    assert!(e.to_string().contains("empty validation set"), "{e}");
}
