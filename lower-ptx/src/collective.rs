//! Collectives over kiln's device tensors on CUDA, as data-parallel training runs them: NCCL issued on
//! the runtime's own stream, so an all-reduce queues behind the step that made the gradients and ahead
//! of the update that reads them with no host wait; many tensors in one NCCL group (one bucket); results
//! in fresh buffers, so a tensor stays immutable.
//!
//! A collective whose peer died never finishes, and NCCL over NVLink cannot tell: a watchdog thread
//! polls NCCL's background error and the age of the oldest unfinished collective (a flag the driver
//! sets from the stream: no CUDA call of its own, which a thread blocked in the driver could hold up,
//! as a blocking read of the loss did), and past the timeout
//! aborts the communicator — which ends the stuck kernels, so a thread waiting on the device returns —
//! and keeps the reason, which every later call (and [`Collective::healthy`]) reports. Should the
//! process still be stuck a grace period later with nobody having been told (an abort that does not
//! return, a thread blocked where the abort cannot reach), the watchdog prints the reason and exits the
//! process, as torch's NCCL watchdog does: a rank that hangs forever is worse than one that stops.

use crate::nccl::{nccl, Comm, DataType, ReduceOp, UniqueId};
use crate::runtime::Cuda;
use kiln_graph::runtime::{lock, DeviceTensor, Runtime};
use kiln_graph::{DType, Error, Result};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// How often the watchdog looks.
const WATCH_EVERY: Duration = Duration::from_millis(50);

/// This process's rank of an NCCL communicator on a kiln CUDA runtime, with its watchdog.
pub struct Collective {
    comm: Comm,
    rt: Arc<Runtime>,
    timeout: Duration,
    /// Collectives issued and not yet seen finished, oldest first.
    in_flight: Mutex<VecDeque<InFlight>>,
    /// Why the communicator was aborted (reported by every later call).
    failure: Mutex<Option<String>>,
    /// A caller has been handed the failure (so the process is not stuck, and must not be ended).
    reported: Arc<std::sync::atomic::AtomicBool>,
    /// Collectives handed to the watchdog so far.
    issued: std::sync::atomic::AtomicU64,
    /// Collectives the device has run so far: a host function queued after each adds one
    /// ([`Cuda::count_done`]), also when a recorded CUDA graph replays it, hence a count and not a flag
    /// per call. (Lives as long as the process: a recording may hold its address.)
    finished: &'static std::sync::atomic::AtomicU64,
}

struct InFlight {
    what: String,
    since: Instant,
    /// Done once `finished` reaches it. Collectives on the kernels' stream and on the collectives' own
    /// may finish out of order; one finishing early stands in for an earlier one, which delays a
    /// timeout by at most that much (a dead peer stops every later one too).
    expected: u64,
}

/// A new communicator's identity as bytes (made on rank 0, handed to the others by the rendezvous).
pub fn new_id() -> Result<Vec<u8>> {
    Ok(nccl()?.unique_id()?.to_bytes())
}

fn cuda(rt: &Runtime) -> Result<&Cuda> {
    rt.driver().as_any().downcast_ref::<Cuda>().ok_or_else(|| Error::Distributed {
        rank: None,
        msg: format!("NCCL collectives run on the CUDA backend; this runtime is `{}`", rt.name()),
    })
}

fn nccl_type(t: &Runtime, d: DType) -> Option<DataType> {
    match d {
        DType::F32 => Some(DataType::F32),
        DType::F64 => Some(DataType::F64),
        DType::F16 => Some(DataType::F16),
        DType::BF16 => Some(DataType::BF16),
        DType::I32 => Some(DataType::I32),
        DType::I64 if t.target().storage_bytes(d, 1) == 8 => Some(DataType::I64),
        _ => None,
    }
}

