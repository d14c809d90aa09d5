//! The wgpu runtime: picks an adapter, requests a device with the limits kiln uses, describes it as a
//! `Target`, and runs compiled graphs — buffers from the plan, one pipeline per distinct shader, bind
//! groups, dispatches folded into 2-D/3-D grids past the per-dimension limit, and readback.

use crate::render::render;
use crate::storage::Storage;
use crate::validate::validate;
use kiln_graph::kernel::Kernel;
use kiln_graph::sym::Bindings;
use kiln_graph::{CompiledGraph, Error, Result, Target, TensorData};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

fn err(msg: impl Into<String>) -> Error {
    Error::Backend { backend: "wgpu".into(), msg: msg.into() }
}

/// A wgpu device ready to run kiln kernels.
pub struct Gpu {
    /// The adapter as the driver reports it.
    pub adapter: wgpu::AdapterInfo,
    device: wgpu::Device,
    queue: wgpu::Queue,
    f16: bool,
    target: Target,
    pipelines: RefCell<HashMap<String, Rc<wgpu::ComputePipeline>>>,
    /// The driver's pipeline cache, persisted next to kiln's compile cache when the adapter has one.
    driver_cache: Option<DriverCache>,
    stats: RefCell<GpuStats>,
    /// Free device buffers by size class (powers of two), reused across runs.
    pool: RefCell<HashMap<u64, Vec<wgpu::Buffer>>>,
    /// Two timestamps around a launch, where the adapter has timestamp queries.
    timestamps: Option<Timestamps>,
}

/// A query set for two timestamps and the buffers they are resolved into and read back from.
struct Timestamps {
    queries: wgpu::QuerySet,
    resolved: wgpu::Buffer,
    readback: wgpu::Buffer,
}

/// What the runtime spent compiling, for compile statistics.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuStats {
    /// Pipelines created (a shader the driver compiled).
    pub pipelines_created: usize,
    /// Kernels served by an existing pipeline (same code).
    pub pipelines_reused: usize,
    /// Time rendering WGSL and validating it with naga, ms.
    pub render_ms: f64,
    /// Time the driver spent creating pipelines, ms.
    pub driver_ms: f64,
}

/// A persisted `wgpu::PipelineCache`: the driver's compiled shaders survive the process, so a warm start
/// skips most of pipeline creation (the part of a cold compile that is not kiln's).
struct DriverCache {
    cache: wgpu::PipelineCache,
    file: std::path::PathBuf,
    dirty: std::cell::Cell<bool>,
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
        Some(DriverCache { cache, file, dirty: std::cell::Cell::new(false) })
    }

    fn save(&self) {
        if !self.dirty.replace(false) {
            return;
        }
        let Some(data) = self.cache.get_data() else { return };
        let mut bytes = blake3::hash(&data).as_bytes().to_vec();
        bytes.extend(data);
        let tmp = self.file.with_extension(format!("{}.tmp", std::process::id()));
        let ok = self.file.parent().is_some_and(|d| std::fs::create_dir_all(d).is_ok())
            && std::fs::write(&tmp, bytes).is_ok();
        if !ok || std::fs::rename(&tmp, &self.file).is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
    }
}

/// A monotonic instant where the platform has one (not on the web, where timings read as zero).
#[cfg(not(target_arch = "wasm32"))]
fn web_time_now() -> Option<std::time::Instant> {
    Some(std::time::Instant::now())
}

#[cfg(target_arch = "wasm32")]
fn web_time_now() -> Option<std::time::Instant> {
    None
}

fn elapsed_ms(from: Option<std::time::Instant>, to: Option<std::time::Instant>) -> f64 {
    match (from, to) {
        (Some(a), Some(b)) => b.duration_since(a).as_secs_f64() * 1e3,
        _ => 0.0,
    }
}

/// Ranks adapters: real GPUs first, then software ones; Vulkan/Metal/DX12 over GL.
fn score(info: &wgpu::AdapterInfo) -> i32 {
    let kind = match info.device_type {
        wgpu::DeviceType::DiscreteGpu => 40,
        wgpu::DeviceType::IntegratedGpu => 30,
        wgpu::DeviceType::VirtualGpu => 20,
        wgpu::DeviceType::Cpu => 10,
        wgpu::DeviceType::Other => 0,
    };
    let api = match info.backend {
        wgpu::Backend::Vulkan | wgpu::Backend::Metal | wgpu::Backend::Dx12 | wgpu::Backend::BrowserWebGpu => 5,
        _ => 0,
    };
    kind + api
}

