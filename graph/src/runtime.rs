//! The one runtime core: runs compiled graphs on any [`Driver`]. Written once for every device:
//!
//! - **Buffers** are pooled by size class (powers of two from 256 bytes, exact past the device's largest
//!   buffer) and handed out as [`DeviceBuffer`]s that return to the pool when dropped. An allocation
//!   that fails frees the pool and tries once more before it is [`Error::OutOfMemory`].
//! - **Binding a plan**: graph inputs are the caller's device tensors, bound in place (never copied);
//!   outputs get fresh buffers the caller keeps; intermediates come from the pool and go back after the
//!   run. Work is ordered on the device (one stream / queue), so a buffer returned to the pool may be
//!   handed to the next run at once. An upload may run beside the kernels instead (CUDA's copy
//!   stream): a freed buffer keeps the driver's mark of where the queue stood ([`Driver::freed`]), and
//!   an upload into it waits for the device to pass that mark only ([`Driver::write_after`]).
//! - **Modules** load once per kernel structure ([`CompiledGraph::kernel_ids`]): a miss renders, a hit
//!   renders nothing.
//! - **Fault words** (run-time checks, see [`crate::kernel::FaultSite`]) are zeroed before a run and read
//!   at the next host read — the first time the host waits anyway — so a checked kernel never adds a
//!   synchronisation. A fault is reported then, naming the op and the user's line.
//! - **Capture**: reduce-overhead mode records a run per compiled graph and symbol values
//!   ([`Driver::record`]); replays copy inputs that live elsewhere into the recorded buffers, and a step
//!   fed its own last outputs gets a partner recording so that state passes in place (`recorded.rs`).
//!   Outputs are the recorded buffers themselves; one a caller keeps across a call is copied out from
//!   then on (a replay overwrites its own buffers). Both copies are counted in [`RuntimeStats`].
//! - **Bindings**: what a driver makes for a kernel bound to particular buffers (a bind group, a GEMM
//!   plan) is kept in one [`BindingCache`] for every driver; pooled buffers keep their identity, so a
//!   call that binds the buffers of the call before makes nothing.
//! - **The gate**: every driver call holds the device shared; a recording holds it alone, so no other
//!   thread's launch, allocation or free lands inside a capture (a CUDA stream being captured records
//!   what others put on it instead of running it). Pooled memory is freed only under the gate.
//! - **A lost device is reopened** (where the driver can be opened again) at the next call: the runtime
//!   stays, its pool, modules, bindings and recordings go with the old device, and every buffer made
//!   before carries the old generation, so a tensor that lived there is a typed `DeviceLost` error when
//!   used (its data is gone), while a value with a host copy (a weight) is uploaded again.
//! - **Statistics**: memory in use, cached and peak; bytes uploaded and downloaded (what the tests of
//!   "inputs on the device are never copied" read).

use crate::device::{BindingCache, Bound, Driver, Launch, Module, Raw, Recording};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::loc::SourceLoc;
use crate::pipeline::CompiledGraph;
use crate::size_class::size_class;
use crate::sym::Bindings;
use crate::target::Target;
use crate::TensorData;
use std::borrow::Borrow;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard, Weak};

mod recorded;

/// Locks a mutex, also after a panic elsewhere poisoned it (the data stays consistent: every critical
/// section here is a few plain updates). Drivers use it too.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

thread_local! {
    /// The runtime (by address) whose gate this thread holds, and whether it is recording on it. Calls
    /// nested in a gated call pass through: a shared lock taken twice by one thread can deadlock
    /// against a writer waiting between the two.
    static HELD: std::cell::Cell<(usize, bool)> = const { std::cell::Cell::new((0, false)) };
}

/// Whether this thread is recording launches now (nothing may be allocated or set up then).
pub(crate) fn recording() -> bool {
    HELD.with(|h| h.get().1)
}

/// The gate as one thread holds it (see the module docs); dropping it restores what the thread held.
struct Gate<'a> {
    _shared: Option<RwLockReadGuard<'a, ()>>,
    _alone: Option<RwLockWriteGuard<'a, ()>>,
    before: (usize, bool),
}

impl Drop for Gate<'_> {
    fn drop(&mut self) {
        HELD.with(|h| h.set(self.before));
    }
}

/// Device memory and host↔device traffic.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MemoryStats {
    /// Bytes of live device buffers (tensors, and a run's buffers while it is being enqueued).
    pub in_use: u64,
    /// Bytes held by the pool for reuse.
    pub cached: u64,
    /// The most `in_use` has been.
    pub peak: u64,
    /// Host → device bytes since the last [`Runtime::reset_transfers`].
    pub uploaded: u64,
    /// Device → host bytes since the last [`Runtime::reset_transfers`].
    pub downloaded: u64,
    /// Allocations the driver made (pool misses).
    pub allocations: u64,
    /// Bytes the driver holds outside the pool now ([`Driver::scratch_bytes`]: cuBLAS's workspace), not
    /// in `in_use` or `peak`.
    #[serde(default)]
    pub scratch: u64,
    /// Bytes of buffers of a lost device that something still holds (a tensor, a weight's old copy):
    /// not counted in `in_use`, freed as they are dropped.
    #[serde(default)]
    pub lost: u64,
}

/// What the runtime did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RuntimeStats {
    /// Graph runs enqueued (a recording's first, plain run included).
    pub runs: u64,
    /// Kernel launches enqueued (a replayed recording counts its launches).
    pub launches: u64,
    /// Kernels loaded (rendered and compiled by the driver).
    pub modules_loaded: u64,
    /// Kernels served by an already loaded module of the same structure.
    pub modules_reused: u64,
    /// Recordings made (reduce-overhead mode).
    pub recordings: u64,
    /// Replays of a recording.
    pub replays: u64,
    /// Inputs copied into a recording's buffers because they lived elsewhere.
    pub replay_input_copies: u64,
    /// Outputs copied out of a recording's buffers: the caller kept an earlier call's outputs alive
    /// across a later call, so that recording hands out copies from then on.
    pub replay_output_copies: u64,
    /// Bindings a driver made (bind groups, GEMM plans).
    #[serde(default)]
    pub bindings_made: u64,
    /// Launches whose binding was found made.
    #[serde(default)]
    pub bindings_reused: u64,
    /// Times the device was lost and opened again.
    #[serde(default)]
    pub reopens: u64,
    /// Microseconds spent rendering and loading kernels (the driver's JIT, or ptxas, included): the
    /// part of a cold compile the device's compiler takes.
    #[serde(default)]
    pub load_us: u64,
}

/// A device allocation owned by kiln; dropping the last handle returns it to its runtime's pool.
pub struct DeviceBuffer {
    raw: Option<Raw>,
    id: u64,
    class: u64,
    /// The runtime's device generation it was made on (see [`Runtime::reopen_if_lost`]).
    generation: u64,
    runtime: Arc<Runtime>,
}

impl DeviceBuffer {
    /// Bytes allocated.
    pub fn bytes(&self) -> u64 {
        self.class
    }

    /// The driver's allocation.
    pub fn raw(&self) -> &Raw {
        // Only `Drop` takes it out.
        self.raw.as_ref().expect("a live buffer holds its allocation")
    }

