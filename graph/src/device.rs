//! The `Driver` trait: the little a device must do for kiln — allocate, move bytes, load a kernel, launch
//! it — so that everything else about running compiled graphs (the buffer pool, binding a plan, launch
//! order, the module cache, fault words, capture policy, memory statistics) is written once, in
//! [`crate::runtime`]. CUDA and wgpu implement it thinly; the kernel interpreter implements it over host
//! memory, so the runtime core is tested without a GPU.
//!
//! Work is ordered as the device orders it (a CUDA stream, a wgpu queue): a driver may return from
//! `launch` before the kernel ran; `read` waits for exactly the work before it.

pub use crate::binding::BindingCache;
use crate::error::{Error, Result};
use crate::kernel::Kernel;
use crate::loc::SourceLoc;
use crate::sym::Bindings;
use crate::target::Target;
use std::any::Any;
use std::sync::Arc;

/// A device allocation as the driver made it (a `CudaSlice`, a `wgpu::Buffer`, host bytes). The runtime
/// owns it and gives it back to the driver's pool; only the driver looks inside.
pub type Raw = Box<dyn Any + Send + Sync>;

/// A kernel loaded on a device (a CUDA function, a wgpu pipeline), cached by the runtime under the
/// kernel's structural id so equal kernels load once.
pub type Module = Arc<dyn Any + Send + Sync>;

/// One bound buffer of a launch: the allocation and the bytes of it the kernel may touch.
#[derive(Clone, Copy)]
pub struct Bound<'a> {
    /// The allocation.
    pub raw: &'a Raw,
    /// The allocation's identity: it keeps it while pooled and handed out again, and no other
    /// allocation ever gets it (the [`BindingCache`] keys on it).
    pub id: u64,
    /// Bytes the kernel may touch, from offset 0.
    pub bytes: u64,
    /// Byte offset of the binding (fault words sit at offsets of one shared allocation).
    pub offset: u64,
}

/// Everything one launch needs.
pub struct Launch<'a> {
    /// One binding per kernel buffer, in the kernel's order.
    pub buffers: &'a [Bound<'a>],
    /// The value of each of the kernel's symbols, in its order.
    pub symbols: &'a [i64],
    /// The symbol values of the whole run (GEMM descriptions evaluate their sizes with them).
    pub bindings: &'a Bindings,
    /// The fault word, for kernels with run-time checks.
    pub fault: Option<Bound<'a>>,
    /// Device workgroups to launch ([`crate::kernel::Launch::device_groups`]; the driver folds them into
    /// a grid with [`Target::fold_grid`]), each of [`crate::kernel::Launch::device_threads`] threads.
    pub groups: u64,
    /// The loaded kernel.
    pub module: &'a Module,
    /// Where [`Launch::binding`] keeps what the driver makes for a binding.
    pub cache: &'a BindingCache,
    /// The device waits for the collectives running beside the kernels before this launch
    /// ([`crate::plan::Plan::waits`]).
    pub wait: bool,
}

/// The bytes of an asynchronous read.
pub type ReadFuture<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = Result<Vec<u8>>> + 'a>>;

/// Seconds the device spent on timed work, once its timestamps are back (`None`: it cannot time itself).
pub type TimeFuture<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = Result<Option<f64>>> + 'a>>;

/// A recorded sequence of launches that replays with one call (a CUDA graph).
pub type Recording = Box<dyn Any + Send + Sync>;

/// What a driver makes for one kernel bound to particular buffers (a wgpu bind group, a cuBLAS call
/// plan), kept by the runtime's [`BindingCache`] and found through [`Launch::binding`].
pub type Binding = Arc<dyn Any + Send + Sync>;

