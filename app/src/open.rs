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
