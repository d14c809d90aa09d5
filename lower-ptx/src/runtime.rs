//! The CUDA runtime over cudarc's driver API, loaded at run time: no CUDA is needed to build kiln, and a
//! machine without a driver gets a typed "unavailable" error. It loads the renderer's PTX through the
//! driver's JIT (one module per distinct kernel text), allocates plan buffers from a pool, launches with
//! buffer pointers and symbol values as the parameters the renderer declares, and captures a prepared
//! graph as a CUDA graph for the reduce-overhead mode.

use crate::gemm::{Blas, GemmCall};
use crate::render::render;
use cudarc::driver::sys::{CUevent_flags, CUgraphInstantiate_flags, CUresult, CUstreamCaptureMode};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaGraph, CudaSlice, CudaStream, DevicePtr, DriverError, LaunchConfig, PushKernelArg,
};
use kiln_graph::kernel::Kernel;
use kiln_graph::{CompiledGraph, DType, Error, Result, Target, TensorData};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

pub(crate) fn err(msg: impl Into<String>) -> Error {
    Error::Backend { backend: "cuda".into(), msg: msg.into() }
}

/// A driver error with the driver's own words; out-of-memory and device loss are named as such.
pub(crate) fn driver(what: &str, e: DriverError) -> Error {
    let words = e.error_string().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|_| format!("{:?}", e.0));
    let kind = match e.0 {
        CUresult::CUDA_ERROR_OUT_OF_MEMORY => "out of device memory: ",
        CUresult::CUDA_ERROR_LAUNCH_FAILED | CUresult::CUDA_ERROR_ILLEGAL_ADDRESS => "device fault (context lost): ",
        _ => "",
    };
    err(format!("{what}: {kind}{words} ({:?})", e.0))
}

/// How to get CUDA here, for the error when it is missing.
pub const NO_DRIVER_HINT: &str =
    "no CUDA driver found (libcuda.so.1 is installed with NVIDIA's driver); kiln needs no CUDA toolkit";

/// Newest compute capability kiln's PTX names; newer GPUs JIT the sm_90 PTX forward.
const NEWEST_SM: u32 = 90;

/// A CUDA device ready to run kiln kernels, with its own stream (CUDA graph capture needs one that is
/// not the legacy default stream).
pub struct Cuda {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    sm: u32,
    name: String,
    driver_version: i32,
    target: Target,
    functions: RefCell<HashMap<String, CudaFunction>>,
    pool: RefCell<HashMap<usize, Vec<CudaSlice<u8>>>>,
    stats: RefCell<CudaStats>,
    /// cuBLAS, opened at the first library GEMM.
    blas: RefCell<Option<Rc<Blas>>>,
}

/// What the runtime spent compiling, for compile statistics.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CudaStats {
    /// Modules the driver JIT-compiled from PTX.
    pub modules_loaded: usize,
    /// Kernels served by an already loaded module (same PTX).
    pub modules_reused: usize,
    /// Time rendering PTX, ms.
    pub render_ms: f64,
    /// Time the driver spent loading (JIT-compiling) modules, ms.
    pub driver_ms: f64,
}

