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
/// ONNX import: `kiln::onnx::load(path)` gives a compiled function over the model's inputs.
pub use kiln_onnx as onnx;

pub mod check;
#[cfg(not(target_arch = "wasm32"))]
pub mod data;
#[cfg(not(target_arch = "wasm32"))]
pub mod dist;
#[cfg(not(target_arch = "wasm32"))]
pub mod fit;
pub mod loss_scale;
pub mod nn;
pub mod optim;
pub mod train;
pub use check::{check, check_targets};
pub use kiln_graph::autodiff::value_and_grad;
pub use kiln_graph::tape::no_grad;
pub use kiln_graph::{
    compile, Args, CompileReport, CompileStats, Compiled, DType, Dynamic, Element, Error, Explanation, MemoryStats,
    Mode, Outputs, Result, Runtime, SourceLoc, Static, Tensor, TensorData,
};

use kiln_graph::{CpuReference, IntoBackend, KernelInterpreter};
use std::sync::{Arc, OnceLock};

/// Turns on kiln's logs as `KILN_LOGS` asks: a comma-separated list of `graph`, `fusion`, `guards`,
/// `recompiles`, `cache`, `output_code` (or `all`), and `launches` (each CUDA launch's host time and
/// each wgpu synchronise's submission and wait: a line each, so not part of `all`), printed to stderr.
/// Safe to call more than once; a program with its own `tracing` subscriber need not call it.
pub fn init_logs() {
    let Ok(wanted) = std::env::var("KILN_LOGS") else { return };
    let all = ["graph", "fusion", "guards", "recompiles", "cache", "output_code"];
    let names: Vec<&str> =
        if wanted.trim() == "all" { all.to_vec() } else { wanted.split(',').map(str::trim).collect() };
    let known = |n: &&&str| all.contains(n) || **n == "launches";
    let directives: Vec<String> = names.iter().filter(known).map(|n| format!("kiln::{n}=debug")).collect();
    let filter = tracing_subscriber::EnvFilter::new(directives.join(","));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
}

/// Makes compile reports ([`Compiled::report`], `KILN_REPORT=dir`) carry every kernel's WGSL and (on
/// native builds with the `cuda` feature) PTX, whichever backend ran it. Choosing a [`Backend`] does this;
/// call it yourself when the function's backend is a runtime you opened another way.
pub fn register_renderers() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        #[cfg(feature = "wgpu")]
        kiln_graph::report::register_renderer("wgsl", |k| {
            kiln_wgsl::render(k, true).map(|s| s.source).map_err(|e| e.to_string())
        });
        #[cfg(all(feature = "cuda", not(target_arch = "wasm32")))]
        kiln_graph::report::register_renderer("ptx", |k| {
            kiln_ptx::render(k, kiln_ptx::NEWEST_SM).map(|p| p.source).map_err(|e| e.to_string())
        });
    });
}

/// Runs eager ops (tensor ops outside `compile`) on `backend` from now on, on this thread: each op is
/// one kernel through the same pipeline and runtime compiled code uses, its result left on the device.
pub fn set_eager_backend(backend: Backend) -> Result<()> {
    kiln_graph::set_eager_backend(Some(backend.into_backend()?));
    Ok(())
}

/// Which backend compiled graphs run on, and where tensors live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Backend {
    /// The best one available: CUDA, else any wgpu adapter, else the CPU reference.
    #[default]
    Auto,
    /// The CPU reference interpreter (f64, exact, slow).
    Cpu,
    /// The full compiler pipeline (decompose, fuse, lower, plan) with its kernels run by the CPU kernel
    /// interpreter on a host-memory device: the kernels a GPU would get, executed without one.
    Kernels,
    /// WGSL kernels through wgpu (Vulkan, Metal, DX12; WebGPU in browsers), on the best adapter (or the
    /// one `KILN_WGPU_ADAPTER` names).
    Wgpu,
    /// WGSL kernels through wgpu on adapter `n` of [`wgpu_adapters`] (best first, so adapter 0 is the device
    /// `Wgpu` opens when `KILN_WGPU_ADAPTER` is unset; the two share it).
    WgpuAdapter(usize),
    /// PTX kernels through the CUDA driver (NVIDIA GPUs, compute capability 8.0 or newer).
    Cuda,
}

/// A backend by name, as command lines take it: `auto`, `cuda`, `wgpu`, `wgpu:N` (adapter `N` of
/// [`wgpu_adapters`]), `kernels` or `cpu`.
impl std::str::FromStr for Backend {
    type Err = Error;

