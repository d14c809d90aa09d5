//! The training loop people otherwise write around `torch.compile` by hand, with what the Lightning and
//! Fabric guides warn about handled by the loop itself: [`fit`] compiles the train step and the
//! validation step once each; a shorter last batch makes the batch dim symbolic once instead of
//! recompiling every epoch (no padding, no `drop_last`); switching between training and validation
//! switches between two compiled functions, not graphs of one; the step's losses stay on the device and
//! are read a step late, so logging never waits for the step it logs. The run writes its metrics (CSV,
//! JSON), loss curves (PNG, SVG), checkpoints that resume bit-identically and, when asked
//! ([`FitConfig::report`]), the compile report of each step function.
//!
//! With [`Strategy::Ddp`] the same loop is one rank of data-parallel training (one process per GPU,
//! started by `kiln-run --gpus N`): each rank trains on its padded share of every epoch, the ranks'
//! gradients and losses are averaged over NCCL between the step's two compiled halves, validation sums
//! are combined once per epoch, and rank 0 alone writes the metrics and checkpoints. Every rank records
//! the same history, so early stopping ends every rank at the same epoch.

pub mod metrics;
pub mod state;

pub use metrics::{EpochRecord, History, StepRecord};
pub use state::LoopState;

use crate::data::{Batch, Loader};
use crate::dist::{ProcessGroup, Reduce};
use crate::nn::Module;
use crate::optim::{warmup_cosine, AdamW};
use crate::train::{DynamicBatch, StepOptions, Trainer};
use crate::{compile, Backend, CompileStats, DType, Error, Result, SourceLoc, Tensor};
use std::path::PathBuf;

/// The dtypes a run computes in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Precision {
    /// Everything f32.
    #[default]
    F32,
    /// Parameters and activations bf16, updates on f32 master weights (Lightning's `bf16-mixed`).
    Bf16Mixed,
}

/// How many processes train, and how.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Strategy {
    /// This process alone.
    #[default]
    Single,
    /// One rank of distributed data parallel over NCCL (CUDA): the world this process was launched
    /// into (`kiln-run --gpus N`, or torchrun's environment), the loaders sharded by rank.
    Ddp,
}

/// Which way the monitored metric should go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Goal {
    /// Lower is better (a loss).
    Min,
    /// Higher is better (an accuracy).
    Max,
}

/// The metric that decides the best checkpoint and early stopping.
#[derive(Clone, Debug, PartialEq)]
pub struct Monitor {
    /// `val_loss` or `train_loss`.
    pub metric: String,
    /// Which way is better.
    pub goal: Goal,
    /// The least change that counts as an improvement.
    pub min_delta: f64,
    /// Stop after this many epochs without an improvement (`None`: never stop early).
    pub patience: Option<u64>,
}

impl Monitor {
    /// Lower validation loss is better; no early stopping.
    pub fn val_loss() -> Monitor {
        Monitor { metric: "val_loss".into(), goal: Goal::Min, min_delta: 0.0, patience: None }
    }

    /// This monitor, stopping after `epochs` epochs without an improvement.
    pub fn patience(mut self, epochs: u64) -> Monitor {
        self.patience = Some(epochs);
        self
    }

    fn improves(&self, value: f64, best: Option<(f64, u64)>) -> bool {
        match (best, self.goal) {
            (None, _) => true,
            (Some((b, _)), Goal::Min) => value < b - self.min_delta,
            (Some((b, _)), Goal::Max) => value > b + self.min_delta,
        }
    }
}

