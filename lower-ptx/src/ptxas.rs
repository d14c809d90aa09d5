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
    run(ptxas, name, ptx, sm, false, None).map(|_| ())
}

/// Assembles `ptx` for `sm_<sm>` into a cubin (the image the driver loads without its JIT).
pub fn cubin(ptxas: &std::path::Path, name: &str, ptx: &str, sm: u32) -> Result<Vec<u8>, String> {
    let out = scratch(name, sm, "cubin");
    let made = run(ptxas, name, ptx, sm, false, Some(&out));
    let image = made.and_then(|_| std::fs::read(&out).map_err(|e| format!("reading {}: {e}", out.display())));
    let _ = std::fs::remove_file(&out);
    image
}

/// ptxas's version line (part of what a cached cubin is keyed by).
pub fn version(ptxas: &std::path::Path) -> Option<String> {
    let out = Command::new(ptxas).arg("--version").output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    out.status.success().then(|| text.lines().last().unwrap_or_default().to_string())
}

/// A scratch file name unique per call: tests assemble the same kernel from several threads at once.
fn scratch(name: &str, sm: u32, ext: &str) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    std::env::temp_dir().join(format!("kiln-{}-{n}-{name}-{sm}.{ext}", std::process::id()))
}

/// What one assembled kernel uses per thread, as `ptxas -v` reports it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Resources {
    /// Registers.
    pub registers: u32,
    /// Bytes stored to local memory because registers ran out (each a round trip to memory).
    pub spill_stores: u32,
    /// Bytes of stack frame.
    pub stack: u32,
}

/// Assembles `ptx` for `sm_<sm>` with `-v` and reads its per-thread resources.
pub fn resources(ptxas: &std::path::Path, name: &str, ptx: &str, sm: u32) -> Result<Resources, String> {
    let report = run(ptxas, name, ptx, sm, true, None)?;
    // "N bytes stack frame, N bytes spill stores, N bytes spill loads" and "Used N registers".
    let number_before = |text: &str, word: &str| -> u32 {
        text.split(word)
            .next()
            .and_then(|head| head.split_whitespace().last())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    let mut r = Resources::default();
    for line in report.lines() {
        if line.contains("spill stores") {
            r.stack = number_before(line, " bytes stack frame");
            r.spill_stores = number_before(line, " bytes spill stores");
        }
        if let Some(rest) = line.split("Used ").nth(1) {
            r.registers = number_before(rest, " registers");
        }
    }
    Ok(r)
}

/// Runs ptxas (with `-v` when `verbose`), writing the cubin to `out` (else discarding it), and returns
/// what it printed to stderr.
fn run(
    ptxas: &std::path::Path,
    name: &str,
    ptx: &str,
    sm: u32,
    verbose: bool,
    out: Option<&std::path::Path>,
) -> Result<String, String> {
    let file = scratch(name, sm, "ptx");
    std::fs::write(&file, ptx).map_err(|e| format!("writing {}: {e}", file.display()))?;
    let mut cmd = Command::new(ptxas);
    cmd.arg(format!("-arch=sm_{sm}")).arg(&file).arg("-o").arg(out.unwrap_or(std::path::Path::new("/dev/null")));
    if verbose {
        cmd.arg("-v");
    }
    let out = cmd.output().map_err(|e| format!("running {}: {e}", ptxas.display()));
    let _ = std::fs::remove_file(&file);
    let out = out?;
    let words = String::from_utf8_lossy(&out.stderr).to_string();
    if out.status.success() {
        return Ok(words);
    }
    Err(kiln_graph::error::rejected_source(name, &format!("ptxas (sm_{sm})"), &words, ptx))
}