    fn from_str(name: &str) -> Result<Backend> {
        Ok(match name {
            "auto" => Backend::Auto,
            "cuda" => Backend::Cuda,
            "wgpu" => Backend::Wgpu,
            "kernels" => Backend::Kernels,
            "cpu" => Backend::Cpu,
            other if other.strip_prefix("wgpu:").is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit())) => {
                match other[5..].parse() {
                    Ok(n) => Backend::WgpuAdapter(n),
                    Err(_) => {
                        return Err(Error::Unsupported {
                            what: format!("backend `{other}`: no such adapter number"),
                            loc: SourceLoc::internal(),
                        })
                    }
                }
            }
            other => {
                return Err(Error::Unsupported {
                    what: format!("backend `{other}` (auto, cuda, wgpu, wgpu:N, kernels, cpu)"),
                    loc: SourceLoc::internal(),
                })
            }
        })
    }
}

/// The name [`Backend::from_str`](std::str::FromStr) reads back (`wgpu:1` for an adapter).
impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Backend::Auto => f.write_str("auto"),
            Backend::Cpu => f.write_str("cpu"),
            Backend::Kernels => f.write_str("kernels"),
            Backend::Wgpu => f.write_str("wgpu"),
            Backend::WgpuAdapter(n) => write!(f, "wgpu:{n}"),
            Backend::Cuda => f.write_str("cuda"),
        }
    }
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

    /// The device runtime behind this backend (`None` for the CPU reference), shared by the process.
    pub fn runtime(self) -> Result<Option<std::sync::Arc<kiln_graph::Runtime>>> {
        Ok(self.into_backend()?.runtime())
    }
}

/// One runtime per device per process, opened on first use and shared by every thread: opening costs
/// milliseconds, and tensors, pools and loaded kernels belong to it.
type DeviceSlot = OnceLock<std::result::Result<Arc<kiln_graph::Runtime>, String>>;

#[allow(dead_code)] // unused when built without both GPU features
fn shared(
    slot: &DeviceSlot,
    name: &str,
    open: impl FnOnce() -> Result<Arc<kiln_graph::Runtime>>,
) -> Result<Arc<dyn kiln_graph::Backend>> {
    Ok(slot_result(slot.get_or_init(|| open().map_err(open_failure)), name)?)
}

/// A slot's device, or the error it failed to open with, naming the backend.
fn slot_result(
    done: &std::result::Result<Arc<kiln_graph::Runtime>, String>,
    name: &str,
) -> Result<Arc<kiln_graph::Runtime>> {
    done.clone().map_err(|msg| Error::Backend { backend: name.into(), msg })
}

/// Why a device did not open, as kept in its slot: a backend error's own message (the slot's error names
/// the backend again), anything else in full.
fn open_failure(e: Error) -> String {
    match e {
        Error::Backend { msg, .. } => msg,
        e => e.to_string(),
    }
}

static KERNELS: DeviceSlot = OnceLock::new();

#[cfg(feature = "wgpu")]
static WGPU: DeviceSlot = OnceLock::new();

#[cfg(all(feature = "wgpu", not(target_arch = "wasm32")))]
fn wgpu_backend() -> Result<Arc<dyn kiln_graph::Backend>> {
    let adapters = kiln_wgsl::adapters::here();
    match kiln_wgsl::adapters::default_index(adapters) {
        Ok(n) => wgpu_adapter_backend(n),
        // No adapter: the slot keeps why, as an open failure would.
        Err(e) => shared(&WGPU, "wgpu", || Err(e)),
    }
}

/// One runtime per adapter per process: `Wgpu` and `WgpuAdapter(n)` naming one adapter share it.
#[cfg(all(feature = "wgpu", not(target_arch = "wasm32")))]
fn wgpu_adapter_backend(n: usize) -> Result<Arc<dyn kiln_graph::Backend>> {
    static SLOTS: OnceLock<Vec<DeviceSlot>> = OnceLock::new();
    let slots = SLOTS.get_or_init(|| kiln_wgsl::adapters::here().iter().map(|_| OnceLock::new()).collect());
    match slots.get(n) {
        // A lost device (a driver reset, a GPU gone) is opened again at the next call.
        Some(slot) => shared(slot, "wgpu", || {
            Ok(Runtime::reopening(kiln_wgsl::Gpu::open(n)?, move || Ok(Box::new(kiln_wgsl::Gpu::open(n)?))))
        }),
        None => Err(Error::Backend {
            backend: "wgpu".into(),
            msg: kiln_wgsl::adapters::missing(n, kiln_wgsl::adapters::here()),
        }),
    }
}