fn ms_since(t: std::time::Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

impl Cuda {
    /// Opens device `ordinal` (0 unless `KILN_CUDA_DEVICE` says otherwise); a typed error when no driver
    /// or device is there.
    pub fn new() -> Result<Cuda> {
        // SAFETY: only probes whether the driver library can be opened.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(err(NO_DRIVER_HINT));
        }
        let ordinal = std::env::var("KILN_CUDA_DEVICE").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
        let ctx = CudaContext::new(ordinal).map_err(|e| driver("opening the CUDA device", e))?;
        // One stream per device, in order: the per-buffer events cudarc records for multi-stream safety
        // would only add work to every launch.
        // SAFETY: no buffer of this context is ever used on another stream.
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
        let mut target = Target::cuda(sm.min(NEWEST_SM));
        target.name = format!("cuda-sm_{sm}");
        // KILN_CUDA_GEMM=kiln keeps every matmul on kiln's own template (for comparisons).
        target.library_gemm = std::env::var("KILN_CUDA_GEMM").as_deref() != Ok("kiln");
        // Tuning knobs for experiments (benches/NOTES.md): threads per row group, persistent-row cap.
        let knob = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u32>().ok());
        if let Some(t) = knob("KILN_CUDA_ROW_THREADS") {
            target.row_threads = t;
        }
        if let Some(c) = knob("KILN_CUDA_ROW_CACHE") {
            target.max_row_cache = c;
        }
        tracing::info!(target: "kiln::graph", device = %name, sm, "cuda device");
        Ok(Cuda {
            ctx,
            stream,
            // The PTX's `.target`: sm_90 for Hopper and newer, sm_80 PTX JIT-compiled forward otherwise.
            sm: if sm >= NEWEST_SM { NEWEST_SM } else { 80 },
            name,
            driver_version,
            target,
            functions: RefCell::new(HashMap::new()),
            pool: RefCell::new(HashMap::new()),
            stats: RefCell::new(CudaStats::default()),
            blas: RefCell::new(None),
        })
    }

    /// The device as kiln's pipeline sees it.
    pub fn target(&self) -> &Target {
        &self.target
    }

    /// One line naming the device, its compute capability and the driver.
    pub fn describe(&self) -> String {
        let v = self.driver_version;
        format!("{} (CUDA, sm_{}, driver API {}.{})", self.name, self.sm, v / 1000, (v % 1000) / 10)
    }

    /// Modules loaded and reused, and time spent rendering and in the driver, so far.
    pub fn stats(&self) -> CudaStats {
        self.stats.borrow().clone()
    }

    /// Forgets loaded modules (the bench measures cold compiles with it).
    pub fn clear_modules(&self) {
        self.functions.borrow_mut().clear();
    }

    /// The stream every launch goes to.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The loaded function for a kernel: rendered, then JIT-compiled by the driver unless a kernel with
    /// the same text (another of 64 equal layers) already was.
    fn function(&self, kernel: &Kernel) -> Result<CudaFunction> {
        let clock = std::time::Instant::now();
        let ptx = render(kernel, self.sm).map_err(|e| err(e.to_string()))?;
        let key = ptx.source.replace(&kernel.name, "kernel");
        if let Some(f) = self.functions.borrow().get(&key) {
            self.stats.borrow_mut().modules_reused += 1;
            return Ok(f.clone());
        }
        let rendered = std::time::Instant::now();
        tracing::debug!(target: "kiln::output_code", kernel = %kernel.name, "\n{}", ptx.source);
        let loaded = self
            .ctx
            .load_module(cudarc::nvrtc::Ptx::from_src(ptx.source.clone()))
            .and_then(|m| m.load_function(&kernel.name));
        let f = loaded.map_err(|e| {
            let numbered: String =
                ptx.source.lines().enumerate().map(|(i, l)| format!("{:4} | {l}\n", i + 1)).collect();
            err(format!("kernel {}: the driver rejected the PTX: {:?}\n{numbered}", kernel.name, e.0))
        })?;
        {
            let mut st = self.stats.borrow_mut();
            st.modules_loaded += 1;
            st.render_ms += rendered.duration_since(clock).as_secs_f64() * 1e3;
            st.driver_ms += ms_since(rendered);
        }
        self.functions.borrow_mut().insert(key, f.clone());
        Ok(f)
    }

    /// cuBLAS on this device's stream, opened once.
    fn blas(&self) -> Result<Rc<Blas>> {
        if let Some(b) = self.blas.borrow().as_ref() {
            return Ok(b.clone());
        }
        let b = Rc::new(Blas::new(&self.stream)?);
        *self.blas.borrow_mut() = Some(b.clone());
        Ok(b)
    }

    /// Device memory of at least `bytes`: from the pool when a buffer of its size class is free.
    fn buffer(&self, bytes: usize) -> Result<CudaSlice<u8>> {
        // Powers of two from 256 bytes, so shapes that vary a little reuse buffers instead of allocating.
        let class = bytes.max(256).next_power_of_two();
        if let Some(b) = self.pool.borrow_mut().get_mut(&class).and_then(Vec::pop) {
            return Ok(b);
        }
        // SAFETY: plan buffers are written by a kernel or an upload before any kernel reads them.
        let alloc = || unsafe { self.stream.alloc::<u8>(class) };
        match alloc() {
            Ok(b) => Ok(b),
            Err(e) if e.0 == CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                // Cached buffers hold memory nobody uses now: give them back and try once more.
                self.pool.borrow_mut().clear();
                alloc().map_err(|e| match e.0 {
                    CUresult::CUDA_ERROR_OUT_OF_MEMORY => Error::OutOfMemory {
                        device: "cuda".into(),
                        what: format!("a buffer of {bytes} bytes"),
                        bytes: class as u64,
                        limit: None,
                    },
                    _ => driver(&format!("allocating {class} bytes"), e),
                })
            }
            Err(e) => Err(driver(&format!("allocating {class} bytes"), e)),
        }
    }

    /// Binds a compiled graph to device memory: buffers from the plan, inputs uploaded, one loaded
    /// function per distinct kernel, parameters resolved. [`Cuda::launch`] then replays it.
    pub fn prepare(&self, c: &CompiledGraph, inputs: &[&TensorData]) -> Result<Prepared> {
        let bindings = c.bindings(inputs)?;
        let sizes = c.buffer_bytes(&bindings, |d, n| (n * d.size_bytes()) as u64)?;
        let bytes_moved = c.traffic_bytes(&bindings)?;
        let mut buffers = Vec::with_capacity(sizes.len());
        for &s in &sizes {
            buffers.push(self.buffer(s as usize)?);
        }
        let pointers: Vec<u64> = buffers.iter().map(|b| b.device_ptr(&self.stream).0).collect();
        // One u32 fault word per kernel with run-time checks, zeroed before every run.
        let fault_kernels: Vec<usize> = c.checked_launches().into_iter().map(|(_, k)| k).collect();
        let faults = self.buffer(4 * fault_kernels.len().max(1))?;
        let fault_base = faults.device_ptr(&self.stream).0;
        let mut launches = Vec::new();
        for &ki in &c.plan.launches {
            let kernel = &c.kernels[ki];
            let groups = kernel.launch.groups.eval(&bindings)?.max(0) as u64;
            if groups == 0 {
                continue;
            }
            if let Some(gemm) = kernel.gemm() {
                let kernel_pointers: Vec<u64> =
                    kernel.buffers.iter().map(|b| pointers[c.plan.value_buffer[&b.node]]).collect();
                let call = GemmCall::plan(gemm, &bindings, &kernel_pointers, &self.stream)?;
                launches.push((kernel.name.clone(), Step::Gemm(self.blas()?, call)));
                continue;
            }
            let function = self.function(kernel)?;
            let mut params: Vec<u64> = kernel.buffers.iter().map(|b| pointers[c.plan.value_buffer[&b.node]]).collect();
            for s in &kernel.symbols {
                let v =
                    bindings.get(*s).ok_or_else(|| err(format!("kernel {}: symbol {s} has no value", kernel.name)))?;
                // The renderer declares symbols `.s64`: the bits of the i64 travel in a u64 slot.
                params.push(v as u64);
            }
            if let Some(slot) = fault_kernels.iter().position(|&k| k == ki) {
                params.push(fault_base + 4 * slot as u64);
            }
            let grid = self
                .target
                .fold_grid(groups)
                .ok_or_else(|| err(format!("kernel {}: {groups} blocks exceed a 3-D grid", kernel.name)))?;
            let config = LaunchConfig { grid_dim: grid, block_dim: (kernel.launch.threads, 1, 1), shared_mem_bytes: 0 };
            launches.push((kernel.name.clone(), Step::Kernel(Launch { function, config, params })));
        }
        let outputs = c.output_slots(&bindings)?;
        let io_bytes = c.io_bytes(&bindings)?;
        let mut prepared =
            Prepared { buffers, launches, outputs, bytes_moved, io_bytes, graph: None, faults, fault_kernels };
        for (b, data) in c.input_buffers().into_iter().zip(inputs) {
            self.upload(&mut prepared, b, data)?;
        }
        Ok(prepared)
    }

    /// Writes host data into plan buffer `buffer` of a prepared graph.
    pub fn upload(&self, p: &mut Prepared, buffer: usize, data: &TensorData) -> Result<()> {
        let bytes = data.to_le_bytes();
        if bytes.is_empty() {
            return Ok(());
        }
        let dst = &mut p.buffers[buffer];
        if bytes.len() > dst.len() {
            return Err(err(format!("upload of {} bytes into a {}-byte buffer", bytes.len(), dst.len())));
        }
        let mut view = dst.slice_mut(0..bytes.len());
        self.stream.memcpy_htod(&bytes, &mut view).map_err(|e| driver("uploading an input", e))
    }

    /// Enqueues every kernel of a prepared graph on the stream (or replays its CUDA graph once captured).
    pub fn launch(&self, p: &Prepared) -> Result<()> {
        if let Some(graph) = &p.graph {
            return graph.launch().map_err(|e| driver("replaying the CUDA graph", e));
        }
        self.enqueue(p)
    }

    fn enqueue(&self, p: &Prepared) -> Result<()> {
        if !p.fault_kernels.is_empty() {
            let n = 4 * p.fault_kernels.len();
            // SAFETY: the fault buffer holds at least `n` bytes (4 per checked kernel).
            let ptr = p.faults.device_ptr(&self.stream).0;
            unsafe { cudarc::driver::result::memset_d8_async(ptr, 0, n, self.stream.cu_stream()) }
                .map_err(|e| driver("clearing the fault words", e))?;
        }
        for (_, step) in &p.launches {
            self.step(step)?;
        }
        Ok(())
    }

    fn step(&self, step: &Step) -> Result<()> {
        let l = match step {
            Step::Kernel(l) => l,
            Step::Gemm(blas, call) => return blas.run(call),
        };
        let mut b = self.stream.launch_builder(&l.function);
        for v in &l.params {
            b.arg(v);
        }
        // SAFETY: the parameters are exactly those the renderer declared for this kernel (one pointer per
        // bound buffer, sized by the plan for the launch's symbol values, then each symbol), and every
        // index a kernel computes is guarded by the bounds the kernel IR carries.
        unsafe { b.launch(l.config) }.map_err(|e| driver("launching a kernel", e))?;
        Ok(())
    }

    /// Milliseconds each step of one run of `p` took on the device, in launch order (an event between
    /// every two steps): where the time of a compiled graph goes.
    pub fn profile(&self, p: &Prepared) -> Result<Vec<(String, f64)>> {
        let mut marks = vec![self.event()?];
        marks[0].record(&self.stream).map_err(|e| driver("recording an event", e))?;
        for (_, step) in &p.launches {
            self.step(step)?;
            let e = self.event()?;
            e.record(&self.stream).map_err(|e| driver("recording an event", e))?;
            marks.push(e);
        }
        self.wait()?;
        let mut out = Vec::with_capacity(p.launches.len());
        for ((name, _), w) in p.launches.iter().zip(marks.windows(2)) {
            let ms = w[0].elapsed_ms(&w[1]).map_err(|e| driver("reading an event", e))?;
            out.push((name.clone(), f64::from(ms)));
        }
        Ok(out)
    }

    /// Records a prepared graph's launches once as a CUDA graph; [`Cuda::launch`] then replays it with one
    /// driver call (torch's reduce-overhead mode). Symbol values are part of the capture: prepare again
    /// and re-capture when they change.
    pub fn capture(&self, p: &mut Prepared) -> Result<()> {
        p.graph = None;
        self.stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(|e| driver("beginning graph capture", e))?;
        let enqueued = self.enqueue(p);
        let graph = self.stream.end_capture(CUgraphInstantiate_flags(0));
        enqueued?;
        let graph = graph.map_err(|e| driver("ending graph capture", e))?;
        p.graph = Some(graph.ok_or_else(|| err("graph capture recorded nothing"))?);
        Ok(())
    }

    /// Blocks until everything enqueued has finished.
    pub fn wait(&self) -> Result<()> {
        self.stream.synchronize().map_err(|e| driver("waiting for the device", e))
    }

    /// Reads a prepared graph's outputs back to the host (waits for the stream).
    pub fn read(&self, p: &Prepared) -> Result<Vec<TensorData>> {
        let mut out = Vec::with_capacity(p.outputs.len());
        for (b, dims, dtype) in &p.outputs {
            let n = dims.iter().product::<usize>() * dtype.size_bytes();
            let bytes = if n == 0 {
                Vec::new()
            } else {
                self.stream.clone_dtoh(&p.buffers[*b].slice(0..n)).map_err(|e| driver("reading back", e))?
            };
            self.wait()?;
            out.push(TensorData::from_le_bytes(&bytes, dims, *dtype)?);
        }
        Ok(out)
    }

    /// Reads the fault words of the last run of `p` (waits for the stream) and turns the first nonzero
    /// one into the error it stands for.
    pub fn check_faults(&self, c: &CompiledGraph, p: &Prepared) -> Result<()> {
        if p.fault_kernels.is_empty() {
            return Ok(());
        }
        let bytes = self
            .stream
            .clone_dtoh(&p.faults.slice(0..4 * p.fault_kernels.len()))
            .map_err(|e| driver("reading faults", e))?;
        self.wait()?;
        for (&k, w) in p.fault_kernels.iter().zip(bytes.chunks_exact(4)) {
            c.check_fault(k, u32::from_le_bytes([w[0], w[1], w[2], w[3]]))?;
        }
        Ok(())
    }

    /// Returns a prepared graph's buffers to the pool for later runs.
    pub fn recycle(&self, p: Prepared) {
        let mut pool = self.pool.borrow_mut();
        for b in p.buffers.into_iter().chain([p.faults]) {
            pool.entry(b.len()).or_default().push(b);
        }
    }

    /// Runs a compiled graph: uploads `inputs`, launches every kernel, reads the outputs.
    pub fn run(&self, c: &CompiledGraph, inputs: &[&TensorData]) -> Result<Vec<TensorData>> {
        let prepared = self.prepare(c, inputs)?;
        self.launch(&prepared)?;
        let out = self.check_faults(c, &prepared).and_then(|()| self.read(&prepared));
        self.recycle(prepared);
        out
    }

    /// GB/s (bytes read + written) of the driver's device-to-device copy of `bytes`, the median of
    /// `repeat` timed copies: the ceiling any kernel's bandwidth is quoted against.
    pub fn memcpy_gbps(&self, bytes: usize, repeat: usize) -> Result<f64> {
        let src = self.buffer(bytes)?;
        let mut dst = self.buffer(bytes)?;
        let mut samples = Vec::with_capacity(repeat);
        for i in 0..repeat.max(1) + 3 {
            let (start, end) = (self.event()?, self.event()?);
            start.record(&self.stream).map_err(|e| driver("recording an event", e))?;
            self.stream.memcpy_dtod(&src, &mut dst).map_err(|e| driver("copying", e))?;
            end.record(&self.stream).map_err(|e| driver("recording an event", e))?;
            end.synchronize().map_err(|e| driver("waiting for the device", e))?;
            let ms = f64::from(start.elapsed_ms(&end).map_err(|e| driver("reading an event", e))?);
            if i >= 3 {
                samples.push(ms);
            }
        }
        samples.sort_by(f64::total_cmp);
        let ms = samples[samples.len() / 2];
        let mut pool = self.pool.borrow_mut();
        pool.entry(src.len()).or_default().push(src);
        pool.entry(dst.len()).or_default().push(dst);
        Ok(2.0 * (bytes.max(256).next_power_of_two() as f64) / (ms / 1e3) / 1e9)
    }

    fn event(&self) -> Result<cudarc::driver::CudaEvent> {
        self.ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map_err(|e| driver("creating an event", e))
    }

    /// Seconds one launch of `p` takes on the device, between two events recorded on the stream around
    /// it (launch overhead on the host is outside; a CUDA graph replay is one launch).
    pub fn time_launch(&self, p: &Prepared) -> Result<f64> {
        let (start, end) = (self.event()?, self.event()?);
        start.record(&self.stream).map_err(|e| driver("recording an event", e))?;
        self.launch(p)?;
        end.record(&self.stream).map_err(|e| driver("recording an event", e))?;
        end.synchronize().map_err(|e| driver("waiting for the device", e))?;
        let ms = start.elapsed_ms(&end).map_err(|e| driver("reading an event", e))?;
        Ok(f64::from(ms) / 1e3)
    }
}