/// How [`fit`] trains.
#[derive(Clone, Debug)]
pub struct FitConfig {
    /// Epochs to train at most.
    pub max_epochs: u64,
    /// Optimizer steps to take at most (`None`: as many as the epochs make).
    pub max_steps: Option<u64>,
    /// The dtypes the run computes in.
    pub precision: Precision,
    /// This process alone, or a rank of data-parallel training.
    pub strategy: Strategy,
    /// Batches whose gradients add up into one optimizer step.
    pub accumulate: usize,
    /// Clip the gradients' global L2 norm to this before each update.
    pub clip_grad_norm: Option<f64>,
    /// Steps of linear learning-rate warmup.
    pub warmup_steps: u64,
    /// After the warmup, decay the learning rate by a cosine to this fraction of the peak over the run
    /// (`None`: keep the peak).
    pub lr_floor: Option<f64>,
    /// Seed of the shuffles and the dropout keys.
    pub seed: u64,
    /// Where metrics, curves and checkpoints go (`None`: nothing is written).
    pub out: Option<PathBuf>,
    /// Write the `last` checkpoint every this many steps too (it is always written at each epoch's end
    /// and when the run stops).
    pub checkpoint_every: Option<u64>,
    /// The metric that picks the `best` checkpoint and stops the run early.
    pub monitor: Option<Monitor>,
    /// Continue the run whose checkpoint is in this directory (bit-identically under the same
    /// configuration: the schedule and the epochs' orders depend on it, the seed is checked).
    pub resume: Option<PathBuf>,
    /// Show a progress bar on the terminal.
    pub progress: bool,
    /// Write the compile report of every compiled function the run used (the train step or its two
    /// accumulation halves, the validation step) to `out/compile/<name>.json` at its end: graphs, fused
    /// regions, kernels with their sources, guards, recompiles with reasons, per-kernel profiles where
    /// taken. `kiln-explorer out/compile/train_step.json` shows one.
    pub report: bool,
    /// How the compiled steps run: [`crate::Mode::ReduceOverhead`] replays each as a recording (a CUDA
    /// graph), the state passed from step to step in place.
    pub mode: crate::Mode,
}

impl Default for FitConfig {
    fn default() -> Self {
        FitConfig {
            max_epochs: 1,
            max_steps: None,
            precision: Precision::F32,
            strategy: Strategy::Single,
            accumulate: 1,
            clip_grad_norm: None,
            warmup_steps: 0,
            lr_floor: None,
            seed: 0,
            out: None,
            checkpoint_every: None,
            monitor: None,
            resume: None,
            progress: false,
            report: false,
            mode: crate::Mode::Default,
        }
    }
}

/// What [`fit`] hands back.
pub struct Fitted<M> {
    /// The trained model (its parameters on the device the run used).
    pub model: M,
    /// Every step's and epoch's metrics.
    pub history: History,
    /// What compiling the train step did: traced once, whatever the epochs and however the batches'
    /// sizes differ (a shorter last batch is traced for with a symbolic batch dim from the start).
    pub train_stats: CompileStats,
    /// The same for the validation step.
    pub val_stats: Option<CompileStats>,
    /// Why the run ended.
    pub stopped: Stop,
}

/// Why a run ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stop {
    /// Every epoch ran.
    MaxEpochs,
    /// `max_steps` steps were taken.
    MaxSteps,
    /// The monitored metric did not improve for `patience` epochs.
    EarlyStopping,
}

fn unsupported(what: String) -> Error {
    Error::Unsupported { what, loc: SourceLoc::internal() }
}

