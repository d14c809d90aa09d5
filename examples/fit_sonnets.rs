//! The training loop of the Lightning and Fabric guides, with kiln doing what they tell users to do by
//! hand: a character-level GPT fitted to Shakespeare's sonnets (`examples/data/sonnets.txt`, public
//! domain) for a number of epochs with [`kiln::fit::fit`] — every window of the text once an epoch, in
//! an order drawn from the seed and the epoch, a shorter last batch (no padding, no `drop_last`), a
//! validation pass on the last tenth of the text each epoch, checkpoints, metrics and loss curves. The
//! train and validation steps are each compiled once; the run prints how often they were traced.
//!
//! `cargo run --release --example fit_sonnets -- --epochs 10 --backend cuda`; stop it (Ctrl-C, or kill)
//! and `--resume` continues from the last checkpoint exactly as if it had never stopped. On several GPUs:
//! `kiln-run --gpus 2 target/release/examples/fit_sonnets --backend cuda --ddp --batch 16`.

use clap::Parser;
use kiln::data::{Loader, TensorDataset};
use kiln::fit::{fit, FitConfig, Monitor, Precision, Strategy};
use kiln::nn::{Gpt, GptConfig};
use kiln::optim::AdamW;
use kiln::{Backend, Tensor, TensorData};
use std::path::PathBuf;

#[derive(Parser)]
#[command(about = "Fit a character-level GPT to Shakespeare's sonnets with kiln's training loop")]
struct Args {
    /// Epochs (each visits every training window once).
    #[arg(long, default_value_t = 10)]
    epochs: u64,
    /// Where to run: auto, cuda, wgpu, kernels (the kernel interpreter) or cpu (the reference).
    #[arg(long, default_value = "auto")]
    backend: String,
    /// Windows per batch.
    #[arg(long, default_value_t = 32)]
    batch: usize,
    /// Batches whose gradients add up into one optimizer step.
    #[arg(long, default_value_t = 1)]
    accumulate: usize,
    /// Characters per window.
    #[arg(long, default_value_t = 64)]
    context: usize,
    /// Model width.
    #[arg(long, default_value_t = 128)]
    dim: usize,
    /// Attention heads.
    #[arg(long, default_value_t = 4)]
    heads: usize,
    /// Transformer blocks.
    #[arg(long, default_value_t = 2)]
    layers: usize,
    /// Dropout probability while training.
    #[arg(long, default_value_t = 0.1)]
    dropout: f64,
    /// Peak learning rate (warmup over the first 5% of steps, then cosine to a tenth).
    #[arg(long, default_value_t = 3e-3)]
    lr: f64,
    /// Clip gradients to this global norm.
    #[arg(long, default_value_t = 1.0)]
    clip: f64,
    /// Train in bf16 on f32 master weights.
    #[arg(long)]
    bf16: bool,
    /// Seed of the weights, the shuffles and the dropout masks.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Stop after this many epochs without a better validation loss.
    #[arg(long)]
    patience: Option<u64>,
    /// Where metrics, curves and checkpoints go.
    #[arg(long, default_value = "target/fit_sonnets")]
    out: PathBuf,
    /// Continue from the last checkpoint in `--out`.
    #[arg(long)]
    resume: bool,
    /// One rank of data-parallel training (start it with `kiln-run --gpus N`; `--batch` is per GPU).
    #[arg(long)]
    ddp: bool,
    /// Fail unless the last epoch's validation loss is below this.
    #[arg(long)]
    threshold: Option<f64>,
    /// Write the run's compile reports to `--out`/compile (open one with `kiln-explorer`).
    #[arg(long)]
    report: bool,
    /// Replay each compiled step from a recording (a CUDA graph on CUDA), as torch's reduce-overhead.
    #[arg(long)]
    reduce_overhead: bool,
}

