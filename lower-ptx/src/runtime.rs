//! The CUDA driver over cudarc's driver API, loaded at run time: no CUDA is needed to build kiln, and a
//! machine without a driver gets a typed "unavailable" error. It is the thin device half of kiln's one
//! runtime core (`kiln_graph::runtime`): allocations on one stream, the renderer's PTX loaded through the
//! driver's JIT, launches with buffer pointers and symbol values as the parameters the renderer declares,
//! cuBLAS for the GEMMs `graph` gives to a library, and CUDA graphs for the reduce-overhead mode.

use crate::gemm::{Blas, GemmCall};
use crate::render::render;
use cudarc::driver::sys::{CUevent_flags, CUgraphInstantiate_flags, CUresult, CUstreamCaptureMode};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaGraph, CudaSlice, CudaStream, DevicePtr, DriverError, LaunchConfig, PushKernelArg,
};
use kiln_graph::device::{Driver, Launch, Module, Raw, Recording};
use kiln_graph::error::rejected_source;
use kiln_graph::kernel::Kernel;
use kiln_graph::runtime::{lock, Runtime};
use kiln_graph::{Error, Result, Target};
use std::sync::{Arc, Mutex};

pub(crate) fn err(msg: impl Into<String>) -> Error {
    Error::Backend { backend: "cuda".into(), msg: msg.into() }
}

/// A driver error with the driver's own words; out-of-memory is [`Error::OutOfMemory`], device loss is
/// named as such.
pub(crate) fn driver(what: &str, e: DriverError) -> Error {
    let words = e.error_string().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|_| format!("{:?}", e.0));
    let kind = match e.0 {
        CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
            return Error::OutOfMemory { device: "cuda".into(), what: what.into(), bytes: 0, limit: None }
        }
        CUresult::CUDA_ERROR_LAUNCH_FAILED
        | CUresult::CUDA_ERROR_ILLEGAL_ADDRESS
        | CUresult::CUDA_ERROR_ILLEGAL_INSTRUCTION
        | CUresult::CUDA_ERROR_HARDWARE_STACK_ERROR
        | CUresult::CUDA_ERROR_ECC_UNCORRECTABLE => {
            // Such an error is sticky: NVIDIA's driver serves this process no more CUDA work, so the runtime
            // does not try to open the device again (as it does a lost wgpu device).
            return Error::DeviceLost {
                device: "cuda".into(),
                what: what.into(),
                msg: format!("{words} ({:?}); CUDA cannot continue in this process: restart it", e.0),
            };
        }
        _ => "",
    };
    err(format!("{what}: {kind}{words} ({:?})", e.0))
}

/// How to get CUDA here, for the error when it is missing.
pub const NO_DRIVER_HINT: &str =
    "no CUDA driver found (libcuda.so.1 is installed with NVIDIA's driver); kiln needs no CUDA toolkit";

/// The newest compute capability kiln's PTX targets (newer GPUs JIT it forward).
pub const NEWEST_SM: u32 = 90;

/// How long a kernel's PTX takes to make, for ordering the work (`assemble::render_and_assemble`):
/// attention templates far longest (a quarter of a second of ptxas each), then by statements.
fn kernel_weight(k: &Kernel) -> usize {
    fn count(body: &[kiln_graph::kernel::Stmt]) -> usize {
        use kiln_graph::kernel::Stmt;
        body.iter()
            .map(|st| match st {
                Stmt::Attention(_) => 1 << 20,
                Stmt::MatMul(_) => 1 << 16,
                Stmt::Loop { body, .. } | Stmt::Reduce { body, .. } => 1 + count(body),
                _ => 1,
            })
            .sum()
    }
    count(&k.body)
}

