//! Quickstart: define a function on tensors, compile it, run it, and see what kiln captured.
//!
//! `cargo run --release --example quickstart`

use kiln::graph::export;
use kiln::{compile, Backend, DType, Result, Tensor};

/// A small MLP block with a residual: the kind of code kiln is built to compile.
fn block(x: &Tensor, w1: &Tensor, w2: &Tensor) -> Result<Tensor> {
    let h = x.layer_norm(1, None, None, 1e-5)?;
    let h = h.linear(w1, None)?.gelu()?;
    let h = h.linear(w2, None)?;
    x.add(&h)?.softmax(-1)
}

fn main() -> Result<()> {
    kiln::init_logs();
    let n = 8;
    let x = Tensor::from_slice(&(0..4 * n).map(|i| (i as f32 * 0.37).sin()).collect::<Vec<_>>(), &[4, n])?;
    let w1 =
        Tensor::from_slice(&(0..2 * n * n).map(|i| (i as f32 * 0.11).cos() * 0.2).collect::<Vec<_>>(), &[2 * n, n])?;
    let w2 =
        Tensor::from_slice(&(0..2 * n * n).map(|i| (i as f32 * 0.07).sin() * 0.2).collect::<Vec<_>>(), &[n, 2 * n])?;

    // Weights are read from the enclosing scope: kiln lifts them into graph inputs.
    let compiled = compile(|x: &Tensor| block(x, &w1, &w2)).backend(Backend::Auto);
    let (y, explanation) = compiled.call_explained(&x)?;

    // Eager mode runs the same ops one at a time: the baseline every speedup is measured against.
    let eager = block(&x, &w1, &w2)?;
    let (a, b) = (y.to_vec::<f32>()?, eager.to_vec::<f32>()?);
    let max_diff = a.iter().zip(&b).map(|(p, q)| (p - q).abs()).fold(0.0f32, f32::max);

    println!("kiln {} — backend `{}`", env!("CARGO_PKG_VERSION"), compiled.backend_name());
    println!("output {} {}, first row: {:?}", y.dtype(), y.shape(), &a[..n]);
    println!("compiled vs eager: max |diff| = {max_diff:e}");
    println!("each row sums to {:.6}", y.sum(&[-1], false)?.to_vec::<f32>()?[0]);
    println!("\n{explanation}");
    println!("DOT of graph 0 (render with `dot -Tsvg`):\n{}", export::to_dot(&explanation.graphs[0].graph));
    assert_eq!(y.dtype(), DType::F32);
    Ok(())
}
