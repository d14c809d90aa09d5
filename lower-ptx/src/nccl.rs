//! NCCL, the collective library data-parallel training runs on, loaded at run time. kiln binds the few
//! entry points it calls itself rather than through cudarc's loader, which looks for `libnccl.so` and
//! `libnccl.so.<CUDA major>` but not NCCL's own soname `libnccl.so.2` — the only name a runtime-only
//! install (Debian's `libnccl2`, or the `nvidia-nccl-cu12` wheel torch ships with) provides.
//! Where no NCCL is found the error says where kiln looked and how to install one.

use kiln_graph::Error;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::path::PathBuf;
use std::sync::OnceLock;

/// An NCCL communicator's identity: made by one rank, shared with the others (the rendezvous), used by
/// all to join the same communicator.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UniqueId {
    /// NCCL's opaque bytes.
    pub bytes: [c_char; 128],
}

/// The element types kiln reduces (NCCL's `ncclDataType_t` values).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
pub enum DataType {
    /// `ncclInt32`.
    I32 = 2,
    /// `ncclInt64`.
    I64 = 4,
    /// `ncclFloat16`.
    F16 = 6,
    /// `ncclFloat32`.
    F32 = 7,
    /// `ncclFloat64`.
    F64 = 8,
    /// `ncclBfloat16`.
    BF16 = 9,
}

type Raw = *mut c_void;
type GetVersion = unsafe extern "C" fn(*mut c_int) -> c_int;
type GetUniqueId = unsafe extern "C" fn(*mut UniqueId) -> c_int;
type CommInitRank = unsafe extern "C" fn(*mut Raw, c_int, UniqueId, c_int) -> c_int;
type CommDestroy = unsafe extern "C" fn(Raw) -> c_int;
type GetErrorString = unsafe extern "C" fn(c_int) -> *const c_char;
type AllReduce = unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, Raw, Raw) -> c_int;
type Broadcast = unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, Raw, Raw) -> c_int;
type Group = unsafe extern "C" fn() -> c_int;
type CommGetAsyncError = unsafe extern "C" fn(Raw, *mut c_int) -> c_int;
type CommAbort = unsafe extern "C" fn(Raw) -> c_int;

/// How an all-reduce combines the ranks' values (NCCL's `ncclRedOp_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
pub enum ReduceOp {
    /// `ncclSum`.
    Sum = 0,
    /// `ncclAvg` (NCCL 2.10 and newer): the sum divided by the world's size, in one pass.
    Avg = 4,
}

impl From<kiln_graph::ir::CollectiveOp> for ReduceOp {
    fn from(op: kiln_graph::ir::CollectiveOp) -> ReduceOp {
        match op {
            kiln_graph::ir::CollectiveOp::Sum => ReduceOp::Sum,
            kiln_graph::ir::CollectiveOp::Mean => ReduceOp::Avg,
        }
    }
}

/// The loaded library and the entry points kiln calls.
pub struct Nccl {
    /// Where it was loaded from.
    pub path: String,
    /// Its version, as NCCL encodes it (2.28.3 is 22803).
    pub version: i32,
    get_unique_id: GetUniqueId,
    comm_init_rank: CommInitRank,
    comm_destroy: CommDestroy,
    get_error_string: GetErrorString,
    all_reduce: AllReduce,
    broadcast: Broadcast,
    group_start: Group,
    group_end: Group,
    comm_get_async_error: CommGetAsyncError,
    comm_abort: CommAbort,
    _lib: libloading::Library,
}

fn distributed(msg: String) -> Error {
    Error::Distributed { rank: None, msg }
}

