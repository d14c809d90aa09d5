//! `kiln check`: a graph run on every backend and mode it can run on, each output compared with the f64
//! reference under the one tolerance rule ([`crate::tolerance`]), and each kernel of the compiled plan run
//! alone by the kernel interpreter on the reference's values of what it reads, so a wrong result is traced
//! to the kernel that made it. [`crate::minimize`] shrinks a graph that fails to a small reproducer.

use crate::backend::Backend;
use crate::data::TensorData;
use crate::error::{Error, Result};
use crate::ir::{Graph, NodeId};
use crate::kernel::Access;
use crate::pipeline::{compile_graph, CompiledGraph};
use crate::tolerance::{compare, depth, Expected, Outcome, Tolerance};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

/// One output of one run, against the reference.
#[derive(Clone, Debug, PartialEq)]
pub struct OutputCheck {
    /// The backend's name.
    pub backend: String,
    /// `default` or `reduce-overhead`.
    pub mode: &'static str,
    /// Which output of the graph.
    pub output: usize,
    /// The tolerance this output was held to: the report's, or f16's base where the backend runs the
    /// graph's f32 convolutions in TF32.
    pub tolerance: Tolerance,
    /// The comparison, or why the run failed.
    pub outcome: std::result::Result<Outcome, String>,
}

impl OutputCheck {
    /// Whether the output was produced and is within the tolerance.
    pub fn passed(&self) -> bool {
        self.outcome.as_ref().is_ok_and(|o| o.correct)
    }
}

/// One kernel of the plan, run alone on the reference's values of what it reads.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelCheck {
    /// The kernel's name.
    pub kernel: String,
    /// The target whose plan it belongs to.
    pub target: String,
    /// Its stored values against the reference's, or why it could not run.
    pub outcome: std::result::Result<Outcome, String>,
}

/// Everything `kiln check` found for one graph.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckReport {
    /// The tolerance the outputs were held to (the rule, for the graph's first output dtype and depth).
    pub tolerance: Tolerance,
    /// Every output of every backend and mode.
    pub outputs: Vec<OutputCheck>,
    /// Every kernel of every device target's plan.
    pub kernels: Vec<KernelCheck>,
}

impl CheckReport {
    /// Whether every output and every kernel passed.
    pub fn passed(&self) -> bool {
        self.outputs.iter().all(OutputCheck::passed)
            && self.kernels.iter().all(|k| k.outcome.as_ref().is_ok_and(|o| o.correct))
    }

    /// The first thing that failed, in words (what a minimizer keeps failing).
    pub fn first_failure(&self) -> Option<String> {
        let out = self.outputs.iter().find(|o| !o.passed()).map(|o| match &o.outcome {
            Ok(x) => format!(
                "{} {}: output {} has {} element(s) outside the tolerance (worst relative error {:.3e})",
                o.backend, o.mode, o.output, x.mismatches, x.max_rel_err
            ),
            Err(e) => format!("{} {}: {e}", o.backend, o.mode),
        });
        out.or_else(|| {
            self.kernels.iter().find(|k| !k.outcome.as_ref().is_ok_and(|o| o.correct)).map(|k| match &k.outcome {
                Ok(x) => format!("kernel {} ({}): {} element(s) wrong", k.kernel, k.target, x.mismatches),
                Err(e) => format!("kernel {} ({}): {e}", k.kernel, k.target),
            })
        })
    }
}

/// A table: one line per output run and per kernel, failures marked.
impl fmt::Display for CheckReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mark = |ok: bool| if ok { "ok  " } else { "FAIL" };
        writeln!(f, "tolerance: rtol {:.2e}, atol {:.2e}", self.tolerance.rtol, self.tolerance.atol)?;
        writeln!(f, "rule: {}", crate::tolerance::RULE)?;
        for o in &self.outputs {
            // An output held to another tolerance (TF32 convolutions) says which.
            let own = if o.tolerance == self.tolerance {
                String::new()
            } else {
                format!(" (held to rtol {:.2e}, atol {:.2e}: TF32 convolutions)", o.tolerance.rtol, o.tolerance.atol)
            };
            match &o.outcome {
                Ok(x) => writeln!(
                    f,
                    "{} {:<12} {:<16} output {}: worst relative error {:.3e}, {} mismatch(es){own}",
                    mark(o.passed()),
                    o.backend,
                    o.mode,
                    o.output,
                    x.max_rel_err,
                    x.mismatches
                )?,
                Err(e) => writeln!(f, "FAIL {:<12} {:<16} output {}: {e}", o.backend, o.mode, o.output)?,
            }
        }
        for k in &self.kernels {
            match &k.outcome {
                Ok(x) => writeln!(
                    f,
                    "{} kernel {} ({}): worst relative error {:.3e}, {} mismatch(es)",
                    mark(x.correct),
                    k.kernel,
                    k.target,
                    x.max_rel_err,
                    x.mismatches
                )?,
                Err(e) => writeln!(f, "FAIL kernel {} ({}): {e}", k.kernel, k.target)?,
            }
        }
        Ok(())
    }
}