/// A CUDA device as a kiln [`Driver`]: one context, one stream (CUDA graph capture needs one that is not
/// the legacy default stream). The runtime core holds the device alone while it records, so no other
/// thread's work, allocation or free lands in a capture.
pub struct Cuda {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    sm: u32,
    name: String,
    driver_version: i32,
    target: Target,
    /// cuBLAS, opened at the first library GEMM; a handle serves one call at a time, hence the lock.
    blas: Mutex<Option<Blas>>,
    /// Waits for each kernel after launching it (`KILN_CUDA_SYNC_LAUNCHES=1`, or [`Cuda::synchronous`]), so
    /// a fault the GPU reports later (an illegal address) names the kernel that caused it, as
    /// `CUDA_LAUNCH_BLOCKING` does for PyTorch. Off by default: it serialises the host with the GPU.
    sync_launches: bool,
    /// A CUDA graph is being captured: a stream cannot be waited for then (the capture would fail), so
    /// `sync_launches` waits only outside captures (a replay is waited for as a whole by its caller).
    capturing: std::sync::atomic::AtomicBool,
    /// ptxas and its version, when one is found and the device runs the PTX's own architecture (a cubin
    /// runs on its architecture only): a batch of kernels is then assembled by ptxas processes side by
    /// side (`assemble`). `KILN_CUDA_PTXAS=0` leaves every kernel to the driver's JIT.
    ptxas: Option<(std::path::PathBuf, String)>,
    /// The stream compiled steps' collectives run on beside the kernels (made at the first).
    side: std::sync::OnceLock<Arc<CudaStream>>,
    /// The stream the watchdog's counts of finished collectives queue on (made at the first): each
    /// waits for its collective's end there, so no host function sits in the collectives' own stream,
    /// where the next bucket would wait for the driver's callback thread to run it.
    counts: std::sync::OnceLock<Arc<CudaStream>>,
    /// The communicator compiled steps' all-reduces run over (`Collective::join` sets it); none: this
    /// process is a world of one.
    collective: Mutex<Option<std::sync::Weak<crate::collective::Collective>>>,
    /// The end of each collective running on `side` that the kernels have not waited for yet.
    in_flight: Mutex<Vec<cudarc::driver::CudaEvent>>,
    /// The collectives the CUDA graph being captured holds, by name.
    captured: Mutex<Vec<String>>,
    /// `KILN_CUDA_TIMELINE=1`: each launched run's collectives timed on the device (when each was
    /// queued behind the kernels and when it ended), printed at the run's end: a diagnosis of how
    /// far they overlap the kernels beside them. Each run then waits for the device.
    timeline: Option<Mutex<Vec<Timed>>>,
    /// Pinned chunks uploads pass through, so an upload is queued on the stream without waiting for
    /// the device (`staging`); `None` with `KILN_CUDA_STAGED_UPLOADS=0`: a pageable copy the host waits
    /// for, as before.
    staging: Option<Mutex<crate::staging::Staging>>,
    /// Uploads into freed buffers beside the kernels, on a copy stream (`copies`); `None` with
    /// `KILN_CUDA_COPY_STREAM=0` or without staging: every upload in the kernels' order.
    copies: Option<crate::copies::Copies>,
}

/// One collective's timing events ([`Cuda::timeline`]): queued on the kernels' stream, ended on the
/// collectives'.
struct Timed {
    queued: cudarc::driver::CudaEvent,
    ended: cudarc::driver::CudaEvent,
}

/// A loaded kernel: its function, or nothing for a library GEMM (its calls are planned per binding) or
/// a bucket of all-reduces (a collective call).
enum Loaded {
    Function(CudaFunction),
    Gemm,
    Collective,
}

// SAFETY: a CUDA function handle may be used from any thread of its context.
unsafe impl Send for Loaded {}
// SAFETY: as above.
unsafe impl Sync for Loaded {}

/// A captured CUDA graph, with the collectives it holds (handed to the watchdog at each replay).
struct Captured(CudaGraph, Vec<String>);
// SAFETY: an instantiated graph is launched only on the driver's stream, one thread at a time (the
// runtime core's recordings are behind its lock).
unsafe impl Send for Captured {}
// SAFETY: as above.
unsafe impl Sync for Captured {}

fn slice(raw: &Raw) -> &CudaSlice<u8> {
    // Every allocation of this driver is made by `alloc` below.
    raw.downcast_ref::<CudaSlice<u8>>().expect("an allocation of the CUDA driver")
}

