//! `kiln check` for a function: every graph it runs (each side of a graph break too) recorded with the
//! values it ran on, then checked on every backend here against the f64 reference
//! ([`kiln_graph::check`]); a failing one can be shrunk to a reproducer ([`kiln_graph::minimize`]).

use crate::Backend;
use kiln_graph::check::CheckReport;
use kiln_graph::minimize::Case;
use kiln_graph::{Args, IntoBackend, Outputs, Result, TensorData};
use std::sync::{Arc, Mutex};

/// The backends `kiln check` holds to the reference: every one here that compiles kernels (the kernel
/// interpreter always; wgpu and CUDA where a device is found).
pub fn check_targets() -> Vec<Arc<dyn kiln_graph::Backend>> {
    Backend::available().into_iter().filter(|b| *b != Backend::Cpu).filter_map(|b| b.into_backend().ok()).collect()
}

/// A backend that keeps each graph it is given with its inputs and runs it on the reference: what a
/// compiled function is traced through when it is checked.
struct Recorder(Mutex<Vec<Case>>);

impl kiln_graph::Backend for Recorder {
    fn name(&self) -> &str {
        "check"
    }

    fn run(&self, graph: &kiln_graph::ir::Graph, inputs: &[&TensorData]) -> Result<Vec<TensorData>> {
        let case = Case { graph: graph.clone(), inputs: inputs.iter().map(|d| (*d).clone()).collect() };
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(case);
        kiln_graph::interp::run(graph, inputs)
    }
}

/// Runs `f` on `args` once, recording every graph it runs, and checks each on `targets` (see
/// [`check_targets`]): one report per graph, in the order they ran.
pub fn check<A: Args, R: Outputs>(
    f: impl Fn(A) -> Result<R>,
    args: A,
    targets: &[Arc<dyn kiln_graph::Backend>],
) -> Result<Vec<(Case, CheckReport)>> {
    let recorder = Arc::new(Recorder(Mutex::new(Vec::new())));
    let backend: Arc<dyn kiln_graph::Backend> = recorder.clone();
    let _: R = kiln_graph::compile(f).backend(backend).call(args)?;
    let cases = std::mem::take(&mut *recorder.0.lock().unwrap_or_else(|e| e.into_inner()));
    cases
        .into_iter()
        .map(|c| {
            let r = c.check(targets)?;
            Ok((c, r))
        })
        .collect()
}

/// Shrinks a case that fails on `targets` to a small one that still fails (at most `budget` tries).
pub fn minimize(case: Case, targets: &[Arc<dyn kiln_graph::Backend>], budget: usize) -> Case {
    kiln_graph::minimize::minimize(case, &mut |c| c.check(targets).is_ok_and(|r| !r.passed()), budget)
}
