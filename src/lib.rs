//! # kiln
//!
//! A tensor compiler in Rust, in the spirit of `torch.compile`: write model code against [`Tensor`], wrap
//! it in [`compile`], and kiln traces it into one graph IR, then (as the pipeline grows) fuses it into
//! regions and lowers each region to WGSL (wgpu) or PTX (CUDA); `Backend::Auto` picks CUDA, else any wgpu
//! adapter, else the CPU reference.
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
    compile, Args, CompileStats, Compiled, DType, Dynamic, Element, Error, Explanation, Mode, Outputs, Result,
    SourceLoc, Static, Tensor, TensorData,
};

use kiln_graph::{CpuReference, IntoBackend, KernelInterpreter};
use std::rc::Rc;

/// Turns on kiln's logs as `KILN_LOGS` asks: a comma-separated list of `graph`, `fusion`, `guards`,
/// `recompiles`, `cache`, `output_code` (or `all`), printed to stderr. Safe to call more than once; a
/// program with its own `tracing` subscriber need not call it.
pub fn init_logs() {
    let Ok(wanted) = std::env::var("KILN_LOGS") else { return };
    let all = ["graph", "fusion", "guards", "recompiles", "cache", "output_code"];
    let names: Vec<&str> =
        if wanted.trim() == "all" { all.to_vec() } else { wanted.split(',').map(str::trim).collect() };
    let directives: Vec<String> =
        names.iter().filter(|n| all.contains(n)).map(|n| format!("kiln::{n}=debug")).collect();
    let filter = tracing_subscriber::EnvFilter::new(directives.join(","));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
}

/// Runs eager ops (tensor ops outside `compile`) on `backend` from now on, on this thread: each op is
/// one kernel through the same pipeline and runtime compiled code uses.
pub fn set_eager_backend(backend: Backend) -> Result<()> {
    kiln_graph::set_eager_backend(Some(backend.into_backend()?));
    Ok(())
}

/// Which backend compiled graphs run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Backend {
    /// The best one available: CUDA, else any wgpu adapter, else the CPU reference.
    #[default]
    Auto,
    /// The CPU reference interpreter (f64, exact, slow).
    Cpu,
    /// The full compiler pipeline (decompose, fuse, lower, plan) with its kernels run by the CPU kernel
    /// interpreter: the kernels a GPU would get, executed without one.
    Kernels,
    /// WGSL kernels through wgpu (Vulkan, Metal, DX12; WebGPU in browsers).
    Wgpu,
    /// PTX kernels through the CUDA driver (NVIDIA GPUs, compute capability 8.0 or newer).
    Cuda,
}

impl Backend {
    /// Every backend this build knows, best first.
    pub const ALL: [Backend; 5] = [Backend::Auto, Backend::Cuda, Backend::Wgpu, Backend::Kernels, Backend::Cpu];

    /// The backends that can run here now, best first (what `Auto` chooses from).
    pub fn available() -> Vec<Backend> {
        let mut v = Vec::new();
        if Backend::Cuda.into_backend().is_ok() {
            v.push(Backend::Cuda);
        }
        if Backend::Wgpu.into_backend().is_ok() {
            v.push(Backend::Wgpu);
        }
        v.extend([Backend::Kernels, Backend::Cpu]);
        v
    }
}

/// A device opened once per thread, kept for the whole program (leaked): opening costs milliseconds,
/// compiled pipelines and modules are cached on it, and a device torn down with its thread's locals can
/// touch other thread-locals that are already gone.
type DeviceSlot<B> = std::thread::LocalKey<std::cell::OnceCell<Result<&'static B, String>>>;

#[allow(dead_code)] // unused when built without both GPU features
fn shared_device<B: kiln_graph::Backend + Clone + 'static>(
    slot: &'static DeviceSlot<B>,
    name: &str,
    open: fn() -> Result<B>,
) -> Result<Rc<dyn kiln_graph::Backend>> {
    let open = || open().map(|b| &*Box::leak(Box::new(b))).map_err(|e| e.to_string());
    slot.with(|cell| match cell.get_or_init(open) {
        Ok(b) => Ok(Rc::new((*b).clone()) as Rc<dyn kiln_graph::Backend>),
        Err(msg) => Err(Error::Backend { backend: name.into(), msg: msg.clone() }),
    })
}

#[cfg(feature = "wgpu")]
thread_local! {
    static WGPU: std::cell::OnceCell<Result<&'static kiln_wgsl::WgpuBackend, String>> = const { std::cell::OnceCell::new() };
}

#[cfg(feature = "wgpu")]
fn wgpu_backend() -> Result<Rc<dyn kiln_graph::Backend>> {
    shared_device(&WGPU, "wgpu", kiln_wgsl::WgpuBackend::new)
}

#[cfg(not(feature = "wgpu"))]
fn wgpu_backend() -> Result<Rc<dyn kiln_graph::Backend>> {
    Err(Error::Backend { backend: "wgpu".into(), msg: "this build of kiln has no `wgpu` feature".into() })
}

#[cfg(feature = "cuda")]
thread_local! {
    static CUDA: std::cell::OnceCell<Result<&'static kiln_ptx::CudaBackend, String>> = const { std::cell::OnceCell::new() };
}

#[cfg(feature = "cuda")]
fn cuda_backend() -> Result<Rc<dyn kiln_graph::Backend>> {
    shared_device(&CUDA, "cuda", kiln_ptx::CudaBackend::new)
}

#[cfg(not(feature = "cuda"))]
fn cuda_backend() -> Result<Rc<dyn kiln_graph::Backend>> {
    Err(Error::Backend { backend: "cuda".into(), msg: "this build of kiln has no `cuda` feature".into() })
}

impl IntoBackend for Backend {
    fn into_backend(self) -> Result<Rc<dyn kiln_graph::Backend>> {
        match self {
            Backend::Auto => cuda_backend().or_else(|_| wgpu_backend()).or_else(|_| Ok(Rc::new(CpuReference))),
            Backend::Cpu => Ok(Rc::new(CpuReference)),
            Backend::Kernels => Ok(Rc::new(KernelInterpreter::default())),
            Backend::Wgpu => wgpu_backend(),
            Backend::Cuda => cuda_backend(),
        }
    }
}