/// Runs `graph` on `inputs` on every backend of `targets` (device runtimes in both modes: launched, and
/// recorded then replayed), compares each output with the reference, and checks every kernel of each
/// device target's plan alone in the kernel interpreter.
pub fn check_graph(graph: &Graph, inputs: &[TensorData], targets: &[Arc<dyn Backend>]) -> Result<CheckReport> {
    let refs: Vec<&TensorData> = inputs.iter().collect();
    let want: Vec<Expected> =
        crate::interp::run(graph, &refs)?.iter().map(|t| Expected::of(t, "kiln's f64 reference")).collect();
    // One depth for every output (decomposing the graph to find it is not free).
    let depth = depth(graph)?;
    let tolerance = Tolerance::rule(graph.outputs.first().map_or(crate::DType::F32, |o| graph.node(*o).dtype), depth);
    let mut report = CheckReport { tolerance, outputs: Vec::new(), kernels: Vec::new() };
    // A target running the graph's f32 convolutions in TF32 is held to f16's base (see `tolerance`).
    let tol_of = |i: usize, tf32: bool| Tolerance::rule_for(graph.node(graph.outputs[i]).dtype, depth, tf32);
    let tf32_on = |t: &Arc<dyn Backend>| t.target().is_some_and(|tg| crate::gemm::rounds_to_tf32(graph, tg));
    let mut push = |backend: &str, mode: &'static str, tf32: bool, got: Result<Vec<TensorData>>| match got {
        Ok(got) => {
            for (i, w) in want.iter().enumerate() {
                let tolerance = tol_of(i, tf32);
                let outcome = got.get(i).map_or(Outcome::MISSING, |g| compare(g, w, tolerance));
                report.outputs.push(OutputCheck {
                    backend: backend.into(),
                    mode,
                    output: i,
                    tolerance,
                    outcome: Ok(outcome),
                });
            }
        }
        Err(e) => {
            let tolerance = if graph.outputs.is_empty() { tolerance } else { tol_of(0, tf32) };
            let (output, outcome) = (0, Err(e.to_string()));
            report.outputs.push(OutputCheck { backend: backend.into(), mode, output, tolerance, outcome })
        }
    };
    let mut plans: Vec<Arc<CompiledGraph>> = Vec::new();
    for t in targets {
        let tf32 = tf32_on(t);
        let Some(rt) = t.runtime() else {
            push(t.name(), "default", tf32, t.run(graph, &refs));
            continue;
        };
        let compiled = match compile_graph(graph, rt.target()) {
            Ok(c) => Arc::new(c),
            Err(e) => {
                push(t.name(), "default", tf32, Err(e));
                continue;
            }
        };
        push(t.name(), "default", tf32, rt.run_host(&compiled, &refs));
        let replayed = (|| {
            let devs = inputs.iter().map(|d| rt.upload(d)).collect::<Result<Vec<_>>>()?;
            // The first call records, the second replays: the replay is what reduce-overhead serves.
            drop(rt.run_recorded(&compiled, &devs)?);
            let outs = rt.run_recorded(&compiled, &devs)?;
            outs.iter().map(|o| rt.download(o)).collect::<Result<Vec<_>>>()
        })();
        push(t.name(), "reduce-overhead", tf32, replayed);
        if !plans.iter().any(|p| p.target == compiled.target) {
            plans.push(compiled);
        }
    }
    for c in &plans {
        let tf32 = Tolerance::rule_for(crate::DType::F32, depth, true);
        report.kernels.extend(check_kernels(c, inputs, tolerance, tf32)?);
    }
    Ok(report)
}