impl Cuda {
    /// Opens the device [`crate::ordinal::device_ordinal`] picks (`KILN_CUDA_DEVICE`, else a
    /// data-parallel process's `LOCAL_RANK`, else 0); a typed error when no driver or device is there.
    pub fn new() -> Result<Cuda> {
        // SAFETY: only probes whether the driver library can be opened.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(err(NO_DRIVER_HINT));
        }
        let ordinal = crate::ordinal::device_ordinal(|k| std::env::var(k).ok()).map_err(err)?;
        let ctx = CudaContext::new(ordinal).map_err(|e| driver("opening the CUDA device", e))?;
        crate::preload::start();
        // One stream per device, in order: the per-buffer events cudarc records for multi-stream safety
        // would only add work to every launch.
        // SAFETY: a buffer is used on another stream only by a compiled step's collective, ordered
        // against this stream by explicit events (`launch_collective`, `wait_collectives`), and the plan
        // keeps its buffers allocated until the kernels have waited for it (`Plan::waits`).
        unsafe { ctx.disable_event_tracking() };
        let (major, minor) = ctx.compute_capability().map_err(|e| driver("reading the compute capability", e))?;
        let sm = (major * 10 + minor) as u32;
        if sm < 80 {
            return Err(err(format!("compute capability {major}.{minor}: kiln's PTX needs sm_80 or newer")));
        }
        let name = ctx.name().map_err(|e| driver("reading the device name", e))?;
        let mut driver_version = 0;
        // SAFETY: writes one int; the library was found above.
        unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut driver_version) };
        let stream = ctx.new_stream().map_err(|e| driver("creating a stream", e))?;
        let rendered_sm = if sm >= NEWEST_SM { NEWEST_SM } else { 80 };
        let ptxas = (rendered_sm == sm && std::env::var("KILN_CUDA_PTXAS").as_deref() != Ok("0"))
            .then(crate::ptxas::find)
            .flatten()
            .and_then(|p| crate::ptxas::version(&p).map(|v| (p, v)));
        let mut target = Target::cuda(sm.min(NEWEST_SM)).tuned_by_env("CUDA");
        let staged = std::env::var("KILN_CUDA_STAGED_UPLOADS").as_deref() != Ok("0");
        target.name = format!("cuda-sm_{sm}");
        tracing::info!(target: "kiln::graph", device = %name, sm, "cuda device");
        Ok(Cuda {
            ctx,
            stream,
            // The PTX's `.target`: sm_90 for Hopper and newer, sm_80 PTX JIT-compiled forward otherwise.
            sm: rendered_sm,
            name,
            driver_version,
            target,
            blas: Mutex::new(None),
            sync_launches: std::env::var("KILN_CUDA_SYNC_LAUNCHES").is_ok_and(|v| v == "1"),
            capturing: Default::default(),
            ptxas,
            side: Default::default(),
            counts: Default::default(),
            collective: Mutex::new(None),
            in_flight: Mutex::default(),
            captured: Mutex::default(),
            timeline: std::env::var("KILN_CUDA_TIMELINE").is_ok_and(|v| v == "1").then(Mutex::default),
            staging: staged.then(|| Mutex::new(crate::staging::Staging::new(crate::staging::MAX_CHUNKS))),
            copies: (staged && std::env::var("KILN_CUDA_COPY_STREAM").as_deref() != Ok("0"))
                .then(crate::copies::Copies::new),
        })
    }

    /// Whether the device has finished everything queued on its stream so far (asks without waiting).
    pub fn idle(&self) -> Result<bool> {
        let e = self.event()?;
        e.record(&self.stream).map_err(|e| driver("recording an event", e))?;
        e.try_is_complete().map_err(|e| driver("querying the device", e))
    }

    /// Uploads made beside the kernels on the copy stream so far (`copies`).
    pub fn uploads_beside_kernels(&self) -> u64 {
        self.copies.as_ref().map_or(0, |c| c.uploads())
    }

    /// Pinned staging chunks held now (at most [`crate::staging::MAX_CHUNKS`]; none when uploads are
    /// not staged).
    pub fn staged_chunks(&self) -> usize {
        self.staging.as_ref().map_or(0, |s| lock(s).chunks())
    }

    /// Starts (`true`) or stops the CUDA profiler's collection, so a profiler started with collection
    /// off (`ncu --profile-from-start off`) times only the work queued between the two: one step of a
    /// loop, not its warm-up.
    pub fn profiling(&self, on: bool) -> Result<()> {
        self.ctx.bind_to_thread().map_err(|e| driver("binding the CUDA context", e))?;
        // SAFETY: the context is bound to this thread; the calls take no arguments.
        let r = unsafe {
            if on {
                cudarc::driver::sys::cuProfilerStart()
            } else {
                cudarc::driver::sys::cuProfilerStop()
            }
        };
        r.result().map_err(|e| driver("starting or stopping the profiler", e))
    }

    /// This device with every launch waited for (see `KILN_CUDA_SYNC_LAUNCHES`).
    pub fn synchronous(mut self) -> Cuda {
        self.sync_launches = true;
        self
    }

    /// A runtime over the device (the facade keeps one per process).
    pub fn runtime() -> Result<Arc<Runtime>> {
        Ok(Runtime::new(Cuda::new()?))
    }

    /// Runs one GEMM call on cuBLAS (opened on this device's stream at the first call).
    fn gemm(&self, call: &GemmCall) -> Result<()> {
        self.open_blas()?;
        lock(&self.blas).as_ref().map_or(Ok(()), |b| b.run(call))
    }

    /// Makes this device's context current on the calling thread (raw driver calls need it; cudarc's own
    /// calls do it themselves).
    fn bind(&self) -> Result<()> {
        self.ctx.bind_to_thread().map_err(|e| driver("binding the CUDA context", e))
    }

    /// Opens cuBLAS now if it is not open yet.
    fn open_blas(&self) -> Result<()> {
        let mut b = lock(&self.blas);
        if b.is_none() {
            *b = Some(Blas::new(&self.stream)?);
        }
        Ok(())
    }

    /// `kernel`'s PTX, or `None` for a library GEMM or a collective (nothing to load).
    fn ptx(&self, kernel: &Kernel) -> Option<Result<String>> {
        (kernel.gemm().is_none() && kernel.all_reduce().is_none())
            .then(|| render(kernel, self.sm).map(|p| p.source).map_err(|e| err(e.to_string())))
    }

    /// What loads for a kernel that renders no PTX.
    fn call_module(kernel: &Kernel) -> Module {
        match kernel.all_reduce() {
            Some(_) => Arc::new(Loaded::Collective),
            None => Arc::new(Loaded::Gemm),
        }
    }

    /// Makes compiled steps' all-reduces on this device run over `c` (its last communicator wins).
    pub(crate) fn set_collective(&self, c: std::sync::Weak<crate::collective::Collective>) {
        *lock(&self.collective) = Some(c);
    }

    /// The stream collectives run on beside the kernels.
    pub(crate) fn side_stream(&self) -> Result<&Arc<CudaStream>> {
        if let Some(s) = self.side.get() {
            return Ok(s);
        }
        self.bind()?;
        // The highest priority: the GPU schedules a collective's blocks ahead of the waiting blocks of
        // the kernels beside it, which would otherwise fill every SM first and hold the collective back
        // until the backward pass had no more work to give (no overlap at all).
        let (_, greatest) = cudarc::driver::result::stream::get_priority_range()
            .map_err(|e| driver("reading the stream priorities", e))?;
        let s =
            self.ctx.new_stream_with_priority(greatest).map_err(|e| driver("creating the collectives' stream", e))?;
        Ok(self.side.get_or_init(|| s))
    }

    /// Queues [`Cuda::count_done`] to run once everything queued on `stream` (the kernels' or the
    /// collectives') so far has, on a stream of its own: `stream` never waits for the host function
    /// (nor, on the collectives' stream, does the next bucket).
    pub(crate) fn count_after(
        &self,
        stream: &CudaStream,
        counter: &'static std::sync::atomic::AtomicU64,
    ) -> Result<()> {
        let counts = match self.counts.get() {
            Some(s) => s,
            None => {
                self.bind()?;
                let s = self.ctx.new_stream().map_err(|e| driver("creating the watchdog's stream", e))?;
                self.counts.get_or_init(|| s)
            }
        };
        let done = stream.record_event(None).map_err(|e| driver("recording an event", e))?;
        counts.wait(&done).map_err(|e| driver("ordering the watchdog's stream", e))?;
        self.count_done(counts, counter)
    }

    /// Queues `call` on the side stream after everything queued on the kernels' stream so far, and
    /// keeps the end of it for [`Driver::wait_collectives`].
    pub(crate) fn beside(&self, call: impl FnOnce(&CudaStream) -> Result<()>) -> Result<()> {
        let side = self.side_stream()?;
        let start = self.stream.record_event(None).map_err(|e| driver("recording an event", e))?;
        side.wait(&start).map_err(|e| driver("ordering the collectives' stream", e))?;
        call(side)?;
        let end = side.record_event(None).map_err(|e| driver("recording an event", e))?;
        lock(&self.in_flight).push(end);
        if let (Some(t), false) = (&self.timeline, self.capturing()) {
            let timed = |s: &CudaStream| s.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT));
            let queued = timed(&self.stream).map_err(|e| driver("recording an event", e))?;
            let ended = timed(side).map_err(|e| driver("recording an event", e))?;
            lock(t).push(Timed { queued, ended });
        }
        Ok(())
    }

    /// Prints the timeline of the run just queued (`KILN_CUDA_TIMELINE=1`), its kernels and
    /// collectives joined: milliseconds from the first collective's queueing.
    fn print_timeline(&self) -> Result<()> {
        let Some(t) = &self.timeline else { return Ok(()) };
        let timed = std::mem::take(&mut *lock(t));
        let Some(first) = timed.first() else { return Ok(()) };
        let end = self.stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT));
        let end = end.map_err(|e| driver("recording an event", e))?;
        let ms = |e: &cudarc::driver::CudaEvent| first.queued.elapsed_ms(e).map_err(|e| driver("timing an event", e));
        let mut line = String::from("kiln timeline (ms from the first collective's queueing):");
        for (i, c) in timed.iter().enumerate() {
            line += &format!(" #{i} queued {:.3} ended {:.3};", ms(&c.queued)?, ms(&c.ended)?);
        }
        line += &format!(" run ended {:.3}", ms(&end)?);
        eprintln!("{line}");
        Ok(())
    }

    /// Runs a bucket of all-reduces: over the communicator when this process joined one, else (a world
    /// of one) each input copied to its output.
    fn launch_collective(&self, kernel: &Kernel, l: &Launch, pointers: &[u64]) -> Result<()> {
        let a = kernel.all_reduce().ok_or_else(|| err("a collective module for a generated kernel"))?;
        let mut parts = Vec::with_capacity(a.parts.len());
        for p in &a.parts {
            let len = p.len.eval(l.bindings).map_err(|e| err(format!("kernel {}: {e}", kernel.name)))?.max(0) as usize;
            parts.push((p.dtype, len, pointers[p.input], pointers[p.output]));
        }
        let collective = lock(&self.collective).as_ref().and_then(std::sync::Weak::upgrade);
        match collective {
            Some(c) => c.bucket(self, &kernel.name, a.op, &parts),
            None => {
                for &(dtype, len, src, dst) in &parts {
                    let bytes = self.target.storage_bytes(dtype, len);
                    if bytes == 0 {
                        continue;
                    }
                    self.bind()?;
                    // SAFETY: both pointers are plan buffers of at least `bytes` (sized by the plan for
                    // this length), ordered on this stream.
                    unsafe {
                        cudarc::driver::result::memcpy_dtod_async(dst, src, bytes as usize, self.stream.cu_stream())
                    }
                    .map_err(|e| driver(&format!("kernel {}: copying a world of one's all-reduce", kernel.name), e))?;
                }
                Ok(())
            }
        }
    }

    /// Loads `kernel` from its PTX: the `cubin` ptxas made of it when there is one and the driver takes
    /// it (a cubin from a ptxas newer than the driver is refused), else through the driver's JIT, whose
    /// rejection names the kernel and shows its source.
    fn load_rendered(&self, kernel: &Kernel, ptx: &str, cubin: Option<Vec<u8>>) -> Result<Module> {
        tracing::debug!(target: "kiln::output_code", kernel = %kernel.name, "\n{ptx}");
        let function = |image| self.ctx.load_module(image).and_then(|m| m.load_function(&kernel.name));
        match cubin.map(|c| function(cudarc::nvrtc::Ptx::from_binary(c))) {
            Some(Ok(f)) => return Ok(Arc::new(Loaded::Function(f))),
            Some(Err(e)) => {
                tracing::debug!(target: "kiln::graph", kernel = %kernel.name, "the driver refused ptxas's cubin ({e}); its JIT compiles the PTX")
            }
            None => {}
        }
        let f = function(cudarc::nvrtc::Ptx::from_src(ptx.to_string()))
            .map_err(|e| err(rejected_source(&kernel.name, "the driver", &e, ptx)))?;
        Ok(Arc::new(Loaded::Function(f)))
    }

    fn event(&self) -> Result<cudarc::driver::CudaEvent> {
        self.ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map_err(|e| driver("creating an event", e))
    }

    fn ptr(&self, raw: &Raw) -> u64 {
        slice(raw).device_ptr(&self.stream).0
    }

    /// The one stream every kiln launch on this device is ordered on, with the device's context made
    /// current on the calling thread: a collective library (NCCL) issued on it runs after the kernels
    /// that made its inputs and before those that read its outputs, with no host wait. The stream first
    /// waits for every upload still pending on the copy stream (the library's buffers are not known
    /// here); the caller counts what it queued there afterwards (`Cuda::queued`, for `copies`' marks).
    pub fn collective_stream(&self) -> Result<*mut std::ffi::c_void> {
        self.bind()?;
        self.settle_all()?;
        Ok(self.stream.cu_stream() as *mut std::ffi::c_void)
    }

    /// The device address of one of this driver's allocations.
    pub fn address(&self, raw: &Raw) -> u64 {
        self.ptr(raw)
    }

    /// Queues on `stream` (the kernels' or the collectives') a host function that adds one to
    /// `counter` once the work queued before it has run: a watchdog reads the count without a CUDA call,
    /// so it cannot be held up behind a thread the driver has blocked. Captured into a CUDA graph, the
    /// function runs at each replay, so the count goes on counting.
    pub fn count_done(&self, stream: &CudaStream, counter: &'static std::sync::atomic::AtomicU64) -> Result<()> {
        unsafe extern "C" fn bump(counter: *mut std::ffi::c_void) {
            // SAFETY: `counter` is the `&'static AtomicU64` passed below.
            let counter = unsafe { &*(counter as *const std::sync::atomic::AtomicU64) };
            counter.fetch_add(1, std::sync::atomic::Ordering::Release);
        }
        self.bind()?;
        let raw = counter as *const std::sync::atomic::AtomicU64 as *mut std::ffi::c_void;
        // SAFETY: the stream is this context's; `bump` makes no CUDA call and reads a value that lives
        // as long as the process.
        let r = unsafe { cudarc::driver::sys::cuLaunchHostFunc(stream.cu_stream(), Some(bump), raw) };
        if r != CUresult::CUDA_SUCCESS {
            return Err(driver("queuing a host function", DriverError(r)));
        }
        Ok(())
    }

    /// The stream every kiln launch on this device is ordered on.
    pub(crate) fn main_stream(&self) -> &CudaStream {
        &self.stream
    }

    /// Notes a collective queued into the CUDA graph being captured.
    pub(crate) fn captured_collective(&self, what: &str) {
        lock(&self.captured).push(what.to_string());
    }

    /// Makes the stream wait for the copies still pending into any of `buffers` (device addresses of
    /// allocations) before the operation queued next (`copies`: the first use of an uploaded buffer).
    fn settle(&self, buffers: impl IntoIterator<Item = u64>) -> Result<()> {
        let Some(c) = &self.copies else { return Ok(()) };
        if c.settle(&self.stream, buffers).map_err(|e| driver("waiting for an upload", e))? {
            self.queued();
        }
        Ok(())
    }

    /// [`Cuda::settle`] for every pending copy: before a capture or a wait for the whole device.
    fn settle_all(&self) -> Result<()> {
        let Some(c) = &self.copies else { return Ok(()) };
        if c.settle_all(&self.stream).map_err(|e| driver("waiting for an upload", e))? {
            self.queued();
        }
        Ok(())
    }

    /// Counts one operation queued on the stream, for the copy stream's marks (`copies`); whoever
    /// queues on [`Cuda::collective_stream`] calls it after.
    pub(crate) fn queued(&self) {
        if let Some(c) = &self.copies {
            c.queued();
        }
    }

    /// Whether a CUDA graph is being captured (a collective queued now runs at each replay instead).
    pub(crate) fn capturing(&self) -> bool {
        self.capturing.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// [`Driver::launch`] itself.
    fn launch_now(&self, kernel: &Kernel, l: &Launch) -> Result<()> {
        let loaded = l.module.downcast_ref::<Loaded>().ok_or_else(|| err("a module of another driver"))?;
        self.settle(l.buffers.iter().map(|b| self.ptr(b.raw)))?;
        if l.wait {
            self.wait_collectives()?;
        }
        let pointers: Vec<u64> = l.buffers.iter().map(|b| self.ptr(b.raw) + b.offset).collect();
        let f = match loaded {
            Loaded::Function(f) => f,
            Loaded::Collective => return self.launch_collective(kernel, l, &pointers),
            Loaded::Gemm => {
                let gemm = kernel.gemm().ok_or_else(|| err("a GEMM module for a generated kernel"))?;
                // Planning allocates and uploads pointer arrays: once per binding, never inside a capture.
                let call = l.binding(|| GemmCall::plan(gemm, l.bindings, &pointers, &self.stream))?;
                return self.gemm(&call);
            }
        };
        let mut params: Vec<u64> = pointers;
        // The renderer declares symbols `.s64`: the bits of the i64 travel in a u64 slot.
        params.extend(l.symbols.iter().map(|&v| v as u64));
        if let Some(fault) = l.fault {
            params.push(self.ptr(fault.raw) + fault.offset);
        }
        let grid = self
            .target
            .fold_grid(l.groups)
            .ok_or_else(|| err(format!("kernel {}: {} blocks exceed a 3-D grid", kernel.name, l.groups)))?;
        let config =
            LaunchConfig { grid_dim: grid, block_dim: (kernel.launch.device_threads(), 1, 1), shared_mem_bytes: 0 };
        let mut b = self.stream.launch_builder(f);
        for v in &params {
            b.arg(v);
        }
        // SAFETY: the parameters are exactly those the renderer declared for this kernel (one pointer per
        // bound buffer, sized by the plan for the launch's symbol values, then each symbol, then the fault
        // word), and every index a kernel computes is guarded by the bounds the kernel IR carries.
        unsafe { b.launch(config) }.map_err(|e| driver(&format!("launching kernel {}", kernel.name), e))?;
        if self.sync_launches && !self.capturing.load(std::sync::atomic::Ordering::Relaxed) {
            self.stream.synchronize().map_err(|e| driver(&format!("running kernel {}", kernel.name), e))?;
        }
        Ok(())
    }
}