/// Windows of `context + 1` characters at a stride of `context`: ids `[n, context]` and next-character
/// targets `[n, context]`.
fn windows(ids: &[i64], context: usize) -> kiln::Result<TensorDataset> {
    let starts: Vec<usize> = (0..ids.len().saturating_sub(context + 1)).step_by(context).collect();
    let (mut x, mut y) = (Vec::new(), Vec::new());
    for &s in &starts {
        x.extend_from_slice(&ids[s..s + context]);
        y.extend_from_slice(&ids[s + 1..s + context + 1]);
    }
    let n = starts.len();
    TensorDataset::new(vec![TensorData::new(&x, &[n, context])?, TensorData::new(&y, &[n, context])?])
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    kiln::init_logs();
    let args = Args::parse();
    let text = include_str!("data/sonnets.txt");
    let mut vocab: Vec<char> = text.chars().collect();
    vocab.sort_unstable();
    vocab.dedup();
    let ids: Vec<i64> = text.chars().map(|c| vocab.binary_search(&c).expect("in the vocabulary") as i64).collect();
    // The last tenth of the text is held out for validation.
    let split = ids.len() * 9 / 10;
    let (train_set, val_set) = (windows(&ids[..split], args.context)?, windows(&ids[split..], args.context)?);
    let train = Loader::new(train_set, args.batch).shuffle(Some(args.seed));
    let val = Loader::new(val_set, args.batch).shuffle(None);
    let backend: Backend = args.backend.parse()?;
    let config = GptConfig {
        vocab: vocab.len(),
        context: args.context,
        dim: args.dim,
        heads: args.heads,
        layers: args.layers,
        dropout: args.dropout,
    };
    let model = Gpt::new(config, args.seed)?;
    // A data-parallel rank steps through its share of each epoch (fit shards the loaders by rank).
    let world = if args.ddp { kiln::dist::DistEnv::from_env()?.map_or(1, |e| e.world) } else { 1 };
    let steps = args.epochs * train.clone().shard(0, world).batches().div_ceil(args.accumulate.max(1)) as u64;
    eprintln!(
        "fit_sonnets: {} training windows ({} batches of up to {}, the last {}), {} validation windows, {} epochs, {steps} steps on {}",
        train.samples(),
        train.batches(),
        args.batch,
        train.batch_sizes().last().copied().unwrap_or(0),
        val.samples(),
        args.epochs,
        backend
    );
    let cfg = FitConfig {
        max_epochs: args.epochs,
        precision: if args.bf16 { Precision::Bf16Mixed } else { Precision::F32 },
        strategy: if args.ddp { Strategy::Ddp } else { Strategy::Single },
        accumulate: args.accumulate,
        clip_grad_norm: Some(args.clip),
        warmup_steps: (steps / 20).max(1),
        lr_floor: Some(0.1),
        seed: args.seed,
        out: Some(args.out.clone()),
        monitor: Some(Monitor { patience: args.patience, ..Monitor::val_loss() }),
        resume: args.resume.then(|| args.out.join("checkpoints/last")),
        progress: true,
        report: args.report,
        mode: if args.reduce_overhead { kiln::Mode::ReduceOverhead } else { kiln::Mode::Default },
        ..FitConfig::default()
    };
    let opt = AdamW { lr: args.lr, weight_decay: 0.1, ..AdamW::default() };
    // The training loss sees the batch and the step's dropout key; validation runs without dropout.
    let fitted = fit(
        model,
        opt,
        |m: &Gpt, b: &[Tensor]| m.loss_train(&b[0], &b[1], &b[2]),
        |m: &Gpt, b: &[Tensor]| m.loss(&b[0], &b[1]),
        &train,
        Some(&val),
        backend,
        &cfg,
    )?;
    let last = fitted.history.epochs.last();
    eprintln!(
        "fit_sonnets: stopped ({:?}) after {} steps; validation loss {}; train step traced {} time(s) in {} calls, validation step {} time(s) in {} calls",
        fitted.stopped,
        fitted.history.steps.last().map_or(0, |s| s.step),
        last.and_then(|e| e.val_loss).map_or("—".into(), |v| format!("{v:.4}")),
        fitted.train_stats.traces,
        fitted.train_stats.calls,
        fitted.val_stats.as_ref().map_or(0, |s| s.traces),
        fitted.val_stats.as_ref().map_or(0, |s| s.calls),
    );
    eprintln!("fit_sonnets: metrics, loss.png and checkpoints in {}", args.out.display());
    if let (Some(limit), Some(v)) = (args.threshold, last.and_then(|e| e.val_loss)) {
        if v >= limit {
            return Err(format!("validation loss {v:.4} is not below the threshold {limit}").into());
        }
    }
    Ok(())
}
