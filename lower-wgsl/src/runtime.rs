//! The wgpu driver: picks an adapter, requests a device with the limits kiln uses, describes it as a
//! `Target`, and is the thin device half of kiln's one runtime core (`kiln_graph::runtime`): storage
//! buffers, one pipeline per kernel (validated WGSL), bind groups cached by what they bind, and the
//! launches of a run recorded into one command buffer, submitted once.

use crate::render::render;
use crate::storage::Storage;
use crate::validate::validate;
use kiln_graph::device::{Driver, Launch, Module, Raw};
use kiln_graph::kernel::Kernel;
use kiln_graph::runtime::Runtime;
use kiln_graph::{DType, Error, Result, Target, TensorData};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

fn err(msg: impl Into<String>) -> Error {
    Error::Backend { backend: "wgpu".into(), msg: msg.into() }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A wgpu device ready to run kiln kernels.
pub struct Gpu {
    /// The adapter as the driver reports it.
    pub adapter: wgpu::AdapterInfo,
    device: wgpu::Device,
    queue: wgpu::Queue,
    f16: bool,
    target: Target,
    /// The driver's pipeline cache, persisted next to kiln's compile cache when the adapter has one.
    driver_cache: Option<DriverCache>,
    /// Work enqueued since the last submission, in order.
    batch: Mutex<Vec<Op>>,
    /// Bind groups by what they bind (pooled buffers recur, so runs after the first make none).
    bind_groups: Mutex<HashMap<BindKey, wgpu::BindGroup>>,
    /// Uniform blocks of symbol values by their bytes (immutable once written).
    uniforms: Mutex<HashMap<Vec<u8>, wgpu::Buffer>>,
    /// Two timestamps around a submission, where the adapter has timestamp queries.
    timestamps: Option<Timestamps>,
    /// The next submission writes timestamps (set by `time`).
    timing: std::sync::atomic::AtomicBool,
    stats: Mutex<GpuStats>,
    /// Errors the device raised outside any error scope (wgpu's default is to panic on them): kept, and
    /// returned by the next submission, wait or read as typed errors naming the kernels involved.
    faults: Arc<Mutex<Vec<String>>>,
    /// Why the device was lost, once it was: every later call fails with it.
    lost: Arc<Mutex<Option<String>>>,
    /// A fault of a submission, with the kernels it held, until a caller is told.
    pending: Mutex<Option<Error>>,
}

/// What binds a launch: the pipeline, each binding (the buffer itself, offset, size), and the symbol
/// bytes. Keyed by the buffer, not the runtime's handle: pooled buffers come back under new handles, and
/// their bind groups should be found again. The key holds the buffer, so its identity is never reused.
type BindKey = (PipelineKey, Vec<(wgpu::Buffer, u64, u64)>, Vec<u8>);

/// A pipeline as a key, by identity; holding it keeps its address from being reused by a later
/// pipeline (whose bind group layout would differ) while a bind group is cached under it.
#[derive(Clone)]
struct PipelineKey(Arc<wgpu::ComputePipeline>);

impl PartialEq for PipelineKey {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for PipelineKey {}

impl std::hash::Hash for PipelineKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        Arc::as_ptr(&self.0).hash(state);
    }
}

/// One piece of enqueued work.
enum Op {
    Clear { buffer: wgpu::Buffer, offset: u64, size: u64 },
    Copy { src: wgpu::Buffer, dst: wgpu::Buffer, size: u64 },
    Dispatch { pipeline: Arc<wgpu::ComputePipeline>, bind: wgpu::BindGroup, grid: (u32, u32, u32), kernel: Arc<str> },
}

/// A loaded kernel.
struct Pipeline {
    pipeline: Arc<wgpu::ComputePipeline>,
    /// The kernel's name, for errors.
    name: Arc<str>,
    uses_symbols: bool,
}

/// A query set for two timestamps and the buffers they are resolved into and read back from.
struct Timestamps {
    queries: wgpu::QuerySet,
    resolved: wgpu::Buffer,
    readback: wgpu::Buffer,
}

/// What the driver spent compiling, for compile statistics.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuStats {
    /// Pipelines created (a shader the driver compiled).
    pub pipelines_created: usize,
    /// Time rendering WGSL and validating it with naga, ms.
    pub render_ms: f64,
    /// Time the driver spent creating pipelines, ms.
    pub driver_ms: f64,
}

