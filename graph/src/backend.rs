//! The contract between the shared pipeline and whatever executes graphs. A backend receives a graph and
//! the concrete inputs and returns the outputs; everything before (tracing, later fusion and guards) is
//! shared, so the CPU reference and the GPU lowerings plug in at the same point.

use crate::data::TensorData;
use crate::error::{Error, Result};
use crate::ir::Graph;
use crate::loc::SourceLoc;
use crate::pipeline::{compile_graph, CompiledGraph};
use crate::runtime::Runtime;
use crate::target::Target;
use crate::value::Value;
use std::sync::Arc;

/// Something that executes graphs.
///
/// A backend either runs graphs directly on the host (the reference: `target()` is `None`) or is a
/// device [`Runtime`]: then the shared pipeline compiles each graph for its `Target` and the runtime runs
/// the kernels on device tensors. Backends are shared by threads.
pub trait Backend: Send + Sync {
    /// Short name for logs, explain and reports (`cpu`, `cpu-kernels`, `wgpu`, `cuda`).
    fn name(&self) -> &str;
    /// The device description kernels are compiled for; `None` for backends that run graphs directly.
    fn target(&self) -> Option<&Target> {
        None
    }
    /// The device runtime, for backends that run kernels.
    fn runtime(&self) -> Option<Arc<Runtime>> {
        None
    }
    /// Runs `graph` on host `inputs` (in `Graph::inputs` order) and returns one value per
    /// `Graph::outputs`, on the host.
    fn run(&self, graph: &Graph, inputs: &[&TensorData]) -> Result<Vec<TensorData>> {
        let rt = self.runtime().ok_or_else(|| Error::Unsupported {
            what: format!("backend `{}` implements neither `run` nor `runtime`", self.name()),
            loc: SourceLoc::internal(),
        })?;
        rt.run_host(&Arc::new(compile_graph(graph, rt.target())?), inputs)
    }
}

/// How a compiled graph is launched, as in `torch.compile(mode=...)`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Every call binds its buffers and launches each kernel.
    #[default]
    Default,
    /// The first call with given shape-symbol values records the launches once (a CUDA graph) and later
    /// calls replay them with one driver call; inputs whose buffers change between calls are copied into
    /// the recording's own. Other symbol values record again. Outputs are the recording's own buffers
    /// while each call's outputs are dropped before the next call (a loop body's locals are); outputs
    /// kept across a call are never overwritten: that recording copies its outputs out from then on
    /// (torch instead invalidates them and fails on access).
    ReduceOverhead,
    /// Launched as `Default`, but each graph's kernel schedules (matmul tiles, threads per row) are chosen
    /// when it compiles by timing candidates on the device with the call's inputs; choices are kept in
    /// the cache directory, so later processes compile the tuned graph without timing
    /// ([`crate::CompileStats::tuning_ms`] says what it cost).
    MaxAutotune,
}

/// Runs one graph on `backend`: on a device runtime, its compiled form on device tensors (inputs bound
/// or uploaded once, outputs left on the device); on a host backend, the graph on host data.
pub(crate) fn execute(
    backend: &dyn Backend,
    graph: &Graph,
    compiled: Option<&Arc<CompiledGraph>>,
    inputs: &[Arc<Value>],
    mode: Mode,
) -> Result<Vec<Arc<Value>>> {
    if let (Some(rt), Some(c)) = (backend.runtime(), compiled) {
        let devs = Value::all_on(inputs, &rt)?;
        let outs = match mode {
            Mode::ReduceOverhead => rt.run_recorded(c, &devs)?,
            Mode::Default | Mode::MaxAutotune => rt.run(c, &devs)?,
        };
        return Ok(outs.into_iter().map(Value::from_device).collect());
    }
    let hosts = inputs.iter().map(|v| v.to_host()).collect::<Result<Vec<_>>>()?;
    let refs: Vec<&TensorData> = hosts.iter().map(|d| d.as_ref()).collect();
    Ok(backend.run(graph, &refs)?.into_iter().map(|d| Value::from_host(Arc::new(d))).collect())
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

/// A device runtime is a backend: kernels compiled for its target, run on device tensors.
impl Backend for Runtime {
    fn name(&self) -> &str {
        Runtime::name(self)
    }

    fn target(&self) -> Option<&Target> {
        Some(Runtime::target(self))
    }

    fn runtime(&self) -> Option<Arc<Runtime>> {
        Some(self.arc())
    }
}

/// The whole pipeline — decompose, fuse, lower, plan — with kernels run by the CPU kernel interpreter on
/// a host-memory device: what a GPU backend would run, executed exactly, without a GPU, through the same
/// runtime core.
#[derive(Clone, Debug)]
pub struct KernelInterpreter {
    pub(crate) target: Target,
}

impl KernelInterpreter {
    /// Kernels compiled for `target` (use a GPU's target to see exactly its kernels run).
    pub fn new(target: Target) -> Self {
        KernelInterpreter { target }
    }

    /// A runtime over this device (each call makes a new one; share it to share its pool).
    pub fn runtime(self) -> Arc<Runtime> {
        Runtime::new(self)
    }
}

impl Default for KernelInterpreter {
    fn default() -> Self {
        KernelInterpreter::new(Target::interpreter())
    }
}

impl IntoBackend for KernelInterpreter {
    fn into_backend(self) -> Result<Arc<dyn Backend>> {
        Ok(Runtime::new(self))
    }
}

/// Turns a user's backend choice into a backend (the facade's `Backend` enum implements it).
pub trait IntoBackend {
    /// The backend, or an error saying why it is unavailable here.
    fn into_backend(self) -> Result<Arc<dyn Backend>>;
}

impl IntoBackend for Arc<dyn Backend> {
    fn into_backend(self) -> Result<Arc<dyn Backend>> {
        Ok(self)
    }
}

impl IntoBackend for Arc<Runtime> {
    fn into_backend(self) -> Result<Arc<dyn Backend>> {
        Ok(self)
    }
}

impl IntoBackend for CpuReference {
    fn into_backend(self) -> Result<Arc<dyn Backend>> {
        Ok(Arc::new(self))
    }
}
