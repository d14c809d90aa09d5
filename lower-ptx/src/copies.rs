//! Uploads beside the kernels: a training loop's next batch is copied to the device while the current
//! step computes. (torch's pinned, `non_blocking=True` copies free the host but run in the compute
//! stream's order, between the steps; overlapping them is left to a side stream the user manages.)
//!
//! The copies run on a stream of their own. What makes that safe is where the destination came from:
//! the runtime's pool hands an upload a buffer some earlier kernel may still be reading. So each buffer
//! freed carries a *mark* — an event recorded on the kernels' stream after every piece of work queued
//! so far (`Copies::mark`) — and its upload waits on the copy stream for that event only, not for the
//! work queued after it. A mark is recorded only when work was queued since the last one (the driver
//! counts what it queues, `Copies::queued`), so freeing a run's intermediates costs one event, not one
//! each; and none during a CUDA graph capture, where an event would join the capture (such buffers are
//! written in the kernels' order instead).
//!
//! The kernels' stream waits for a copy where the buffer is first used there, not where the upload was
//! made (`Copies::settle`): a loader's upload made between two steps would otherwise hold the next
//! step until the copy — which itself waits for the step before — is done, putting the copy between the
//! steps again. So the driver settles the buffers of every operation it queues (a launch's bindings, a
//! copy's ends, a read, a clear, a free) and every pending copy before a capture or a wait for the
//! device; an operation that touches no uploaded buffer costs one atomic load.

use crate::staging::Staging;
use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{CudaContext, CudaEvent, CudaStream, DriverError};
use kiln_graph::runtime::lock;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// Chunks the copy stream's staging may pin (256 MiB): room for a few large batches staged ahead, so a
/// loader fills the next batches while the device still reads the earlier ones — with one batch's worth
/// it waited for each copy, and so for the step before it, and the copies ran between the steps.
pub const MAX_COPY_CHUNKS: usize = 64;

/// Buffers below this size are written in the kernels' order: a copy this small is over before a second
/// stream's events would pay for themselves.
pub const MIN_BYTES: u64 = 1 << 20;

/// The copy stream, its staging and the marks (see the module docs).
pub(crate) struct Copies {
    stream: OnceLock<Arc<CudaStream>>,
    staging: Mutex<Staging>,
    marks: Mutex<Marks>,
    /// Operations queued on the kernels' stream so far (bumped after each is queued).
    queued: AtomicU64,
    /// Uploads made on the copy stream.
    uploads: AtomicU64,
    /// Copies the kernels' stream has not waited for yet: the end of the last copy into each buffer
    /// (by its device address).
    pending: Mutex<HashMap<CUdeviceptr, CudaEvent>>,
    /// `pending`'s length, read without the lock.
    pending_count: AtomicUsize,
}

/// Marks recorded on the kernels' stream that the device may not have passed yet, oldest first.
#[derive(Default)]
struct Marks {
    live: VecDeque<Mark>,
    /// Every mark up to this one has been passed.
    passed: u64,
    /// `Copies::queued` when that one was recorded.
    passed_queued: u64,
    /// The last mark's number.
    last: u64,
    /// Events of passed marks, recorded again by later ones.
    spare: Vec<CudaEvent>,
    /// A CUDA graph is being captured on the kernels' stream: nothing may be recorded there.
    capturing: bool,
}

struct Mark {
    id: u64,
    /// `Copies::queued` when it was recorded.
    queued: u64,
    event: CudaEvent,
}

impl Marks {
    /// Forgets the marks the device has passed.
    fn prune(&mut self) {
        while let Some(front) = self.live.front() {
            if !front.event.try_is_complete().unwrap_or(false) {
                break;
            }
            let m = self.live.pop_front().expect("a front mark");
            (self.passed, self.passed_queued) = (m.id, m.queued);
            self.spare.push(m.event);
        }
    }
}

impl Copies {
    pub(crate) fn new() -> Copies {
        Copies {
            stream: OnceLock::new(),
            staging: Mutex::new(Staging::new(MAX_COPY_CHUNKS)),
            marks: Mutex::default(),
            queued: AtomicU64::new(0),
            uploads: AtomicU64::new(0),
            pending: Mutex::default(),
            pending_count: AtomicUsize::new(0),
        }
    }