    /// The allocation's identity: kept while pooled and handed out again, never given to another.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The runtime it belongs to.
    pub fn runtime(&self) -> &Arc<Runtime> {
        &self.runtime
    }

    /// `Ok` while the device it was made on is the runtime's device; [`Error::DeviceLost`] once that
    /// device was lost and another opened (its data went with the old one).
    #[inline]
    pub fn live(&self, what: &str) -> Result<()> {
        if self.is_live() {
            return Ok(());
        }
        self.runtime.lost_with_its_device(what)
    }

    /// Whether the device it was made on is still the runtime's ([`DeviceBuffer::live`] as a test).
    #[inline]
    pub fn is_live(&self) -> bool {
        self.generation == self.runtime.generation.load(Ordering::Relaxed)
    }

    fn bound_at(&self, offset: u64, bytes: u64) -> Bound<'_> {
        Bound { raw: self.raw(), id: self.id, bytes, offset }
    }
}

impl Runtime {
    /// The error for a buffer made before the device was lost and opened again.
    #[cold]
    fn lost_with_its_device(&self, what: &str) -> Result<()> {
        Err(Error::DeviceLost {
            device: self.name().into(),
            what: what.into(),
            msg: "it lived on the device before that device was lost and opened again: its data is gone \
                  (make it again, or upload it from the host)"
                .into(),
        })
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if let Some(raw) = self.raw.take() {
            self.runtime.release(raw, self.id, self.class, self.generation);
        }
    }
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceBuffer({} bytes on {})", self.class, self.runtime.name())
    }
}

/// A tensor's data on a device: a buffer, with the dtype and dims of what it holds, and the run-time
/// checks of the runs it came from (read when the tensor is read: a failed check is reported to whoever
/// reads a result that depends on it, and to nobody else).
#[derive(Clone, Debug)]
pub struct DeviceTensor {
    /// The buffer (shared: tensors are immutable, so a value may be bound by many runs).
    pub buffer: Arc<DeviceBuffer>,
    /// Element type.
    pub dtype: DType,
    /// Dims.
    pub dims: Arc<[usize]>,
    /// Fault words of the runs that computed it (and of the runs its inputs came from), not yet known good.
    pub checks: Vec<Arc<Checks>>,
}

impl DeviceTensor {
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.dims.iter().product()
    }
}

/// The fault words of one launched run, read when a tensor depending on it is read; the outcome is kept.
pub struct Checks {
    words: Arc<DeviceBuffer>,
    stride: u64,
    kernels: Vec<usize>,
    compiled: Arc<CompiledGraph>,
    /// `None` once read and good; the failed check's op, message and line otherwise.
    outcome: OnceLock<Option<(String, String, SourceLoc)>>,
}

impl std::fmt::Debug for Checks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Checks({} kernels, {:?})", self.kernels.len(), self.outcome.get())
    }
}

impl Checks {
    fn known_good(&self) -> bool {
        matches!(self.outcome.get(), Some(None))
    }

    /// Records what the fault words say (once).
    fn settle(&self, words: &[u8]) {
        self.outcome.get_or_init(|| {
            for (slot, &k) in self.kernels.iter().enumerate() {
                let at = (self.stride * slot as u64) as usize;
                let word = u32::from_le_bytes([words[at], words[at + 1], words[at + 2], words[at + 3]]);
                match self.compiled.check_fault(k, word) {
                    Ok(()) => {}
                    Err(Error::Runtime { op, msg, loc }) => return Some((op, msg, loc)),
                    Err(e) => return Some(("fault".into(), e.to_string(), SourceLoc::internal())),
                }
            }
            None
        });
    }

    /// Bytes of its fault words.
    fn bytes(&self) -> u64 {
        self.stride * self.kernels.len() as u64
    }

    /// The failed check, once settled.
    fn failure(&self) -> Result<()> {
        match self.outcome.get() {
            Some(Some((op, msg, loc))) => Err(Error::Runtime { op: op.clone(), msg: msg.clone(), loc: loc.clone() }),
            _ => Ok(()),
        }
    }
}

/// Checks a tensor carries before the oldest are read without being asked (bounded memory in long
/// chains of checked runs that nobody reads).
const MAX_CARRIED_CHECKS: usize = 64;

struct Step {
    kernel: usize,
    /// Waits for the collectives in flight first ([`crate::plan::Plan::waits`]).
    wait: bool,
    module: Module,
    symbols: Vec<i64>,
    groups: u64,
    fault_slot: Option<usize>,
}

/// Binding a compiled graph to inputs of given dims, apart from the buffers (see [`Runtime::layout`]).
struct Layout {
    /// The device generation its modules were loaded on.
    generation: u64,
    /// The plan buffer of each graph input.
    input_slots: Vec<usize>,
    bindings: Bindings,
    sizes: Vec<u64>,
    steps: Vec<Step>,
    outputs: Vec<(usize, Arc<[usize]>, DType)>,
    /// Kernels with fault words, and the byte stride between their words.
    checked: Vec<usize>,
    stride: u64,
    io_bytes: u64,
    bytes_moved: u64,
    /// Values bound from inside a buffer (an assembled concatenation's parts): byte offset and length.
    placed: HashMap<crate::ir::NodeId, (u64, u64)>,
}

/// Cached layouts by the compiled graph's address; under it, one per set of input dims (each input's
/// dtype, rank and dims, flattened), with the compiled graph it was made for (which keeps the address
/// from being reused while it is cached). A lookup compares the inputs against the flattened dims in
/// place: W4's 259 inputs are checked without building or hashing a key on every call.
#[derive(Default)]
struct Layouts {
    by_graph: HashMap<usize, Vec<KeptLayout>>,
    count: usize,
}

impl Layouts {
    fn get<T: Borrow<DeviceTensor>>(&self, c: &Arc<CompiledGraph>, inputs: &[T]) -> Option<Arc<Layout>> {
        let kept = self.by_graph.get(&(Arc::as_ptr(c) as usize))?;
        kept.iter().find(|(dims, _, _)| same_dims(dims, inputs)).map(|(_, _, l)| l.clone())
    }

    fn insert<T: Borrow<DeviceTensor>>(&mut self, c: &Arc<CompiledGraph>, inputs: &[T], layout: Arc<Layout>) {
        if self.count >= MAX_LAYOUTS {
            self.clear();
        }
        let mut dims: Vec<usize> = Vec::with_capacity(inputs.len() * 4);
        for t in inputs.iter().map(Borrow::borrow) {
            dims.extend([t.dtype as usize, t.dims.len()]);
            dims.extend(t.dims.iter());
        }
        self.by_graph.entry(Arc::as_ptr(c) as usize).or_default().push((dims, c.clone(), layout));
        self.count += 1;
    }

    fn clear(&mut self) {
        self.by_graph.clear();
        self.count = 0;
    }
}

/// One cached layout: the flattened input dims it was made for, the compiled graph, the layout.
type KeptLayout = (Vec<usize>, Arc<CompiledGraph>, Arc<Layout>);

