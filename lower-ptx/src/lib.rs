//! kiln-ptx: the NVIDIA lowering. Kernels from `kiln-graph` are printed as PTX — no CUDA C, no NVRTC —
//! for a compute capability, checked by `ptxas`, and run by a cudarc runtime (driver API loaded at run
//! time, so building needs no CUDA) with cuBLAS for the matmuls `graph` gives to a library and CUDA
//! graphs for the reduce-overhead mode.

mod assemble;
pub mod check;
pub mod collective;
pub mod copies;
mod gemm;
mod lt;
pub mod nccl;
pub mod ordinal;
mod preload;
pub mod ptxas;
pub mod render;
pub mod runtime;
pub mod staging;

pub use check::PtxasChecked;
pub use render::{render, PtxKernel, RenderError};
pub use runtime::{Cuda, NEWEST_SM};