/// Where NCCL may be: `KILN_NCCL_LIB` when set (a file), else the dynamic loader's search by soname,
/// else the `nvidia-nccl-cu12` wheel in the usual Python package directories.
fn candidates() -> Vec<PathBuf> {
    if let Some(p) = std::env::var_os("KILN_NCCL_LIB") {
        return vec![PathBuf::from(p)];
    }
    let mut v: Vec<PathBuf> = ["libnccl.so.2", "libnccl.so"].iter().map(PathBuf::from).collect();
    let mut roots: Vec<PathBuf> = Vec::new();
    for base in ["/usr/local/lib", "/usr/lib", "/opt/conda/lib"] {
        if let Ok(entries) = std::fs::read_dir(base) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.starts_with("python3") {
                    roots.push(e.path().join("dist-packages"));
                    roots.push(e.path().join("site-packages"));
                }
            }
        }
    }
    roots.push(PathBuf::from("/usr/lib/python3/dist-packages"));
    if let Some(venv) = std::env::var_os("VIRTUAL_ENV") {
        if let Ok(entries) = std::fs::read_dir(PathBuf::from(venv).join("lib")) {
            roots.extend(entries.flatten().map(|e| e.path().join("site-packages")));
        }
    }
    v.extend(roots.into_iter().map(|r| r.join("nvidia/nccl/lib/libnccl.so.2")).filter(|p| p.exists()));
    v
}

/// NCCL, loaded once per process; the error (kept) names every place tried.
pub fn nccl() -> Result<&'static Nccl, Error> {
    static LOADED: OnceLock<Result<Nccl, String>> = OnceLock::new();
    LOADED.get_or_init(load).as_ref().map_err(|msg| distributed(msg.clone()))
}

fn load() -> Result<Nccl, String> {
    load_from(&candidates())
}

/// NCCL from the first of `tried` that loads (what [`nccl`] does with its own search list); the error
/// names every path and how to install NCCL.
pub fn load_from(tried: &[PathBuf]) -> Result<Nccl, String> {
    let mut why = Vec::new();
    for path in tried {
        // SAFETY: loading NCCL runs its initialisers, which only register the library.
        match unsafe { libloading::Library::new(path) } {
            Ok(lib) => return bind(lib, path.display().to_string()),
            Err(e) => why.push(format!("{}: {e}", path.display())),
        }
    }
    Err(format!(
        "NCCL was not found (tried {}). Install it (Debian/Ubuntu: `apt install libnccl2`; with pip: `pip install \
         nvidia-nccl-cu12`) or point KILN_NCCL_LIB at libnccl.so.2",
        why.join("; ")
    ))
}

fn bind(lib: libloading::Library, path: String) -> Result<Nccl, String> {
    // SAFETY: each symbol is NCCL's public C entry point of this exact signature (nccl.h, 2.x).
    unsafe {
        fn sym<T: Copy>(lib: &libloading::Library, path: &str, name: &str) -> Result<T, String> {
            // SAFETY: see `bind`.
            unsafe { lib.get::<T>(name.as_bytes()).map(|s| *s).map_err(|e| format!("{path}: no `{name}`: {e}")) }
        }
        let get_version: GetVersion = sym(&lib, &path, "ncclGetVersion")?;
        let mut version = 0;
        get_version(&mut version);
        Ok(Nccl {
            version,
            get_unique_id: sym(&lib, &path, "ncclGetUniqueId")?,
            comm_init_rank: sym(&lib, &path, "ncclCommInitRank")?,
            comm_destroy: sym(&lib, &path, "ncclCommDestroy")?,
            get_error_string: sym(&lib, &path, "ncclGetErrorString")?,
            all_reduce: sym(&lib, &path, "ncclAllReduce")?,
            broadcast: sym(&lib, &path, "ncclBroadcast")?,
            group_start: sym(&lib, &path, "ncclGroupStart")?,
            group_end: sym(&lib, &path, "ncclGroupEnd")?,
            comm_get_async_error: sym(&lib, &path, "ncclCommGetAsyncError")?,
            comm_abort: sym(&lib, &path, "ncclCommAbort")?,
            path,
            _lib: lib,
        })
    }
}