fn buffer_of(raw: &Raw) -> &wgpu::Buffer {
    // Every allocation of this driver is made by `alloc` below.
    raw.downcast_ref::<wgpu::Buffer>().expect("an allocation of the wgpu driver")
}

/// A persisted `wgpu::PipelineCache`: the driver's compiled shaders survive the process, so a warm start
/// skips most of pipeline creation (the part of a cold compile that is not kiln's).
struct DriverCache {
    cache: wgpu::PipelineCache,
    file: std::path::PathBuf,
    dirty: std::sync::atomic::AtomicBool,
}

impl DriverCache {
    /// Opens the cache file for this adapter; a file whose checksum fails is ignored (and later replaced).
    fn open(device: &wgpu::Device, info: &wgpu::AdapterInfo) -> Option<DriverCache> {
        let key = wgpu::util::pipeline_cache_key(info)?;
        let file = kiln_graph::cache::directory()?.join(key);
        let data = std::fs::read(&file).ok().and_then(|bytes| {
            let (sum, data) = bytes.split_at_checked(32)?;
            (blake3::hash(data).as_bytes() == sum).then(|| data.to_vec())
        });
        // SAFETY: `data` is exactly what an earlier `PipelineCache::get_data` returned: this file holds
        // nothing else and its checksum matched; wgpu also checks the adapter and version it was made for.
        let cache = unsafe {
            device.create_pipeline_cache(&wgpu::PipelineCacheDescriptor {
                label: Some("kiln"),
                data: data.as_deref(),
                fallback: true,
            })
        };
        Some(DriverCache { cache, file, dirty: std::sync::atomic::AtomicBool::new(false) })
    }

    fn save(&self) {
        if !self.dirty.swap(false, std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        let Some(data) = self.cache.get_data() else { return };
        let mut bytes = blake3::hash(&data).as_bytes().to_vec();
        bytes.extend(data);
        // Two devices of one model share the file: each write goes through a temporary of its own.
        static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = self.file.with_extension(format!("{}.{n}.tmp", std::process::id()));
        let ok = self.file.parent().is_some_and(|d| std::fs::create_dir_all(d).is_ok())
            && std::fs::write(&tmp, bytes).is_ok();
        if !ok || std::fs::rename(&tmp, &self.file).is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
    }
}

/// The error for a shader the device rejected: the kernel, the device's words, the numbered source.
fn rejected(kernel: &str, e: &wgpu::Error, source: &str) -> String {
    let numbered: String = source.lines().enumerate().map(|(i, l)| format!("{:4} | {l}\n", i + 1)).collect();
    format!("kernel {kernel}: the device rejected the shader: {e}\n{numbered}")
}

impl Gpu {
    /// Opens the best adapter (or the one whose name contains `KILN_WGPU_ADAPTER`).
    pub async fn new_async() -> Result<Gpu> {
        let adapters = crate::adapters::find().await;
        let i = crate::adapters::default_index(&adapters)?;
        Gpu::on(adapters[i].clone()).await
    }