/// How to get an adapter here, for the error when none is found.
pub const NO_ADAPTER_HINT: &str = "no GPU adapter found: install a Vulkan driver (on Debian/Ubuntu without a GPU: \
     `apt-get install -y mesa-vulkan-drivers libvulkan1` for lavapipe), or set KILN_WGPU_ADAPTER to one of the \
     listed adapters";

impl Gpu {
    /// Opens the best adapter (or the one whose name contains `KILN_WGPU_ADAPTER`).
    pub async fn new_async() -> Result<Gpu> {
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
        let adapters = instance.enumerate_adapters(wgpu::Backends::all()).await;
        let wanted = std::env::var("KILN_WGPU_ADAPTER").ok();
        let names: Vec<String> = adapters
            .iter()
            .map(|a| a.get_info())
            .map(|i| format!("{} ({:?}, {:?})", i.name, i.backend, i.device_type))
            .collect();
        let adapter = adapters
            .into_iter()
            .filter(|a| wanted.as_ref().is_none_or(|w| a.get_info().name.to_lowercase().contains(&w.to_lowercase())))
            .filter(|a| a.get_info().backend != wgpu::Backend::Noop)
            .max_by_key(|a| score(&a.get_info()))
            .ok_or_else(|| err(format!("{NO_ADAPTER_HINT}; adapters present: [{}]", names.join(", "))))?;
        let info = adapter.get_info();
        // KILN_WGPU_NO_F16=1 ignores `shader-f16`, so tests cover the packed-f16 path on any adapter.
        let f16 =
            adapter.features().contains(wgpu::Features::SHADER_F16) && std::env::var_os("KILN_WGPU_NO_F16").is_none();
        let limits = adapter.limits();
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
        Ok(Gpu {
            adapter: info,
            device,
            queue,
            f16,
            target,
            pipelines: RefCell::new(HashMap::new()),
            driver_cache,
            stats: RefCell::new(GpuStats::default()),
            pool: RefCell::new(HashMap::new()),
            timestamps,
        })
    }

