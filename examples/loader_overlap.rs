//! Whether a training loop's uploads hide behind its steps: an MLP regression whose batches are large
//! (f32 features and targets, 64 MiB a step by default) trained with its batches drawn from a
//! [`kiln::data::Loader`] (collated and moved to the device on the loader's thread, a few batches
//! ahead), against the same steps on one batch kept on the device — the floor, where nothing is
//! uploaded — and the loader alone (batches collated and uploaded, no step): the gap between the first
//! two is what feeding costs the loop, the third says whether the loader keeps up. Prints one JSON line.
//!
//! `cargo run --release --example loader_overlap --features cuda`; `KILN_CUDA_COPY_STREAM=0` puts the
//! uploads in the kernels' order, `KILN_CUDA_STAGED_UPLOADS=0` makes each wait for the device (a
//! pageable copy), as before they were staged.

use clap::Parser;
use kiln::data::{Dataset, Loader, TensorDataset};
use kiln::nn::{mse_loss, Init, Linear, Module};
use kiln::optim::AdamW;
use kiln::train::Trainer;
use kiln::{Backend, Result, Tensor, TensorData};
use std::time::Instant;

#[derive(Parser)]
#[command(about = "Training steps fed by the loader against steps on one resident batch: milliseconds a step")]
struct Args {
    /// Rows a batch.
    #[arg(long, default_value_t = 8192)]
    batch: usize,
    /// Features a row (the width of every layer, and of the target).
    #[arg(long, default_value_t = 1024)]
    width: usize,
    /// Linear layers (GELU between them).
    #[arg(long, default_value_t = 4)]
    layers: usize,
    /// Batches in the dataset (the loader cycles through them each epoch).
    #[arg(long, default_value_t = 8)]
    batches: usize,
    /// Batches the loader prepares ahead.
    #[arg(long, default_value_t = 2)]
    prefetch: usize,
    /// Timed steps of each kind.
    #[arg(long, default_value_t = 48)]
    steps: usize,
    /// Steps per timed window (each ends with a read of its last loss; the median window is reported).
    #[arg(long, default_value_t = 8)]
    window: usize,
    /// The backend (`cuda`, `wgpu`, `kernels`).
    #[arg(long, default_value = "cuda")]
    backend: String,
    /// After the resident steps, one more with the CUDA profiler collecting (for `ncu --profile-from-start
    /// off`: that step's kernels alone), then stop.
    #[arg(long)]
    profile: bool,
}

/// Linear layers with GELU between them.
#[derive(Clone)]
struct Mlp {
    layers: Vec<Linear>,
}

impl Mlp {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut h = x.clone();
        for (i, l) in self.layers.iter().enumerate() {
            h = l.forward(&h)?;
            if i + 1 < self.layers.len() {
                h = h.gelu()?;
            }
        }
        Ok(h)
    }
}

impl Module for Mlp {
    fn parameters(&self) -> Vec<(String, Tensor)> {
        let named =
            |(i, l): (usize, &Linear)| l.parameters().into_iter().map(move |(n, t)| (format!("layers.{i}.{n}"), t));
        self.layers.iter().enumerate().flat_map(named).collect()
    }

    fn with_parameters(&self, next: &mut dyn Iterator<Item = Tensor>) -> Result<Self> {
        let layers = self.layers.iter().map(|l| l.with_parameters(next)).collect::<Result<Vec<_>>>()?;
        Ok(Mlp { layers })
    }
}

/// `n` values from a fixed generator, scaled to about ±1.
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// The host's share of the loader's work: milliseconds to collate one batch (rows gathered into the
/// memory of the batch before, as the loader's thread does), the median of eight.
fn collate_ms(dataset: &TensorDataset, batch: usize) -> Result<f64> {
    let indices: Vec<usize> = (0..batch).map(|i| (i * 7919) % dataset.len()).collect();
    let mut spare = Vec::new();
    let mut times = Vec::new();
    for _ in 0..9 {
        let t = Instant::now();
        let cols = dataset.batch_into(&indices, &mut spare)?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
        spare.extend(cols.into_iter().map(TensorData::into_le_bytes));
    }
    Ok(median(times.split_off(1)))
}

/// Median of `windows` steps' mean times (ms) over timed windows.
fn median(mut windows: Vec<f64>) -> f64 {
    windows.sort_by(f64::total_cmp);
    windows[windows.len() / 2]
}

fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    kiln::init_logs();
    let args = Args::parse();
    let backend: Backend = args.backend.parse()?;
    let rt = backend.runtime()?.ok_or("the backend has no device runtime")?;
    let mut init = Init::new(7);
    let layers =
        (0..args.layers).map(|_| Linear::new(args.width, args.width, true, &mut init)).collect::<Result<Vec<_>>>()?;
    let model = Mlp { layers }.to(&rt)?;
    let loss = |m: &Mlp, b: &[Tensor]| mse_loss(&m.forward(&b[0])?, &b[1]);
    let mut trainer = Trainer::new(model, AdamW { lr: 1e-4, ..AdamW::default() }, loss, backend)?;

    let rows = args.batch * args.batches;
    let x = TensorData::new(&values(rows * args.width, 1), &[rows, args.width])?;
    let y = TensorData::new(&values(rows * args.width, 2), &[rows, args.width])?;
    let dataset = TensorDataset::new(vec![x, y])?;
    let collate_ms = collate_ms(&dataset, args.batch)?;
    let loader = Loader::new(dataset, args.batch).shuffle(Some(3)).prefetch(args.prefetch).to(rt.clone());
    let window = args.window.max(1);

    // The floor: one batch kept on the device.
    let resident = loader.epoch(0).next().ok_or("an empty dataset")??.tensors;
    for _ in 0..3 {
        trainer.step(&resident, 1.0)?;
    }
    trainer.step(&resident, 1.0)?.item::<f32>()?;
    let mut floor = Vec::new();
    for _ in 0..args.steps.div_ceil(window) {
        let t = Instant::now();
        let mut last = None;
        for _ in 0..window {
            last = Some(trainer.step(&resident, 1.0)?);
        }
        last.expect("a window has steps").item::<f32>()?;
        floor.push(t.elapsed().as_secs_f64() * 1e3 / window as f64);
    }
    if args.profile {
        let cuda = rt.driver().as_any().downcast_ref::<kiln_ptx::Cuda>().ok_or("--profile needs the CUDA backend")?;
        rt.synchronize()?;
        cuda.profiling(true)?;
        trainer.step(&resident, 1.0)?;
        rt.synchronize()?;
        cuda.profiling(false)?;
        println!("{}", serde_json::json!({ "layers": args.layers, "resident_step_ms": median(floor) }));
        return Ok(());
    }

    // The loader alone (collate, move to the device, no step): how fast it can feed a loop, over an
    // epoch after one that warms its memory.
    let mut loader_alone_ms = 0.0;
    for epoch in [100, 101] {
        rt.synchronize()?;
        let t = Instant::now();
        let mut count = 0;
        for b in loader.epoch(epoch) {
            drop(b?);
            count += 1;
        }
        rt.synchronize()?;
        loader_alone_ms = t.elapsed().as_secs_f64() * 1e3 / count as f64;
    }

    // The loop as a user writes it: every step's batch from the loader.
    let mut fed = Vec::new();
    let (mut epoch, mut batches) = (1u64, loader.epoch(1));
    let mut next_batch = || -> std::result::Result<Vec<Tensor>, Box<dyn std::error::Error>> {
        loop {
            if let Some(b) = batches.next() {
                return Ok(b?.tensors);
            }
            epoch += 1;
            batches = loader.epoch(epoch);
        }
    };
    // Uploads the copy stream made (CUDA), counted over the fed steps.
    let beside = || rt.driver().as_any().downcast_ref::<kiln_ptx::Cuda>().map(kiln_ptx::Cuda::uploads_beside_kernels);
    for _ in 0..4 {
        trainer.step(&next_batch()?, 1.0)?;
    }
    let beside_before = beside();
    trainer.step(&next_batch()?, 1.0)?.item::<f32>()?;
    let mut last_loss = 0.0;
    for _ in 0..args.steps.div_ceil(window) {
        let t = Instant::now();
        let mut last = None;
        for _ in 0..window {
            last = Some(trainer.step(&next_batch()?, 1.0)?);
        }
        last_loss = last.expect("a window has steps").item::<f32>()?;
        fed.push(t.elapsed().as_secs_f64() * 1e3 / window as f64);
    }
    let uploads_beside = beside().zip(beside_before).map(|(a, b)| a - b);
    let env = |k: &str| std::env::var(k).unwrap_or_default();
    let bytes_per_step = 2 * args.batch * args.width * 4;
    let line = serde_json::json!({
        "device": rt.driver().describe(),
        "staged_uploads": env("KILN_CUDA_STAGED_UPLOADS"),
        "copy_stream": env("KILN_CUDA_COPY_STREAM"),
        "batch": args.batch, "width": args.width, "layers": args.layers, "prefetch": args.prefetch,
        "upload_mib_per_step": bytes_per_step as f64 / (1 << 20) as f64,
        "resident_step_ms": median(floor.clone()),
        "loader_step_ms": median(fed.clone()),
        "loader_alone_batch_ms": loader_alone_ms,
        "collate_batch_ms": collate_ms,
        "resident_windows_ms": floor,
        "loader_windows_ms": fed,
        "loss_last": last_loss,
        "fed_steps": args.steps.div_ceil(window) * window + 1,
        "uploads_beside_kernels": uploads_beside,
    });
    println!("{line}");
    Ok(())
}
