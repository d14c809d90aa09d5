//! Getting a report to show: compile a built-in workload or an example program (on the kernel backend, which runs the whole
//! pipeline — decompose, fuse, lower, plan — and the kernels on the CPU, so it needs no GPU), or read a
//! report or bench file.

use kiln::graph::workloads;
use kiln::{CompileReport, Tensor};

/// Compiles and runs built-in workload `id` (`W1`…`W5`) at its check size and returns its report.
pub fn workload_report(id: &str) -> Result<CompileReport, String> {
    kiln::register_renderers();
    let w = workloads::all()
        .into_iter()
        .find(|w| w.id.eq_ignore_ascii_case(id))
        .ok_or_else(|| format!("no built-in workload `{id}` (W1, W2, W3, W4, W5, LG, W5-bf16)"))?;
    let inputs: Vec<Tensor> = workloads::inputs(&w.check).into_iter().map(Tensor::from_data).collect();
    let f = w.f;
    let compiled = kiln::compile(move |x: Vec<Tensor>| f(&x)).backend(kiln::Backend::Kernels);
    let _: Vec<Tensor> = compiled.call(inputs).map_err(|e| e.to_string())?;
    Ok(compiled.report())
}

/// The example programs the app opens (their own code, compiled in: `examples/` is the one source).
pub const EXAMPLES: [&str; 2] = ["graph breaks", "digits CNN (ONNX)"];

#[allow(dead_code)] // the example's `main` is its own; the app calls its function
#[path = "../../examples/graph_breaks.rs"]
mod graph_breaks;

/// The digits classifier `examples/onnx_classify.rs` runs (exported from PyTorch by `scripts/onnx_models.py`).
const DIGITS_ONNX: &[u8] = include_bytes!("../../tests/data/onnx/digits/model.onnx");

/// Compiles and runs example `name` (one of [`EXAMPLES`]) as its program does, and returns its report:
/// `graph breaks` on inputs that take both of its paths; the digits CNN on one 8x8 image.
pub fn example_report(name: &str) -> Result<CompileReport, String> {
    kiln::register_renderers();
    match name {
        "graph breaks" => {
            let f = kiln::compile(graph_breaks::normalise).backend(kiln::Backend::Kernels);
            for values in [[1.0f32, 2.0, 3.0, 6.0], [-1.0, -2.0, 0.5, 0.25]] {
                let x = Tensor::from_slice(&values, &[4]).map_err(|e| e.to_string())?;
                let _: Tensor = f.call(&x).map_err(|e| e.to_string())?;
            }
            Ok(f.report())
        }
        "digits CNN (ONNX)" => {
            let model = kiln::onnx::load_bytes(DIGITS_ONNX, "digits.onnx")
                .map_err(|e| e.to_string())?
                .backend(kiln::Backend::Kernels);
            let x = Tensor::from_slice(&[0.5f32; 64], &[1, 1, 8, 8]).map_err(|e| e.to_string())?;
            model.call(vec![x]).map_err(|e| e.to_string())?;
            Ok(model.compiled().report())
        }
        other => Err(format!("no example `{other}` ({})", EXAMPLES.join(", "))),
    }
}

/// The built-in workloads the app offers.
pub fn workload_ids() -> Vec<&'static str> {
    workloads::all().into_iter().map(|w| w.id).collect()
}

/// The report of a made-up graph of about `nodes` pointwise ops over one small tensor, each op reading
/// one or two of the last few values (a wide, many-layered DAG like a large model's): the explorer's
/// frame-rate test draws it.
pub fn synthetic_report(nodes: usize) -> Result<CompileReport, String> {
    kiln::register_renderers();
    let f = move |x: &Tensor| -> kiln::Result<Tensor> {
        let mut live = vec![x.clone()];
        for i in 0..nodes.saturating_sub(1) {
            let a = &live[live.len() - 1 - i % live.len().min(3)];
            let b = &live[live.len() - 1 - (i * 7 + 1) % live.len().min(5)];
            let y = match i % 6 {
                0 => a.add(b)?,
                1 => a.tanh()?,
                2 => a.mul(b)?,
                3 => a.sigmoid()?,
                4 => a.sub(b)?,
                _ => a.mul(0.5)?,
            };
            live.push(y);
            if live.len() > 8 {
                live.remove(0);
            }
        }
        Ok(live.pop().unwrap_or_else(|| x.clone()))
    };
    let compiled = kiln::compile(f).backend(kiln::Backend::Kernels);
    let x = Tensor::from_slice(&[0.5f32; 16], &[4, 4]).map_err(|e| e.to_string())?;
    let _: Tensor = compiled.call(&x).map_err(|e| e.to_string())?;
    Ok(compiled.report())
}
