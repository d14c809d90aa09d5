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
    run(ptxas, name, ptx, sm, false, None, time_limit()).map(|_| ())
}

/// Assembles `ptx` for `sm_<sm>` into a cubin (the image the driver loads without its JIT).
pub fn cubin(ptxas: &std::path::Path, name: &str, ptx: &str, sm: u32) -> Result<Vec<u8>, String> {
    let out = scratch(name, sm, "cubin");
    let made = run(ptxas, name, ptx, sm, false, Some(&out), time_limit());
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
    let report = run(ptxas, name, ptx, sm, true, None, time_limit())?;
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

/// How long one ptxas run may take before it is stopped: `KILN_PTXAS_TIMEOUT_S` seconds, 120 by default.
/// A kernel takes well under a second; a ptxas that hangs (a wedged license check, a full disk, a kernel
/// that sends its optimiser into a loop) must not hang the compile that waits for it, so a cubin that
/// does not come in time is left to the driver's JIT, as one ptxas rejects is.
fn time_limit() -> std::time::Duration {
    let seconds = std::env::var("KILN_PTXAS_TIMEOUT_S").ok().and_then(|s| s.parse::<f64>().ok()).filter(|s| *s > 0.0);
    std::time::Duration::from_secs_f64(seconds.unwrap_or(120.0))
}

/// Runs ptxas on `ptx` (`-v` when `verbose`, the cubin to `out`), stopping it after `limit`; on failure,
/// its message followed by the numbered source. Its messages go to a scratch file, not a pipe, so a long
/// error report cannot block it while nobody reads.
fn run(
    ptxas: &std::path::Path,
    name: &str,
    ptx: &str,
    sm: u32,
    verbose: bool,
    out: Option<&std::path::Path>,
    limit: std::time::Duration,
) -> Result<String, String> {
    use wait_timeout::ChildExt;
    let file = scratch(name, sm, "ptx");
    let log = scratch(name, sm, "log");
    let cleanup = || {
        let _ = std::fs::remove_file(&file);
        let _ = std::fs::remove_file(&log);
    };
    std::fs::write(&file, ptx).map_err(|e| format!("writing {}: {e}", file.display()))?;
    let stderr = std::fs::File::create(&log).map_err(|e| format!("creating {}: {e}", log.display()));
    let stderr = match stderr {
        Ok(f) => f,
        Err(e) => {
            cleanup();
            return Err(e);
        }
    };
    let mut cmd = Command::new(ptxas);
    cmd.arg(format!("-arch=sm_{sm}")).arg(&file).arg("-o").arg(out.unwrap_or(std::path::Path::new("/dev/null")));
    if verbose {
        cmd.arg("-v");
    }
    cmd.stdin(std::process::Stdio::null()).stdout(std::process::Stdio::null()).stderr(stderr);
    let status = cmd.spawn().map_err(|e| format!("running {}: {e}", ptxas.display())).and_then(|mut child| match child
        .wait_timeout(limit)
    {
        Ok(Some(status)) => Ok(status),
        Ok(None) => {
            let _ = child.kill();
            let _ = child.wait();
            Err(format!(
                "kernel {name}: ptxas (sm_{sm}) did not finish within {:.0} s and was stopped",
                limit.as_secs_f64()
            ))
        }
        Err(e) => Err(format!("waiting for {}: {e}", ptxas.display())),
    });
    let words = std::fs::read_to_string(&log).unwrap_or_default();
    cleanup();
    if status?.success() {
        return Ok(words);
    }
    Err(kiln_graph::error::rejected_source(name, &format!("ptxas (sm_{sm})"), &words, ptx))
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// Runs the fake ptxas script `body`, retrying while another test thread's fork still holds the
    /// script open for writing (`ETXTBSY`, "Text file busy").
    fn run_fake(label: &str, body: &str, kernel: &str, limit: std::time::Duration) -> Result<String, String> {
        let fake = scratch(label, 90, "sh");
        std::fs::write(&fake, body).unwrap();
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut result = run(&fake, kernel, ".version 7.8", 90, false, None, limit);
        for _ in 0..50 {
            match &result {
                Err(e) if e.contains("busy") => {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                    result = run(&fake, kernel, ".version 7.8", 90, false, None, limit);
                }
                _ => break,
            }
        }
        let _ = std::fs::remove_file(&fake);
        result
    }

    /// A ptxas that never finishes is stopped at the limit, and the error names the kernel: a compile
    /// waiting on it goes on (the driver's JIT gets the kernel) instead of hanging.
    #[test]
    fn a_ptxas_that_hangs_is_stopped_at_the_limit() {
        let started = std::time::Instant::now();
        let limit = std::time::Duration::from_millis(300);
        let err = run_fake("hanging", "#!/bin/sh\nsleep 60\n", "k0_slow", limit).unwrap_err();
        assert!(started.elapsed() < std::time::Duration::from_secs(20), "waited {:?}", started.elapsed());
        assert!(err.contains("k0_slow") && err.contains("did not finish"), "{err}");
    }

    /// A ptxas that fails within the limit reports its own words, read from the scratch file.
    #[test]
    fn a_failing_ptxas_reports_its_message() {
        let body = "#!/bin/sh\necho 'ptxas fatal: bad input' >&2\nexit 1\n";
        let err = run_fake("failing", body, "k1_bad", std::time::Duration::from_secs(30)).unwrap_err();
        assert!(err.contains("ptxas fatal: bad input") && err.contains("k1_bad"), "{err}");
    }
}