/// The wgpu adapters found here, best first, in words: `Backend::WgpuAdapter(n)` runs on the `n`th.
/// Empty in a browser (its one adapter is `Backend::Wgpu`) and in builds without the `wgpu` feature.
pub fn wgpu_adapters() -> Vec<String> {
    #[cfg(all(feature = "wgpu", not(target_arch = "wasm32")))]
    return kiln_wgsl::adapters::names(kiln_wgsl::adapters::here());
    #[cfg(not(all(feature = "wgpu", not(target_arch = "wasm32"))))]
    Vec::new()
}

#[cfg(not(all(feature = "wgpu", not(target_arch = "wasm32"))))]
fn wgpu_adapter_backend(n: usize) -> Result<Arc<dyn kiln_graph::Backend>> {
    Err(Error::Backend { backend: "wgpu".into(), msg: format!("adapter {n}: this build lists no wgpu adapters") })
}

/// A page cannot block while the browser opens a WebGPU adapter: the device is the one [`open_wgpu`]
/// opened, and until then there is none.
#[cfg(all(feature = "wgpu", target_arch = "wasm32"))]
fn wgpu_backend() -> Result<Arc<dyn kiln_graph::Backend>> {
    match WGPU.get() {
        Some(done) => Ok(slot_result(done, "wgpu")?),
        None => Err(Error::Backend {
            backend: "wgpu".into(),
            msg: "a browser opens WebGPU asynchronously: await `kiln::open_wgpu()` before using Backend::Wgpu".into(),
        }),
    }
}

#[cfg(not(feature = "wgpu"))]
fn wgpu_backend() -> Result<Arc<dyn kiln_graph::Backend>> {
    Err(Error::Backend { backend: "wgpu".into(), msg: "this build of kiln has no `wgpu` feature".into() })
}

/// Opens the wgpu device without blocking and makes it the one `Backend::Wgpu` (and `Auto`) use: what a
/// browser page awaits first, since a page cannot block while WebGPU finds an adapter. Native programs
/// need not call it (the device opens on first use), but may. A failure (no WebGPU in this browser, no
/// adapter) is kept: `Backend::Wgpu` reports it from then on and `Auto` passes over it.
#[cfg(feature = "wgpu")]
pub async fn open_wgpu() -> Result<Arc<Runtime>> {
    // Native code opens it where `Backend::Wgpu` does (one runtime per adapter).
    #[cfg(not(target_arch = "wasm32"))]
    {
        let rt = Backend::Wgpu.into_backend()?.runtime();
        rt.ok_or_else(|| Error::Backend { backend: "wgpu".into(), msg: "the wgpu backend has no runtime".into() })
    }
    #[cfg(target_arch = "wasm32")]
    {
        if let Some(done) = WGPU.get() {
            return slot_result(done, "wgpu");
        }
        let opened = kiln_wgsl::Gpu::runtime_async().await.map_err(open_failure);
        // Another task may have opened it meanwhile: theirs stands.
        let done = WGPU.get_or_init(|| opened);
        register_renderers();
        slot_result(done, "wgpu")
    }
}

#[cfg(all(feature = "cuda", not(target_arch = "wasm32")))]
static CUDA: DeviceSlot = OnceLock::new();

#[cfg(all(feature = "cuda", not(target_arch = "wasm32")))]
fn cuda_backend() -> Result<Arc<dyn kiln_graph::Backend>> {
    shared(&CUDA, "cuda", kiln_ptx::Cuda::runtime)
}

#[cfg(not(all(feature = "cuda", not(target_arch = "wasm32"))))]
fn cuda_backend() -> Result<Arc<dyn kiln_graph::Backend>> {
    Err(Error::Backend { backend: "cuda".into(), msg: "this build of kiln has no `cuda` feature".into() })
}

impl IntoBackend for Backend {
    fn into_backend(self) -> Result<Arc<dyn kiln_graph::Backend>> {
        register_renderers();
        match self {
            Backend::Auto => cuda_backend().or_else(|_| wgpu_backend()).or_else(|_| Ok(Arc::new(CpuReference))),
            Backend::Cpu => Ok(Arc::new(CpuReference)),
            Backend::Kernels => shared(&KERNELS, "cpu-kernels", || Ok(KernelInterpreter::default().runtime())),
            Backend::Wgpu => wgpu_backend(),
            Backend::WgpuAdapter(n) => wgpu_adapter_backend(n),
            Backend::Cuda => cuda_backend(),
        }
    }
}