impl Driver for Cuda {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn target(&self) -> &Target {
        &self.target
    }

    fn describe(&self) -> String {
        let v = self.driver_version;
        format!("{} (CUDA, sm_{}, driver API {}.{})", self.name, self.sm, v / 1000, (v % 1000) / 10)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn alloc(&self, bytes: u64) -> Result<Raw> {
        // SAFETY: buffers are written by a kernel, an upload or a zeroing before any kernel reads them.
        match unsafe { self.stream.alloc::<u8>(bytes as usize) } {
            Ok(b) => Ok(Box::new(b)),
            Err(e) if e.0 == CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                Err(Error::OutOfMemory { device: "cuda".into(), what: "a buffer".into(), bytes, limit: None })
            }
            Err(e) => Err(driver(&format!("allocating {bytes} bytes"), e)),
        }
    }

    fn write(&self, dst: &Raw, bytes: &[u8]) -> Result<()> {
        self.bind()?;
        let dst = self.ptr(dst);
        self.settle([dst])?;
        if let Some(staging) = &self.staging {
            let queued = lock(staging).upload(&self.ctx, &self.stream, dst, bytes);
            self.queued();
            return queued.map_err(|e| driver("uploading", e));
        }
        // SAFETY: the destination holds at least `bytes.len()` bytes (the runtime sized it); the copy is
        // ordered on the stream and the host slice outlives the call, which waits for pageable memory.
        unsafe { cudarc::driver::result::memcpy_htod_async(dst, bytes, self.stream.cu_stream()) }
            .map_err(|e| driver("uploading", e))?;
        self.stream.synchronize().map_err(|e| driver("uploading", e))
    }

