//! kiln-ptx: the NVIDIA lowering. Kernels from `kiln-graph` are printed as PTX — no CUDA C, no NVRTC —
//! for a compute capability, and checked by `ptxas`. The cudarc runtime (launches, cuBLASLt for matmul
//! regions, CUDA graphs) builds on this renderer.

pub mod check;
pub mod ptxas;
pub mod render;

pub use check::PtxasChecked;
pub use render::{render, PtxKernel, RenderError};