/// One step of a prepared graph: a generated kernel, or a library GEMM call.
enum Step {
    Kernel(Launch),
    Gemm(Rc<Blas>, GemmCall),
}

struct Launch {
    function: CudaFunction,
    config: LaunchConfig,
    params: Vec<u64>,
}

/// A compiled graph bound to device memory, ready to launch again and again; after [`Cuda::capture`] it
/// replays as one CUDA graph.
pub struct Prepared {
    buffers: Vec<CudaSlice<u8>>,
    /// Each step with the name of the kernel it runs.
    launches: Vec<(String, Step)>,
    outputs: Vec<(usize, Vec<usize>, DType)>,
    graph: Option<CudaGraph>,
    /// Fault words, one per kernel with run-time checks (`fault_kernels`, by kernel index).
    faults: CudaSlice<u8>,
    fault_kernels: Vec<usize>,
    /// Bytes every launch reads and writes (each kernel's buffers, in their dtypes).
    pub bytes_moved: u64,
    /// Bytes the computation itself must move: its inputs read once, its outputs written once.
    pub io_bytes: u64,
}

impl Prepared {
    /// Kernel launches per run.
    pub fn launches(&self) -> usize {
        self.launches.len()
    }

    /// True once captured as a CUDA graph.
    pub fn is_captured(&self) -> bool {
        self.graph.is_some()
    }
}

