//! Trains a small character-level GPT on Shakespeare's sonnets (`examples/data/sonnets.txt`, public
//! domain) with kiln's compiled train step — forward, cross-entropy, backward and AdamW as one fused
//! graph — then writes the loss curve (PNG and SVG), a checkpoint (safetensors) and a sample of text.
//!
//! `cargo run --release --example train_gpt -- --steps 600 --backend cuda`
//! (`--backend wgpu` on any Vulkan/Metal/DX12 adapter, `kernels` or `cpu` without a GPU; `--threshold L`
//! fails the run unless the final loss is below `L`).

use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use kiln::nn::{Gpt, GptConfig, Module};
use kiln::optim::{warmup_cosine, AdamW};
use kiln::train::Trainer;
use kiln::{compile, Backend, Tensor};
use std::path::PathBuf;

#[derive(Parser)]
#[command(about = "Train a character-level GPT on Shakespeare's sonnets with kiln")]
struct Args {
    /// Optimizer steps.
    #[arg(long, default_value_t = 600)]
    steps: u64,
    /// Where to run: auto, cuda, wgpu, kernels (the kernel interpreter) or cpu (the reference).
    #[arg(long, default_value = "auto")]
    backend: String,
    /// Sequences per batch.
    #[arg(long, default_value_t = 16)]
    batch: usize,
    /// Characters per sequence.
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
    /// Peak learning rate (linear warmup over the first tenth, then cosine to a tenth of it).
    #[arg(long, default_value_t = 3e-3)]
    lr: f64,
    /// Seed of the weights and the batches.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Characters to sample after training.
    #[arg(long, default_value_t = 300)]
    sample_chars: usize,
    /// Train in bf16 on f32 master weights (mixed precision).
    #[arg(long, conflicts_with = "f16")]
    bf16: bool,
    /// Dropout probability while training (GPT-2's sites; the sample is drawn without it).
    #[arg(long, default_value_t = 0.0)]
    dropout: f64,
    /// Train in f16 on f32 master weights, with dynamic loss scaling (skipped steps shown at the end).
    #[arg(long)]
    f16: bool,
    /// Fail unless the mean loss of the last ten steps is below this.
    #[arg(long)]
    threshold: Option<f64>,
    /// Where the loss curve (`loss.csv`, `loss.png`, `loss.svg`), the checkpoint and the sample go.
    #[arg(long, default_value = "target/train_gpt")]
    out: PathBuf,
    /// Another run's `loss.csv` (same settings, another backend): fail unless the two curves agree, each
    /// window of `--window` steps' mean loss within `--curve-tolerance` nats; both are plotted.
    #[arg(long)]
    agree_with: Option<PathBuf>,
    /// Steps per window of the curve comparison.
    #[arg(long, default_value_t = 25)]
    window: usize,
    /// The most two runs' window means may differ by, in nats.
    #[arg(long, default_value_t = 0.05)]
    curve_tolerance: f64,
}