/// Whether `inputs` have the dtypes and dims `flat` lists (as [`Layouts::insert`] flattens them).
fn same_dims<T: Borrow<DeviceTensor>>(flat: &[usize], inputs: &[T]) -> bool {
    let mut k = flat.iter().copied();
    for t in inputs.iter().map(Borrow::borrow) {
        if k.next() != Some(t.dtype as usize) || k.next() != Some(t.dims.len()) {
            return false;
        }
        if !t.dims.iter().all(|&d| k.next() == Some(d)) {
            return false;
        }
    }
    k.next().is_none()
}

/// Layouts kept per runtime; all are dropped past this many.
const MAX_LAYOUTS: usize = 1024;

/// One launch's device time in a profiled run.
#[derive(Clone, Debug, PartialEq)]
pub struct LaunchTime {
    /// The kernel's index in its compiled graph.
    pub kernel: usize,
    /// The kernel's name.
    pub name: String,
    /// Device time, ms.
    pub ms: f64,
}

/// A compiled graph bound to device buffers, ready to be launched again and again (the bench's device
/// time and the reduce-overhead mode use it; [`Runtime::run`] makes one per call).
pub struct Prepared {
    compiled: Arc<CompiledGraph>,
    generation: u64,
    layout: Arc<Layout>,
    buffers: Vec<Arc<DeviceBuffer>>,
    /// Fault words of the kernels `layout.checked` names, `layout.stride` bytes apart.
    faults: Option<Arc<DeviceBuffer>>,
    recording: Option<Recording>,
    /// The drivers' bindings the recording replays with, kept alive with it.
    recorded_bindings: Vec<crate::device::Binding>,
}

impl Prepared {
    /// Kernel launches per run.
    pub fn launches(&self) -> usize {
        self.layout.steps.len()
    }

    /// Bytes every launch reads and writes (each kernel's buffers, in their dtypes).
    pub fn bytes_moved(&self) -> u64 {
        self.layout.bytes_moved
    }

    /// Bytes the computation itself must move: its inputs read once, its outputs written once.
    pub fn io_bytes(&self) -> u64 {
        self.layout.io_bytes
    }
}

/// Recordings kept for reduce-overhead mode; the least recently used goes past this many.
const MAX_RECORDINGS: usize = 16;

/// The runtime core over one device. One per device per process, shared (`Arc`) by every tensor,
/// compiled function and thread using it.
pub struct Runtime {
    /// The device's driver at each generation: the newest is the device now. Older ones (lost
    /// devices) are kept until the runtime goes, so a driver borrowed by a call in flight stays valid
    /// without a lock or a reference count on every call.
    drivers: Box<[OnceLock<Box<dyn Driver>>]>,
    /// The device's capabilities (a reopened device must have the same).
    target: Target,
    /// How to open the device again after it is lost (`None`: it cannot be, in this process).
    reopen: Option<Reopen>,
    /// Bumped by each reopening (an index into `drivers`); buffers carry the one they were made under.
    generation: AtomicU64,
    /// A driver call reported the device lost.
    lost: AtomicBool,
    me: Weak<Runtime>,
    /// Free allocations by size class.
    pool: Mutex<HashMap<u64, Vec<Pooled>>>,
    /// Freed buffers are marked ([`Driver::freed`]): set by the first upload into a reused buffer that
    /// the driver would run beside its queue ([`Driver::uploads_beside`]).
    marking: AtomicBool,
    modules: Mutex<HashMap<u64, Module>>,
    bindings: BindingCache,
    gate: RwLock<()>,
    mem: Mutex<MemoryStats>,
    stats: Mutex<RuntimeStats>,
    recordings: Mutex<recorded::Recordings>,
    layouts: Mutex<Layouts>,
    next_id: AtomicU64,
}

/// A free allocation in the pool: its identity, and the device's mark when it was freed
/// ([`Driver::freed`]).
struct Pooled {
    id: u64,
    raw: Raw,
    free_at: Option<u64>,
}

/// Opens a device again (see [`Runtime::reopening`]).
pub type Reopen = Box<dyn Fn() -> Result<Box<dyn Driver>> + Send + Sync>;

/// Times one runtime opens its device again before a loss is final (a device lost this often is not
/// coming back).
pub const MAX_REOPENS: usize = 16;

impl Runtime {
    /// A runtime over `driver`; a lost device stays lost (every later call is [`Error::DeviceLost`]).
    pub fn new(driver: impl Driver) -> Arc<Runtime> {
        Runtime::with(Box::new(driver), None)
    }

    /// A runtime over `driver` that opens the device again with `reopen` at the first call after it
    /// was lost.
    pub fn reopening(
        driver: impl Driver,
        reopen: impl Fn() -> Result<Box<dyn Driver>> + Send + Sync + 'static,
    ) -> Arc<Runtime> {
        Runtime::with(Box::new(driver), Some(Box::new(reopen)))
    }

    fn with(driver: Box<dyn Driver>, reopen: Option<Reopen>) -> Arc<Runtime> {
        let drivers: Box<[OnceLock<Box<dyn Driver>>]> = (0..=MAX_REOPENS).map(|_| OnceLock::new()).collect();
        let target = driver.target().clone();
        let _ = drivers[0].set(driver);
        Arc::new_cyclic(|me| Runtime {
            target,
            drivers,
            reopen,
            generation: AtomicU64::new(0),
            lost: AtomicBool::new(false),
            me: me.clone(),
            pool: Mutex::default(),
            marking: AtomicBool::new(false),
            modules: Mutex::default(),
            bindings: BindingCache::default(),
            gate: RwLock::new(()),
            mem: Mutex::default(),
            stats: Mutex::default(),
            recordings: Mutex::default(),
            layouts: Mutex::default(),
            next_id: AtomicU64::new(1),
        })
    }

    /// The device driver (the one now: a lost device's successor after a reopening).
    pub fn driver(&self) -> &dyn Driver {
        let now = self.generation.load(Ordering::Acquire) as usize;
        self.drivers[now].get().expect("the generation is bumped after its driver is set").as_ref()
    }

