//! The wgpu driver: picks an adapter, requests a device with the limits kiln uses, describes it as a
//! `Target`, and is the thin device half of kiln's one runtime core (`kiln_graph::runtime`): storage
//! buffers, one pipeline per kernel (validated WGSL), a bind group per binding (the core keeps them),
//! and the launches of runs recorded into one command buffer, submitted once 32 dispatches are
//! recorded or when the host needs the device (a read, a write, a wait, a timing).

use crate::render::render;
use crate::shader_checks::ShaderChecks;
use crate::validate::validate;
use kiln_graph::device::{Driver, Launch, Module, Raw};
use kiln_graph::error::rejected_source;
use kiln_graph::kernel::Kernel;
use kiln_graph::runtime::{lock, Runtime};
use kiln_graph::{Error, Result, Target};
use std::sync::{Arc, Mutex};

fn err(msg: impl Into<String>) -> Error {
    Error::Backend { backend: "wgpu".into(), msg: msg.into() }
}

/// A wgpu device ready to run kiln kernels.
pub struct Gpu {
    /// The adapter as the driver reports it.
    pub adapter: wgpu::AdapterInfo,
    device: wgpu::Device,
    queue: wgpu::Queue,
    /// The device as the compiler sees it (`f16_compute`: the adapter's `shader-f16` is used).
    target: Target,
    /// The driver's compiled shaders, kept in kiln's cache directory when the adapter can: a warm start
    /// skips most of pipeline creation (the part of a cold compile that is not kiln's).
    driver_cache: Option<(wgpu::PipelineCache, String)>,
    /// Work recorded since the last submission.
    batch: Mutex<Batch>,
    /// Two timestamps around timed work, where the adapter has timestamp queries.
    timestamps: Option<Timestamps>,
    stats: Mutex<GpuStats>,
    /// Errors the device raised outside any error scope (wgpu's default is to panic on them): kept, and
    /// returned by the next submission, wait or read as typed errors naming the kernels involved.
    faults: Arc<Mutex<Vec<String>>>,
    /// Why the device was lost, once it was: every later call fails with it.
    lost: Arc<Mutex<Option<String>>>,
    /// A fault of a submission, with the kernels it held, until a caller is told.
    pending: Mutex<Option<Error>>,
    /// The run-time checks wgpu adds to kiln's shaders (`KILN_WGPU_SHADER_CHECKS`).
    checks: ShaderChecks,
    /// Dispatches a run leaves recorded before the runtime submits them ([`submit_every`]).
    submit_every: usize,
    /// How long a wait polls before it blocks ([`spin`]; a browser awaits instead).
    #[cfg(not(target_arch = "wasm32"))]
    spin: std::time::Duration,
}

/// Work recorded since the last submission: one command encoder, the compute pass that consecutive
/// dispatches share (WebGPU orders storage writes between the dispatches of a pass; a pass per kernel
/// costs a barrier and bookkeeping each on some drivers), and the kernels recorded, for errors.
#[derive(Default)]
struct Batch {
    encoder: Option<wgpu::CommandEncoder>,
    pass: Option<wgpu::ComputePass<'static>>,
    kernels: Vec<Arc<str>>,
}

impl Batch {
    /// The encoder, with no pass open (clears and copies are recorded outside passes).
    fn encoder(&mut self, device: &wgpu::Device) -> &mut wgpu::CommandEncoder {
        self.pass = None;
        self.encoder.get_or_insert_with(|| device.create_command_encoder(&Default::default()))
    }

    /// The open compute pass (opened when there is none).
    fn pass(&mut self, device: &wgpu::Device) -> &mut wgpu::ComputePass<'static> {
        let Batch { encoder, pass, .. } = self;
        pass.get_or_insert_with(|| {
            let encoder = encoder.get_or_insert_with(|| device.create_command_encoder(&Default::default()));
            encoder.begin_compute_pass(&Default::default()).forget_lifetime()
        })
    }
}

/// A loaded kernel.
struct Pipeline {
    pipeline: wgpu::ComputePipeline,
    /// The kernel's name, for errors.
    name: Arc<str>,
    uses_symbols: bool,
}

/// A query set for two timestamps and the buffers they are resolved into and read back from; one timing
/// at a time (`busy` while its readback is pending).
struct Timestamps {
    queries: wgpu::QuerySet,
    resolved: wgpu::Buffer,
    readback: wgpu::Buffer,
    busy: std::sync::atomic::AtomicBool,
}

