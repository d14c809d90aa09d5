//! Pinned staging for uploads, so an upload never waits for the device. A copy from pageable host
//! memory either blocks the host or is staged by the driver (which may wait for the stream first); kiln
//! instead copies the host bytes into page-locked chunks it owns and queues the device copy from there
//! on the stream, behind the work already queued and ahead of what comes next — the same order a
//! synchronous copy gives, without the wait (a training step's few-byte optimizer scalars used to hold
//! the host until the previous step had finished). A chunk is written again only once the device has
//! read it (an event recorded after its copy), so at most a ring's limit of chunks ([`MAX_CHUNKS`] for
//! the kernels' stream) is pinned and a larger upload streams through them, the host filling some chunks
//! while the device reads others.

use cudarc::driver::sys::{CUdeviceptr, CUevent_flags};
use cudarc::driver::{CudaContext, CudaEvent, CudaStream, DriverError, PinnedHostSlice};
use std::collections::VecDeque;
use std::sync::Arc;

/// Bytes a chunk holds: large enough that a big upload's copies run at the link's rate, small enough
/// that a few of them stay pinned without weighing on the host.
pub const CHUNK_BYTES: usize = 4 << 20;

/// Chunks kept pinned at most (64 MiB): past this many in flight, an upload waits for the oldest.
pub const MAX_CHUNKS: usize = 16;

/// Host threads filling chunks side by side at most (one thread's copy into pinned memory is slower than
/// the link it feeds).
const FILL_THREADS: usize = 8;

/// One page-locked chunk and the event recorded after the last copy that reads it.
struct Chunk {
    host: PinnedHostSlice<u8>,
    read: CudaEvent,
    /// Bytes of it handed out since it was last free (small uploads share a chunk).
    used: usize,
}

/// A ring of pinned chunks on one stream (see the module docs).
pub(crate) struct Staging {
    /// In the order they were last written: the front was read longest ago.
    chunks: VecDeque<Chunk>,
    /// Chunks pinned, in the ring or being filled.
    pinned: usize,
    max_chunks: usize,
}

impl Staging {
    /// An empty ring: chunks are pinned as uploads need them, up to `max_chunks`.
    pub(crate) fn new(max_chunks: usize) -> Staging {
        Staging { chunks: VecDeque::new(), pinned: 0, max_chunks: max_chunks.max(1) }
    }

    /// Chunks pinned now.
    pub(crate) fn chunks(&self) -> usize {
        self.pinned
    }

    /// Queues a copy of `bytes` to `dst` on `stream` through the ring; returns once the host bytes are
    /// copied into pinned chunks (waiting for the device only when every chunk is still being read). A
    /// large upload fills up to half the ring's chunks (at most [`FILL_THREADS`]) at a time on as many
    /// host threads, then queues their copies, which run while the next chunks fill.
    pub(crate) fn upload(
        &mut self,
        ctx: &Arc<CudaContext>,
        stream: &CudaStream,
        dst: CUdeviceptr,
        bytes: &[u8],
    ) -> Result<(), DriverError> {
        let round = (self.max_chunks / 2).clamp(1, FILL_THREADS) * CHUNK_BYTES;
        let mut offset = 0;
        while offset < bytes.len() {
            let part = &bytes[offset..(offset + round).min(bytes.len())];
            let mut taken = Vec::new();
            let mut filled = 0;
            while filled < part.len() {
                let (chunk, at) = self.take(ctx, part.len() - filled)?;
                let n = (CHUNK_BYTES - at).min(part.len() - filled);
                taken.push((chunk, at, filled, n));
                filled += n;
            }
            let fill = |(chunk, at, from, n): &mut (Chunk, usize, usize, usize)| -> Result<(), DriverError> {
                // SAFETY: the chunk holds CHUNK_BYTES and `at + n` is within it; the device has read
                // everything queued from this range (`take` waited, or never handed it out since).
                unsafe {
                    let base = chunk.host.as_mut_ptr()?.add(*at);
                    std::ptr::copy_nonoverlapping(part[*from..].as_ptr(), base, *n);
                }
                Ok(())
            };
            let written = if taken.len() > 1 {
                std::thread::scope(|s| {
                    let filling: Vec<_> = taken.iter_mut().map(|t| s.spawn(move || fill(t))).collect();
                    filling.into_iter().try_for_each(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                })
            } else {
                taken.iter_mut().try_for_each(fill)
            };
            let queued = written.and_then(|()| {
                taken.iter_mut().try_for_each(|(chunk, at, from, n)| {
                    // SAFETY: the range was just written; it stays untouched until `read` completes.
                    let staged =
                        unsafe { std::slice::from_raw_parts(chunk.host.as_mut_ptr()?.add(*at) as *const u8, *n) };
                    let to = dst + (offset + *from) as u64;
                    // SAFETY: `dst` holds `bytes.len()` bytes (the caller's allocation), `to + n` within it.
                    unsafe { cudarc::driver::result::memcpy_htod_async(to, staged, stream.cu_stream()) }?;
                    chunk.read.record(stream)?;
                    // The next small upload starts aligned, as the device's copies prefer.
                    chunk.used = (*at + *n).next_multiple_of(256).min(CHUNK_BYTES);
                    Ok(())
                })
            });
            // Back in the ring whatever happened: a chunk's event covers what was queued from it.
            self.chunks.extend(taken.into_iter().map(|(chunk, ..)| chunk));
            queued?;
            offset += part.len();
        }
        Ok(())
    }

    /// A chunk with room for up to `want` bytes (at least one), taken out of the ring, and the offset
    /// where the room starts: the newest chunk while it has room, else the oldest once the device has
    /// read it, else a new one, else (at the limit) the oldest after waiting for it.
    fn take(&mut self, ctx: &Arc<CudaContext>, want: usize) -> Result<(Chunk, usize), DriverError> {
        if let Some(last) = self.chunks.back() {
            // A small upload shares the newest chunk: its event, recorded again, covers both copies.
            if last.used > 0 && CHUNK_BYTES - last.used >= want.min(CHUNK_BYTES) {
                let c = self.chunks.pop_back().expect("a newest chunk");
                let at = c.used;
                return Ok((c, at));
            }
        }
        let oldest_free = self.chunks.front().is_some_and(|c| c.read.try_is_complete().unwrap_or(false));
        // Chunks taken out by the caller count against the limit too (`pinned`).
        if oldest_free || self.pinned >= self.max_chunks {
            if let Some(mut c) = self.chunks.pop_front() {
                // Returns at once when the device has read it already.
                c.read.synchronize()?;
                c.used = 0;
                return Ok((c, 0));
            }
        }
        // SAFETY: the memory is written before the device reads any of it.
        let host = unsafe { ctx.alloc_pinned::<u8>(CHUNK_BYTES) }?;
        self.pinned += 1;
        // The host waits on it when the ring is full: sleeping, not spinning a core the loop needs.
        let read = ctx.new_event(Some(CUevent_flags::CU_EVENT_BLOCKING_SYNC))?;
        Ok((Chunk { host, read, used: 0 }, 0))
    }
}

impl Drop for Chunk {
    fn drop(&mut self) {
        // The device may still be reading it (a ring dropped with the driver, or a chunk dropped while
        // being taken): its memory is freed only after.
        let _ = self.read.synchronize();
    }
}