/// A SplitMix64 stream for batch offsets and sampling.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// `t` where `rt` says (the host when there is no device runtime).
fn placed(t: Tensor, rt: &Option<std::sync::Arc<kiln::Runtime>>) -> kiln::Result<Tensor> {
    match rt {
        Some(rt) => t.to(rt.clone()),
        None => Ok(t),
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    kiln::init_logs();
    let args = Args::parse();
    let text = include_str!("data/sonnets.txt");
    let mut vocab: Vec<char> = text.chars().collect();
    vocab.sort_unstable();
    vocab.dedup();
    let ids: Vec<i64> = text.chars().map(|c| vocab.binary_search(&c).expect("in the vocabulary") as i64).collect();
    let (b, t) = (args.batch, args.context);
    if ids.len() <= t + 1 {
        return Err(format!("the text has {} characters, a context of {t} needs more", ids.len()).into());
    }
    let chosen: Backend = args.backend.parse()?;
    let rt = chosen.runtime()?;
    let config = GptConfig {
        vocab: vocab.len(),
        context: t,
        dim: args.dim,
        heads: args.heads,
        layers: args.layers,
        dropout: args.dropout,
    };
    let mut model = Gpt::new(config, args.seed)?;
    if args.bf16 {
        model = model.cast(kiln::DType::BF16)?;
    } else if args.f16 {
        model = model.cast(kiln::DType::F16)?;
    }
    if let Some(rt) = &rt {
        model = model.to(rt)?;
    }
    let n_params: usize =
        model.tensors().iter().map(|p| p.shape().as_concrete().unwrap_or_default().iter().product::<usize>()).sum();
    eprintln!(
        "train_gpt: {} characters, vocabulary {}, {n_params} parameters, on {}",
        ids.len(),
        vocab.len(),
        rt.as_ref().map_or("the CPU reference".to_string(), |r| r.driver().describe())
    );
    let opt = AdamW { lr: args.lr, weight_decay: 0.01, ..AdamW::default() };
    // The batch's third tensor is the step's dropout key: data, so a new one each step recompiles nothing.
    let loss = |m: &Gpt, batch: &[Tensor]| m.loss_train(&batch[0], &batch[1], &batch[2]);
    let mut trainer = Trainer::new(model, opt, loss, chosen)?;
    let mut rng = Rng(args.seed ^ 0x5eed);
    let bar = ProgressBar::new(args.steps);
    bar.set_style(ProgressStyle::with_template("{bar:40} {pos}/{len} steps, {elapsed} {msg}")?);
    let started = std::time::Instant::now();
    let mut losses: Vec<Tensor> = Vec::with_capacity(args.steps as usize);
    for step in 1..=args.steps {
        let (mut x, mut y) = (Vec::with_capacity(b * t), Vec::with_capacity(b * t));
        for _ in 0..b {
            let at = (rng.next() % (ids.len() - t - 1) as u64) as usize;
            x.extend_from_slice(&ids[at..at + t]);
            y.extend_from_slice(&ids[at + 1..at + t + 1]);
        }
        let batch = [
            placed(Tensor::from_slice(&x, &[b, t])?, &rt)?,
            placed(Tensor::from_slice(&y, &[b, t])?, &rt)?,
            placed(Tensor::rng_key(args.seed as u32, step as u32), &rt)?,
        ];
        let scale = warmup_cosine(step, (args.steps / 10).max(1), args.steps, 0.1);
        let loss = trainer.step(&batch, scale)?.cast(kiln::DType::F32)?;
        // Reading a loss waits for its step: only every tenth, for the progress line.
        if step % 10 == 0 || step == args.steps {
            bar.set_message(format!("loss {:.3}", loss.item::<f32>()?));
        }
        losses.push(loss);
        bar.inc(1);
    }
    bar.finish();
    let curve: Vec<f64> = losses.iter().map(|l| l.item::<f32>().map(f64::from)).collect::<kiln::Result<_>>()?;
    let secs = started.elapsed().as_secs_f64();
    let tail = &curve[curve.len().saturating_sub(10)..];
    let final_loss = tail.iter().sum::<f64>() / tail.len().max(1) as f64;
    eprintln!(
        "train_gpt: loss {:.3} → {final_loss:.3} (mean of the last {}) in {secs:.1} s ({:.1} ms a step); compiled step: {:?}",
        curve[0],
        tail.len(),
        secs * 1e3 / args.steps.max(1) as f64,
        trainer.stats()
    );
    if let Some(s) = trainer.loss_scale()? {
        eprintln!(
            "train_gpt: loss scale {} after {} steps ({} skipped for overflow)",
            s.scale,
            trainer.steps(),
            trainer.steps() - s.updates
        );
    }
    std::fs::create_dir_all(&args.out)?;
    let csv: String = curve.iter().enumerate().map(|(i, l)| format!("{},{l}\n", i + 1)).collect();
    std::fs::write(args.out.join("loss.csv"), format!("step,loss\n{csv}"))?;
    let other = args.agree_with.as_deref().map(read_curve).transpose()?;
    plot(&curve, other.as_deref(), &args.out)?;
    kiln::nn::save(trainer.model(), &args.out.join("gpt.safetensors"))?;
    let sample = sample(trainer.model(), &vocab, &ids[..t], args.sample_chars, &mut rng, chosen)?;
    std::fs::write(args.out.join("sample.txt"), &sample)?;
    println!("{sample}");
    eprintln!(
        "train_gpt: wrote loss.csv, loss.png, loss.svg, gpt.safetensors and sample.txt to {}",
        args.out.display()
    );
    if let (Some(other), Some(path)) = (&other, &args.agree_with) {
        let worst = curve_gap(&curve, other, args.window)?;
        eprintln!(
            "train_gpt: against {}: window means ({} steps) differ by at most {:.4} nats (tolerance {})",
            path.display(),
            args.window,
            worst.0,
            args.curve_tolerance
        );
        if worst.0 > args.curve_tolerance {
            return Err(format!(
                "the loss curves disagree: steps {}–{} average {:.4} here, {:.4} in {}",
                worst.1 + 1,
                worst.1 + args.window,
                worst.2,
                worst.3,
                path.display()
            )
            .into());
        }
    }
    if let Some(limit) = args.threshold {
        if final_loss >= limit {
            return Err(format!("final loss {final_loss:.3} is not below the threshold {limit}").into());
        }
    }
    Ok(())
}

/// `chars` characters after `prompt` (exactly a context long), each drawn from the model's distribution
/// at temperature 0.8. The forward pass is compiled once for the window's shape.
fn sample(
    model: &Gpt,
    vocab: &[char],
    prompt: &[i64],
    chars: usize,
    rng: &mut Rng,
    backend: Backend,
) -> kiln::Result<String> {
    let t = prompt.len();
    let forward = compile(|x: &Tensor| model.forward(x)?.narrow(1, t - 1, 1)?.cast(kiln::DType::F32)).backend(backend);
    let mut window: Vec<i64> = prompt.to_vec();
    let mut out: String = prompt.iter().map(|&i| vocab[i as usize]).collect();
    let device = model.tensors()[0].value().and_then(|v| v.device()).map(|d| d.buffer.runtime().clone());
    for _ in 0..chars {
        let x = placed(Tensor::from_slice(&window, &[1, t])?, &device)?;
        let logits: Vec<f32> = forward.call(&x)?.to_vec()?;
        let top = logits.iter().copied().fold(f32::MIN, f32::max) as f64;
        let weights: Vec<f64> = logits.iter().map(|&l| ((l as f64 - top) / 0.8).exp()).collect();
        let mut r = rng.unit() * weights.iter().sum::<f64>();
        let next = weights.iter().position(|w| {
            r -= w;
            r <= 0.0
        });
        let next = next.unwrap_or(weights.len() - 1);
        out.push(vocab[next]);
        window.remove(0);
        window.push(next as i64);
    }
    Ok(out)
}

/// A `loss.csv` this example wrote: the losses in step order.
fn read_curve(path: &std::path::Path) -> Result<Vec<f64>, Box<dyn std::error::Error>> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let rows = text.lines().skip(1).filter(|l| !l.trim().is_empty());
    let loss = |l: &str| l.split(',').nth(1).and_then(|v| v.trim().parse::<f64>().ok());
    rows.enumerate()
        .map(|(i, l)| loss(l).ok_or_else(|| format!("{}: line {} is not `step,loss`", path.display(), i + 2).into()))
        .collect()
}