/// Each kernel of `c` run alone by the kernel interpreter, its buffers read from the reference's values
/// of the nodes they hold, its stores compared with the reference's under `tol` (`tf32_tol` for a library
/// GEMM whose f32 operands are rounded to TF32).
pub fn check_kernels(
    c: &CompiledGraph,
    inputs: &[TensorData],
    tol: Tolerance,
    tf32_tol: Tolerance,
) -> Result<Vec<KernelCheck>> {
    let prim = &c.primitive.graph;
    let refs: Vec<&TensorData> = inputs.iter().collect();
    // The reference's value of every node a kernel touches.
    let mut wanted: Vec<NodeId> = c.kernels.iter().flat_map(|k| k.buffers.iter().map(|b| b.node)).collect();
    wanted.sort();
    wanted.dedup();
    let mut all = prim.clone();
    all.outputs = wanted.clone();
    let values: BTreeMap<NodeId, TensorData> = wanted.into_iter().zip(crate::interp::run(&all, &refs)?).collect();
    let bindings = crate::interp::bind_symbols(prim, &refs)?;
    let mut out = Vec::with_capacity(c.kernels.len());
    // A kernel that runs inside another's launch is checked there.
    for kernel in c.kernels.iter().filter(|k| k.launched_in.is_none()) {
        let tol = if kernel.gemm().is_some_and(|g| g.tf32) { tf32_tol } else { tol };
        let mut arrays: Vec<Vec<f64>> = kernel
            .buffers
            .iter()
            .map(|b| match b.access {
                Access::Read => values[&b.node].values().to_vec(),
                Access::Write => vec![0.0; values[&b.node].values().len()],
            })
            .collect();
        let ran = crate::kinterp::run_kernel(kernel, &mut Arrays(&mut arrays), &bindings);
        let outcome = ran.map_err(|e| e.to_string()).map(|_| {
            kernel
                .buffers
                .iter()
                .zip(&arrays)
                .filter(|(b, _)| b.access == Access::Write)
                .map(|(b, got)| {
                    let want = &values[&b.node];
                    let got: Vec<f64> = got.iter().map(|&x| b.dtype.round(x)).collect();
                    crate::tolerance::compare_values(want.dims(), &got, &Expected::of(want, "reference"), tol)
                })
                .reduce(Outcome::and)
                .unwrap_or(Outcome { max_rel_err: 0.0, mismatches: 0, correct: true })
        });
        out.push(KernelCheck { kernel: kernel.name.clone(), target: c.target.name.clone(), outcome });
    }
    Ok(out)
}

/// A kernel's buffers as plain arrays, for the kernel interpreter.
struct Arrays<'a>(&'a mut [Vec<f64>]);

impl crate::kinterp::Memory for Arrays<'_> {
    fn slot(&mut self, buffer: usize) -> &mut Vec<f64> {
        &mut self.0[buffer]
    }
}

/// Seeded inputs for `graph`'s inputs (all of their dims must be concrete): what `kiln check` runs a saved
/// graph on.
pub fn seeded_inputs(graph: &Graph) -> Result<Vec<TensorData>> {
    let specs = graph
        .inputs
        .iter()
        .map(|gi| {
            let n = graph.node(gi.node);
            let dims = n.shape.as_concrete().ok_or_else(|| Error::Unsupported {
                what: format!("checking a graph whose input {} has symbolic dims {}", gi.node, n.shape),
                loc: n.loc.clone(),
            })?;
            Ok(crate::TensorSpec::new(n.dtype, &dims))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(crate::workloads::inputs(&specs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DType;

    /// The report's header states the rule; an output a backend ran with TF32 convolutions, held to the
    /// wider tolerance, says so on its own line (it used to be printed under the f32 rule alone).
    #[test]
    fn an_output_held_to_the_tf32_rule_says_so() {
        let f32_rule = Tolerance::rule_for(DType::F32, 4.0, false);
        let tf32_rule = Tolerance::rule_for(DType::F32, 4.0, true);
        assert_ne!(f32_rule, tf32_rule);
        let ok = Outcome { max_rel_err: 1e-4, mismatches: 0, correct: true };
        let output = |backend: &str, tolerance| OutputCheck {
            backend: backend.into(),
            mode: "default",
            output: 0,
            tolerance,
            outcome: Ok(ok),
        };
        let report = CheckReport {
            tolerance: f32_rule,
            outputs: vec![output("wgpu", f32_rule), output("cuda", tf32_rule)],
            kernels: Vec::new(),
        };
        let text = report.to_string();
        let line = |b: &str| text.lines().find(|l| l.contains(b)).unwrap_or_default().to_string();
        assert!(!line("wgpu").contains("TF32"), "{text}");
        assert!(line("cuda").contains("TF32") && line("cuda").contains(&format!("{:.2e}", tf32_rule.rtol)), "{text}");
    }
}