/// Trains `model` with `opt` on `train`'s batches against `loss(model, batch)`, validating each epoch on
/// `val` with `val_loss` (a loss without dropout), on `backend`. The batch a loss sees is the loader's
/// tensors (on the device) followed, for `loss` only, by the step's dropout key
/// ([`Tensor::rng_key`] of the seed and the step), so a loss with dropout draws new masks every step
/// without recompiling.
#[allow(clippy::too_many_arguments)]
pub fn fit<M, L, V>(
    model: M,
    opt: AdamW,
    loss: L,
    val_loss: V,
    train: &Loader,
    val: Option<&Loader>,
    backend: Backend,
    config: &FitConfig,
) -> Result<Fitted<M>>
where
    M: Module + Clone + 'static,
    L: Fn(&M, &[Tensor]) -> Result<Tensor> + 'static,
    V: Fn(&M, &[Tensor]) -> Result<Tensor> + 'static,
{
    let rt = backend.runtime()?;
    let mut model = match config.precision {
        Precision::F32 => model,
        Precision::Bf16Mixed => model.cast(DType::BF16)?,
    };
    if let Some(rt) = &rt {
        model = model.to(rt)?;
    }
    let placed = |l: &Loader| match &rt {
        Some(rt) => l.clone().to(rt.clone()),
        None => l.clone(),
    };
    let ddp = match config.strategy {
        Strategy::Single => None,
        Strategy::Ddp => Some(ProcessGroup::from_env(backend)?),
    };
    // Training shares are padded to equal batches (their gradients are averaged step by step);
    // validation takes every sample once (its sums are combined once).
    let (train, val) = match &ddp {
        Some(g) => {
            (train.clone().shard(g.rank(), g.world()), val.map(|v| v.clone().shard_exactly(g.rank(), g.world())))
        }
        None => (train.clone(), val.cloned()),
    };
    let (train, val) = (placed(&train), val.as_ref().map(placed));
    // Rank 0 alone writes files and shows progress.
    let writes = ddp.as_ref().is_none_or(|g| g.is_main());
    let world = ddp.as_ref().map_or(1, |g| g.world());
    // An empty validation set would average nothing into a loss of 0.
    if val.as_ref().is_some_and(|v| v.samples() == 0) {
        return Err(unsupported("fit with an empty validation set (pass None to skip validation)".into()));
    }
    let mixed = config.precision == Precision::Bf16Mixed;
    // Batches of several sizes compile once with a symbolic batch dim (see `DynamicBatch`).
    let dynamic = |l: &Loader| -> Result<Option<DynamicBatch>> {
        Ok(l.varies().then_some(DynamicBatch { columns: l.columns()?, max: l.batch_size() }))
    };
    let options = StepOptions {
        loss_scale: None,
        clip_grad_norm: config.clip_grad_norm,
        accumulate: config.accumulate.max(1),
        dynamic_batch: dynamic(&train)?,
        mode: config.mode,
    };
    let template = model.clone();
    let mut trainer = Trainer::with_options(model, opt, options, loss, backend)?;
    let n = template.tensors().len();
    let shape = template.clone();
    let mut val_step = compile(move |args: Vec<Tensor>| val_loss(&shape.load(&args[..n])?, &args[n..]))
        .backend(backend)
        .mode(config.mode);
    if let Some(d) = val.as_ref().map(dynamic).transpose()?.flatten() {
        val_step = d.mark(val_step, n);
    }

    let mut st = LoopState { seed: config.seed, ..LoopState::default() };
    if let Some(dir) = &config.resume {
        let r = state::load(dir, &template, mixed)?;
        trainer.restore(r.model, r.masters, r.optimizer)?;
        if r.state.seed != config.seed {
            return Err(unsupported(format!(
                "resuming {}: it was trained with seed {}, this run has seed {}",
                dir.display(),
                r.state.seed,
                config.seed
            )));
        }
        st = r.state;
    }
    if let Some(g) = &ddp {
        trainer = trainer.data_parallel(g.clone())?;
    }

    let k = config.accumulate.max(1);
    let groups_per_epoch = train.batches().div_ceil(k) as u64;
    if groups_per_epoch == 0 {
        return Err(unsupported("fit on a training set with no batches".into()));
    }
    let total_steps = config.max_steps.unwrap_or(u64::MAX).min(config.max_epochs.saturating_mul(groups_per_epoch));
    let bar = progress_bar(config.progress && writes, total_steps, st.step);
    let ckpt = |name: &str| config.out.as_ref().filter(|_| writes).map(|o| o.join("checkpoints").join(name));
    let save = |trainer: &Trainer<M, _>, st: &LoopState, name: &str| -> Result<()> {
        match ckpt(name) {
            Some(dir) => state::save(&dir, trainer.model(), trainer.masters(), trainer.optimizer_state(), st),
            None => Ok(()),
        }
    };
    let mut stopped = Stop::MaxEpochs;
    'epochs: while st.epoch < config.max_epochs {
        let started = std::time::Instant::now();
        let mut pending: Vec<Pending> = Vec::new();
        let mut batches = train.epoch_from(st.epoch, st.batch);
        let mut trained_samples = 0usize;
        loop {
            if st.step >= total_steps {
                stopped = Stop::MaxSteps;
                break;
            }
            let group: Vec<Batch> = batches.by_ref().take(k).collect::<Result<_>>()?;
            if group.is_empty() {
                break;
            }
            let samples: usize = group.iter().map(|b| b.size).sum();
            let weights: Vec<f64> = group.iter().map(|b| b.size as f64 / samples as f64).collect();
            st.step += 1;
            let scale = match config.lr_floor {
                Some(floor) => warmup_cosine(st.step, config.warmup_steps, total_steps, floor),
                None if st.step <= config.warmup_steps => st.step as f64 / config.warmup_steps as f64,
                None => 1.0,
            };
            let key = Tensor::rng_key(config.seed as u32, st.step as u32);
            let key = match &rt {
                Some(rt) => key.to(rt.clone())?,
                None => key,
            };
            let inputs: Vec<Vec<Tensor>> =
                group.iter().map(|b| b.tensors.iter().cloned().chain([key.clone()]).collect()).collect();
            let losses = trainer.step_group(&inputs, &weights, scale)?;
            st.batch = group.last().map_or(st.batch, |b| b.index + 1);
            trained_samples += samples;
            pending.push(Pending { step: st.step, lr: opt.lr * scale, losses, weights });
            // Losses are read one step late: the step just queued keeps the device busy meanwhile.
            if pending.len() > 1 {
                let done: Vec<Pending> = pending.drain(..pending.len() - 1).collect();
                record(&mut st, done, &bar)?;
                healthy(&ddp)?;
            }
            if config.checkpoint_every.is_some_and(|c| st.step % c.max(1) == 0) {
                record(&mut st, std::mem::take(&mut pending), &bar)?;
                save(&trainer, &st, "last")?;
            }
        }
        record(&mut st, pending, &bar)?;
        healthy(&ddp)?;
        let seconds = started.elapsed().as_secs_f64();
        let epoch_steps: Vec<&StepRecord> = st.history.steps.iter().filter(|s| s.epoch == st.epoch).collect();
        let finished = st.batch >= train.batches();
        if !finished {
            // Stopped inside the epoch (max_steps): where it stopped is the checkpoint's to say.
            save(&trainer, &st, "last")?;
            break 'epochs;
        }
        let val_loss = match &val {
            Some(v) => {
                let (sum, count) = validate(&val_step, trainer.model(), v, n)?;
                Some(match &ddp {
                    Some(g) => {
                        let both =
                            Tensor::from_data(crate::TensorData::from_f64(vec![sum, count as f64], &[2], DType::F32)?);
                        let total: Vec<f32> = g.all_reduce(&[both], Reduce::Sum)?[0].to_vec()?;
                        g.healthy()?;
                        f64::from(total[0]) / f64::from(total[1]).max(1.0)
                    }
                    None => sum / count.max(1) as f64,
                })
            }
            None => None,
        };
        let train_loss = weighted_mean(&epoch_steps, &train, k);
        let record = EpochRecord {
            epoch: st.epoch,
            step: st.step,
            train_loss,
            val_loss,
            samples_per_s: (trained_samples * world) as f64 / seconds.max(1e-9),
        };
        let line = format!(
            "epoch {}: train loss {:.4}{} ({:.0} samples/s)",
            record.epoch,
            record.train_loss,
            record.val_loss.map_or(String::new(), |v| format!(", val loss {v:.4}")),
            record.samples_per_s
        );
        // Above the bar on a terminal; on stderr as it is otherwise (a hidden bar prints nothing).
        if config.progress && writes {
            bar.suspend(|| eprintln!("{line}"));
        } else if writes {
            tracing::info!(target: "kiln::fit", "{line}");
        }
        st.history.epochs.push(record);
        st.epoch += 1;
        st.batch = 0;
        let mut stop_early = false;
        if let Some(m) = &config.monitor {
            let value = st.history.last(&m.metric).ok_or_else(|| {
                unsupported(format!(
                    "monitor `{}`: the run has no such metric (train_loss, or val_loss with a validation set)",
                    m.metric
                ))
            })?;
            if m.improves(value, st.best) {
                st.best = Some((value, st.epoch - 1));
                st.stale_epochs = 0;
                save(&trainer, &st, "best")?;
            } else {
                st.stale_epochs += 1;
                stop_early = m.patience.is_some_and(|p| st.stale_epochs >= p);
            }
        }
        save(&trainer, &st, "last")?;
        if stop_early {
            stopped = Stop::EarlyStopping;
            break;
        }
        if st.step >= total_steps {
            stopped = if st.epoch >= config.max_epochs { Stop::MaxEpochs } else { Stop::MaxSteps };
            break;
        }
    }
    bar.finish_and_clear();
    if let Some(out) = config.out.as_ref().filter(|_| writes) {
        st.history.write(out)?;
        if config.report {
            let val_report = val.as_ref().map(|_| ("val_step", val_step.report()));
            write_reports(&out.join("compile"), trainer.reports().into_iter().chain(val_report))?;
        }
        // A run is not lost over its picture: without a font (a bare GPU host) the curves stay in the CSV.
        if !st.history.steps.is_empty() {
            if let Err(e) = st.history.plot(out, "training loss per step, validation loss per epoch") {
                tracing::warn!(target: "kiln::fit", error = %e, "loss curves not drawn (the metrics files are written)");
            }
        }
    }
    Ok(Fitted {
        // The half that sees the batches when a step is split (accumulation, data parallel).
        train_stats: trainer.accumulation_stats().map_or_else(|| trainer.stats(), |(add, _)| add),
        val_stats: val.as_ref().map(|_| val_step.stats()),
        model: trainer.model().clone(),
        history: st.history,
        stopped,
    })
}