impl Nccl {
    fn check(&self, what: &str, code: c_int) -> Result<(), Error> {
        if code == 0 {
            return Ok(());
        }
        // SAFETY: NCCL returns a static, NUL-terminated string for every result code.
        let text = unsafe { CStr::from_ptr((self.get_error_string)(code)) }.to_string_lossy().into_owned();
        Err(distributed(format!("NCCL {what} failed: {text} (code {code})")))
    }

    /// A new communicator identity (on the rank that makes it; the others receive it).
    pub fn unique_id(&self) -> Result<UniqueId, Error> {
        let mut id = UniqueId { bytes: [0; 128] };
        // SAFETY: `id` is a writable `ncclUniqueId`.
        self.check("ncclGetUniqueId", unsafe { (self.get_unique_id)(&mut id) })?;
        Ok(id)
    }

    /// Runs `calls` as one NCCL group: their collectives are launched together when the group ends
    /// (many tensors' all-reduces fused into a few kernels, as one bucket).
    pub fn group<T>(&self, calls: impl FnOnce() -> Result<T, Error>) -> Result<T, Error> {
        // SAFETY: group calls only mark the thread's pending collectives; they take no pointers.
        self.check("ncclGroupStart", unsafe { (self.group_start)() })?;
        let out = calls();
        // The group is closed whatever happened inside it, or the thread's next collective would join it.
        // SAFETY: as above.
        let end = self.check("ncclGroupEnd", unsafe { (self.group_end)() });
        let out = out?;
        end.map(|()| out)
    }
}

impl UniqueId {
    /// The id as bytes (what the rendezvous hands from rank 0 to the others).
    pub fn to_bytes(&self) -> Vec<u8> {
        self.bytes.iter().map(|&b| b as u8).collect()
    }

    /// The id from bytes made by [`UniqueId::to_bytes`]; `None` unless there are exactly 128.
    pub fn from_bytes(bytes: &[u8]) -> Option<UniqueId> {
        let mut id = UniqueId { bytes: [0; 128] };
        if bytes.len() != id.bytes.len() {
            return None;
        }
        for (d, &b) in id.bytes.iter_mut().zip(bytes) {
            *d = b as c_char;
        }
        Some(id)
    }
}

/// A communicator: this rank's membership of a world of `world` ranks on the current CUDA device.
pub struct Comm {
    raw: Raw,
    nccl: &'static Nccl,
    /// Aborted (by a watchdog): the communicator is gone and must not be destroyed again.
    aborted: std::sync::atomic::AtomicBool,
    /// This rank.
    pub rank: usize,
    /// Ranks in the world.
    pub world: usize,
}

// SAFETY: NCCL allows a communicator to be called from any thread; its collectives are ordered on the
// stream they are given.
unsafe impl Send for Comm {}
// SAFETY: the calls made through `&Comm` from several threads at once are the ones NCCL documents as
// safe to make concurrently with a blocked collective: `ncclCommGetAsyncError` and `ncclCommAbort`
// (a watchdog's); collectives themselves are issued by one thread (the training loop's).
unsafe impl Sync for Comm {}

impl Comm {
    /// Joins the communicator `id` as `rank` of `world` on the CUDA context current on this thread
    /// (every rank must call it; it returns when all have).
    pub fn init(world: usize, rank: usize, id: UniqueId) -> Result<Comm, Error> {
        let nccl = nccl()?;
        let mut raw: Raw = std::ptr::null_mut();
        // SAFETY: `raw` receives the communicator; the id is NCCL's bytes.
        nccl.check("ncclCommInitRank", unsafe { (nccl.comm_init_rank)(&mut raw, world as c_int, id, rank as c_int) })?;
        Ok(Comm { raw, nccl, aborted: false.into(), rank, world })
    }

