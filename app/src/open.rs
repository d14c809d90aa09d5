//! Getting a report to show: compile a built-in workload (on the kernel backend, which runs the whole
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