impl Collective {
    /// Joins communicator `id` (from [`new_id`] on rank 0) as `rank` of `world` on `rt`'s device;
    /// returns once every rank has, or fails after `timeout` (a rank that passed the rendezvous and
    /// died before joining). Collectives unfinished after `timeout` abort it.
    pub fn join(rt: &Arc<Runtime>, world: usize, rank: usize, id: &[u8], timeout: Duration) -> Result<Arc<Collective>> {
        let fail = |msg: String| Error::Distributed { rank: Some(rank), msg };
        let id = UniqueId::from_bytes(id)
            .ok_or_else(|| fail(format!("an NCCL id has 128 bytes; rank 0 sent {}", id.len())))?;
        cuda(rt)?.collective_stream()?;
        let comm = join_within(rt, world, rank, id, timeout).map_err(fail)?;
        let c = Arc::new(Collective {
            comm,
            rt: rt.clone(),
            timeout,
            in_flight: Mutex::default(),
            failure: Mutex::default(),
            reported: Arc::default(),
            issued: 0.into(),
            finished: Box::leak(Box::new(0.into())),
        });
        let weak = Arc::downgrade(&c);
        cuda(rt)?.set_collective(weak.clone());
        std::thread::Builder::new()
            .name(format!("kiln-nccl-watchdog-{rank}"))
            .spawn(move || watch(weak))
            .map_err(|e| fail(format!("starting the NCCL watchdog: {e}")))?;
        Ok(c)
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.comm.rank
    }

    /// Ranks in the world.
    pub fn world(&self) -> usize {
        self.comm.world
    }

    /// The runtime whose device and stream it runs on.
    pub fn runtime(&self) -> &Arc<Runtime> {
        &self.rt
    }

    fn fail(&self, msg: String) -> Error {
        Error::Distributed { rank: Some(self.comm.rank), msg }
    }

    /// `Ok` unless the communicator failed (a peer gone, a collective past the timeout).
    pub fn healthy(&self) -> Result<()> {
        match lock(&self.failure).as_ref() {
            Some(why) => {
                self.reported.store(true, std::sync::atomic::Ordering::Release);
                Err(self.fail(why.clone()))
            }
            None => Ok(()),
        }
    }

    /// Each of `xs` combined across the world by `op`, into new tensors (one NCCL group).
    pub fn all_reduce(&self, xs: &[DeviceTensor], op: ReduceOp) -> Result<Vec<DeviceTensor>> {
        let what = format!("an all-reduce of {} tensors", xs.len());
        self.each(xs, &what, |comm, dtype, count, send, recv, stream| {
            // SAFETY: `send` and `recv` hold `count` elements of `dtype` on this device (sized by the
            // runtime for the tensor); both buffers are kept alive by the tensors the caller holds and the
            // outputs returned, and kiln frees device memory only through the stream-ordered pool.
            unsafe { comm.all_reduce(send, recv, count, dtype, op, stream) }
        })
    }

    /// Each of `xs` as rank `root` holds it, on every rank, into new tensors (one NCCL group).
    pub fn broadcast(&self, xs: &[DeviceTensor], root: usize) -> Result<Vec<DeviceTensor>> {
        if root >= self.world() {
            return Err(self.fail(format!("broadcast from rank {root} in a world of {}", self.world())));
        }
        let what = format!("a broadcast of {} tensors from rank {root}", xs.len());
        self.each(xs, &what, |comm, dtype, count, send, recv, stream| {
            // SAFETY: as in `all_reduce`.
            unsafe { comm.broadcast_into(send, recv, count, dtype, root, stream) }
        })
    }