    /// Opens `adapter` (one of [`crate::adapters::find`]'s).
    pub async fn on(adapter: wgpu::Adapter) -> Result<Gpu> {
        let info = adapter.get_info();
        // KILN_WGPU_NO_F16=1 ignores `shader-f16`, so tests cover the packed-f16 path on any adapter.
        let f16 =
            adapter.features().contains(wgpu::Features::SHADER_F16) && std::env::var_os("KILN_WGPU_NO_F16").is_none();
        // KILN_WGPU_LIMITS=webgpu asks for WebGPU's default limits (8 storage buffers a stage, 65,535
        // workgroups a dimension, 128 MiB a binding) instead of the adapter's: what a page gets unless it
        // asks for more, so the compiler's fitting to them is tested on any machine.
        let limits = match std::env::var("KILN_WGPU_LIMITS").as_deref() {
            Ok("webgpu") => wgpu::Limits::default(),
            Ok(other) => {
                return Err(err(format!("KILN_WGPU_LIMITS={other}: `webgpu` is the one value it takes")));
            }
            Err(_) => adapter.limits(),
        };
        let mut required_features = if f16 { wgpu::Features::SHADER_F16 } else { wgpu::Features::empty() };
        let persist = adapter.features().contains(wgpu::Features::PIPELINE_CACHE);
        if persist {
            required_features |= wgpu::Features::PIPELINE_CACHE;
        }
        // Timestamp queries time a submission on the GPU itself (the bench prefers them to wall time).
        let timestamps = adapter.features().contains(wgpu::Features::TIMESTAMP_QUERY);
        if timestamps {
            required_features |= wgpu::Features::TIMESTAMP_QUERY;
        }
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("kiln"),
                required_features,
                required_limits: limits.clone(),
                ..Default::default()
            })
            .await
            .map_err(|e| err(format!("requesting a device on {}: {e}", info.name)))?;
        // KILN_WGPU_MAX_THREADS caps the workgroup size the pipeline may choose (for tuning experiments).
        let cap = std::env::var("KILN_WGPU_MAX_THREADS").ok().and_then(|v| v.parse::<u32>().ok()).unwrap_or(u32::MAX);
        let target = Target {
            name: format!("wgpu-{:?}-{}", info.backend, info.name).to_lowercase().replace(' ', "-"),
            max_bindings: limits.max_storage_buffers_per_shader_stage,
            max_threads_per_group: limits
                .max_compute_invocations_per_workgroup
                .min(limits.max_compute_workgroup_size_x)
                .min(cap),
            max_groups_per_dim: limits.max_compute_workgroups_per_dimension as u64,
            grid_dims: 3,
            subgroup_size: None,
            shared_memory_bytes: limits.max_compute_workgroup_storage_size,
            f16_compute: f16,
            bf16_compute: false,
            matrix_units: false,
            max_vector_bytes: 16,
            packed_half_storage: true,
            // KILN_WGPU_ROW_CACHE caps persistent rows (0: off), for tuning experiments.
            max_row_cache: std::env::var("KILN_WGPU_ROW_CACHE").ok().and_then(|v| v.parse().ok()).unwrap_or(32),
            library_gemm: false,
            row_threads: 256,
        };
        tracing::info!(target: "kiln::graph", adapter = %info.name, backend = ?info.backend, kind = ?info.device_type, "wgpu adapter");
        let driver_cache = if persist { DriverCache::open(&device, &info) } else { None };
        let timestamps = timestamps.then(|| Timestamps {
            queries: device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("kiln timing"),
                ty: wgpu::QueryType::Timestamp,
                count: 2,
            }),
            resolved: device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("kiln timing"),
                size: 16,
                usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            }),
            readback: device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("kiln timing readback"),
                size: 16,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }),
        });
        let faults: Arc<Mutex<Vec<String>>> = Arc::default();
        let sink = faults.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| lock(&sink).push(e.to_string())));
        let lost: Arc<Mutex<Option<String>>> = Arc::default();
        let gone = lost.clone();
        device.set_device_lost_callback(move |reason, msg| {
            // Dropping the device on purpose is not a loss anyone needs to hear of.
            if reason != wgpu::DeviceLostReason::Destroyed {
                *lock(&gone) = Some(format!("{reason:?}: {msg}"));
            }
        });
        Ok(Gpu {
            faults,
            lost,
            pending: Mutex::default(),
            adapter: info,
            device,
            queue,
            f16,
            target,
            driver_cache,
            batch: Mutex::default(),
            bind_groups: Mutex::default(),
            uniforms: Mutex::default(),
            timestamps,
            timing: std::sync::atomic::AtomicBool::new(false),
            stats: Mutex::default(),
        })
    }

    /// A runtime over the best adapter, opened without blocking (the only way in a browser).
    pub async fn runtime_async() -> Result<Arc<Runtime>> {
        Ok(Runtime::new(Gpu::new_async().await?))
    }

    /// [`Gpu::new_async`] for native code: blocks, and picks from the adapters found once per process.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn new() -> Result<Gpu> {
        let adapters = crate::adapters::here();
        Gpu::open(crate::adapters::default_index(adapters)?)
    }

    /// Opens adapter `index` of [`crate::adapters::here`] (native code; a browser offers one adapter).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn open(index: usize) -> Result<Gpu> {
        let adapters = crate::adapters::here();
        let adapter = adapters.get(index).ok_or_else(|| err(crate::adapters::missing(index, adapters)))?;
        pollster::block_on(Gpu::on(adapter.clone()))
    }

    /// A runtime over the best adapter (the facade keeps one per process).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn runtime() -> Result<Arc<Runtime>> {
        Ok(Runtime::new(Gpu::new()?))
    }

    /// Whether the adapter is a software rasteriser (lavapipe, SwiftShader).
    pub fn is_software(&self) -> bool {
        self.adapter.device_type == wgpu::DeviceType::Cpu
    }

    /// Pipelines created and time spent rendering and in the driver, so far.
    pub fn stats(&self) -> GpuStats {
        lock(&self.stats).clone()
    }

    /// Submits everything enqueued so far as one command buffer: clears and copies where they stand,
    /// consecutive dispatches in one compute pass (WebGPU orders storage writes between the dispatches
    /// of a pass; a pass per kernel costs a barrier and bookkeeping each on some drivers).
    ///
    /// The batch's lock is held through the submission: two threads flushing at once must not submit
    /// their halves of the queue's work out of order.
    fn flush(&self) {
        self.flush_locked(&mut lock(&self.batch));
    }

    /// [`Gpu::flush`] with the batch already locked by the caller (who may queue more in order after it).
    fn flush_locked(&self, batch: &mut Vec<Op>) {
        let ops = std::mem::take(batch);
        let timing = self.timing.swap(false, std::sync::atomic::Ordering::AcqRel);
        if ops.is_empty() && !timing {
            return;
        }
        let mut encoder = self.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("kiln") });
        let passes = ops.iter().filter(|o| matches!(o, Op::Dispatch { .. })).count();
        let mut dispatched = 0;
        // Iterated by reference: the ops outlive the submission, so a fault can name their kernels.
        let mut iter = ops.iter().peekable();
        while let Some(op) = iter.next() {
            match op {
                Op::Clear { buffer, offset, size } => encoder.clear_buffer(buffer, *offset, Some(*size)),
                Op::Copy { src, dst, size } => encoder.copy_buffer_to_buffer(src, 0, dst, 0, *size),
                Op::Dispatch { pipeline, bind, grid, .. } => {
                    let mut run = vec![(pipeline, bind, *grid)];
                    while let Some(Op::Dispatch { .. }) = iter.peek() {
                        if let Some(Op::Dispatch { pipeline, bind, grid, .. }) = iter.next() {
                            run.push((pipeline, bind, *grid));
                        }
                    }
                    let (first, last) = (dispatched == 0, dispatched + run.len() == passes);
                    dispatched += run.len();
                    let timestamp_writes =
                        self.timestamps.as_ref().filter(|_| timing).map(|t| wgpu::ComputePassTimestampWrites {
                            query_set: &t.queries,
                            beginning_of_pass_write_index: first.then_some(0),
                            end_of_pass_write_index: last.then_some(1),
                        });
                    let mut pass = encoder
                        .begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some("kiln"), timestamp_writes });
                    for (p, b, g) in &run {
                        pass.set_pipeline(p);
                        pass.set_bind_group(0, *b, &[]);
                        pass.dispatch_workgroups(g.0, g.1, g.2);
                    }
                }
            }
        }
        if let (Some(t), true) = (&self.timestamps, timing) {
            encoder.resolve_query_set(&t.queries, 0..2, &t.resolved, 0);
            encoder.copy_buffer_to_buffer(&t.resolved, 0, &t.readback, 0, 16);
        }
        self.queue.submit([encoder.finish()]);
        // Natively, validation errors of this submission reach the handler during `finish`/`submit`; a
        // browser reports them later, and `fault` collects those.
        let faults = std::mem::take(&mut *lock(&self.faults));
        if !faults.is_empty() {
            let names: Vec<&str> = ops
                .iter()
                .filter_map(|o| if let Op::Dispatch { kernel, .. } = o { Some(&**kernel) } else { None })
                .collect();
            let msg =
                format!("the device rejected a submission of kernel(s) [{}]: {}", names.join(", "), faults.join("; "));
            lock(&self.pending).get_or_insert(err(msg));
        }
    }

    /// The fault a submission left, or the loss of the device: a typed error for the caller who meets it.
    fn fault(&self) -> Result<()> {
        if let Some(msg) = lock(&self.lost).clone() {
            return Err(Error::DeviceLost { device: "wgpu".into(), what: "running kernels".into(), msg });
        }
        if let Some(e) = lock(&self.pending).take() {
            return Err(e);
        }
        // Errors that arrived after their submission (a browser's, each naming its kernel where known).
        let late = std::mem::take(&mut *lock(&self.faults));
        match late.is_empty() {
            true => Ok(()),
            false => Err(err(format!("the device reported: {}", late.join("; ")))),
        }
    }

    /// Blocks until every submitted piece of work has finished (native only: a browser awaits).
    #[cfg(not(target_arch = "wasm32"))]
    fn wait(&self) -> Result<()> {
        self.device
            .poll(wgpu::PollType::Wait { submission_index: None, timeout: None })
            .map(|_| ())
            .map_err(|e| err(format!("waiting for the device: {e}")))
    }

    /// Copies `bytes` of `src` into a fresh staging buffer (after the work enqueued before) and submits.
    fn stage(&self, src: &wgpu::Buffer, bytes: u64) -> wgpu::Buffer {
        let mut batch = lock(&self.batch);
        self.flush_locked(&mut batch);
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("readback"),
            size: bytes,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut encoder =
            self.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("readback") });
        encoder.copy_buffer_to_buffer(src, 0, &staging, 0, bytes);
        self.queue.submit([encoder.finish()]);
        staging
    }

    /// Maps `buffer` for reading once the device has written it, and returns its bytes. Native code
    /// drives the device while it waits; in a browser the event loop does.
    async fn map_read(&self, buffer: &wgpu::Buffer, bytes: u64) -> Result<Vec<u8>> {
        let (tx, rx) = futures_channel::oneshot::channel();
        buffer.map_async(wgpu::MapMode::Read, ..bytes, move |r| {
            let _ = tx.send(r);
        });
        #[cfg(not(target_arch = "wasm32"))]
        self.wait()?;
        let lost = || Error::DeviceLost {
            device: "wgpu".into(),
            what: "reading back".into(),
            msg: "the map never finished".into(),
        };
        rx.await.map_err(|_| lost())?.map_err(|e| err(format!("reading back: {e}")))?;
        let out = buffer.get_mapped_range(..bytes).map_err(|e| err(format!("reading back: {e}")))?.to_vec();
        buffer.unmap();
        Ok(out)
    }

    fn uniform(&self, bytes: Vec<u8>) -> wgpu::Buffer {
        let mut u = lock(&self.uniforms);
        if u.len() > 4096 {
            u.clear();
        }
        u.entry(bytes)
            .or_insert_with_key(|bytes| {
                let buf = self.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("kiln symbols"),
                    size: bytes.len() as u64,
                    usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                });
                self.queue.write_buffer(&buf, 0, bytes);
                buf
            })
            .clone()
    }
}