    fn read(&self, src: &Raw, bytes: u64) -> Result<Vec<u8>> {
        self.settle([self.ptr(src)])?;
        let view = slice(src).slice(0..bytes as usize);
        let out = self.stream.clone_dtoh(&view).map_err(|e| driver("reading back", e))?;
        self.stream.synchronize().map_err(|e| driver("reading back", e))?;
        Ok(out)
    }

    fn zero(&self, dst: &Raw, offset: u64, bytes: u64) -> Result<()> {
        self.bind()?;
        self.settle([self.ptr(dst)])?;
        // SAFETY: the range lies inside the allocation (the runtime sized it).
        unsafe {
            cudarc::driver::result::memset_d8_async(self.ptr(dst) + offset, 0, bytes as usize, self.stream.cu_stream())
        }
        .map_err(|e| driver("clearing memory", e))?;
        self.queued();
        Ok(())
    }

    fn copy(&self, src: &Raw, dst: &Raw, bytes: u64) -> Result<()> {
        self.bind()?;
        self.settle([self.ptr(src), self.ptr(dst)])?;
        // SAFETY: both allocations hold at least `bytes` (the runtime sized them); ordered on the stream.
        unsafe {
            cudarc::driver::result::memcpy_dtod_async(
                self.ptr(dst),
                self.ptr(src),
                bytes as usize,
                self.stream.cu_stream(),
            )
        }
        .map_err(|e| driver("copying on the device", e))?;
        self.queued();
        Ok(())
    }