    /// Counts one operation queued on the kernels' stream (called after queueing it, so a mark that sees
    /// the count was recorded behind the operation).
    pub(crate) fn queued(&self) {
        self.queued.fetch_add(1, Ordering::Release);
    }

    /// Starts or ends a capture on the kernels' stream (no marks are recorded inside one).
    pub(crate) fn set_capturing(&self, on: bool) {
        lock(&self.marks).capturing = on;
    }

    /// Where the kernels' stream stands, for a buffer of `bytes` freed now; `None` for a small buffer,
    /// inside a capture, or when the event cannot be recorded.
    pub(crate) fn mark(&self, ctx: &Arc<CudaContext>, kernels: &CudaStream, bytes: u64) -> Option<u64> {
        if bytes < MIN_BYTES {
            return None;
        }
        let mut m = lock(&self.marks);
        if m.capturing {
            return None;
        }
        let queued = self.queued.load(Ordering::Acquire);
        if let Some(back) = m.live.back().filter(|b| b.queued == queued) {
            return Some(back.id);
        }
        if m.live.is_empty() && m.last > 0 && m.passed_queued == queued {
            // Nothing queued since the last mark, which the device has passed already.
            return Some(m.passed);
        }
        m.prune();
        let event = match m.spare.pop() {
            Some(e) => e,
            None => ctx.new_event(None).ok()?,
        };
        event.record(kernels).ok()?;
        m.last += 1;
        let id = m.last;
        m.live.push_back(Mark { id, queued, event });
        Some(id)
    }

    /// Queues a copy of `bytes` into `dst` on the copy stream after the device has passed `free_at`; the
    /// kernels' stream waits for it where `dst` is first used (`Copies::settle`).
    pub(crate) fn upload(
        &self,
        ctx: &Arc<CudaContext>,
        dst: CUdeviceptr,
        bytes: &[u8],
        free_at: u64,
    ) -> Result<(), DriverError> {
        let copies = match self.stream.get() {
            Some(s) => s,
            None => {
                let s = ctx.new_stream()?;
                self.stream.get_or_init(|| s)
            }
        };
        {
            let mut m = lock(&self.marks);
            m.prune();
            if free_at > m.passed {
                if let Some(mark) = m.live.iter().find(|k| k.id == free_at) {
                    copies.wait(&mark.event)?;
                }
            }
        }
        let staged = lock(&self.staging).upload(ctx, copies, dst, bytes);
        // Recorded even when staging failed half-way: the copies it queued are pending all the same.
        let copied = ctx.new_event(None)?;
        if let Err(e) = copied.record(copies) {
            // Without an end to wait for, the copy stream is waited for here.
            copies.synchronize()?;
            return Err(e);
        }
        // A copy into the same buffer still pending comes before this one on the copy stream, so this
        // copy's end covers both.
        let mut pending = lock(&self.pending);
        pending.insert(dst, copied);
        self.pending_count.store(pending.len(), Ordering::Release);
        drop(pending);
        staged?;
        self.uploads.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Makes the kernels' stream wait for the pending copies into any of `buffers` (device addresses of
    /// allocations) before what is queued next; returns whether it waited for any.
    pub(crate) fn settle(
        &self,
        kernels: &CudaStream,
        buffers: impl IntoIterator<Item = CUdeviceptr>,
    ) -> Result<bool, DriverError> {
        if self.pending_count.load(Ordering::Acquire) == 0 {
            return Ok(false);
        }
        let mut pending = lock(&self.pending);
        let mut waited = false;
        for b in buffers {
            let Some(copied) = pending.get(&b) else { continue };
            // Forgotten only once the stream waits for it (a failed wait leaves it pending).
            kernels.wait(copied)?;
            pending.remove(&b);
            waited = true;
        }
        self.pending_count.store(pending.len(), Ordering::Release);
        Ok(waited)
    }

    /// Makes the kernels' stream wait for every pending copy (before a capture, a wait for the device).
    pub(crate) fn settle_all(&self, kernels: &CudaStream) -> Result<bool, DriverError> {
        if self.pending_count.load(Ordering::Acquire) == 0 {
            return Ok(false);
        }
        let pending = lock(&self.pending);
        let buffers: Vec<CUdeviceptr> = pending.keys().copied().collect();
        drop(pending);
        self.settle(kernels, buffers)
    }

    /// Uploads made on the copy stream so far.
    pub(crate) fn uploads(&self) -> u64 {
        self.uploads.load(Ordering::Relaxed)
    }
}