impl Driver for Gpu {
    fn name(&self) -> &'static str {
        "wgpu"
    }

    fn target(&self) -> &Target {
        &self.target
    }

    fn describe(&self) -> String {
        let i = &self.adapter;
        // Browsers may withhold the adapter's name and driver (WebGPU exposes them only on request).
        let name = if i.name.is_empty() { "an adapter the browser does not name" } else { i.name.as_str() };
        let driver = format!("{} {}", i.driver, i.driver_info);
        let driver = if driver.trim().is_empty() { String::new() } else { format!(", driver {}", driver.trim()) };
        format!("{name} ({:?}, {:?}{driver})", i.backend, i.device_type)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn bytes(&self, dtype: DType, n: usize) -> u64 {
        Storage::of(dtype, self.f16).bytes(n) as u64
    }

    fn encode<'a>(&self, data: &'a TensorData) -> std::borrow::Cow<'a, [u8]> {
        Storage::of(data.dtype(), self.f16).encode(data)
    }

    fn decode(&self, bytes: &[u8], dims: &[usize], dtype: DType) -> Result<TensorData> {
        Storage::of(dtype, self.f16).decode(bytes, dims, dtype)
    }

    fn max_buffer_bytes(&self) -> u64 {
        self.device.limits().max_buffer_size
    }

    fn max_binding_bytes(&self) -> u64 {
        self.device.limits().max_storage_buffer_binding_size
    }

    fn offset_alignment(&self) -> u64 {
        u64::from(self.device.limits().min_storage_buffer_offset_alignment)
    }

    fn alloc(&self, bytes: u64) -> Result<Raw> {
        let size = bytes.div_ceil(4) * 4;
        let usage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST;
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let buffer =
            self.device.create_buffer(&wgpu::BufferDescriptor { label: None, size, usage, mapped_at_creation: false });
        #[cfg(not(target_arch = "wasm32"))]
        if let Some(e) = pollster::block_on(scope.pop()) {
            // Cached bind groups hold pooled buffers alive: let them go before the runtime retries.
            lock(&self.bind_groups).clear();
            return Err(Error::OutOfMemory {
                device: "wgpu".into(),
                what: format!("a buffer ({e})"),
                bytes,
                limit: None,
            });
        }
        #[cfg(target_arch = "wasm32")]
        drop(scope);
        Ok(Box::new(buffer))
    }

    fn write(&self, dst: &Raw, bytes: &[u8]) -> Result<()> {
        // Work enqueued before must see the old contents: submit it first (a write lands before the next
        // submission), holding the batch so no other thread's work slips in between.
        let mut batch = lock(&self.batch);
        self.flush_locked(&mut batch);
        if bytes.len() % 4 == 0 {
            self.queue.write_buffer(buffer_of(dst), 0, bytes);
        } else {
            let mut padded = bytes.to_vec();
            padded.resize(bytes.len().div_ceil(4) * 4, 0);
            self.queue.write_buffer(buffer_of(dst), 0, &padded);
        }
        Ok(())
    }

    #[cfg(not(target_arch = "wasm32"))]
    fn read(&self, src: &Raw, bytes: u64) -> Result<Vec<u8>> {
        pollster::block_on(self.read_async(src, bytes))
    }

    #[cfg(target_arch = "wasm32")]
    fn read(&self, _src: &Raw, _bytes: u64) -> Result<Vec<u8>> {
        Err(err("a browser cannot block on the GPU: read tensors with `to_vec_async`"))
    }

    fn read_async<'a>(&'a self, src: &'a Raw, bytes: u64) -> kiln_graph::device::ReadFuture<'a> {
        Box::pin(async move {
            let size = bytes.div_ceil(4) * 4;
            let staging = self.stage(buffer_of(src), size);
            self.fault()?;
            let mut out = self.map_read(&staging, size).await?;
            // A browser's errors for the work this read waited on have arrived by now.
            self.fault()?;
            out.truncate(bytes as usize);
            Ok(out)
        })
    }

    fn zero(&self, dst: &Raw, offset: u64, bytes: u64) -> Result<()> {
        lock(&self.batch).push(Op::Clear { buffer: buffer_of(dst).clone(), offset, size: bytes.div_ceil(4) * 4 });
        Ok(())
    }

    fn copy(&self, src: &Raw, dst: &Raw, bytes: u64) -> Result<()> {
        let size = bytes.div_ceil(4) * 4;
        lock(&self.batch).push(Op::Copy { src: buffer_of(src).clone(), dst: buffer_of(dst).clone(), size });
        Ok(())
    }

    fn load(&self, kernel: &Kernel) -> Result<Module> {
        let clock = web_time::Instant::now();
        let shader = render(kernel, self.f16).map_err(|e| err(e.to_string()))?;
        validate(&kernel.name, &shader.source).map_err(|e| err(e.to_string()))?;
        tracing::debug!(target: "kiln::output_code", kernel = %kernel.name, "\n{}", shader.source);
        let rendered = web_time::Instant::now();
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let module = self.device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some(&kernel.name),
            source: wgpu::ShaderSource::Wgsl(shader.source.as_str().into()),
        });
        let pipeline = self.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(&kernel.name),
            layout: None,
            module: &module,
            entry_point: Some("main"),
            compilation_options: Default::default(),
            cache: self.driver_cache.as_ref().map(|d| &d.cache),
        });
        if let Some(d) = &self.driver_cache {
            d.dirty.store(true, std::sync::atomic::Ordering::Relaxed);
            d.save();
        }
        #[cfg(not(target_arch = "wasm32"))]
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(err(rejected(&kernel.name, &e, &shader.source)));
        }
        // A page cannot wait for the verdict: it arrives later, as a fault the next submission reports,
        // naming the kernel and showing its source.
        #[cfg(target_arch = "wasm32")]
        {
            let faults = self.faults.clone();
            let (name, source) = (kernel.name.clone(), shader.source.clone());
            // Popped now (scopes pop in reverse order of pushing); only the verdict is awaited.
            let verdict = scope.pop();
            wasm_bindgen_futures::spawn_local(async move {
                if let Some(e) = verdict.await {
                    lock(&faults).push(rejected(&name, &e, &source));
                }
            });
        }
        {
            let mut st = lock(&self.stats);
            st.pipelines_created += 1;
            st.render_ms += rendered.duration_since(clock).as_secs_f64() * 1e3;
            st.driver_ms += rendered.elapsed().as_secs_f64() * 1e3;
        }
        Ok(Arc::new(Pipeline {
            pipeline: Arc::new(pipeline),
            name: kernel.name.as_str().into(),
            uses_symbols: shader.uses_symbols,
        }))
    }

    fn launch(&self, module: &Module, kernel: &Kernel, l: &Launch) -> Result<()> {
        let p = module.downcast_ref::<Pipeline>().ok_or_else(|| err("a module of another driver"))?;
        let mut symbols = Vec::new();
        if p.uses_symbols {
            for (s, &v) in kernel.symbols.iter().zip(l.symbols) {
                let v = i32::try_from(v)
                    .map_err(|_| err(format!("kernel {}: {s} = {v} does not fit in i32", kernel.name)))?;
                symbols.extend(v.to_le_bytes());
            }
            symbols.resize(symbols.len().div_ceil(16).max(1) * 16, 0);
        }
        let mut bound: Vec<(wgpu::Buffer, u64, u64)> =
            l.buffers.iter().map(|b| (buffer_of(b.raw).clone(), b.offset, b.bytes)).collect();
        if let Some(f) = l.fault {
            bound.push((buffer_of(f.raw).clone(), f.offset, f.bytes));
        }
        let key: BindKey = (PipelineKey(p.pipeline.clone()), bound, symbols.clone());
        let cached = lock(&self.bind_groups).get(&key).cloned();
        let bind = match cached {
            Some(b) => b,
            None => {
                let uniform = p.uses_symbols.then(|| self.uniform(symbols));
                fn binding(raw: &Raw, offset: u64, size: u64) -> wgpu::BindingResource<'_> {
                    wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer: buffer_of(raw),
                        offset,
                        size: wgpu::BufferSize::new(size.div_ceil(4).max(1) * 4),
                    })
                }
                let mut entries: Vec<wgpu::BindGroupEntry> = l
                    .buffers
                    .iter()
                    .enumerate()
                    .map(|(i, b)| wgpu::BindGroupEntry {
                        binding: i as u32,
                        resource: binding(b.raw, b.offset, b.bytes),
                    })
                    .collect();
                if let Some(u) = &uniform {
                    entries.push(wgpu::BindGroupEntry {
                        binding: kernel.buffers.len() as u32,
                        resource: u.as_entire_binding(),
                    });
                }
                if let Some(f) = l.fault {
                    entries.push(wgpu::BindGroupEntry {
                        binding: crate::render::fault_binding(kernel),
                        resource: binding(f.raw, f.offset, f.bytes),
                    });
                }
                let bind = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
                    label: Some(&kernel.name),
                    layout: &p.pipeline.get_bind_group_layout(0),
                    entries: &entries,
                });
                let mut groups = lock(&self.bind_groups);
                if groups.len() > 4096 {
                    groups.clear();
                }
                groups.insert(key, bind.clone());
                bind
            }
        };
        let grid = self
            .target
            .fold_grid(l.groups)
            .ok_or_else(|| err(format!("kernel {}: {} workgroups exceed a 3-D grid", kernel.name, l.groups)))?;
        self.fault()?;
        lock(&self.batch).push(Op::Dispatch { pipeline: p.pipeline.clone(), bind, grid, kernel: p.name.clone() });
        Ok(())
    }

    fn submit(&self) -> Result<()> {
        self.flush();
        self.fault()
    }

    fn synchronize(&self) -> Result<()> {
        self.flush();
        #[cfg(not(target_arch = "wasm32"))]
        self.wait()?;
        self.fault()
    }

    #[cfg(not(target_arch = "wasm32"))]
    fn time(&self, enqueue: &mut dyn FnMut() -> Result<()>) -> Result<Option<f64>> {
        let Some(t) = &self.timestamps else { return Ok(None) };
        self.flush();
        self.timing.store(true, std::sync::atomic::Ordering::Release);
        enqueue()?;
        self.flush();
        let bytes = pollster::block_on(self.map_read(&t.readback, 16))?;
        let at = |i: usize| u64::from_le_bytes(bytes[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]));
        let ticks = at(1).saturating_sub(at(0));
        Ok(Some(ticks as f64 * f64::from(self.queue.get_timestamp_period()) * 1e-9))
    }

    fn timing(&self) -> &'static str {
        if self.timestamps.is_some() {
            "timestamp queries"
        } else {
            "fenced wall time"
        }
    }
}
