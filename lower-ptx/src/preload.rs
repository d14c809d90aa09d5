//! cuBLAS's and cuBLASLt's shared libraries opened in the background when a CUDA device opens.
//!
//! The libraries are hundreds of MB (libcublasLt alone ~500): opening them took 53–350 ms on an H200
//! (session 37, `benches/NOTES.md`), cold page cache the slow end, and kiln used to open them at a
//! graph's first load, inside its first compile. A program that opens a device usually uploads its
//! weights and traces before it compiles; the libraries load meanwhile, as PyTorch's load when it is
//! imported. Only the `dlopen` runs here: cuBLASLt's heuristic is warmed by a graph's load, on a thread
//! it joins (`Cuda::load_many`), because a thread still inside cuBLASLt when the process exits crashes
//! it — the library's static destructors, registered during its `dlopen` and so run before any exit
//! handler registered earlier, tear its tables down under the thread (a segfault at exit on an H200,
//! session 37). Nothing here fails: a library that is not there is reported by the first GEMM that
//! needs it, as before.

use std::sync::{Mutex, OnceLock};
use std::thread::JoinHandle;

/// Set once the preload has started in this process. The libraries it opens stay open for the life of
/// the process; cudarc opens them again by name at its first call and finds them loaded.
static STARTED: OnceLock<()> = OnceLock::new();

/// The preload thread while it may still run: the process joins it before exiting.
static RUNNING: Mutex<Option<JoinHandle<()>>> = Mutex::new(None);

/// Waits for the preload at exit, so a library is never mid-`dlopen` (its static constructors running)
/// while the process tears down: a program that opens a device and ends at once waits for the open.
extern "C" fn join_at_exit() {
    let running = RUNNING.lock().map(|mut r| r.take()).unwrap_or_else(|mut e| e.get_mut().take());
    if let Some(thread) = running {
        let _ = thread.join();
    }
}

/// Starts opening cuBLAS and cuBLASLt on a thread of their own, once per process.
/// `KILN_CUDA_PRELOAD_BLAS=0` leaves them to the first graph that needs them.
pub(crate) fn start() {
    if std::env::var("KILN_CUDA_PRELOAD_BLAS").as_deref() == Ok("0") {
        return;
    }
    STARTED.get_or_init(|| {
        // SAFETY: registers a plain function taking and returning nothing.
        if unsafe { libc::atexit(join_at_exit) } != 0 {
            return; // no way to wait for the thread at exit: no preload
        }
        let spawned = std::thread::Builder::new().name("kiln-preload-blas".into()).spawn(|| {
            let clock = std::time::Instant::now();
            for lib in ["cublas", "cublasLt"] {
                let opened = cudarc::get_lib_name_candidates(lib).into_iter().find_map(|name| {
                    // SAFETY: NVIDIA's libraries run no initialisation that depends on the caller; this
                    // is the same open cudarc makes at its first call.
                    unsafe { libloading::Library::new(name) }.ok()
                });
                // Kept open for the life of the process: closing would unload what was just loaded.
                std::mem::forget(opened);
            }
            tracing::debug!(target: "kiln::graph", ms = clock.elapsed().as_secs_f64() * 1e3, "cuBLAS libraries opened");
        });
        match spawned {
            Ok(thread) => *RUNNING.lock().unwrap_or_else(|e| e.into_inner()) = Some(thread),
            Err(e) => tracing::debug!(target: "kiln::graph", error = %e, "cuBLAS libraries not preloaded"),
        }
    });
}