    /// The NCCL library it runs on.
    pub fn library(&self) -> &'static Nccl {
        self.nccl
    }

    /// Combines `count` elements of `dtype` at device address `send` across the world by `op` into
    /// `recv` (which may be `send`), ordered on `stream` (a `CUstream`).
    ///
    /// # Safety
    /// `send` and `recv` must each hold `count` elements of `dtype` on this communicator's device, and
    /// stay valid until `stream` has run the reduction.
    pub unsafe fn all_reduce(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        stream: *mut c_void,
    ) -> Result<(), Error> {
        // SAFETY: the caller's contract.
        let code = unsafe {
            (self.nccl.all_reduce)(
                send as *const c_void,
                recv as *mut c_void,
                count,
                dtype as c_int,
                op as c_int,
                self.raw,
                stream,
            )
        };
        self.nccl.check("ncclAllReduce", code)
    }

    /// Copies `count` elements of `dtype` at `send` on rank `root` into `recv` on every rank, on
    /// `stream` (`send` is read on the root only).
    ///
    /// # Safety
    /// As [`Comm::all_reduce`].
    pub unsafe fn broadcast_into(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        root: usize,
        stream: *mut c_void,
    ) -> Result<(), Error> {
        // SAFETY: the caller's contract.
        let code = unsafe {
            (self.nccl.broadcast)(
                send as *const c_void,
                recv as *mut c_void,
                count,
                dtype as c_int,
                root as c_int,
                self.raw,
                stream,
            )
        };
        self.nccl.check("ncclBroadcast", code)
    }

    /// An error NCCL found in the background (a peer that went away, a network failure), if any: a
    /// collective waiting on it will never finish.
    pub fn async_error(&self) -> Option<Error> {
        if self.aborted.load(std::sync::atomic::Ordering::Acquire) {
            return None;
        }
        let mut code: c_int = 0;
        // SAFETY: `code` receives the communicator's state; callable while a collective is blocked.
        let call = unsafe { (self.nccl.comm_get_async_error)(self.raw, &mut code) };
        self.nccl.check("ncclCommGetAsyncError", call).err().or_else(|| self.nccl.check("a collective", code).err())
    }

    /// Tears the communicator down now, ending its collectives in flight (they finish with garbage):
    /// the one way out of a collective whose peer will never join it. Every later call fails.
    pub fn abort(&self) {
        if !self.aborted.swap(true, std::sync::atomic::Ordering::AcqRel) {
            // SAFETY: the communicator is live (not aborted before) and is never used by NCCL again.
            unsafe {
                (self.nccl.comm_abort)(self.raw);
            }
        }
    }

    /// Sums `count` elements of `dtype` at device address `data` across the world, in place, ordered on
    /// `stream` (a `CUstream`).
    ///
    /// # Safety
    /// `data` must hold `count` elements of `dtype` on this communicator's device, and stay valid until
    /// `stream` has run the reduction.
    pub unsafe fn all_reduce_sum(
        &self,
        data: u64,
        count: usize,
        dtype: DataType,
        stream: *mut c_void,
    ) -> Result<(), Error> {
        // SAFETY: the caller's contract; NCCL allows the send and receive buffers to be the same.
        unsafe { self.all_reduce(data, data, count, dtype, ReduceOp::Sum, stream) }
    }

    /// Copies `count` elements of `dtype` at `data` from rank `root` to every rank, in place, on `stream`.
    ///
    /// # Safety
    /// As [`Comm::all_reduce_sum`].
    pub unsafe fn broadcast(
        &self,
        data: u64,
        count: usize,
        dtype: DataType,
        root: usize,
        stream: *mut c_void,
    ) -> Result<(), Error> {
        // SAFETY: the caller's contract.
        unsafe { self.broadcast_into(data, data, count, dtype, root, stream) }
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        if self.aborted.load(std::sync::atomic::Ordering::Acquire) {
            return;
        }
        // SAFETY: the communicator was made by `init`, not aborted, and is destroyed once.
        unsafe {
            (self.nccl.comm_destroy)(self.raw);
        }
    }
}
