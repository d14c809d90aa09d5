//! cuBLAS's and cuBLASLt's shared libraries opened in the background when a CUDA device opens.
//!
//! The libraries are hundreds of MB (libcublasLt alone ~500): opening them took 57–247 ms on an H200
//! (session 37, `benches/NOTES.md`), cold page cache the slow end, and kiln used to open them at a
//! graph's first load, inside its first compile. A program that opens a device usually uploads its
//! weights and traces before it compiles; the libraries load meanwhile, as PyTorch's load when it is
//! imported. cuBLASLt's heuristic is warmed there too: its first query in a process took ~130 ms,
//! the first run's largest part. Nothing here fails: a library that is not there is reported by the
//! first GEMM that needs it, as before.

use cudarc::driver::CudaContext;
use std::sync::{Arc, OnceLock};

/// Set once the preload has started in this process. The libraries it opens stay open for the life of
/// the process; cudarc opens them again by name at its first call and finds them loaded.
static STARTED: OnceLock<()> = OnceLock::new();

/// Starts opening cuBLAS and cuBLASLt on a thread of their own, once per process, then warms cuBLASLt's
/// heuristic on `ctx` ([`crate::lt::Lt::warm`]: its first query in a process costs ~130 ms).
/// `KILN_CUDA_PRELOAD_BLAS=0` leaves both to the first graph that needs them.
pub(crate) fn start(ctx: &Arc<CudaContext>) {
    if std::env::var("KILN_CUDA_PRELOAD_BLAS").as_deref() == Ok("0") {
        return;
    }
    STARTED.get_or_init(|| {
        let ctx = ctx.clone();
        let spawned = std::thread::Builder::new().name("kiln-preload-blas".into()).spawn(move || {
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
            if ctx.bind_to_thread().is_ok() {
                if let Ok(lt) = crate::lt::Lt::new() {
                    lt.warm(crate::gemm::WORKSPACE_BYTES);
                }
            }
        });
        if let Err(e) = spawned {
            tracing::debug!(target: "kiln::graph", error = %e, "cuBLAS libraries not preloaded");
        }
    });
}