/// What kiln needs from a device. See the module docs.
pub trait Driver: Send + Sync + 'static {
    /// Backend name (`cuda`, `wgpu`, `cpu-kernels`).
    fn name(&self) -> &'static str;
    /// The device described for the compiler.
    fn target(&self) -> &Target;
    /// The device in words, for reports.
    fn describe(&self) -> String;
    /// The driver itself, so tools (the bench) can reach device-specific extras.
    fn as_any(&self) -> &dyn Any;
    /// A fresh allocation of `bytes`; [`Error::OutOfMemory`] when the device has no room.
    fn alloc(&self, bytes: u64) -> Result<Raw>;
    /// Writes `bytes` at the start of `dst`, ordered after the work enqueued before.
    fn write(&self, dst: &Raw, bytes: &[u8]) -> Result<()>;
    /// `buffer` (of `bytes`) goes back to the runtime's pool now: whatever the driver still has queued
    /// for it beside the queue (an upload on a copy stream) is ordered before the work queued next, and,
    /// when `mark`, the driver says where its queue stands — the runtime keeps the mark with the
    /// buffer, and [`Driver::write_after`] may fill it beside later work once the device has passed the
    /// mark. `None` (the default): this driver writes in queue order only.
    fn freed(&self, buffer: &Raw, bytes: u64, mark: bool) -> Option<u64> {
        let _ = (buffer, bytes, mark);
        None
    }
    /// Whether an upload of `bytes` into a marked buffer ([`Driver::freed`]) would run beside the
    /// queue: the runtime starts marking freed buffers at the first such upload into a reused one.
    fn uploads_beside(&self, bytes: u64) -> bool {
        let _ = bytes;
        false
    }
    /// [`Driver::write`] into a buffer whose earlier contents the device needs no more once it has
    /// passed `free_at` (`None`: after every piece of work enqueued before, as `write`); work enqueued
    /// after this call that uses the buffer sees the bytes. By default [`Driver::write`].
    fn write_after(&self, dst: &Raw, bytes: &[u8], free_at: Option<u64>) -> Result<()> {
        let _ = free_at;
        self.write(dst, bytes)
    }
    /// Reads the first `bytes` of `src` once the work enqueued before has finished.
    fn read(&self, src: &Raw, bytes: u64) -> Result<Vec<u8>>;
    /// [`Driver::read`] without blocking: what a browser, which cannot block, uses (and async callers).
    fn read_async<'a>(&'a self, src: &'a Raw, bytes: u64) -> ReadFuture<'a> {
        Box::pin(std::future::ready(self.read(src, bytes)))
    }
    /// Zeroes `bytes` of `dst` from `offset`, in order with launches.
    fn zero(&self, dst: &Raw, offset: u64, bytes: u64) -> Result<()>;
    /// Copies `bytes` from `src` to `dst` on the device, in order with launches.
    fn copy(&self, src: &Raw, dst: &Raw, bytes: u64) -> Result<()>;
    /// Renders and loads a kernel (a library GEMM loads nothing).
    fn load(&self, kernel: &Kernel) -> Result<Module>;
    /// Renders and loads several kernels, one result each: the batch a graph's first run needs. A driver
    /// whose compiler runs faster side by side (CUDA: ptxas processes on every core) overrides it.
    fn load_many(&self, kernels: &[&Kernel]) -> Vec<Result<Module>> {
        kernels.iter().map(|k| self.load(k)).collect()
    }
    /// Enqueues one launch of a loaded kernel.
    fn launch(&self, kernel: &Kernel, launch: &Launch) -> Result<()>;
    /// Makes the work enqueued after it wait for the collectives still running beside the kernels (a
    /// bucket of all-reduces runs on a stream of its own from its launch on). A driver that runs no
    /// collectives has none to wait for.
    fn wait_collectives(&self) -> Result<()> {
        Ok(())
    }
    /// Ends a run's enqueueing: the work may go to the device now (wgpu submits its command buffer once
    /// enough dispatches are recorded, and before any read, write, wait or timing; stream-ordered
    /// drivers need nothing).
    fn submit(&self) -> Result<()> {
        Ok(())
    }
    /// Waits until every enqueued piece of work has finished.
    fn synchronize(&self) -> Result<()>;
    /// Records the launches `enqueue` makes into something [`Driver::replay`] runs with one call;
    /// `None` where the device has no such thing (then the runtime launches again each time).
    fn record(&self, enqueue: &mut dyn FnMut() -> Result<()>) -> Result<Option<Recording>> {
        let _ = enqueue;
        Ok(None)
    }
    /// Replays a recording.
    fn replay(&self, recording: &Recording) -> Result<()> {
        let _ = recording;
        Err(Error::Unsupported { what: format!("{}: graph replay", self.name()), loc: SourceLoc::internal() })
    }
    /// Seconds the device spent on the work `enqueue` makes, timed on the device (events, timestamp
    /// queries); `None` where it cannot time itself.
    fn time(&self, enqueue: &mut dyn FnMut() -> Result<()>) -> Result<Option<f64>> {
        let _ = enqueue;
        Ok(None)
    }
    /// [`Driver::time`] without blocking, for a browser (and async callers): `enqueue` runs at once, the
    /// future waits for the timestamps. By default the blocking [`Driver::time`], already finished.
    fn time_async(&self, enqueue: &mut dyn FnMut() -> Result<()>) -> TimeFuture<'_> {
        Box::pin(std::future::ready(self.time(enqueue)))
    }
    /// How [`Driver::time`] times (`CUDA events`, `timestamp queries`).
    fn timing(&self) -> &'static str {
        "fenced wall time"
    }
    /// Device bytes the driver holds outside the runtime's pool (a GEMM library's workspace), counted in
    /// [`crate::runtime::MemoryStats::scratch`] so a peak compares with a framework whose allocator hands
    /// out such scratch too.
    fn scratch_bytes(&self) -> u64 {
        0
    }
    /// Whether the device told the driver it is lost (wgpu's lost callback), before any call failed.
    fn is_lost(&self) -> bool {
        false
    }
}