/// Graphs recorded for the reduce-overhead mode: one per compiled graph and symbol values, newest last.
type Replays = RefCell<Vec<(Rc<CompiledGraph>, Vec<(kiln_graph::sym::SymId, i64)>, Prepared)>>;

/// Recorded graphs kept per backend; the oldest is dropped (its buffers back to the pool) past this.
const MAX_REPLAYS: usize = 16;

/// kiln's CUDA backend.
#[derive(Clone)]
pub struct CudaBackend {
    cuda: Rc<Cuda>,
    replays: Rc<Replays>,
}

impl CudaBackend {
    /// Opens the CUDA device; a typed error when there is none.
    pub fn new() -> Result<Self> {
        Ok(CudaBackend { cuda: Rc::new(Cuda::new()?), replays: Rc::default() })
    }

    /// Reduce-overhead: replays the CUDA graph recorded for this compiled graph and these symbol values
    /// (recording it on first use), after copying `inputs` into its buffers.
    fn replay(&self, compiled: &Rc<CompiledGraph>, inputs: &[&TensorData]) -> Result<Vec<TensorData>> {
        let values: Vec<_> = compiled.bindings(inputs)?.iter().collect();
        let mut replays = self.replays.borrow_mut();
        let found = replays.iter().position(|(c, v, _)| Rc::ptr_eq(c, compiled) && *v == values);
        let at = match found {
            Some(i) => {
                let p = &mut replays[i].2;
                for (b, data) in compiled.input_buffers().into_iter().zip(inputs) {
                    self.cuda.upload(p, b, data)?;
                }
                i
            }
            None => {
                let mut p = self.cuda.prepare(compiled, inputs)?;
                self.cuda.capture(&mut p)?;
                tracing::debug!(target: "kiln::graph", launches = p.launches(), "recorded a CUDA graph");
                if replays.len() >= MAX_REPLAYS {
                    let (_, _, old) = replays.remove(0);
                    self.cuda.recycle(old);
                }
                replays.push((compiled.clone(), values, p));
                replays.len() - 1
            }
        };
        let p = &replays[at].2;
        self.cuda.launch(p)?;
        self.cuda.check_faults(compiled, p)?;
        self.cuda.read(p)
    }

    /// The device.
    pub fn cuda(&self) -> &Cuda {
        &self.cuda
    }
}

impl kiln_graph::Backend for CudaBackend {
    fn name(&self) -> &str {
        "cuda"
    }

    fn target(&self) -> Option<&Target> {
        Some(self.cuda.target())
    }

    fn run_compiled(&self, compiled: &CompiledGraph, inputs: &[&TensorData]) -> Result<Vec<TensorData>> {
        self.cuda.run(compiled, inputs)
    }

    fn run_compiled_in(
        &self,
        compiled: &Rc<CompiledGraph>,
        inputs: &[&TensorData],
        mode: kiln_graph::Mode,
    ) -> Result<Vec<TensorData>> {
        match mode {
            kiln_graph::Mode::ReduceOverhead => self.replay(compiled, inputs),
            kiln_graph::Mode::Default => self.cuda.run(compiled, inputs),
        }
    }
}

impl kiln_graph::IntoBackend for CudaBackend {
    fn into_backend(self) -> Result<Rc<dyn kiln_graph::Backend>> {
        Ok(Rc::new(self))
    }
}