    /// Blocking [`Gpu::new_async`] for native code.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn new() -> Result<Gpu> {
        pollster::block_on(Self::new_async())
    }

    /// True for a CPU implementation of the API (lavapipe, SwiftShader, WARP): correct, not fast.
    pub fn is_software(&self) -> bool {
        self.adapter.device_type == wgpu::DeviceType::Cpu
    }

    /// Forgets compiled pipelines (the bench measures cold compiles with it).
    pub fn clear_pipelines(&self) {
        self.pipelines.borrow_mut().clear();
    }

    /// The device as kiln's pipeline sees it.
    pub fn target(&self) -> &Target {
        &self.target
    }

    /// One line naming the adapter, its API and kind (never mistake lavapipe or GL for a GPU).
    pub fn describe(&self) -> String {
        format!(
            "{} ({:?}, {:?}, driver {})",
            self.adapter.name, self.adapter.backend, self.adapter.device_type, self.adapter.driver_info
        )
    }

    /// Pipelines created and reused, and time spent rendering and in the driver, so far.
    pub fn stats(&self) -> GpuStats {
        self.stats.borrow().clone()
    }

    async fn pipeline(&self, kernel: &Kernel) -> Result<(Rc<wgpu::ComputePipeline>, bool)> {
        let clock = web_time_now();
        let shader = render(kernel, self.f16).map_err(|e| err(e.to_string()))?;
        // Keyed by the code, not the kernel's name: identical kernels (64 equal layers) share a pipeline.
        let key: String = shader.source.lines().filter(|l| !l.starts_with("// ")).collect::<Vec<_>>().join("\n");
        if let Some(p) = self.pipelines.borrow().get(&key) {
            self.stats.borrow_mut().pipelines_reused += 1;
            return Ok((p.clone(), shader.uses_symbols));
        }
        validate(&kernel.name, &shader.source).map_err(|e| err(e.to_string()))?;
        tracing::debug!(target: "kiln::output_code", kernel = %kernel.name, "\n{}", shader.source);
        let rendered = web_time_now();
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
            d.dirty.set(true);
        }
        if let Some(e) = scope.pop().await {
            let numbered: String =
                shader.source.lines().enumerate().map(|(i, l)| format!("{:4} | {l}\n", i + 1)).collect();
            return Err(err(format!("kernel {}: the device rejected the shader: {e}\n{numbered}", kernel.name)));
        }
        {
            let mut st = self.stats.borrow_mut();
            st.pipelines_created += 1;
            st.render_ms += elapsed_ms(clock, rendered);
            st.driver_ms += elapsed_ms(rendered, web_time_now());
        }
        let p = Rc::new(pipeline);
        self.pipelines.borrow_mut().insert(key, p.clone());
        Ok((p, shader.uses_symbols))
    }

    fn grid(&self, groups: u64) -> Result<(u32, u32, u32)> {
        self.target.fold_grid(groups).ok_or_else(|| err(format!("{groups} workgroups exceed a 3-D grid")))
    }

    /// Blocking [`Gpu::run_async`] for native code.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn run(&self, c: &CompiledGraph, inputs: &[&TensorData]) -> Result<Vec<TensorData>> {
        pollster::block_on(self.run_async(c, inputs))
    }

    /// Runs a compiled graph: uploads `inputs`, launches every kernel in one submission, reads the outputs.
    /// Asynchronous underneath, so the same code serves the browser, which cannot block.
    pub async fn run_async(&self, c: &CompiledGraph, inputs: &[&TensorData]) -> Result<Vec<TensorData>> {
        let prepared = self.prepare(c, inputs).await?;
        self.launch(&prepared);
        let out = match self.check_faults(c, &prepared).await {
            Ok(()) => self.read(&prepared).await,
            Err(e) => Err(e),
        };
        self.recycle(prepared);
        out
    }

    /// Returns a prepared graph's buffers to the pool for later runs.
    pub fn recycle(&self, p: Prepared) {
        let mut pool = self.pool.borrow_mut();
        for b in p.buffers.into_iter().chain([p.faults]) {
            pool.entry(b.size()).or_default().push(b);
        }
    }

    /// A storage buffer of at least `size` bytes: from the pool when one of its size class is free. A
    /// size past what one binding may cover is a typed error naming `what`, never a driver panic.
    fn buffer(&self, size: u64, what: &str) -> Result<wgpu::Buffer> {
        let limits = self.device.limits();
        let max_binding = limits.max_storage_buffer_binding_size;
        if size > max_binding || size > limits.max_buffer_size {
            return Err(Error::OutOfMemory {
                device: "wgpu".into(),
                what: format!("{what} (one storage binding on {})", self.adapter.name),
                bytes: size,
                limit: Some(max_binding.min(limits.max_buffer_size)),
            });
        }
        // Size classes are powers of two from 256 bytes, so a model whose shapes vary a little reuses
        // buffers instead of allocating per call; a class past the device's largest buffer is not used.
        let class = size.max(256).next_power_of_two();
        let class = if class > limits.max_buffer_size { size.div_ceil(256) * 256 } else { class };
        if let Some(b) = self.pool.borrow_mut().get_mut(&class).and_then(Vec::pop) {
            return Ok(b);
        }
        let usage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST;
        Ok(self.device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: class,
            usage,
            mapped_at_creation: false,
        }))
    }

    /// Binds a compiled graph to device memory: buffers from the plan, inputs uploaded, one pipeline per
    /// distinct shader, bind groups made once. [`Gpu::launch`] then replays it as one submission.
    pub async fn prepare(&self, c: &CompiledGraph, inputs: &[&TensorData]) -> Result<Prepared> {
        let bindings = c.bindings(inputs)?;
        // Device bytes per plan buffer: the widest value placed in it, in its device layout (a multiple of
        // 16 so vector bindings cover whole vectors).
        let sizes = c.buffer_bytes(&bindings, |d, n| Storage::of(d, self.f16).bytes(n) as u64)?;
        let bytes_moved = c.traffic_bytes(&bindings)?;
        let oom = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let buffers = sizes.iter().enumerate().map(|(i, &size)| self.buffer(size, &format!("plan buffer {i}")));
        let buffers: Result<Vec<wgpu::Buffer>> = buffers.collect();
        // One fault word per kernel with run-time checks, each at its own aligned offset.
        let fault_kernels: Vec<usize> = c.checked_launches().into_iter().map(|(_, k)| k).collect();
        let stride = u64::from(self.device.limits().min_storage_buffer_offset_alignment).max(4);
        let faults = self.buffer(stride * fault_kernels.len().max(1) as u64, "fault words");
        let popped = oom.pop().await;
        let (buffers, faults) = (buffers?, faults?);
        if let Some(e) = popped {
            return Err(Error::OutOfMemory {
                device: "wgpu".into(),
                what: format!("the buffers of a graph ({e})"),
                bytes: sizes.iter().sum::<u64>(),
                limit: None,
            });
        }
        let mut dispatches = Vec::new();
        let mut uniforms = Vec::new();
        for &ki in &c.plan.launches {
            let kernel = &c.kernels[ki];
            let groups = kernel.launch.groups.eval(&bindings)?.max(0) as u64;
            if groups == 0 {
                continue;
            }
            let (pipeline, uses_symbols) = self.pipeline(kernel).await?;
            let mut entries: Vec<wgpu::BindGroupEntry> = kernel
                .buffers
                .iter()
                .enumerate()
                .map(|(i, b)| {
                    // Bind the range the plan uses: the pooled buffer may be larger than one binding allows.
                    let slot = c.plan.value_buffer[&b.node];
                    wgpu::BindGroupEntry {
                        binding: i as u32,
                        resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                            buffer: &buffers[slot],
                            offset: 0,
                            size: wgpu::BufferSize::new(sizes[slot]),
                        }),
                    }
                })
                .collect();
            if let Some(slot) = fault_kernels.iter().position(|&k| k == ki) {
                entries.push(wgpu::BindGroupEntry {
                    binding: crate::render::fault_binding(kernel),
                    resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer: &faults,
                        offset: stride * slot as u64,
                        size: wgpu::BufferSize::new(4),
                    }),
                });
            }
            if uses_symbols {
                uniforms.push(self.symbol_block(kernel, &bindings)?);
                entries.push(wgpu::BindGroupEntry {
                    binding: kernel.buffers.len() as u32,
                    resource: uniforms[uniforms.len() - 1].as_entire_binding(),
                });
            }
            let bind = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some(&kernel.name),
                layout: &pipeline.get_bind_group_layout(0),
                entries: &entries,
            });
            dispatches.push(Dispatch { pipeline, bind, grid: self.grid(groups)? });
        }
        if let Some(d) = &self.driver_cache {
            d.save();
        }
        let outputs = c.output_slots(&bindings)?;
        let io_bytes = c.io_bytes(&bindings)?;
        let prepared = Prepared {
            buffers,
            sizes,
            dispatches,
            _uniforms: uniforms,
            outputs,
            bytes_moved,
            io_bytes,
            faults,
            fault_kernels,
            fault_stride: stride,
        };
        for (b, data) in c.input_buffers().into_iter().zip(inputs) {
            self.upload(&prepared, b, data);
        }
        Ok(prepared)
    }

    /// Writes host data into plan buffer `buffer` of a prepared graph.
    pub fn upload(&self, p: &Prepared, buffer: usize, data: &TensorData) {
        let mut bytes = Storage::of(data.dtype(), self.f16).encode(data);
        bytes.resize(bytes.len().div_ceil(4) * 4, 0);
        if !bytes.is_empty() {
            self.queue.write_buffer(&p.buffers[buffer], 0, &bytes);
        }
    }

    /// Records every kernel of a prepared graph into one command buffer and submits it.
    pub fn launch(&self, p: &Prepared) {
        self.queue.submit([self.encode(p, None).finish()]);
    }

    /// One compute pass over every dispatch of `p`, with timestamps at its start and end when given.
    fn encode(&self, p: &Prepared, timestamps: Option<&Timestamps>) -> wgpu::CommandEncoder {
        let mut encoder = self.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("kiln") });
        if !p.fault_kernels.is_empty() {
            encoder.clear_buffer(&p.faults, 0, None);
        }
        {
            // One pass for the whole graph: WebGPU orders storage writes between dispatches of a pass, and a
            // pass per kernel costs a barrier and bookkeeping each on some drivers.
            let timestamp_writes = timestamps.map(|t| wgpu::ComputePassTimestampWrites {
                query_set: &t.queries,
                beginning_of_pass_write_index: Some(0),
                end_of_pass_write_index: Some(1),
            });
            let mut pass =
                encoder.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some("kiln"), timestamp_writes });
            for d in &p.dispatches {
                pass.set_pipeline(&d.pipeline);
                pass.set_bind_group(0, &d.bind, &[]);
                pass.dispatch_workgroups(d.grid.0, d.grid.1, d.grid.2);
            }
        }
        if let Some(t) = timestamps {
            encoder.resolve_query_set(&t.queries, 0..2, &t.resolved, 0);
            encoder.copy_buffer_to_buffer(&t.resolved, 0, &t.readback, 0, 16);
        }
        encoder
    }

    /// Whether [`Gpu::time_launch`] can time on the GPU (the adapter has timestamp queries).
    pub fn has_timestamps(&self) -> bool {
        self.timestamps.is_some()
    }

    /// Seconds one launch of `p` takes on the GPU, between timestamps written at the start and the end of
    /// its compute pass; `None` where the adapter has no timestamp queries.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn time_launch(&self, p: &Prepared) -> Result<Option<f64>> {
        let Some(t) = &self.timestamps else { return Ok(None) };
        self.queue.submit([self.encode(p, Some(t)).finish()]);
        let (tx, rx) = std::sync::mpsc::channel();
        t.readback.map_async(wgpu::MapMode::Read, .., move |r| {
            let _ = tx.send(r);
        });
        self.wait()?;
        rx.recv()
            .map_err(|_| err("the device was lost while timing"))?
            .map_err(|e| err(format!("reading timestamps: {e}")))?;
        let ticks = {
            let view = t.readback.get_mapped_range(..).map_err(|e| err(format!("reading timestamps: {e}")))?;
            let at = |i: usize| u64::from_le_bytes(view[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]));
            at(1).saturating_sub(at(0))
        };
        t.readback.unmap();
        Ok(Some(ticks as f64 * f64::from(self.queue.get_timestamp_period()) * 1e-9))
    }

    /// Blocks until every submitted launch has finished (native only; a browser awaits readback instead).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn wait(&self) -> Result<()> {
        self.device
            .poll(wgpu::PollType::Wait { submission_index: None, timeout: None })
            .map(|_| ())
            .map_err(|e| err(format!("waiting for the device: {e}")))
    }

    /// Reads the fault words of the last run of `p` and turns the first nonzero one into the error it
    /// stands for.
    pub async fn check_faults(&self, c: &CompiledGraph, p: &Prepared) -> Result<()> {
        if p.fault_kernels.is_empty() {
            return Ok(());
        }
        let size = p.fault_stride * p.fault_kernels.len() as u64;
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("fault readback"),
            size,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut encoder = self.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("faults") });
        encoder.copy_buffer_to_buffer(&p.faults, 0, &staging, 0, size);
        self.queue.submit([encoder.finish()]);
        let (tx, rx) = futures_channel::oneshot::channel();
        staging.map_async(wgpu::MapMode::Read, .., move |r| {
            let _ = tx.send(r);
        });
        #[cfg(not(target_arch = "wasm32"))]
        self.wait()?;
        rx.await
            .map_err(|_| err("the device was lost before readback"))?
            .map_err(|e| err(format!("reading faults: {e}")))?;
        let view = staging.get_mapped_range(..).map_err(|e| err(format!("reading faults: {e}")))?;
        for (slot, &k) in p.fault_kernels.iter().enumerate() {
            let at = (p.fault_stride * slot as u64) as usize;
            c.check_fault(k, u32::from_le_bytes([view[at], view[at + 1], view[at + 2], view[at + 3]]))?;
        }
        Ok(())
    }

    /// Reads a prepared graph's outputs back to the host.
    pub async fn read(&self, p: &Prepared) -> Result<Vec<TensorData>> {
        let mut encoder =
            self.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("readback") });
        let mut staging = Vec::new();
        for &(b, _, _) in &p.outputs {
            let s = self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("readback"),
                size: p.sizes[b],
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            encoder.copy_buffer_to_buffer(&p.buffers[b], 0, &s, 0, p.sizes[b]);
            staging.push(s);
        }
        self.queue.submit([encoder.finish()]);
        let mut pending = Vec::with_capacity(staging.len());
        for s in &staging {
            let (tx, rx) = futures_channel::oneshot::channel();
            s.map_async(wgpu::MapMode::Read, .., move |r| {
                let _ = tx.send(r);
            });
            pending.push(rx);
        }
        // Native code drives the device here; in a browser the event loop does.
        #[cfg(not(target_arch = "wasm32"))]
        self.wait()?;
        let mut out = Vec::with_capacity(staging.len());
        for ((s, rx), (_, dims, dtype)) in staging.iter().zip(pending).zip(&p.outputs) {
            rx.await
                .map_err(|_| err("the device was lost before readback"))?
                .map_err(|e| err(format!("reading back: {e}")))?;
            let view = s.get_mapped_range(..).map_err(|e| err(format!("reading back: {e}")))?;
            out.push(Storage::of(*dtype, self.f16).decode(&view, dims, *dtype)?);
        }
        Ok(out)
    }

    fn symbol_block(&self, kernel: &Kernel, b: &Bindings) -> Result<wgpu::Buffer> {
        let mut bytes = Vec::new();
        for s in &kernel.symbols {
            let v = b.get(*s).ok_or_else(|| err(format!("kernel {}: symbol {s} has no value", kernel.name)))?;
            let v =
                i32::try_from(v).map_err(|_| err(format!("kernel {}: {s} = {v} does not fit in i32", kernel.name)))?;
            bytes.extend(v.to_le_bytes());
        }
        bytes.resize(bytes.len().div_ceil(16).max(1) * 16, 0);
        let buf = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("kiln symbols"),
            size: bytes.len() as u64,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        self.queue.write_buffer(&buf, 0, &bytes);
        Ok(buf)
    }
}

