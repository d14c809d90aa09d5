//! kiln-wgsl: the portable lowering. Kernels from `kiln-graph` are printed as WGSL, validated with naga,
//! and run through wgpu on Vulkan, Metal, DX12 — and in browsers through WebGPU.

pub mod adapters;
pub mod render;
pub mod shader_checks;
pub mod storage;
pub mod validate;

pub use render::{render, RenderError, Shader};
pub use storage::Storage;
pub use validate::{validate, ValidationError};
pub mod runtime;

pub use adapters::NO_ADAPTER_HINT;
pub use runtime::{Gpu, GpuStats};
