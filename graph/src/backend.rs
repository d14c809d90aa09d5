//! The contract between the shared pipeline and whatever executes graphs. A backend receives a graph and
//! the concrete inputs and returns the outputs; everything before (tracing, later fusion and guards) is
//! shared, so the CPU reference and the GPU lowerings plug in at the same point.

use crate::data::TensorData;
use crate::error::Result;
use crate::ir::Graph;
use std::rc::Rc;

/// Something that executes graphs.
pub trait Backend {
    /// Short name for logs, explain and reports (`cpu`, `wgpu`, `cuda`).
    fn name(&self) -> &str;
    /// Runs `graph` on `inputs` (in `Graph::inputs` order) and returns one value per `Graph::outputs`.
    fn run(&self, graph: &Graph, inputs: &[&TensorData]) -> Result<Vec<TensorData>>;
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
