//! Data-parallel scaling of W5's training step (WORKLOADS.md: 4 GPT blocks, width 768, 12 heads,
//! sequences of 512) at a fixed batch per GPU: run alone it takes the one-graph compiled step on one
//! GPU; run as `kiln-run --gpus N target/release/examples/ddp_scaling` each rank steps on its own batch
//! and the ranks average their gradients over NCCL every step. It prints one JSON line (rank 0): the
//! world, the median step time over the timed steps' windows and the throughput of the whole world —
//! the ratio of two such lines is the scaling.
//!
//! `cargo run --release --example ddp_scaling -- --bf16` (one GPU), then under `kiln-run --gpus 2`.

use clap::Parser;
use kiln::dist::{DistEnv, ProcessGroup};
use kiln::nn::{Gpt, GptConfig, Module};
use kiln::optim::AdamW;
use kiln::train::Trainer;
use kiln::{Backend, DType, Tensor};
use std::time::Instant;

#[derive(Parser)]
#[command(about = "W5's training step, alone or as one rank of data-parallel training: steps per second")]
struct Args {
    /// Sequences per GPU in a step.
    #[arg(long, default_value_t = 8)]
    batch: usize,
    /// Tokens per sequence.
    #[arg(long, default_value_t = 512)]
    context: usize,
    /// Model width.
    #[arg(long, default_value_t = 768)]
    dim: usize,
    /// Attention heads.
    #[arg(long, default_value_t = 12)]
    heads: usize,
    /// Blocks.
    #[arg(long, default_value_t = 4)]
    layers: usize,
    /// Train in bf16 on f32 master weights.
    #[arg(long)]
    bf16: bool,
    /// With `--bf16`, as a rank: average the gradients in bf16 (`DataParallel::reduce_in_model_dtype`)
    /// instead of in f32.
    #[arg(long)]
    reduce_bf16: bool,
    /// Replay each step as a CUDA graph (`Mode::ReduceOverhead`), alone and as a rank alike.
    #[arg(long)]
    reduce_overhead: bool,
    /// Untimed steps first (compile, warm the pools).
    #[arg(long, default_value_t = 5)]
    warmup: usize,
    /// Timed steps, in windows of `--window` (the median window is reported).
    #[arg(long, default_value_t = 40)]
    steps: usize,
    /// Steps per timed window (each window ends with a read of its last loss).
    #[arg(long, default_value_t = 10)]
    window: usize,
    /// Diagnosis: as a rank, step without averaging anything (what two processes cost each other
    /// with no collective).
    #[arg(long)]
    independent: bool,
    /// Diagnosis: as a rank, time only the all-reduce of tensors shaped as the parameters (in the
    /// parameters' dtype, f32 without `--bf16`), one NCCL group a step: the collective's floor.
    #[arg(long)]
    allreduce_only: bool,
    /// With `--allreduce-only`: one flat tensor of all the parameters' elements instead (one NCCL
    /// call, as a flat bucket would be).
    #[arg(long)]
    flat: bool,
    /// Append the JSON line to this file too (rank 0).
    #[arg(long)]
    out: Option<std::path::PathBuf>,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    kiln::init_logs();
    let args = Args::parse();
    let backend = Backend::Cuda;
    let group = match DistEnv::from_env()? {
        Some(_) => Some(ProcessGroup::from_env(backend)?),
        None => None,
    };
    let (rank, world) = group.as_ref().map_or((0, 1), |g| (g.rank(), g.world()));
    let rt = backend.runtime()?.ok_or("no CUDA device")?;
    let config = GptConfig {
        vocab: 256,
        context: args.context,
        dim: args.dim,
        heads: args.heads,
        layers: args.layers,
        dropout: 0.0,
    };
    let mut model = Gpt::new(config, 1)?;
    if args.bf16 {
        model = model.cast(DType::BF16)?;
    }
    let model = model.to(&rt)?;
    let opt = AdamW { lr: 3e-4, ..AdamW::default() };
    let mode = if args.reduce_overhead { kiln::Mode::ReduceOverhead } else { kiln::Mode::Default };
    let options = kiln::train::StepOptions { mode, ..Default::default() };
    let loss = |m: &Gpt, b: &[Tensor]| m.loss(&b[0], &b[1]);
    let mut trainer = Trainer::with_options(model, opt, options, loss, backend)?;
    if let (Some(g), false) = (&group, args.independent) {
        let how = kiln::train::DataParallel { reduce_in_model_dtype: args.reduce_bf16 };
        trainer = trainer.data_parallel_with(g.clone(), how)?;
    }
    // Each rank's own tokens (a different batch per rank, as a sharded loader gives).
    let n = args.batch * args.context;
    let mut s = 0x9e37_79b9_u64.wrapping_mul(rank as u64 + 1);
    let tokens: Vec<i64> = (0..=n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 33) % 256) as i64
        })
        .collect();
    let ids = Tensor::from_slice(&tokens[..n], &[args.batch, args.context])?.to(rt.clone())?;
    let targets = Tensor::from_slice(&tokens[1..], &[args.batch, args.context])?.to(rt.clone())?;
    let batch = [ids, targets];
    // The f32 gradients' shapes, reduced as one group (the all-reduce-only diagnosis).
    let grads: Vec<Tensor> = trainer
        .model()
        .tensors()
        .iter()
        .map(|p| p.cast(if args.bf16 { DType::BF16 } else { DType::F32 }))
        .collect::<Result<_, _>>()?;
    let grads = match args.flat {
        true => {
            let total: usize = grads.iter().map(|g| g.shape().numel().as_const().unwrap_or(0) as usize).sum();
            vec![Tensor::zeros(&[total], grads[0].dtype())?.to(rt.clone())?]
        }
        false => grads,
    };
    let mut step = || -> Result<Tensor, Box<dyn std::error::Error>> {
        match (&group, args.allreduce_only) {
            (Some(g), true) => {
                Ok(g.all_reduce(&grads, kiln::dist::Reduce::Mean)?.swap_remove(0).reshape(&[-1])?.narrow(0, 0, 1)?)
            }
            _ => Ok(trainer.step(&batch, 1.0)?),
        }
    };
    let compile_start = Instant::now();
    let first: f32 = step()?.cast(DType::F32)?.item()?;
    let first_step_s = compile_start.elapsed().as_secs_f64();
    for _ in 1..args.warmup {
        step()?;
    }
    step()?.cast(DType::F32)?.item::<f32>()?;
    if let Some(g) = &group {
        g.barrier()?;
    }
    let mut windows = Vec::new();
    let window = args.window.max(1);
    let mut last = 0.0f32;
    for _ in 0..args.steps.div_ceil(window) {
        let t = Instant::now();
        let mut loss = None;
        for _ in 0..window {
            loss = Some(step()?);
        }
        last = loss.expect("a window has steps").cast(DType::F32)?.item()?;
        windows.push(t.elapsed().as_secs_f64() * 1e3 / window as f64);
    }
    if let Some(g) = &group {
        g.healthy()?;
    }
    let mut sorted = windows.clone();
    sorted.sort_by(f64::total_cmp);
    let median = sorted[sorted.len() / 2];
    let line = serde_json::json!({
        "world": world,
        "mode": match (&group, args.independent, args.allreduce_only) {
            (None, ..) => "single",
            (Some(_), true, _) => "independent",
            (Some(_), _, true) => "allreduce-only",
            _ => "ddp",
        },
        "precision": match (args.bf16, args.reduce_bf16) {
            (true, true) => "bf16-mixed, averaged in bf16",
            (true, false) => "bf16-mixed",
            _ => "f32",
        },
        "compile_mode": if args.reduce_overhead { "reduce-overhead" } else { "default" },
        "batch_per_gpu": args.batch,
        "context": args.context,
        "step_ms_median": median,
        "step_ms_windows": windows,
        "samples_per_s": (world * args.batch) as f64 / (median / 1e3),
        "tokens_per_s": (world * n) as f64 / (median / 1e3),
        "first_step_s": first_step_s,
        "loss_first": first,
        "loss_last": last,
        "device": rt.driver().describe(),
    });
    if rank == 0 {
        println!("{line}");
        if let Some(path) = &args.out {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
            writeln!(f, "{line}")?;
        }
    }
    Ok(())
}