    /// Issues `call` for each tensor into a fresh buffer, as one group, and tracks it for the watchdog.
    fn each(
        &self,
        xs: &[DeviceTensor],
        what: &str,
        call: impl Fn(&Comm, DataType, usize, u64, u64, *mut std::ffi::c_void) -> Result<()>,
    ) -> Result<Vec<DeviceTensor>> {
        self.healthy()?;
        let cuda = cuda(&self.rt)?;
        let mut outs = Vec::with_capacity(xs.len());
        for x in xs {
            x.buffer.live("a collective's input")?;
            if !Arc::ptr_eq(x.buffer.runtime(), &self.rt) {
                return Err(self.fail(format!("{what}: a tensor on another device than the communicator's")));
            }
            let dtype = nccl_type(&self.rt, x.dtype)
                .ok_or_else(|| self.fail(format!("{what}: NCCL does not reduce {:?} tensors", x.dtype)))?;
            let bytes = self.rt.target().storage_bytes(x.dtype, x.numel());
            let buffer = self.rt.alloc(bytes.max(1), "a collective's result")?;
            outs.push((dtype, buffer));
        }
        let stream = cuda.collective_stream()?;
        self.comm
            .library()
            .group(|| {
                for (x, (dtype, out)) in xs.iter().zip(&outs) {
                    if x.numel() > 0 {
                        let (send, recv) = (cuda.address(x.buffer.raw()), cuda.address(out.raw()));
                        call(&self.comm, *dtype, x.numel(), send, recv, stream)
                            .map_err(|e| self.fail(e.to_string()))?;
                    }
                }
                Ok(())
            })
            // An abort while this call waited in NCCL: the watchdog's reason says more than NCCL's code.
            .map_err(|e| self.healthy().err().unwrap_or(e))?;
        // Counted as queued on the kernels' stream, so a buffer freed from now on gets a mark behind it.
        cuda.queued();
        cuda.count_after(cuda.main_stream(), self.finished)?;
        self.track(what);
        Ok(xs
            .iter()
            .zip(outs)
            .map(|(x, (_, buffer))| DeviceTensor {
                buffer,
                dtype: x.dtype,
                dims: x.dims.clone(),
                checks: x.checks.clone(),
            })
            .collect())
    }

    /// A compiled step's bucket of all-reduces (kernel `kernel`: `(dtype, elements, input, output)`
    /// each), issued as one group on the collectives' stream beside the kernels after it.
    pub(crate) fn bucket(
        &self,
        cuda: &Cuda,
        kernel: &str,
        op: kiln_graph::ir::CollectiveOp,
        parts: &[(DType, usize, u64, u64)],
    ) -> Result<()> {
        self.healthy()?;
        let what = format!("{kernel}: an all-reduce of {} tensors", parts.len());
        // Named again at each replay of a recording that captured it.
        if cuda.capturing() {
            cuda.captured_collective(&what);
        }
        let op = ReduceOp::from(op);
        let types = parts
            .iter()
            .map(|&(d, ..)| {
                nccl_type(&self.rt, d).ok_or_else(|| self.fail(format!("{what}: NCCL does not reduce {d:?}")))
            })
            .collect::<Result<Vec<_>>>()?;
        cuda.beside(|side| {
            let stream = side.cu_stream() as *mut std::ffi::c_void;
            self.comm
                .library()
                .group(|| {
                    for (&(_, count, send, recv), &dtype) in parts.iter().zip(&types) {
                        if count > 0 {
                            // SAFETY: `send` and `recv` are plan buffers of `count` elements of `dtype` on
                            // this device, kept allocated until the kernels wait for this call
                            // (`Plan::waits`, and every run's end).
                            unsafe { self.comm.all_reduce(send, recv, count, dtype, op, stream) }
                                .map_err(|e| self.fail(e.to_string()))?;
                        }
                    }
                    Ok(())
                })
                .map_err(|e| self.healthy().err().unwrap_or(e))?;
            // Captured into a CUDA graph, the count goes before the end the kernels wait for: a
            // capture must join every piece of the collectives' stream's work back into the kernels'.
            if cuda.capturing() {
                cuda.count_done(side, self.finished)?;
            }
            Ok(())
        })?;
        // Captured, it runs at each replay, which hands it to the watchdog then. Launched, the count
        // waits for the bucket's end on a stream of its own: neither the kernels nor the next bucket
        // wait for the host function.
        if !cuda.capturing() {
            cuda.count_after(cuda.side_stream()?, self.finished)?;
            self.track(&what);
        }
        Ok(())
    }