    fn load(&self, kernel: &Kernel) -> Result<Module> {
        match self.ptx(kernel) {
            None => Ok(Self::call_module(kernel)),
            Some(ptx) => self.load_rendered(kernel, &ptx?, None),
        }
    }

    fn load_many(&self, kernels: &[&Kernel]) -> Vec<Result<Module>> {
        let Some((ptxas, version)) = &self.ptxas else { return kernels.iter().map(|k| self.load(k)).collect() };
        let started = std::time::Instant::now();
        // cuBLAS opens while the kernels render and assemble, not at the first GEMM, and cuBLASLt's
        // heuristic is asked once per kind of call the graph gives it (its first query for one costs
        // ~100 ms): element type and TF32, for the GEMMs with an epilogue, which cuBLASLt runs.
        let open_blas = || {
            let gemms = || kernels.iter().filter_map(|k| k.gemm());
            let lt: std::collections::HashSet<(kiln_graph::DType, bool)> =
                gemms().filter(|g| !g.epilogue.is_empty()).map(|g| (g.dtype, g.tf32)).collect();
            gemms().next().is_some().then(|| {
                let opened = self.open_blas().is_ok();
                if let Some(blas) = lock(&self.blas).as_ref() {
                    lt.into_iter().for_each(|(element, tf32)| blas.warm(element, tf32));
                }
                (opened, started.elapsed())
            })
        };
        fn name<'a>(k: &'a &Kernel) -> &'a str {
            &k.name
        }
        let (made, blas) = crate::assemble::render_and_assemble(
            kernels,
            |k| kernel_weight(k),
            |k| self.ptx(k),
            name,
            (ptxas, version, self.sm),
            open_blas,
        );
        let assembling = started.elapsed();
        let modules = (kernels.iter().zip(made))
            .map(|(k, (r, cubin))| match r {
                None => Ok(Self::call_module(k)),
                Some(Err(e)) => Err(e),
                Some(Ok(ptx)) => self.load_rendered(k, &ptx, cubin),
            })
            .collect();
        // A failure to open is reported by the first GEMM, which opens cuBLAS again.
        tracing::debug!(
            target: "kiln::graph",
            kernels = kernels.len(),
            render_ptxas_and_cublas_ms = assembling.as_secs_f64() * 1e3,
            load_ms = (started.elapsed() - assembling).as_secs_f64() * 1e3,
            cublas_opened = ?blas.map(|b| b.0),
            cublas_open_ms = blas.map_or(0.0, |b| b.1.as_secs_f64() * 1e3),
            "modules loaded"
        );
        modules
    }

    fn launch(&self, kernel: &Kernel, l: &Launch) -> Result<()> {
        if !tracing::enabled!(target: "kiln::launches", tracing::Level::DEBUG) {
            let launched = self.launch_now(kernel, l);
            self.queued();
            return launched;
        }
        // `KILN_LOGS=launches`: where a first run's host time goes (plans, pointer arrays, lazy loads).
        let clock = std::time::Instant::now();
        let launched = self.launch_now(kernel, l);
        self.queued();
        let host_us = clock.elapsed().as_secs_f64() * 1e6;
        tracing::debug!(target: "kiln::launches", kernel = %kernel.name, host_us, "launched");
        launched
    }

    fn freed(&self, buffer: &Raw, bytes: u64, mark: bool) -> Option<u64> {
        let copies = self.copies.as_ref()?;
        // A copy still pending into it comes before whatever reuses or frees it. A failed wait leaves the
        // copy pending (the buffer's next use waits for it again) and the buffer unmarked.
        if let Err(e) = self.settle([self.ptr(buffer)]) {
            tracing::warn!(target: "kiln::graph", error = %e, "a freed buffer's pending upload could not be waited for");
            return None;
        }
        if !mark {
            return None;
        }
        copies.mark(&self.ctx, &self.stream, bytes)
    }

    fn uploads_beside(&self, bytes: u64) -> bool {
        self.copies.is_some() && bytes >= crate::copies::MIN_BYTES
    }

    fn write_after(&self, dst: &Raw, bytes: &[u8], free_at: Option<u64>) -> Result<()> {
        match (&self.copies, free_at) {
            (Some(copies), Some(at)) if bytes.len() as u64 >= crate::copies::MIN_BYTES => {
                self.bind()?;
                copies
                    .upload(&self.ctx, self.ptr(dst), bytes, at)
                    .map_err(|e| driver("uploading beside the kernels", e))
            }
            _ => self.write(dst, bytes),
        }
    }

    fn wait_collectives(&self) -> Result<()> {
        for end in std::mem::take(&mut *lock(&self.in_flight)) {
            self.stream.wait(&end).map_err(|e| driver("waiting for a collective", e))?;
            self.queued();
        }
        self.print_timeline()
    }

    fn scratch_bytes(&self) -> u64 {
        if lock(&self.blas).is_some() {
            crate::gemm::WORKSPACE_BYTES as u64
        } else {
            0
        }
    }

    fn synchronize(&self) -> Result<()> {
        self.settle_all()?;
        self.stream.synchronize().map_err(|e| driver("waiting for the device", e))
    }

    fn record(&self, enqueue: &mut dyn FnMut() -> Result<()>) -> Result<Option<Recording>> {
        // Before the capture begins: the stream waits for every pending upload (a wait inside the capture
        // would join an outside event to it), and a buffer freed by another thread meanwhile records no
        // mark on the stream (the event would join the capture).
        self.settle_all()?;
        if let Some(c) = &self.copies {
            c.set_capturing(true);
        }
        let begun = self.stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
        if begun.is_err() {
            if let Some(c) = &self.copies {
                c.set_capturing(false);
            }
        }
        begun.map_err(|e| driver("beginning graph capture", e))?;
        // The runtime core holds the device alone while it records, so the flag is this capture's.
        lock(&self.captured).clear();
        self.capturing.store(true, std::sync::atomic::Ordering::Relaxed);
        let enqueued = enqueue();
        self.capturing.store(false, std::sync::atomic::Ordering::Relaxed);
        let graph = self.stream.end_capture(CUgraphInstantiate_flags(0));
        if let Some(c) = &self.copies {
            c.set_capturing(false);
        }
        enqueued?;
        let graph = graph.map_err(|e| driver("ending graph capture", e))?;
        let graph = graph.ok_or_else(|| err("graph capture recorded nothing"))?;
        tracing::debug!(target: "kiln::graph", "recorded a CUDA graph");
        let collectives = std::mem::take(&mut *lock(&self.captured));
        Ok(Some(Box::new(Captured(graph, collectives))))
    }

    fn replay(&self, recording: &Recording) -> Result<()> {
        let g = recording.downcast_ref::<Captured>().ok_or_else(|| err("a recording of another driver"))?;
        // A replay's buffers are its own (inputs are copied in, settled there); any pending copy is
        // waited for all the same, so nothing an uploaded buffer holds is read before it lands.
        self.settle_all()?;
        g.0.launch().map_err(|e| driver("replaying the CUDA graph", e))?;
        self.queued();
        if !g.1.is_empty() {
            if let Some(c) = lock(&self.collective).as_ref().and_then(std::sync::Weak::upgrade) {
                c.replayed(&g.1);
            }
        }
        Ok(())
    }

    fn time(&self, enqueue: &mut dyn FnMut() -> Result<()>) -> Result<Option<f64>> {
        let (start, end) = (self.event()?, self.event()?);
        start.record(&self.stream).map_err(|e| driver("recording an event", e))?;
        enqueue()?;
        end.record(&self.stream).map_err(|e| driver("recording an event", e))?;
        end.synchronize().map_err(|e| driver("waiting for the device", e))?;
        let ms = start.elapsed_ms(&end).map_err(|e| driver("reading an event", e))?;
        Ok(Some(f64::from(ms) / 1e3))
    }

    fn timing(&self) -> &'static str {
        "CUDA events"
    }
}
