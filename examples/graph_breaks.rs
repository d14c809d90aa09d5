//! Graph breaks: a function that branches on a tensor value. The host read splits the trace; each path
//! actually taken gets its own graph, and `explain` says where and why.
//!
//! `cargo run --release --example graph_breaks`

use kiln::{compile, Result, Tensor};

/// Normalises `x` one way if its mean is positive, another way if not. (Public: the explorer opens this
/// example by compiling this very function.)
pub fn normalise(x: &Tensor) -> Result<Tensor> {
    let mean = x.mean(&[], false)?;
    let centred = x.sub(&mean)?;
    if mean.item::<f32>()? > 0.0 {
        centred.div(&x.max(&[], false)?)
    } else {
        centred.tanh()?.mul(2.0)
    }
}

fn main() -> Result<()> {
    kiln::init_logs();
    let f = compile(normalise);
    for values in [[1.0f32, 2.0, 3.0, 6.0], [-1.0, -2.0, 0.5, 0.25]] {
        let x = Tensor::from_slice(&values, &[4])?;
        let (y, explanation) = f.call_explained(&x)?;
        println!("input  {values:?}\noutput {:?}\n{explanation}", y.to_vec::<f32>()?);
    }
    // With fullgraph, the same read is an error that points at the line.
    match compile(normalise).fullgraph(true).call(&Tensor::from_slice(&[1.0f32], &[1])?) {
        Err(e) => println!("fullgraph(true): {e}"),
        Ok(_) => unreachable!("normalise always reads a value"),
    }
    Ok(())
}