/// Marks [`Timestamps`] free again when its timing ends, finished or dropped.
struct Busy<'a>(&'a std::sync::atomic::AtomicBool);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.store(false, std::sync::atomic::Ordering::Release);
    }
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
    /// Command buffers submitted to the queue (runs of few kernels share one: `KILN_WGPU_SUBMIT_EVERY`).
    pub submissions: usize,
}

fn buffer_of(raw: &Raw) -> &wgpu::Buffer {
    // Every allocation of this driver is made by `alloc` below.
    raw.downcast_ref::<wgpu::Buffer>().expect("an allocation of the wgpu driver")
}

/// Opens the driver's pipeline cache, filled from the file kept for this adapter (when whole).
fn driver_cache(device: &wgpu::Device, info: &wgpu::AdapterInfo) -> Option<(wgpu::PipelineCache, String)> {
    let name = wgpu::util::pipeline_cache_key(info)?;
    let data = kiln_graph::cache::load_blob(&name);
    // SAFETY: `data` is exactly what an earlier `PipelineCache::get_data` returned (the file holds nothing
    // else and its checksum matched); wgpu also checks the adapter and version it was made for.
    let cache = unsafe {
        device.create_pipeline_cache(&wgpu::PipelineCacheDescriptor {
            label: Some("kiln"),
            data: data.as_deref(),
            fallback: true,
        })
    };
    Some((cache, name))
}

/// Dispatches recorded before a run's end submits them: `KILN_WGPU_SUBMIT_EVERY` (1: every run is its
/// own submission), 32 by default. Each Vulkan submission cost ~16 µs of idle GPU on the H200 between
/// runs (W1–W3's kernels took 0.134–0.163 ms submitted ten to a pass, 0.150–0.179 a run each:
/// `benches/NOTES.md`, session 36), so runs of few kernels share one, as CubeCL's wgpu runtime batches
/// its tasks (`CUBECL_WGPU_MAX_TASKS`). A read, a write, a wait or a timing submits whatever is recorded.
fn submit_every() -> Result<usize> {
    let Ok(v) = std::env::var("KILN_WGPU_SUBMIT_EVERY") else { return Ok(32) };
    v.trim()
        .parse()
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| err(format!("KILN_WGPU_SUBMIT_EVERY={v}: a count of dispatches, 1 or more")))
}

/// How long a native wait for the device polls before it blocks: `KILN_WGPU_SPIN_US` microseconds, else
/// 2,000 on a GPU and 0 (block at once) on a CPU adapter such as lavapipe, whose own threads need the
/// cores a poll would take. A thread blocked on an NVIDIA Vulkan fence woke ~25 µs after the GPU was
/// done: polling cut a tiny call's synchronise from 53–55 to 30–31 µs and W1–W3's public calls by
/// 22–54 µs on an H200 (`benches/NOTES.md`, session 37). CUDA's stream synchronise spins by default
/// for the same reason. A wait longer than the budget blocks, so a long run costs at most that much CPU.
#[cfg(not(target_arch = "wasm32"))]
fn spin(value: Option<&str>, device: wgpu::DeviceType) -> Result<std::time::Duration> {
    let us = match value {
        None if device == wgpu::DeviceType::Cpu => 0,
        None => 2_000,
        Some(v) => v.trim().parse().map_err(|_| err(format!("KILN_WGPU_SPIN_US={v}: microseconds, 0 or more")))?,
    };
    Ok(std::time::Duration::from_micros(us))
}

/// The subgroup size `graph` may plan combines and packed rows for (`Target::subgroup_size`): the
/// adapter's, where it has subgroup operations and one fixed size (NVIDIA 32, lavapipe 8; not Intel's
/// 8–32, where a shader cannot know its lanes before it runs). None in a browser (Chrome's WGSL compiler
/// wants an `enable subgroups;` that naga, which validates every shader first, does not take yet),
/// under WebGPU's default limits (a page's), or with `KILN_WGPU_SUBGROUPS=0`.
fn subgroup_size(adapter: &wgpu::Adapter, info: &wgpu::AdapterInfo, webgpu_limits: bool) -> Option<u32> {
    let asked_off = std::env::var("KILN_WGPU_SUBGROUPS").as_deref() == Ok("0");
    let page_like = cfg!(target_arch = "wasm32") || webgpu_limits;
    (adapter.features().contains(wgpu::Features::SUBGROUP)
        && info.subgroup_min_size == info.subgroup_max_size
        && info.subgroup_min_size.is_power_of_two()
        && !asked_off
        && !page_like)
        .then_some(info.subgroup_min_size)
}