struct Dispatch {
    pipeline: Rc<wgpu::ComputePipeline>,
    bind: wgpu::BindGroup,
    grid: (u32, u32, u32),
}

/// A compiled graph bound to device memory, ready to launch again and again (the reduce-overhead mode of
/// wgpu: one pre-built submission, bind groups made once).
pub struct Prepared {
    buffers: Vec<wgpu::Buffer>,
    sizes: Vec<u64>,
    dispatches: Vec<Dispatch>,
    /// Fault words of the kernels with run-time checks (`fault_kernels`), `fault_stride` bytes apart.
    faults: wgpu::Buffer,
    fault_kernels: Vec<usize>,
    fault_stride: u64,
    _uniforms: Vec<wgpu::Buffer>,
    outputs: Vec<(usize, Vec<usize>, kiln_graph::DType)>,
    /// Bytes every launch reads and writes (each kernel's buffers, in their dtypes).
    pub bytes_moved: u64,
    /// Bytes the computation itself must move: its inputs read once, its outputs written once. Achieved
    /// bandwidth is quoted against this, as for any implementation.
    pub io_bytes: u64,
}

impl Prepared {
    /// Kernel launches per run.
    pub fn launches(&self) -> usize {
        self.dispatches.len()
    }
}

/// kiln's wgpu backend.
#[derive(Clone)]
pub struct WgpuBackend {
    gpu: Rc<Gpu>,
}

impl WgpuBackend {
    /// Opens the best adapter; errors say what to install when there is none.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn new() -> Result<Self> {
        Ok(WgpuBackend { gpu: Rc::new(Gpu::new()?) })
    }

    /// Opens the best adapter without blocking (the browser's way).
    pub async fn new_async() -> Result<Self> {
        Ok(WgpuBackend { gpu: Rc::new(Gpu::new_async().await?) })
    }

    /// The device.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }
}

impl kiln_graph::Backend for WgpuBackend {
    fn name(&self) -> &str {
        "wgpu"
    }

    fn target(&self) -> Option<&Target> {
        Some(self.gpu.target())
    }

    #[cfg(not(target_arch = "wasm32"))]
    fn run_compiled(&self, compiled: &CompiledGraph, inputs: &[&TensorData]) -> Result<Vec<TensorData>> {
        self.gpu.run(compiled, inputs)
    }
}

impl kiln_graph::IntoBackend for WgpuBackend {
    fn into_backend(self) -> Result<Rc<dyn kiln_graph::Backend>> {
        Ok(Rc::new(self))
    }
}