    /// Backend name.
    pub fn name(&self) -> &'static str {
        self.driver().name()
    }

    /// The target kernels are compiled for.
    pub fn target(&self) -> &Target {
        &self.target
    }

    /// Notes a driver error that says the device is lost: the next call opens it again.
    fn seen<T>(&self, r: Result<T>) -> Result<T> {
        if let Err(Error::DeviceLost { .. }) = &r {
            self.lost.store(true, Ordering::Release);
        }
        r
    }

    /// Opens the device again when it was lost (a driver call said so, or the driver noticed), before
    /// a call uses it: the new device replaces the old, and what belonged to the old one — pooled
    /// buffers, loaded modules, bindings, layouts (recordings at their next replay) — goes. Buffers
    /// still held (tensors) keep the old generation and are [`Error::DeviceLost`] when used. The entry
    /// points (upload, prepare, run, reduce-overhead run, launch, copy rate) do this first; a caller that
    /// binds values to the device before its run (uploading a weight again) calls it before that. Calls
    /// nested in another pass.
    pub fn reopen_if_lost(&self) -> Result<()> {
        if !self.lost.load(Ordering::Acquire) && !self.driver().is_lost() {
            return Ok(());
        }
        if HELD.with(|h| h.get().0) == self as *const Runtime as usize {
            return Ok(());
        }
        let name = self.name();
        let failed =
            |msg: String| Error::DeviceLost { device: name.into(), what: "opening the device again".into(), msg };
        let gate = self.gate_alone()?;
        // Another thread may have opened it meanwhile.
        if !self.lost.load(Ordering::Acquire) && !self.driver().is_lost() {
            return Ok(());
        }
        let next = self.generation.load(Ordering::Acquire) as usize + 1;
        let (Some(reopen), true) = (&self.reopen, next <= MAX_REOPENS) else {
            return Err(Error::DeviceLost {
                device: name.into(),
                what: "a call".into(),
                msg: format!(
                    "the device was lost and cannot be opened again in this process{} (restart it)",
                    if self.reopen.is_some() { format!(" ({MAX_REOPENS} reopenings already)") } else { String::new() }
                ),
            });
        };
        let fresh = reopen().map_err(|e| failed(e.to_string()))?;
        if fresh.target() != &self.target {
            return Err(failed(format!("the device opened has other capabilities: {}", fresh.describe())));
        }
        if self.drivers[next].set(fresh).is_err() {
            return Err(failed("opened twice".into()));
        }
        // The generation moves under the pool's lock, where `release` decides whether a buffer is pooled:
        // no buffer of the old device enters the new pool. (Recordings are not touched here: a reduce-
        // overhead call holds them while it takes the gate; it drops stale ones itself.)
        let pooled: Vec<(u64, Vec<Pooled>)> = {
            let mut pool = lock(&self.pool);
            self.generation.store(next as u64, Ordering::Release);
            let mut m = lock(&self.mem);
            let pooled: Vec<(u64, Vec<Pooled>)> = pool.drain().collect();
            m.cached -= pooled.iter().map(|(class, v)| class * v.len() as u64).sum::<u64>();
            // Everything in use now is the old device's.
            m.lost += m.in_use;
            m.in_use = 0;
            pooled
        };
        self.lost.store(false, Ordering::Release);
        lock(&self.modules).clear();
        lock(&self.layouts).clear();
        self.bindings.clear();
        lock(&self.stats).reopens += 1;
        drop(gate);
        // The old device's pooled buffers go (outside every lock).
        drop(pooled);
        tracing::warn!("{name}: the device was lost and has been opened again");
        Ok(())
    }

    /// Shared use of the device, for one driver call or a sequence of them (see the module docs).
    fn gate(&self) -> Gate<'_> {
        let (me, before) = (self as *const Runtime as usize, HELD.with(|h| h.get()));
        if before.0 == me {
            return Gate { _shared: None, _alone: None, before };
        }
        let shared = self.gate.read().unwrap_or_else(|e| e.into_inner());
        HELD.with(|h| h.set((me, false)));
        Gate { _shared: Some(shared), _alone: None, before }
    }

    /// The device alone, for a recording.
    fn gate_alone(&self) -> Result<Gate<'_>> {
        let (me, before) = (self as *const Runtime as usize, HELD.with(|h| h.get()));
        if before.0 == me {
            return Err(Error::Backend {
                backend: self.name().into(),
                msg: "recording a graph from inside another call on the device".into(),
            });
        }
        let alone = self.gate.write().unwrap_or_else(|e| e.into_inner());
        HELD.with(|h| h.set((me, false)));
        Ok(Gate { _shared: None, _alone: Some(alone), before })
    }

    /// This runtime's shared handle.
    pub fn arc(&self) -> Arc<Runtime> {
        // `me` is set by `new` and the runtime is only reachable through that Arc.
        self.me.upgrade().expect("a runtime is used through its Arc")
    }

    /// Memory statistics now.
    pub fn memory_stats(&self) -> MemoryStats {
        let scratch = self.driver().scratch_bytes();
        MemoryStats { scratch, ..*lock(&self.mem) }
    }

    /// Zeroes the upload/download counters.
    pub fn reset_transfers(&self) {
        let mut m = lock(&self.mem);
        m.uploaded = 0;
        m.downloaded = 0;
    }

    /// Drops the reduce-overhead recordings made for `c`, returning their buffers to the pool: the
    /// function that made them is gone. Another function sharing `c` (the compile cache shares equal
    /// graphs) records again on its next call.
    pub fn release_recordings(&self, c: &Arc<CompiledGraph>) {
        let released = lock(&self.recordings).take(|r| Arc::ptr_eq(&r.compiled, c));
        // Dropped outside the lock: returning buffers takes the pool's.
        drop(released);
    }

    /// Starts a new peak: `peak` becomes what is in use now.
    pub fn reset_peak(&self) {
        let mut m = lock(&self.mem);
        m.peak = m.in_use;
    }

    /// What the runtime did so far.
    pub fn stats(&self) -> RuntimeStats {
        let (made, reused) = self.bindings.counts();
        RuntimeStats { bindings_made: made, bindings_reused: reused, ..*lock(&self.stats) }
    }

    /// Forgets loaded modules (cold-compile measurements).
    pub fn clear_modules(&self) {
        let _gate = self.gate();
        lock(&self.modules).clear();
        lock(&self.layouts).clear();
        self.bindings.clear();
    }

    /// Frees every pooled buffer (and the bindings that may hold them).
    pub fn trim(&self) {
        let _gate = self.gate();
        self.bindings.clear();
        let pooled: Vec<(u64, Vec<Pooled>)> = lock(&self.pool).drain().collect();
        let freed: u64 = pooled.iter().map(|(class, v)| class * v.len() as u64).sum();
        lock(&self.mem).cached -= freed;
        // Freed outside the pool's lock: a driver's free may wait for the device's stream.
        drop(pooled);
    }

    fn release(&self, raw: Raw, id: u64, class: u64, generation: u64) {
        // Where the device's queue stands now: an upload may write this buffer beside later work once
        // the device has passed it (asked before the pool's lock: it may record on the device; a lost
        // device's buffer is not its successor's to ask about). Marked only once uploads reuse freed
        // buffers (a loop feeding batches): a call whose inputs stay on the device pays nothing for it.
        let ours = generation == self.generation.load(Ordering::Acquire);
        let free_at = if ours { self.driver().freed(&raw, class, self.marking.load(Ordering::Relaxed)) } else { None };
        // Decided under the pool's lock, where a reopening moves the generation.
        let mut pool = lock(&self.pool);
        let mut m = lock(&self.mem);
        if generation != self.generation.load(Ordering::Acquire) {
            // The old device's: freed (outside the locks), never handed out again.
            m.lost -= class;
            drop((m, pool));
            drop(raw);
            return;
        }
        m.in_use -= class;
        m.cached += class;
        drop(m);
        pool.entry(class).or_default().push(Pooled { id, raw, free_at });
    }

    /// [`Error::OutOfMemory`] when one buffer of `bytes` exceeds what the device allocates or binds.
    fn check_fits(&self, bytes: u64, what: &str) -> Result<()> {
        let t = &self.target;
        if bytes > t.max_binding_bytes || bytes > t.max_buffer_bytes {
            return Err(Error::OutOfMemory {
                device: self.name().into(),
                what: format!("{what} (one binding on {})", self.driver().describe()),
                bytes,
                limit: Some(t.max_binding_bytes.min(t.max_buffer_bytes)),
            });
        }
        Ok(())
    }

    /// A buffer of at least `bytes`, from the pool when one of its size class is free. `what` names it
    /// in an out-of-memory error.
    pub fn alloc(&self, bytes: u64, what: &str) -> Result<Arc<DeviceBuffer>> {
        // The buffer freed last: likeliest still in the device's caches.
        self.alloc_picking(bytes, what, Vec::pop).map(|(b, _)| b)
    }

    /// [`Runtime::alloc`] for an upload: the pooled buffer the device let go of first, so an upload
    /// beside the kernels ([`Driver::write_after`]) waits least, with the mark it was freed at (`None`:
    /// fresh, or freed before marking began). The first upload into a reused buffer that the driver
    /// would run beside the kernels starts the marking.
    fn alloc_for_upload(&self, bytes: u64, what: &str) -> Result<(Arc<DeviceBuffer>, Option<u64>)> {
        let (buffer, pooled) = self.alloc_picking(bytes, what, |free| {
            let first = (0..free.len()).filter(|&i| free[i].free_at.is_some()).min_by_key(|&i| free[i].free_at);
            first.map(|i| free.swap_remove(i)).or_else(|| free.pop())
        })?;
        if pooled == Some(None) && self.driver().uploads_beside(buffer.bytes()) {
            self.marking.store(true, Ordering::Relaxed);
        }
        Ok((buffer, pooled.flatten()))
    }

    /// A buffer of at least `bytes`: the one `pick` takes from its size class's free buffers, else a
    /// fresh allocation; with the mark it was freed at when it came from the pool (`None`: fresh).
    fn alloc_picking(
        &self,
        bytes: u64,
        what: &str,
        pick: impl FnOnce(&mut Vec<Pooled>) -> Option<Pooled>,
    ) -> Result<(Arc<DeviceBuffer>, Option<Option<u64>>)> {
        self.check_fits(bytes, what)?;
        if recording() {
            // The address would exist only inside the recording.
            return Err(Error::Backend {
                backend: self.name().into(),
                msg: format!("allocating {what} while recording"),
            });
        }
        let _gate = self.gate();
        let d = self.driver();
        let generation = self.generation.load(Ordering::Acquire);
        let class = size_class(bytes);
        let class = if class > d.target().max_buffer_bytes { bytes.div_ceil(256) * 256 } else { class };
        let pooled = lock(&self.pool).get_mut(&class).and_then(pick);
        let (id, raw, free_at) = match pooled {
            Some(Pooled { id, raw, free_at }) => {
                lock(&self.mem).cached -= class;
                (id, raw, Some(free_at))
            }
            None => {
                let raw = match d.alloc(class) {
                    Err(Error::OutOfMemory { .. }) => {
                        // Cached buffers hold memory nobody uses now: free them and try once more.
                        self.trim();
                        d.alloc(class)
                    }
                    other => other,
                };
                let raw = self.seen(raw).map_err(|e| match e {
                    Error::OutOfMemory { device, bytes, limit, .. } => {
                        Error::OutOfMemory { device, what: what.to_string(), bytes, limit }
                    }
                    e => e,
                })?;
                lock(&self.mem).allocations += 1;
                (self.next_id.fetch_add(1, Ordering::Relaxed), raw, None)
            }
        };
        {
            let mut m = lock(&self.mem);
            m.in_use += class;
            m.peak = m.peak.max(m.in_use);
        }
        Ok((Arc::new(DeviceBuffer { raw: Some(raw), id, class, generation, runtime: self.arc() }), free_at))
    }

    /// Copies host data to a new device tensor.
    pub fn upload(&self, data: &TensorData) -> Result<DeviceTensor> {
        self.reopen_if_lost()?;
        self.target().check_upload(data)?;
        let _gate = self.gate();
        let bytes = self.target().encode(data);
        let (buffer, free_at) = self.alloc_for_upload(bytes.len() as u64, "an uploaded tensor")?;
        if !bytes.is_empty() {
            self.seen(self.driver().write_after(buffer.raw(), &bytes, free_at))?;
        }
        lock(&self.mem).uploaded += bytes.len() as u64;
        Ok(DeviceTensor { buffer, dtype: data.dtype(), dims: data.dims().into(), checks: Vec::new() })
    }

    /// Reads a device tensor back (waits for the work that writes it). The fault words of the runs it
    /// depends on are read first: a failed check is reported here.
    pub fn download(&self, t: &DeviceTensor) -> Result<TensorData> {
        let _gate = self.gate();
        t.buffer.live("reading a tensor")?;
        self.check(&t.checks)?;
        let n = self.target().storage_bytes(t.dtype, t.numel());
        let bytes = if n == 0 { Vec::new() } else { self.seen(self.driver().read(t.buffer.raw(), n))? };
        self.downloaded(t, &bytes)
    }

    /// Counts and decodes a tensor's bytes read back.
    fn downloaded(&self, t: &DeviceTensor, bytes: &[u8]) -> Result<TensorData> {
        lock(&self.mem).downloaded += bytes.len() as u64;
        self.target().decode(bytes, &t.dims, t.dtype)
    }

    /// [`Runtime::download`] without blocking (browsers, async callers).
    pub async fn download_async(&self, t: &DeviceTensor) -> Result<TensorData> {
        t.buffer.live("reading a tensor")?;
        for c in &t.checks {
            if c.outcome.get().is_none() {
                c.words.live("reading a run's checks")?;
                c.settle(&self.read_async(c.words.raw(), c.bytes()).await?);
            }
            c.failure()?;
        }
        let n = self.target().storage_bytes(t.dtype, t.numel());
        let bytes = if n == 0 { Vec::new() } else { self.seen(self.read_async(t.buffer.raw(), n).await)? };
        self.downloaded(t, &bytes)
    }

    /// A driver's asynchronous read, started under the gate (a driver that reads at once, as CUDA's,
    /// does its work there; the gate is not held across the wait).
    fn read_async<'a>(&'a self, raw: &'a Raw, bytes: u64) -> crate::device::ReadFuture<'a> {
        let _gate = self.gate();
        self.driver().read_async(raw, bytes)
    }

    /// Reads the fault words of `checks` (waiting for those runs) and reports the first failed check.
    pub fn check(&self, checks: &[Arc<Checks>]) -> Result<()> {
        let _gate = self.gate();
        for c in checks {
            if c.outcome.get().is_none() {
                c.words.live("reading a run's checks")?;
                c.settle(&self.seen(self.driver().read(c.words.raw(), c.bytes()))?);
            }
            c.failure()?;
        }
        Ok(())
    }

    /// Waits for everything enqueued on the device. (Failed run-time checks are reported by reading the
    /// results that depend on them.)
    pub fn synchronize(&self) -> Result<()> {
        let _gate = self.gate();
        self.seen(self.driver().synchronize())
    }

    /// [`Runtime::synchronize`] without blocking (a browser page's fence): a four-byte read queued
    /// behind everything enqueued so far, which resolves once the device has run all of it.
    pub async fn synchronize_async(&self) -> Result<()> {
        let fence = self.alloc(4, "a fence")?;
        self.read_async(fence.raw(), 4).await.map(drop)
    }

    fn module(&self, id: u64, kernel: &crate::kernel::Kernel) -> Result<Module> {
        if let Some(m) = lock(&self.modules).get(&id).cloned() {
            lock(&self.stats).modules_reused += 1;
            return Ok(m);
        }
        let generation = self.generation.load(Ordering::Acquire);
        let clock = web_time::Instant::now();
        let m = self.seen(self.driver().load(kernel))?;
        {
            let mut stats = lock(&self.stats);
            stats.modules_loaded += 1;
            stats.load_us += clock.elapsed().as_micros() as u64;
        }
        let mut modules = lock(&self.modules);
        if generation != self.generation.load(Ordering::Acquire) {
            // Loaded on a device lost since: not kept (its layout is made again too).
            return Ok(m);
        }
        // Two threads may load one kernel at once: both keep the first module stored.
        Ok(modules.entry(id).or_insert(m).clone())
    }

    /// Loads the kernels of `c` not loaded yet that launch under `bindings` (a kernel of no groups is
    /// skipped, as the launch is) as one batch ([`Driver::load_many`]), returning them by structural id
    /// (so they are not counted as reused); the first failure in launch order is the one reported.
    fn load_missing(&self, c: &CompiledGraph, ids: &[u64], bindings: &Bindings) -> Result<HashMap<u64, Module>> {
        let launches = |k: usize| c.kernels[k].launch.groups.eval(bindings).map_or(true, |g| g > 0);
        let missing: Vec<usize> = {
            let loaded = lock(&self.modules);
            let mut seen = std::collections::HashSet::new();
            (c.plan.launches.iter().copied())
                .filter(|&k| launches(k) && !loaded.contains_key(&ids[k]) && seen.insert(ids[k]))
                .collect()
        };
        if missing.len() < 2 {
            return Ok(HashMap::new()); // `module` loads it on first use
        }
        let generation = self.generation.load(Ordering::Acquire);
        let kernels: Vec<&crate::kernel::Kernel> = missing.iter().map(|&k| &c.kernels[k]).collect();
        let clock = web_time::Instant::now();
        let loaded = self.driver().load_many(&kernels);
        lock(&self.stats).load_us += clock.elapsed().as_micros() as u64;
        let mut modules = lock(&self.modules);
        let (mut fresh, mut first_failure) = (HashMap::new(), None);
        for (&k, m) in missing.iter().zip(loaded) {
            match self.seen(m) {
                Ok(m) => {
                    lock(&self.stats).modules_loaded += 1;
                    // Not kept past a device lost since (its layout is made again too).
                    if generation == self.generation.load(Ordering::Acquire) {
                        modules.entry(ids[k]).or_insert(m.clone());
                    }
                    fresh.insert(ids[k], m);
                }
                Err(e) => {
                    first_failure.get_or_insert(e);
                }
            }
        }
        first_failure.map_or(Ok(fresh), Err)
    }

    /// Binds a compiled graph to device memory: `inputs` (in graph-input order) bound in place, fresh
    /// buffers for outputs, pooled ones for intermediates, every kernel loaded.
    pub fn prepare<T: Borrow<DeviceTensor>>(&self, c: &Arc<CompiledGraph>, inputs: &[T]) -> Result<Prepared> {
        self.reopen_if_lost()?;
        self.prepare_now(c, inputs)
    }

    /// [`Runtime::prepare`] on the device as it is: under the gate, so no reopening lands inside it.
    fn prepare_now<T: Borrow<DeviceTensor>>(&self, c: &Arc<CompiledGraph>, inputs: &[T]) -> Result<Prepared> {
        let _gate = self.gate();
        let generation = self.generation.load(Ordering::Acquire);
        self.check_inputs(c, inputs)?;
        let layout = self.layout(c, inputs)?;
        let mut buffers: Vec<Option<Arc<DeviceBuffer>>> = vec![None; layout.sizes.len()];
        for (&slot, t) in layout.input_slots.iter().zip(inputs.iter().map(Borrow::borrow)) {
            buffers[slot] = Some(t.buffer.clone());
        }
        self.bind_buffers(c, layout, buffers, generation)
    }

    /// What every run asks of its inputs: as many as the graph takes, each on this runtime and made on
    /// the device it has now.
    fn check_inputs<T: Borrow<DeviceTensor>>(&self, c: &Arc<CompiledGraph>, inputs: &[T]) -> Result<()> {
        let g = &c.primitive.graph;
        if inputs.len() != g.inputs.len() {
            return Err(Error::Runtime {
                op: "run".into(),
                msg: format!("the graph takes {} inputs, {} were given", g.inputs.len(), inputs.len()),
                loc: SourceLoc::internal(),
            });
        }
        let me = self.arc();
        for t in inputs.iter().map(Borrow::borrow) {
            if !Arc::ptr_eq(t.buffer.runtime(), &me) {
                return Err(Error::Unsupported {
                    what: format!("an input on `{}` bound to a run on `{}`", t.buffer.runtime().name(), self.name()),
                    loc: SourceLoc::internal(),
                });
            }
            t.buffer.live("an input of a run")?;
        }
        Ok(())
    }

    /// Counts one run of `p` (its launches) in the statistics.
    fn count_run(&self, p: &Prepared) {
        let mut s = lock(&self.stats);
        s.runs += 1;
        s.launches += p.layout.steps.len() as u64;
    }

    /// A prepared graph over `buffers`, one per plan buffer: those given, and fresh ones from the pool
    /// for the rest; fault words of its own.
    fn bind_buffers(
        &self,
        c: &Arc<CompiledGraph>,
        layout: Arc<Layout>,
        buffers: Vec<Option<Arc<DeviceBuffer>>>,
        generation: u64,
    ) -> Result<Prepared> {
        let mut filled = Vec::with_capacity(layout.sizes.len());
        for (i, (b, &size)) in buffers.into_iter().zip(&layout.sizes).enumerate() {
            filled.push(match b {
                Some(b) => b,
                None => self.alloc(size, &format!("plan buffer {i} of a {}-kernel graph", c.kernels.len()))?,
            });
        }
        let faults = match layout.checked.len() {
            0 => None,
            n => Some(self.alloc(layout.stride * n as u64, "fault words")?),
        };
        Ok(Prepared {
            compiled: c.clone(),
            generation,
            layout,
            buffers: filled,
            faults,
            recording: None,
            recorded_bindings: Vec::new(),
        })
    }

    /// What binding `c` to inputs of these dims needs besides the buffers themselves — symbol values,
    /// buffer sizes, launches with their loaded kernels — worked out once per compiled graph and input
    /// dims, so a call spends its time launching.
    fn layout<T: Borrow<DeviceTensor>>(&self, c: &Arc<CompiledGraph>, inputs: &[T]) -> Result<Arc<Layout>> {
        // Dtypes too: a cached layout skips the checks `bind_symbol_dims` makes on a miss.
        let generation = self.generation.load(Ordering::Acquire);
        if let Some(l) = lock(&self.layouts).get(c, inputs).filter(|l| l.generation == generation) {
            return Ok(l);
        }
        let g = &c.primitive.graph;
        let shapes: Vec<(DType, &[usize])> = inputs.iter().map(|t| (t.borrow().dtype, &*t.borrow().dims)).collect();
        let bindings = crate::interp::bind_symbol_dims(g, &shapes)?;
        let sizes = c.buffer_bytes(&bindings, |d, n| self.target().storage_bytes(d, n))?;
        // Sizes no device holds are the user's error before any kernel is rendered for them.
        for (i, &size) in sizes.iter().enumerate() {
            self.check_fits(size, &format!("plan buffer {i} of a {}-kernel graph", c.kernels.len()))?;
        }
        let checked: Vec<usize> = c.checked_launches().into_iter().map(|(_, k)| k).collect();
        let ids = c.kernel_ids();
        let fresh = self.load_missing(c, ids, &bindings)?;
        let mut steps = Vec::new();
        for &k in &c.plan.launches {
            let kernel = &c.kernels[k];
            let groups = kernel.launch.device_groups(kernel.launch.groups.eval(&bindings)?.max(0) as u64);
            if groups == 0 {
                continue;
            }
            let symbols = kernel
                .symbols
                .iter()
                .map(|s| {
                    bindings.get(*s).ok_or_else(|| Error::Backend {
                        backend: self.name().into(),
                        msg: format!("kernel {}: symbol {s} has no value", kernel.name),
                    })
                })
                .collect::<Result<Vec<i64>>>()?;
            let module = match fresh.get(&ids[k]) {
                Some(m) => m.clone(),
                None => self.module(ids[k], kernel)?,
            };
            let (wait, fault_slot) = (c.plan.waits.contains(&k), checked.iter().position(|&x| x == k));
            steps.push(Step { kernel: k, wait, module, symbols, groups, fault_slot });
        }
        let mut placed = HashMap::new();
        for b in c.kernels.iter().flat_map(|k| &k.buffers) {
            if let Some(off) = c.plan.value_offset.get(&b.node) {
                let slot = c.plan.value_buffer[&b.node];
                let offset = self.target().storage_bytes(b.dtype, off.eval(&bindings)?.max(0) as usize);
                // Never an empty window (`buffer_bytes` keeps an element of room past every offset).
                let len = self.target().storage_bytes(b.dtype, b.len.eval(&bindings)?.max(1) as usize);
                placed.insert(b.node, (offset, (len.div_ceil(16) * 16).min(sizes[slot].saturating_sub(offset))));
            }
        }
        let layout = Arc::new(Layout {
            placed,
            generation,
            input_slots: c.input_buffers(),
            outputs: c.output_slots(&bindings)?.into_iter().map(|(b, d, t)| (b, d.into(), t)).collect(),
            io_bytes: c.io_bytes(&bindings)?,
            bytes_moved: c.traffic_bytes(&bindings)?,
            bindings,
            sizes,
            steps,
            checked,
            stride: self.target.binding_alignment.max(4),
        });
        lock(&self.layouts).insert(c, inputs, layout.clone());
        Ok(layout)
    }

    /// Enqueues every launch of `p` (without submitting).
    fn enqueue_launches(&self, d: &dyn Driver, p: &Prepared) -> Result<()> {
        if !recording() {
            self.bindings.trim();
        }
        if let Some(words) = &p.faults {
            d.zero(words.raw(), 0, p.layout.stride * p.layout.checked.len() as u64)?;
        }
        (0..p.layout.steps.len()).try_for_each(|i| self.enqueue_step(d, p, i))?;
        // Nothing after a run (a read of its results, a later run's reuse of its memory) may overtake
        // a collective still running beside it.
        if p.compiled.has_collectives() {
            d.wait_collectives()?;
        }
        Ok(())
    }

    /// The time each launch of one run of `p` takes on the device, in launch order; `None` where the
    /// device cannot time itself. Each launch is timed alone.
    pub fn profile(&self, p: &Prepared) -> Result<Option<Vec<LaunchTime>>> {
        let _gate = self.gate();
        self.current(p)?;
        let d = self.driver();
        let mut out = Vec::with_capacity(p.layout.steps.len());
        for (i, step) in p.layout.steps.iter().enumerate() {
            let collective = p.compiled.kernels[step.kernel].all_reduce().is_some();
            let timed = self.seen(d.time(&mut || {
                self.enqueue_step(d, p, i)?;
                if collective {
                    d.wait_collectives()?;
                }
                d.submit()
            }))?;
            let Some(s) = timed else { return Ok(None) };
            out.push(LaunchTime {
                kernel: step.kernel,
                name: p.compiled.kernels[step.kernel].name.clone(),
                ms: s * 1e3,
            });
        }
        Ok(Some(out))
    }

    /// Prepares `c` for `inputs` and times each of its launches alone ([`Runtime::profile`]).
    pub fn profile_graph<T: Borrow<DeviceTensor>>(
        &self,
        c: &Arc<CompiledGraph>,
        inputs: &[T],
    ) -> Result<Option<Vec<LaunchTime>>> {
        let p = self.prepare(c, inputs)?;
        self.profile(&p)
    }

    /// How this device times launches (`CUDA events`, `timestamp queries`, `host wall time`).
    pub fn timing(&self) -> &'static str {
        self.driver().timing()
    }

    /// Enqueues launch `i` of `p`.
    fn enqueue_step(&self, d: &dyn Driver, p: &Prepared, i: usize) -> Result<()> {
        let c = &p.compiled;
        {
            let step = &p.layout.steps[i];
            let kernel = &c.kernels[step.kernel];
            let bound: Vec<Bound> = kernel
                .buffers
                .iter()
                .map(|b| {
                    let slot = c.plan.value_buffer[&b.node];
                    match p.layout.placed.get(&b.node) {
                        Some(&(offset, bytes)) => p.buffers[slot].bound_at(offset, bytes),
                        None => p.buffers[slot].bound_at(0, p.layout.sizes[slot]),
                    }
                })
                .collect();
            let fault = match (&p.faults, step.fault_slot) {
                (Some(words), Some(slot)) => {
                    Some(Bound { raw: words.raw(), id: words.id(), bytes: 4, offset: p.layout.stride * slot as u64 })
                }
                _ => None,
            };
            let launch = Launch {
                buffers: &bound,
                symbols: &step.symbols,
                bindings: &p.layout.bindings,
                fault,
                groups: step.groups,
                module: &step.module,
                cache: &self.bindings,
                wait: step.wait,
            };
            d.launch(kernel, &launch)
        }
    }

    /// Launches a prepared graph once (replaying its recording when it has one) and hands the work to the
    /// device. Returns without waiting, with the run's fault words when it has checks.
    pub fn launch(&self, p: &Prepared) -> Result<Option<Arc<Checks>>> {
        self.reopen_if_lost()?;
        self.launch_now(p)
    }

    /// [`Runtime::launch`] on the device as it is.
    fn launch_now(&self, p: &Prepared) -> Result<Option<Arc<Checks>>> {
        let _gate = self.gate();
        self.current(p)?;
        let d = self.driver();
        match &p.recording {
            Some(r) => {
                self.seen(d.replay(r))?;
                lock(&self.stats).replays += 1;
            }
            None => {
                self.seen(self.enqueue_launches(d, p).and_then(|()| d.submit()))?;
            }
        }
        self.count_run(p);
        Ok(p.faults.clone().map(|words| self.checks_over(p, words)))
    }

    /// `Ok` while `p` was prepared on the device the runtime has now.
    fn current(&self, p: &Prepared) -> Result<()> {
        if p.generation == self.generation.load(Ordering::Acquire) {
            return Ok(());
        }
        Err(Error::DeviceLost {
            device: self.name().into(),
            what: "launching a prepared graph".into(),
            msg: "it was prepared on the device before that device was lost and opened again: prepare it again".into(),
        })
    }

    /// The checks of one launch of `p`, read from `words` (its fault words or a copy of them).
    fn checks_over(&self, p: &Prepared, words: Arc<DeviceBuffer>) -> Arc<Checks> {
        Arc::new(Checks {
            words,
            stride: p.layout.stride,
            kernels: p.layout.checked.clone(),
            compiled: p.compiled.clone(),
            outcome: OnceLock::new(),
        })
    }

    /// The checks a run's outputs carry: its own, and those its inputs carry that are not known good.
    fn carried<T: Borrow<DeviceTensor>>(&self, inputs: &[T], own: Option<Arc<Checks>>) -> Result<Vec<Arc<Checks>>> {
        let mut all: Vec<Arc<Checks>> = Vec::new();
        for c in inputs.iter().flat_map(|t| &t.borrow().checks).chain(own.as_ref()) {
            if !c.known_good() && !all.iter().any(|x| Arc::ptr_eq(x, c)) {
                all.push(c.clone());
            }
        }
        if all.len() > MAX_CARRIED_CHECKS {
            let old: Vec<Arc<Checks>> = all.drain(..all.len() - MAX_CARRIED_CHECKS / 2).collect();
            self.check(&old)?;
        }
        Ok(all)
    }

    /// Records `p`'s launches for replay where the device can ([`Driver::record`]); `false` where it
    /// cannot (launching again is then the replay).
    pub fn record(&self, p: &mut Prepared) -> Result<bool> {
        p.recording = None;
        let gate = self.gate_alone()?;
        self.current(p)?;
        let d = self.driver();
        // One plain run first: whatever a launch sets up on first use with these buffers (a library
        // GEMM's pointer arrays, allocated and uploaded) must not happen inside the capture, where an
        // allocation or a host copy would be recorded instead of done.
        self.seen(self.enqueue_launches(d, p).and_then(|()| d.submit()).and_then(|()| d.synchronize()))?;
        self.count_run(p);
        HELD.with(|h| h.set((self as *const Runtime as usize, true)));
        drop(crate::binding::take_recorded());
        let recording = d.record(&mut || self.enqueue_launches(d, p));
        p.recorded_bindings = crate::binding::take_recorded();
        drop(gate);
        let recording = self.seen(recording)?;
        let recorded = recording.is_some();
        p.recording = recording;
        if recorded {
            lock(&self.stats).recordings += 1;
        }
        Ok(recorded)
    }

    /// Seconds the device spent on the work `enqueue` makes (a call of a compiled function, say), timed on
    /// the device (CUDA events, wgpu timestamp queries) without blocking: `enqueue` runs at once, the
    /// future waits for the timing, so awaiting it also waits for the work. `None` where the device
    /// cannot time itself (or, on wgpu, while another timing is pending): then nothing was waited for.
    pub fn time_async<'a>(&'a self, enqueue: &mut dyn FnMut() -> Result<()>) -> crate::device::TimeFuture<'a> {
        let _gate = self.gate();
        self.driver().time_async(enqueue)
    }

    /// Seconds one launch of `p` takes: `n` launches back to back between two device events, divided by
    /// `n`, where the device can time itself; else host wall time around the launches and a wait.
    pub fn time_launches(&self, p: &Prepared, n: usize) -> Result<f64> {
        let _gate = self.gate();
        let n = n.max(1);
        // A stale plan is the caller's error, not a sign that the device is lost.
        self.current(p)?;
        let d = self.driver();
        let mut enqueue = || (0..n).try_for_each(|_| self.launch_now(p).map(drop));
        if let Some(s) = self.seen(d.time(&mut enqueue))? {
            return Ok(s / n as f64);
        }
        let t = web_time::Instant::now();
        enqueue()?;
        self.seen(d.synchronize())?;
        Ok(t.elapsed().as_secs_f64() / n as f64)
    }

    /// GB/s (bytes read + written) of the device's own copy of `bytes` (a CUDA memcpy, a wgpu buffer
    /// copy: no kiln kernel), the median of `repeat` copies each timed on the device: the ceiling a
    /// memory-bound kernel is quoted against. `None` where the device cannot time itself.
    pub fn copy_rate(&self, bytes: u64, repeat: usize) -> Result<Option<f64>> {
        self.reopen_if_lost()?;
        let _gate = self.gate();
        let (src, dst) = (self.alloc(bytes, "a timed copy's source")?, self.alloc(bytes, "a timed copy's target")?);
        let d = self.driver();
        let mut seconds = Vec::with_capacity(repeat);
        // Three copies first, untimed in the median: the first touches of fresh memory are slower.
        for i in 0..repeat.max(1) + 3 {
            let copy = &mut || {
                d.copy(src.raw(), dst.raw(), bytes)?;
                d.submit()
            };
            let Some(s) = self.seen(d.time(copy))? else { return Ok(None) };
            if i >= 3 {
                seconds.push(s);
            }
        }
        seconds.sort_by(f64::total_cmp);
        Ok(Some(2.0 * bytes as f64 / seconds[seconds.len() / 2] / 1e9))
    }

    /// The output tensors of a prepared graph (its output buffers, shared), carrying `checks`.
    pub fn outputs(&self, p: &Prepared, checks: &[Arc<Checks>]) -> Vec<DeviceTensor> {
        p.layout
            .outputs
            .iter()
            .map(|(b, dims, dtype)| DeviceTensor {
                buffer: p.buffers[*b].clone(),
                dtype: *dtype,
                dims: dims.clone(),
                checks: checks.to_vec(),
            })
            .collect()
    }

    /// Runs a compiled graph on device tensors and returns device tensors; nothing waits and nothing
    /// crosses to the host.
    pub fn run<T: Borrow<DeviceTensor>>(&self, c: &Arc<CompiledGraph>, inputs: &[T]) -> Result<Vec<DeviceTensor>> {
        self.reopen_if_lost()?;
        let p = self.prepare_now(c, inputs)?;
        let own = self.launch_now(&p)?;
        Ok(self.outputs(&p, &self.carried(inputs, own)?))
    }

    /// Host in, host out: uploads `inputs`, runs, downloads the outputs (tests and tools).
    pub fn run_host(&self, c: &Arc<CompiledGraph>, inputs: &[&TensorData]) -> Result<Vec<TensorData>> {
        let devs = inputs.iter().map(|d| self.upload(d)).collect::<Result<Vec<_>>>()?;
        let outs = self.run(c, &devs)?;
        outs.iter().map(|t| self.download(t)).collect()
    }
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Runtime({})", self.driver().describe())
    }
}