impl Gpu {
    /// Loses the device now, as a driver reset or an unplugged GPU would: destroys it and marks it lost
    /// with `why`. For tests of what follows a loss (the runtime opens the device again).
    pub fn lose_device(&self, why: &str) {
        *lock(&self.lost) = Some(why.to_string());
        self.device.destroy();
    }

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
        let (limits, webgpu_limits) = match std::env::var("KILN_WGPU_LIMITS").as_deref() {
            Ok("webgpu") => (wgpu::Limits::default(), true),
            Ok(other) => {
                return Err(err(format!("KILN_WGPU_LIMITS={other}: `webgpu` is the one value it takes")));
            }
            Err(_) => (adapter.limits(), false),
        };
        // The pipeline cache keeps compiled shaders across processes; timestamp queries time work on the
        // GPU itself (the bench prefers them to wall time).
        // `shader-f64` (desktop Vulkan, lavapipe; never a browser's WebGPU) lets f64 graphs compile.
        let wanted = wgpu::Features::SHADER_F16
            | wgpu::Features::SHADER_F64
            | wgpu::Features::PIPELINE_CACHE
            | wgpu::Features::TIMESTAMP_QUERY;
        let mut required_features = adapter.features() & wanted;
        required_features.set(wgpu::Features::SHADER_F16, f16);
        let checks = ShaderChecks::from_env().map_err(err)?;
        let submit_every = submit_every()?;
        #[cfg(not(target_arch = "wasm32"))]
        let spin = spin(std::env::var("KILN_WGPU_SPIN_US").ok().as_deref(), info.device_type)?;
        let subgroup_size = subgroup_size(&adapter, &info, webgpu_limits);
        required_features.set(wgpu::Features::SUBGROUP, subgroup_size.is_some());
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("kiln"),
                required_features,
                required_limits: limits.clone(),
                ..Default::default()
            })
            .await
            .map_err(|e| err(format!("requesting a device on {}: {e}", info.name)))?;
        let target = Target {
            name: format!("wgpu-{:?}-{}", info.backend, info.name).to_lowercase().replace(' ', "-"),
            max_bindings: limits.max_storage_buffers_per_shader_stage,
            max_threads_per_group: limits
                .max_compute_invocations_per_workgroup
                .min(limits.max_compute_workgroup_size_x),
            max_groups_per_dim: limits.max_compute_workgroups_per_dimension as u64,
            shared_memory_bytes: limits.max_compute_workgroup_storage_size,
            f16_compute: f16,
            float64: required_features.contains(wgpu::Features::SHADER_F64),
            subgroup_size,
            max_buffer_bytes: limits.max_buffer_size,
            max_binding_bytes: limits.max_storage_buffer_binding_size,
            binding_alignment: limits.min_storage_buffer_offset_alignment.into(),
            ..Target::webgpu_default()
        }
        .tuned_by_env("WGPU");
        tracing::info!(target: "kiln::graph", adapter = %info.name, backend = ?info.backend, kind = ?info.device_type, "wgpu adapter");
        let persist = required_features.contains(wgpu::Features::PIPELINE_CACHE);
        let buffer = |label, size, usage| {
            device.create_buffer(&wgpu::BufferDescriptor { label: Some(label), size, usage, mapped_at_creation: false })
        };
        let timestamps = required_features.contains(wgpu::Features::TIMESTAMP_QUERY).then(|| Timestamps {
            queries: device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("kiln timing"),
                ty: wgpu::QueryType::Timestamp,
                count: 2,
            }),
            resolved: buffer("kiln timing", 16, wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC),
            readback: buffer("kiln timing readback", 16, wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST),
            busy: Default::default(),
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
            driver_cache: if persist { driver_cache(&device, &info) } else { None },
            faults,
            lost,
            pending: Mutex::default(),
            checks,
            submit_every,
            #[cfg(not(target_arch = "wasm32"))]
            spin,
            adapter: info,
            device,
            queue,
            target,
            batch: Mutex::default(),
            timestamps,
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

    /// Submits the work recorded so far as one command buffer. The caller holds the batch's lock, and
    /// may record more in order after it (two threads flushing at once must not submit their halves of
    /// the queue's work out of order).
    fn flush(&self, batch: &mut Batch) {
        batch.pass = None;
        let Some(encoder) = batch.encoder.take() else { return };
        self.queue.submit([encoder.finish()]);
        lock(&self.stats).submissions += 1;
        let kernels = std::mem::take(&mut batch.kernels);
        // Natively, validation errors of this submission reach the handler during `finish`/`submit`; a
        // browser reports them later, and `fault` collects those.
        let faults = std::mem::take(&mut *lock(&self.faults));
        if !faults.is_empty() {
            let (names, words) = (kernels.join(", "), faults.join("; "));
            let msg = format!("the device rejected a submission of kernel(s) [{names}]: {words}");
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

    /// Blocks until every submitted piece of work has finished (native only: a browser awaits), polling
    /// for up to [`spin`]'s time first (a blocked thread woke tens of µs after the GPU finished).
    #[cfg(not(target_arch = "wasm32"))]
    fn wait(&self) -> Result<()> {
        let poll = |how| self.device.poll(how).map_err(|e| err(format!("waiting for the device: {e}")));
        let started = web_time::Instant::now();
        while started.elapsed() < self.spin {
            if poll(wgpu::PollType::Poll)?.is_queue_empty() {
                return Ok(());
            }
            std::hint::spin_loop();
        }
        poll(wgpu::PollType::Wait { submission_index: None, timeout: None }).map(|_| ())
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

    /// Records an empty compute pass that writes timestamp `index` (0 at its start, 1 at its end): the
    /// device writes it once the work recorded before has finished.
    fn stamp(&self, t: &Timestamps, index: u32) {
        let mut batch = lock(&self.batch);
        let writes = wgpu::ComputePassTimestampWrites {
            query_set: &t.queries,
            beginning_of_pass_write_index: (index == 0).then_some(0),
            end_of_pass_write_index: (index == 1).then_some(1),
        };
        let desc = wgpu::ComputePassDescriptor { label: Some("kiln timing"), timestamp_writes: Some(writes) };
        drop(batch.encoder(&self.device).begin_compute_pass(&desc));
    }

    /// The bind group of a launch: its buffers, the symbol values (a uniform block), the fault word.
    fn bind_group(&self, p: &Pipeline, kernel: &Kernel, l: &Launch) -> Result<wgpu::BindGroup> {
        let binding = |raw, offset, size: u64| {
            let size = wgpu::BufferSize::new(size.div_ceil(4).max(1) * 4);
            wgpu::BindingResource::Buffer(wgpu::BufferBinding { buffer: buffer_of(raw), offset, size })
        };
        let mut entries: Vec<wgpu::BindGroupEntry> = (l.buffers.iter().enumerate())
            .map(|(i, b)| wgpu::BindGroupEntry { binding: i as u32, resource: binding(b.raw, b.offset, b.bytes) })
            .collect();
        let mut symbols = Vec::new();
        for (s, &v) in kernel.symbols.iter().zip(l.symbols).filter(|_| p.uses_symbols) {
            let v =
                i32::try_from(v).map_err(|_| err(format!("kernel {}: {s} = {v} does not fit in i32", kernel.name)))?;
            symbols.extend(v.to_le_bytes());
        }
        let uniform = p.uses_symbols.then(|| {
            symbols.resize(symbols.len().div_ceil(16).max(1) * 16, 0);
            let usage = wgpu::BufferUsages::UNIFORM;
            let init = wgpu::util::BufferInitDescriptor { label: Some("kiln symbols"), contents: &symbols, usage };
            wgpu::util::DeviceExt::create_buffer_init(&self.device, &init)
        });
        if let Some(u) = &uniform {
            let resource = u.as_entire_binding();
            entries.push(wgpu::BindGroupEntry { binding: kernel.buffers.len() as u32, resource });
        }
        if let Some(f) = l.fault {
            let resource = binding(f.raw, f.offset, f.bytes);
            entries.push(wgpu::BindGroupEntry { binding: crate::render::fault_binding(kernel), resource });
        }
        Ok(self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(&kernel.name),
            layout: &p.pipeline.get_bind_group_layout(0),
            entries: &entries,
        }))
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

    fn alloc(&self, bytes: u64) -> Result<Raw> {
        let size = bytes.div_ceil(4) * 4;
        let usage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST;
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let buffer =
            self.device.create_buffer(&wgpu::BufferDescriptor { label: None, size, usage, mapped_at_creation: false });
        #[cfg(not(target_arch = "wasm32"))]
        if let Some(e) = pollster::block_on(scope.pop()) {
            let what = format!("a buffer ({e})");
            return Err(Error::OutOfMemory { device: "wgpu".into(), what, bytes, limit: None });
        }
        #[cfg(target_arch = "wasm32")]
        drop(scope);
        Ok(Box::new(buffer))
    }

    fn write(&self, dst: &Raw, bytes: &[u8]) -> Result<()> {
        // Work recorded before must see the old contents: submit it first (a write lands before the next
        // submission), holding the batch so no other thread's work slips in between.
        let mut batch = lock(&self.batch);
        self.flush(&mut batch);
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
            // Copied into a staging buffer after the work recorded before, and submitted with it.
            let size = bytes.div_ceil(4) * 4;
            let usage = wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST;
            let desc = wgpu::BufferDescriptor { label: Some("readback"), size, usage, mapped_at_creation: false };
            let staging = self.device.create_buffer(&desc);
            {
                let mut batch = lock(&self.batch);
                batch.encoder(&self.device).copy_buffer_to_buffer(buffer_of(src), 0, &staging, 0, size);
                self.flush(&mut batch);
            }
            self.fault()?;
            let mut out = self.map_read(&staging, size).await?;
            // A browser's errors for the work this read waited on have arrived by now.
            self.fault()?;
            out.truncate(bytes as usize);
            Ok(out)
        })
    }

    fn zero(&self, dst: &Raw, offset: u64, bytes: u64) -> Result<()> {
        let size = Some(bytes.div_ceil(4) * 4);
        lock(&self.batch).encoder(&self.device).clear_buffer(buffer_of(dst), offset, size);
        Ok(())
    }

    fn copy(&self, src: &Raw, dst: &Raw, bytes: u64) -> Result<()> {
        let size = bytes.div_ceil(4) * 4;
        lock(&self.batch).encoder(&self.device).copy_buffer_to_buffer(buffer_of(src), 0, buffer_of(dst), 0, size);
        Ok(())
    }

    fn load(&self, kernel: &Kernel) -> Result<Module> {
        let clock = web_time::Instant::now();
        let shader = render(kernel, self.target.f16_compute).map_err(|e| err(e.to_string()))?;
        validate(&kernel.name, &shader.source).map_err(|e| err(e.to_string()))?;
        tracing::debug!(target: "kiln::output_code", kernel = %kernel.name, "\n{}", shader.source);
        let rendered = web_time::Instant::now();
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let module = self.checks.module(&self.device, &kernel.name, &shader.source);
        let pipeline = self.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(&kernel.name),
            layout: None,
            module: &module,
            entry_point: Some("main"),
            compilation_options: self.checks.compilation_options(),
            cache: self.driver_cache.as_ref().map(|(cache, _)| cache),
        });
        if let Some((data, name)) = self.driver_cache.as_ref().and_then(|(c, name)| Some((c.get_data()?, name))) {
            kiln_graph::cache::store_blob(name, &data);
        }
        #[cfg(not(target_arch = "wasm32"))]
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(err(rejected_source(&kernel.name, "the device", &e, &shader.source)));
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
                    lock(&faults).push(rejected_source(&name, "the device", &e, &source));
                }
            });
        }
        {
            let mut st = lock(&self.stats);
            st.pipelines_created += 1;
            st.render_ms += rendered.duration_since(clock).as_secs_f64() * 1e3;
            st.driver_ms += rendered.elapsed().as_secs_f64() * 1e3;
        }
        Ok(Arc::new(Pipeline { pipeline, name: kernel.name.as_str().into(), uses_symbols: shader.uses_symbols }))
    }

    fn launch(&self, kernel: &Kernel, l: &Launch) -> Result<()> {
        let p = l.module.downcast_ref::<Pipeline>().ok_or_else(|| err("a module of another driver"))?;
        let bind = l.binding(|| self.bind_group(p, kernel, l))?;
        let (x, y, z) = self
            .target
            .fold_grid(l.groups)
            .ok_or_else(|| err(format!("kernel {}: {} workgroups exceed a 3-D grid", kernel.name, l.groups)))?;
        self.fault()?;
        let mut batch = lock(&self.batch);
        let pass = batch.pass(&self.device);
        pass.set_pipeline(&p.pipeline);
        pass.set_bind_group(0, &*bind, &[]);
        pass.dispatch_workgroups(x, y, z);
        batch.kernels.push(p.name.clone());
        Ok(())
    }

    fn submit(&self) -> Result<()> {
        let mut batch = lock(&self.batch);
        if batch.kernels.len() >= self.submit_every {
            self.flush(&mut batch);
        }
        drop(batch);
        self.fault()
    }

    fn synchronize(&self) -> Result<()> {
        let clock = web_time::Instant::now();
        self.flush(&mut lock(&self.batch));
        let submitted = clock.elapsed();
        #[cfg(not(target_arch = "wasm32"))]
        self.wait()?;
        // `KILN_LOGS=launches`: a synchronise's submission and its wait, apart.
        let (submit_us, wait_us) = (submitted.as_secs_f64() * 1e6, (clock.elapsed() - submitted).as_secs_f64() * 1e6);
        tracing::debug!(target: "kiln::launches", submit_us, wait_us, "synchronised");
        self.fault()
    }

    #[cfg(not(target_arch = "wasm32"))]
    fn time(&self, enqueue: &mut dyn FnMut() -> Result<()>) -> Result<Option<f64>> {
        pollster::block_on(self.time_async(enqueue))
    }

    fn time_async(&self, enqueue: &mut dyn FnMut() -> Result<()>) -> kiln_graph::device::TimeFuture<'_> {
        use std::sync::atomic::Ordering::AcqRel;
        // Without timestamp queries, or while another timing's readback is pending: untimed.
        let Some(t) = self.timestamps.as_ref().filter(|t| !t.busy.swap(true, AcqRel)) else {
            return Box::pin(std::future::ready(enqueue().map(|()| None)));
        };
        let busy = Busy(&t.busy);
        self.stamp(t, 0);
        let enqueued = enqueue();
        self.stamp(t, 1);
        {
            let mut batch = lock(&self.batch);
            let encoder = batch.encoder(&self.device);
            encoder.resolve_query_set(&t.queries, 0..2, &t.resolved, 0);
            encoder.copy_buffer_to_buffer(&t.resolved, 0, &t.readback, 0, 16);
            self.flush(&mut batch);
        }
        if let Err(e) = enqueued.and_then(|()| self.fault()) {
            return Box::pin(std::future::ready(Err(e)));
        }
        Box::pin(async move {
            let bytes = self.map_read(&t.readback, 16).await;
            drop(busy);
            let bytes = bytes?;
            let at = |i: usize| u64::from_le_bytes(bytes[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]));
            let ticks = at(1).saturating_sub(at(0));
            Ok(Some(ticks as f64 * f64::from(self.queue.get_timestamp_period()) * 1e-9))
        })
    }

    fn is_lost(&self) -> bool {
        lock(&self.lost).is_some()
    }

    fn timing(&self) -> &'static str {
        if self.timestamps.is_some() {
            "timestamp queries"
        } else {
            "fenced wall time"
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_wait_polls_on_a_gpu_and_blocks_on_a_cpu_adapter_unless_told() {
        assert_eq!(spin(None, wgpu::DeviceType::DiscreteGpu).unwrap(), Duration::from_micros(2_000));
        assert_eq!(spin(None, wgpu::DeviceType::Cpu).unwrap(), Duration::ZERO);
        assert_eq!(spin(Some(" 150 "), wgpu::DeviceType::Cpu).unwrap(), Duration::from_micros(150));
        assert_eq!(spin(Some("0"), wgpu::DeviceType::IntegratedGpu).unwrap(), Duration::ZERO);
        let e = spin(Some("-1"), wgpu::DeviceType::DiscreteGpu).unwrap_err().to_string();
        assert!(e.contains("KILN_WGPU_SPIN_US=-1"), "{e}");
    }
}
