//! The contract between the shared pipeline and whatever executes graphs. A backend receives a graph and
//! the concrete inputs and returns the outputs; everything before (tracing, later fusion and guards) is
//! shared, so the CPU reference and the GPU lowerings plug in at the same point.

use crate::data::TensorData;
use crate::error::{Error, Result};
use crate::ir::Graph;
use crate::loc::SourceLoc;
use crate::pipeline::{compile_graph, CompiledGraph};
use crate::target::Target;
use std::rc::Rc;

/// Something that executes graphs.
///
/// A backend either runs graphs directly (the reference: `target()` is `None`) or runs kernels: then the
/// shared pipeline compiles each graph for its `Target` and hands the result to `run_compiled`.
pub trait Backend {
    /// Short name for logs, explain and reports (`cpu`, `wgpu`, `cuda`).
    fn name(&self) -> &str;
    /// The device description kernels are compiled for; `None` for backends that run graphs directly.
    fn target(&self) -> Option<&Target> {
        None
    }
    /// Runs `graph` on `inputs` (in `Graph::inputs` order) and returns one value per `Graph::outputs`.
    fn run(&self, graph: &Graph, inputs: &[&TensorData]) -> Result<Vec<TensorData>> {
        let target = self.target().ok_or_else(|| Error::Unsupported {
            what: format!("backend `{}` implements neither `run` nor `target`", self.name()),
            loc: SourceLoc::internal(),
        })?;
        self.run_compiled(&compile_graph(graph, target)?, inputs)
    }
    /// Runs a graph compiled for `target()`.
    fn run_compiled(&self, compiled: &CompiledGraph, inputs: &[&TensorData]) -> Result<Vec<TensorData>> {
        let _ = (compiled, inputs);
        Err(Error::Unsupported {
            what: format!("backend `{}` does not run compiled kernels", self.name()),
            loc: SourceLoc::internal(),
        })
    }
    /// Runs a compiled graph in `mode`. A backend with a cheaper way to replay the same graph (CUDA
    /// graphs) uses it for [`Mode::ReduceOverhead`]; the others run it as `run_compiled` does.
    fn run_compiled_in(
        &self,
        compiled: &Rc<CompiledGraph>,
        inputs: &[&TensorData],
        mode: Mode,
    ) -> Result<Vec<TensorData>> {
        let _ = mode;
        self.run_compiled(compiled, inputs)
    }
}

/// How a compiled graph is launched, as in `torch.compile(mode=...)`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Every call binds its buffers and launches each kernel.
    #[default]
    Default,
    /// The first call with given shape-symbol values records the launches once (a CUDA graph) and later
    /// calls replay them with one driver call, copying new inputs into the recorded buffers. Other symbol
    /// values record again.
    ReduceOverhead,
}

/// The CPU reference interpreter as a backend: slow, exact (f64), and always there.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuReference;

impl Backend for CpuReference {
    fn name(&self) -> &str {
        "cpu"
    }

    fn run(&self, graph: &Graph, inputs: &[&TensorData]) -> Result<Vec<TensorData>> {
        crate::interp::run(graph, inputs)
    }
}

/// The whole pipeline — decompose, fuse, lower, plan — with kernels run by the CPU kernel interpreter:
/// what a GPU backend would run, executed exactly, without a GPU.
#[derive(Clone, Debug)]
pub struct KernelInterpreter {
    target: Target,
}

impl KernelInterpreter {
    /// Kernels compiled for `target` (use a GPU's target to see exactly its kernels run).
    pub fn new(target: Target) -> Self {
        KernelInterpreter { target }
    }
}

impl Default for KernelInterpreter {
    fn default() -> Self {
        KernelInterpreter::new(Target::interpreter())
    }
}

impl Backend for KernelInterpreter {
    fn name(&self) -> &str {
        "cpu-kernels"
    }

    fn target(&self) -> Option<&Target> {
        Some(&self.target)
    }

    fn run_compiled(&self, compiled: &CompiledGraph, inputs: &[&TensorData]) -> Result<Vec<TensorData>> {
        compiled.run_interpreted(inputs)
    }
}

impl IntoBackend for KernelInterpreter {
    fn into_backend(self) -> Result<Rc<dyn Backend>> {
        Ok(Rc::new(self))
    }
}

/// Turns a user's backend choice into a backend (the facade's `Backend` enum implements it).
pub trait IntoBackend {
    /// The backend, or an error saying why it is unavailable here.
    fn into_backend(self) -> Result<Rc<dyn Backend>>;
}

impl IntoBackend for Rc<dyn Backend> {
    fn into_backend(self) -> Result<Rc<dyn Backend>> {
        Ok(self)
    }
}

impl IntoBackend for CpuReference {
    fn into_backend(self) -> Result<Rc<dyn Backend>> {
        Ok(Rc::new(self))
    }
}
