//! Classifies an image with an ONNX model exported from PyTorch: a small CNN trained on scikit-learn's
//! 8x8 handwritten digits (`scripts/onnx_models.py` trains and exports it; 99% held-out accuracy there).
//! Prints the top-5 classes and a summary of what kiln compiled.
//!
//! `cargo run --release --example onnx_classify -- [--image examples/data/digits/digit_7.pgm]
//! [--model tests/data/onnx/digits/model.onnx] [--backend auto|cuda|wgpu|kernels|cpu]`

use clap::Parser;
use kiln::{Backend, Result, Tensor};
use std::path::PathBuf;

#[derive(Parser)]
struct Args {
    /// An 8-bit greyscale PGM image (binary `P5`), 8x8 pixels.
    #[arg(long, default_value = "examples/data/digits/digit_7.pgm")]
    image: PathBuf,
    /// The ONNX model.
    #[arg(long, default_value = "tests/data/onnx/digits/model.onnx")]
    model: PathBuf,
    /// Where it runs.
    #[arg(long, default_value = "auto")]
    backend: String,
}

/// The pixels of a binary PGM (`P5`, maxval 255) scaled to [0, 1], with its width and height.
fn read_pgm(path: &PathBuf) -> Result<(Vec<f32>, usize, usize)> {
    let bad = |msg: &str| kiln::Error::Format { what: format!("PGM image {}", path.display()), msg: msg.into() };
    let bytes = std::fs::read(path).map_err(|e| bad(&e.to_string()))?;
    // Header: magic, width, height, maxval, then one whitespace byte before the pixels.
    let mut fields = vec![];
    let mut at = 0;
    while fields.len() < 4 {
        while at < bytes.len() && bytes[at].is_ascii_whitespace() {
            at += 1;
        }
        let start = at;
        while at < bytes.len() && !bytes[at].is_ascii_whitespace() {
            at += 1;
        }
        if start == at {
            return Err(bad("truncated header"));
        }
        fields.push(String::from_utf8_lossy(&bytes[start..at]).to_string());
    }
    let num = |s: &str| s.parse::<usize>().map_err(|_| bad("bad header number"));
    if fields[0] != "P5" || num(&fields[3])? != 255 {
        return Err(bad("expected a binary 8-bit PGM (P5, maxval 255)"));
    }
    let (w, h) = (num(&fields[1])?, num(&fields[2])?);
    let pixels = bytes.get(at + 1..at + 1 + w * h).ok_or_else(|| bad("fewer pixels than the header says"))?;
    Ok((pixels.iter().map(|&p| p as f32 / 255.0).collect(), w, h))
}

fn main() -> Result<()> {
    kiln::init_logs();
    let args = Args::parse();
    let backend: Backend = args.backend.parse()?;
    let model = kiln::onnx::load(&args.model)?.backend(backend);
    println!("{model:?}");
    let (pixels, w, h) = read_pgm(&args.image)?;
    let x = Tensor::from_slice(&pixels, &[1, 1, h, w])?;
    let started = std::time::Instant::now();
    let logits = model.call(vec![x])?;
    let probs = logits[0].softmax(-1)?.to_vec::<f32>()?;
    let first_ms = started.elapsed().as_secs_f64() * 1e3;
    let mut ranked: Vec<(usize, f32)> = probs.iter().copied().enumerate().collect();
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
    println!("\n{} ({w}x{h}): top 5", args.image.display());
    for (class, p) in ranked.iter().take(5) {
        println!("  digit {class}: {:6.2}%", p * 100.0);
    }
    let report = model.compiled().report();
    println!("\nfirst call (compile + run): {first_ms:.1} ms on {}", report.backend);
    for (e, entry) in report.entries.iter().enumerate() {
        for (g, graph) in entry.graphs.iter().enumerate() {
            let hist: Vec<String> = graph.captured.op_histogram().iter().map(|(n, c)| format!("{n}×{c}")).collect();
            println!("entry {e}, graph {g}: {} ops [{}]", graph.captured.op_count(), hist.join(", "));
            for k in &graph.kernels {
                println!("  kernel {} ({}, {} threads)", k.name, k.kind, k.threads);
            }
        }
    }
    Ok(())
}
