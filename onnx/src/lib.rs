//! ONNX import: most trained models leave PyTorch as ONNX files, and this is how they reach kiln.
//!
//! [`load`] reads a model (protobuf through `prost`, its schema compiled at build time by `protox`, so
//! no system `protoc`) and returns an [`OnnxModel`]: a compiled kiln function over the model's inputs.
//! The model is not translated into a second IR: each ONNX node becomes calls on [`kiln_graph::Tensor`],
//! so under `compile` the whole model is traced into one kiln graph and gets kiln's fusion, guards,
//! caching and backends like Rust code does. Initializers are read once into kiln tensors, which tracing
//! lifts as weights (uploaded once, never baked into kernels). `dim_param` dims become symbolic from the
//! first call, so a dynamic batch runs without recompiling; shape arithmetic (`Shape`, `Gather`,
//! `Concat`, ...) is folded on the host into expressions over those symbols.

mod fold;
mod model;
mod old_opsets;
mod ops;
pub mod proto;
mod scan;
pub mod tensor;
mod value;

pub use model::{DimSpec, IoSpec, Model, MAX_LOOP_ITERATIONS, OPSETS};
pub use ops::supported_ops;

use kiln_graph::{Compiled, Error, IntoBackend, Mode, Result, Tensor};
use std::path::Path;
use std::sync::Arc;

/// The function a compiled ONNX model wraps.
type ModelFn = Box<dyn Fn(Vec<Tensor>) -> Result<Vec<Tensor>> + Send + Sync>;

/// A loaded ONNX model as a compiled kiln function: call it with tensors in [`OnnxModel::inputs`] order.
pub struct OnnxModel {
    model: Arc<Model>,
    compiled: Compiled<ModelFn>,
}

/// Reads an ONNX model file (external data is looked up next to it).
pub fn load(path: impl AsRef<Path>) -> Result<OnnxModel> {
    let path = path.as_ref();
    let bytes = std::fs::read(path)
        .map_err(|e| Error::Format { what: format!("ONNX model {}", path.display()), msg: e.to_string() })?;
    let model = Model::parse(&bytes, &path.display().to_string(), path.parent())?;
    Ok(OnnxModel::new(model))
}

/// Reads an ONNX model from memory; `name` names it in errors. External data cannot be found this way.
pub fn load_bytes(bytes: &[u8], name: &str) -> Result<OnnxModel> {
    Ok(OnnxModel::new(Model::parse(bytes, name, None)?))
}

impl OnnxModel {
    fn new(model: Model) -> OnnxModel {
        let model = Arc::new(model);
        OnnxModel { compiled: Self::wrap(&model), model }
    }

    /// The compiled function over `model`, with every `dim_param` dim marked dynamic.
    fn wrap(model: &Arc<Model>) -> Compiled<ModelFn> {
        let m = model.clone();
        let f: ModelFn = Box::new(move |xs: Vec<Tensor>| m.run(&xs));
        let mut c = kiln_graph::compile(f);
        for (i, spec) in model.inputs.iter().enumerate() {
            for (d, dim) in spec.dims.iter().flatten().enumerate() {
                if matches!(dim, DimSpec::Param(_)) {
                    // Sizes 0 and 1 stay specialised, as for every kiln dynamic dim.
                    c = c.mark_dynamic(i, d, 2..=i32::MAX as usize);
                }
            }
        }
        c
    }

    /// Runs the model on `inputs` (checked against the declared inputs first).
    pub fn call(&self, inputs: Vec<Tensor>) -> Result<Vec<Tensor>> {
        self.model.check_inputs(&inputs)?;
        self.compiled.call(inputs)
    }

    /// Where the model runs (default: the facade's automatic choice, else the CPU reference).
    pub fn backend(mut self, b: impl IntoBackend) -> Self {
        self.compiled = Self::wrap(&self.model).backend(b);
        self
    }

    /// How it launches (`Mode::ReduceOverhead`: CUDA graphs where the backend has them).
    pub fn mode(mut self, mode: Mode) -> Self {
        self.compiled = self.compiled.mode(mode);
        self
    }

    /// The inputs a call takes, with their declared (possibly symbolic) dims.
    pub fn inputs(&self) -> &[IoSpec] {
        &self.model.inputs
    }

    /// The outputs a call returns.
    pub fn outputs(&self) -> &[IoSpec] {
        &self.model.outputs
    }

    /// The parsed model (run it eagerly with [`Model::run`]).
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// The compiled function: its report, stats, guards.
    pub fn compiled(&self) -> &Compiled<ModelFn> {
        &self.compiled
    }
}

impl std::fmt::Debug for OnnxModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let m = &self.model;
        let list = |v: &[IoSpec]| v.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ");
        write!(
            f,
            "OnnxModel({}, opset {}, {} nodes, inputs [{}], outputs [{}], on {})",
            m.name,
            m.opset,
            m.nodes.len(),
            list(&m.inputs),
            list(&m.outputs),
            self.compiled.backend_name()
        )
    }
}
