//! kiln-graph: the shared middle of kiln — tensor IR, tracing with graph breaks, symbolic dims, the CPU
//! reference, explain and export. Everything a lowering does not need to decide lives here, once.
//!
//! Start reading at [`compile`]: it is the pipeline as one short function.

pub mod autodiff;
pub mod backend;
mod binding;
pub mod cache;
pub mod check;
pub mod compile;
pub mod conv;
pub mod data;
pub mod decompose;
pub mod device;
pub mod dtype;
pub mod error;
pub mod explain;
pub mod export;
pub mod fan_in;
pub mod fuse;
pub mod gemm;
pub mod guard;
pub mod host_device;
pub mod interp;
pub mod ir;
pub mod kernel;
pub mod kinterp;
pub mod layers;
pub mod loc;
pub mod lower;
pub mod minimize;
pub mod numbers;
pub mod opdocs;
pub mod ops;
pub mod pipeline;
pub mod plan;
pub mod report;
pub mod resize;
pub mod rng;
pub mod runtime;
pub mod shape;
mod size_class;
pub mod sym;
pub mod tape;
pub mod target;
pub mod tolerance;
pub mod trace;
pub mod value;
pub mod workloads;

pub use backend::{Backend, CpuReference, IntoBackend, KernelInterpreter, Mode};
pub use compile::{compile, Args, CompileStats, Compiled, Outputs, Static};
pub use conv::Window;
pub use data::TensorData;
pub use dtype::{DType, Element};
pub use error::{Error, Result};
pub use explain::Explanation;
pub use fuse::FusionMode;
pub use guard::Dynamic;
pub use ir::{Graph, Node, NodeId, Op};
pub use loc::SourceLoc;
pub use ops::{Operand, OperandValue};
pub use pipeline::{compile_cached, compile_graph, compile_graph_with, CompiledGraph};
pub use report::CompileReport;
pub use runtime::{DeviceTensor, MemoryStats, Runtime};
pub use shape::Shape;
pub use target::Target;
pub use trace::{capture, set_eager_backend, GraphBreak, Tensor, TensorSpec, TracedGraph};
