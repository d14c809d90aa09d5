//! # kiln
//!
//! A tensor compiler in Rust, in the spirit of `torch.compile`: write model code against [`Tensor`], wrap
//! it in [`compile`], and kiln traces it into one graph IR, then (as the pipeline grows) fuses it into
//! regions and lowers each region to WGSL or PTX. Today every graph runs on the CPU reference.
//!
//! ```
//! use kiln::{compile, DType, Tensor};
//! let f = compile(|x: &Tensor| x.mul(1.5)?.add(0.5)?.gelu());
//! let x = Tensor::from_slice(&[0.0f32, 1.0, -1.0], &[3])?;
//! let y: Vec<f32> = f.call(&x)?.to_vec()?;
//! assert_eq!(y.len(), 3);
//! # Ok::<(), kiln::Error>(())
//! ```
//!
//! This crate is the small public facade; the machinery lives in [`graph`] (`kiln-graph`).

pub use kiln_graph as graph;
pub use kiln_graph::{
    compile, Args, Compiled, DType, Element, Error, Explanation, Result, SourceLoc, Static, Tensor, TensorData,
};

use kiln_graph::{CpuReference, IntoBackend, KernelInterpreter};
use std::rc::Rc;

/// Which backend compiled graphs run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Backend {
    /// The best one available: CUDA, else wgpu, else the CPU reference (only the CPU reference exists yet).
    #[default]
    Auto,
    /// The CPU reference interpreter (f64, exact, slow).
    Cpu,
    /// The full compiler pipeline (decompose, fuse, lower, plan) with its kernels run by the CPU kernel
    /// interpreter: the kernels a GPU would get, executed without one.
    Kernels,
}

impl Backend {
    /// Every backend this build knows, best first.
    pub const ALL: [Backend; 3] = [Backend::Auto, Backend::Cpu, Backend::Kernels];

    /// The backends that can run here now, best first (what `Auto` chooses from).
    pub fn available() -> Vec<Backend> {
        vec![Backend::Cpu, Backend::Kernels]
    }
}

impl IntoBackend for Backend {
    fn into_backend(self) -> Result<Rc<dyn kiln_graph::Backend>> {
        match self {
            Backend::Auto | Backend::Cpu => Ok(Rc::new(CpuReference)),
            Backend::Kernels => Ok(Rc::new(KernelInterpreter::default())),
        }
    }
}