/// Writes each named compile report to `dir/<name>.json`.
fn write_reports(
    dir: &std::path::Path,
    reports: impl IntoIterator<Item = (&'static str, crate::CompileReport)>,
) -> Result<()> {
    let failed =
        |e: std::io::Error| Error::Format { what: format!("compile reports in {}", dir.display()), msg: e.to_string() };
    std::fs::create_dir_all(dir).map_err(failed)?;
    for (name, report) in reports {
        std::fs::write(dir.join(format!("{name}.json")), report.to_json()).map_err(failed)?;
    }
    Ok(())
}

/// `Ok` unless the data-parallel world failed (a collective the watchdog ended returned garbage: say
/// why instead of training on it).
fn healthy(group: &Option<std::sync::Arc<ProcessGroup>>) -> Result<()> {
    group.as_ref().map_or(Ok(()), |g| g.healthy())
}

/// A step whose losses are still on the device.
struct Pending {
    step: u64,
    lr: f64,
    losses: Vec<Tensor>,
    weights: Vec<f64>,
}

/// Reads `done`'s losses into the history (a wait for those steps only).
fn record(st: &mut LoopState, done: Vec<Pending>, bar: &indicatif::ProgressBar) -> Result<()> {
    for p in done {
        let mut loss = 0.0;
        for (l, w) in p.losses.iter().zip(&p.weights) {
            loss += w * f64::from(l.cast(DType::F32)?.item::<f32>()?);
        }
        st.history.steps.push(StepRecord { step: p.step, epoch: st.epoch, loss, lr: p.lr });
        bar.set_position(p.step);
        bar.set_message(format!("epoch {} loss {loss:.4}", st.epoch));
    }
    Ok(())
}

/// The mean training loss of an epoch over its samples: each step's loss weighted by its samples.
fn weighted_mean(steps: &[&StepRecord], train: &Loader, k: usize) -> f64 {
    let sizes: Vec<usize> = train.batch_sizes().chunks(k).map(|c| c.iter().sum()).collect();
    let (mut sum, mut count) = (0.0, 0.0);
    for (i, s) in steps.iter().enumerate() {
        let n = sizes.get(i).copied().unwrap_or(0) as f64;
        sum += s.loss * n;
        count += n;
    }
    if count > 0.0 {
        sum / count
    } else {
        f64::NAN
    }
}

/// The validation loss summed over this process's validation samples (each batch's mean weighted by
/// its size), and how many there were.
fn validate<M: Module, F>(step: &crate::Compiled<F>, model: &M, val: &Loader, n: usize) -> Result<(f64, usize)>
where
    F: Fn(Vec<Tensor>) -> Result<Tensor>,
{
    let params = model.tensors();
    debug_assert_eq!(params.len(), n);
    let mut losses = Vec::new();
    for b in val.epoch(0) {
        let b = b?;
        let l: Tensor = step.call([params.clone(), b.tensors].concat())?;
        losses.push((l, b.size));
    }
    let (mut sum, mut count) = (0.0, 0usize);
    for (l, size) in losses {
        sum += f64::from(l.cast(DType::F32)?.item::<f32>()?) * size as f64;
        count += size;
    }
    Ok((sum, count))
}

/// The run's progress bar, hidden unless asked for.
fn progress_bar(shown: bool, total: u64, at: u64) -> indicatif::ProgressBar {
    if !shown {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(total);
    if let Ok(style) = indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} steps, {elapsed}, {per_sec} {msg}")
    {
        bar.set_style(style);
    }
    bar.set_position(at);
    bar
}