    /// Hands the collectives a CUDA graph replay just queued to the watchdog (their names, in order).
    pub(crate) fn replayed(&self, names: &[String]) {
        for what in names {
            self.track(what);
        }
    }

    /// Hands a collective just queued to the watchdog.
    fn track(&self, what: &str) {
        let n = self.issued.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        lock(&self.in_flight).push_back(InFlight {
            what: format!("{what} (collective #{n})"),
            since: Instant::now(),
            expected: n,
        });
    }

    /// One look: `false` once there is nothing more to watch (the communicator failed).
    fn look(&self) -> bool {
        if lock(&self.failure).is_some() {
            return false;
        }
        let mut q = lock(&self.in_flight);
        while let Some(f) = q.front() {
            if self.finished.load(std::sync::atomic::Ordering::Acquire) >= f.expected {
                q.pop_front();
                continue;
            }
            if f.since.elapsed() > self.timeout {
                let msg = format!(
                    "{} did not finish within {:?}: a rank died or stalled (NCCL cannot say which); the \
                     communicator was aborted",
                    f.what, self.timeout
                );
                drop(q);
                return self.abort(msg);
            }
            break;
        }
        drop(q);
        // After the timeout check, which needs no library call: NCCL's own could wait on the collective.
        if let Some(e) = self.comm.async_error() {
            return self.abort(format!("NCCL reported: {e} (a peer may have died); the communicator was aborted"));
        }
        true
    }

    fn abort(&self, why: String) -> bool {
        let error = self.fail(why.clone());
        tracing::error!(target: "kiln::dist", rank = self.comm.rank, "{why}");
        *lock(&self.failure) = Some(why);
        // The last resort, armed before the abort (which may itself not return).
        let (reported, grace) =
            (self.reported.clone(), self.timeout.clamp(Duration::from_secs(5), Duration::from_secs(60)));
        let _ = std::thread::Builder::new().name("kiln-nccl-last-resort".into()).spawn(move || {
            std::thread::sleep(grace);
            if !reported.load(std::sync::atomic::Ordering::Acquire) {
                eprintln!("{error}\nkiln: the process was still blocked {grace:?} after the abort: exiting");
                std::process::exit(1);
            }
        });
        self.comm.abort();
        false
    }
}

/// `Comm::init` on a thread of its own, waited for at most `timeout`. NCCL's set-up waits for every
/// rank with no timeout of its own, and a communicator it has not handed back cannot be aborted: past
/// the timeout the caller gets the error and the thread is left blocked (it ends with the process).
fn join_within(
    rt: &Arc<Runtime>,
    world: usize,
    rank: usize,
    id: UniqueId,
    timeout: Duration,
) -> std::result::Result<Comm, String> {
    let (tx, rx) = std::sync::mpsc::channel();
    let rt = rt.clone();
    std::thread::Builder::new()
        .name(format!("kiln-nccl-join-{rank}"))
        .spawn(move || {
            // The device's context, current on this thread too.
            let joined = cuda(&rt)
                .and_then(Cuda::collective_stream)
                .map_err(|e| e.to_string())
                .and_then(|_| Comm::init(world, rank, id).map_err(|e| e.to_string()));
            let _ = tx.send(joined);
        })
        .map_err(|e| format!("starting NCCL's set-up: {e}"))?;
    match rx.recv_timeout(timeout) {
        Ok(joined) => joined,
        Err(_) => Err(format!(
            "joining the NCCL world ({world} ranks) did not finish within {timeout:?}: a rank passed the \
             rendezvous and died or stalled before joining (NCCL cannot say which)"
        )),
    }
}

fn watch(c: Weak<Collective>) {
    loop {
        std::thread::sleep(WATCH_EVERY);
        let Some(c) = c.upgrade() else { return };
        if !c.look() {
            return;
        }
    }
}