/// The widest gap between two curves' means over windows of `window` steps: (gap, first step of its
/// window, this curve's mean there, the other's). Single steps differ by the batches' noise once rounding
/// has moved the weights apart; windows show whether the two trained alike.
fn curve_gap(curve: &[f64], other: &[f64], window: usize) -> Result<(f64, usize, f64, f64), String> {
    if curve.len() != other.len() || window == 0 || curve.len() < window {
        return Err(format!("curves of {} and {} steps, windows of {window}", curve.len(), other.len()));
    }
    let mean = |c: &[f64]| c.iter().sum::<f64>() / c.len() as f64;
    let gaps = curve.chunks(window).zip(other.chunks(window)).enumerate();
    let worst = gaps.map(|(i, (a, b))| ((mean(a) - mean(b)).abs(), i * window, mean(a), mean(b)));
    Ok(worst.fold((0.0, 0, 0.0, 0.0), |w, g| if g.0 > w.0 { g } else { w }))
}

/// The loss curve, step by step, as PNG and SVG (with another run's, when compared).
fn plot(curve: &[f64], other: Option<&[f64]>, out: &std::path::Path) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    // Text in the PNG needs a TrueType font (DejaVu Sans, which `scripts/deps.sh` installs).
    kiln::fit::metrics::register_font()?;
    draw(&BitMapBackend::new(&out.join("loss.png"), (800, 480)).into_drawing_area(), curve, other)?;
    draw(&SVGBackend::new(&out.join("loss.svg"), (800, 480)).into_drawing_area(), curve, other)?;
    Ok(())
}

fn draw<DB: plotters::prelude::DrawingBackend>(
    area: &plotters::prelude::DrawingArea<DB, plotters::coord::Shift>,
    curve: &[f64],
    other: Option<&[f64]>,
) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    use plotters::prelude::*;
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    let top = curve.iter().chain(other.unwrap_or_default()).copied().fold(0.0f64, f64::max) * 1.05;
    area.fill(&WHITE).map_err(e)?;
    let mut chart = ChartBuilder::on(area)
        .caption("train_gpt: training loss (cross-entropy, nats per character)", ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(48)
        .build_cartesian_2d(1u64..curve.len().max(2) as u64, 0.0..top.max(1e-3))
        .map_err(e)?;
    chart.configure_mesh().x_desc("step").y_desc("loss").draw().map_err(e)?;
    let line = |c: &[f64]| c.iter().enumerate().map(|(i, &l)| (i as u64 + 1, l)).collect::<Vec<_>>();
    chart
        .draw_series(LineSeries::new(line(curve), &BLUE))
        .map_err(e)?
        .label("this run")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE));
    if let Some(other) = other {
        chart
            .draw_series(LineSeries::new(line(other), &RED))
            .map_err(e)?
            .label("compared run")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED));
        chart.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw().map_err(e)?;
    }
    area.present().map_err(e)
}
