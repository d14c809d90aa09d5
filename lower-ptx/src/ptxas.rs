//! NVIDIA's `ptxas`, used to check every generated kernel without a GPU: it assembles PTX for a target
//! and rejects bad PTX with a line-numbered error. `scripts/deps.sh` installs it from PyPI
//! (`nvidia-cuda-nvcc-cu12`) and points `KILN_PTXAS` at it.

use std::path::PathBuf;
use std::process::Command;

/// How to get ptxas here, for the error when it is missing.
pub const INSTALL_HINT: &str =
    "ptxas not found: run `source scripts/deps.sh` (it installs `nvidia-cuda-nvcc-cu12` from \
     PyPI into .tools/) or set KILN_PTXAS to a ptxas binary";

/// The ptxas binary: `KILN_PTXAS`, else the one `scripts/deps.sh` installs, else `ptxas` on the PATH.
pub fn find() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("KILN_PTXAS") {
        return Some(PathBuf::from(p));
    }
    let local = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.tools/nvcc/nvidia/cuda_nvcc/bin/ptxas");
    if local.exists() {
        return Some(local);
    }
    let on_path = Command::new("ptxas").arg("--version").output().is_ok_and(|o| o.status.success());
    on_path.then(|| PathBuf::from("ptxas"))
}

/// Assembles `ptx` for `sm_<sm>`; on failure, ptxas's message followed by the numbered source.
pub fn assemble(ptxas: &std::path::Path, name: &str, ptx: &str, sm: u32) -> Result<(), String> {
    // Unique per call: tests assemble the same kernel from several threads at once.
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let file = std::env::temp_dir().join(format!("kiln-{}-{n}-{name}-{sm}.ptx", std::process::id()));
    std::fs::write(&file, ptx).map_err(|e| format!("writing {}: {e}", file.display()))?;
    let out = Command::new(ptxas)
        .arg(format!("-arch=sm_{sm}"))
        .arg(&file)
        .arg("-o")
        .arg("/dev/null")
        .output()
        .map_err(|e| format!("running {}: {e}", ptxas.display()));
    let _ = std::fs::remove_file(&file);
    let out = out?;
    if out.status.success() {
        return Ok(());
    }
    let words = String::from_utf8_lossy(&out.stderr);
    Err(kiln_graph::error::rejected_source(name, &format!("ptxas (sm_{sm})"), &words, ptx))
}
