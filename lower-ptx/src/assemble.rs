//! A graph's kernels assembled to machine code side by side. The driver's JIT assembles one module at a
//! time per process: measured on an H200 (`benches/NOTES.md`, session 20), DenseNet-121's 121 kernels
//! took 5.4 s to load on one thread and 6.7 s on sixteen. ptxas processes, one per core, do not wait
//! for each other, and the driver loads their cubins without compiling anything. Each cubin is kept in
//! kiln's cache directory under the hash of its PTX, the architecture and ptxas's version, so a warm
//! process assembles nothing. A kernel ptxas cannot assemble is left to the driver's JIT, whose error
//! names it.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// One kernel to assemble: its name and PTX.
pub(crate) struct Source<'a> {
    pub(crate) name: &'a str,
    pub(crate) ptx: &'a str,
}

/// The cache entry of one kernel's cubin.
fn key(ptx: &str, sm: u32, version: &str) -> String {
    let mut h = blake3::Hasher::new();
    h.update(version.as_bytes());
    h.update(&sm.to_le_bytes());
    h.update(ptx.as_bytes());
    format!("cubin-sm{sm}-{}", &h.finalize().to_hex()[..32])
}

/// Each source's cubin for `sm_<sm>` (`None` where ptxas failed): from the cache, else assembled by up
/// to one ptxas process per core.
pub(crate) fn cubins(ptxas: &Path, version: &str, sources: &[Source], sm: u32) -> Vec<Option<Vec<u8>>> {
    let keys: Vec<String> = sources.iter().map(|s| key(s.ptx, sm, version)).collect();
    let out: Vec<Mutex<Option<Vec<u8>>>> = keys.iter().map(|k| Mutex::new(kiln_graph::cache::load_blob(k))).collect();
    let mut todo: Vec<usize> = (0..sources.len()).filter(|&i| out[i].lock().is_ok_and(|c| c.is_none())).collect();
    // Longest first (ptxas's time grows with the PTX's length), so no core is left with a long kernel
    // at the end while the others idle.
    todo.sort_by_key(|&i| std::cmp::Reverse(sources[i].ptx.len()));
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get()).min(todo.len());
    let next = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| loop {
                let Some(&i) = todo.get(next.fetch_add(1, Ordering::Relaxed)) else { return };
                match crate::ptxas::cubin(ptxas, sources[i].name, sources[i].ptx, sm) {
                    Ok(image) => {
                        kiln_graph::cache::store_blob(&keys[i], &image);
                        if let Ok(mut slot) = out[i].lock() {
                            *slot = Some(image);
                        }
                    }
                    Err(e) => tracing::debug!(target: "kiln::graph", kernel = sources[i].name, "ptxas failed, the driver's JIT will try: {e}"),
                }
            });
        }
    });
    out.into_iter().map(|m| m.into_inner().unwrap_or_else(|e| e.into_inner())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_graph::{capture, compile_graph, DType, Target, TensorSpec};

    /// Two kernels of a small graph assembled to cubins (ELF images), then served from the cache by a
    /// "ptxas" that cannot run; PTX ptxas rejects gives `None`, left to the driver.
    #[test]
    fn kernels_assemble_side_by_side_and_come_back_from_the_cache() {
        let Some(ptxas) = crate::ptxas::find() else { panic!("{}", crate::ptxas::INSTALL_HINT) };
        // The version is part of each cubin's key: one of this run's own makes every entry a miss at
        // first, whatever an earlier run left in the cache directory (no environment is changed).
        let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let found = crate::ptxas::version(&ptxas).expect("ptxas --version");
        let version = format!("{found} (test {} {stamp})", std::process::id());
        let g = capture(&[TensorSpec::new(DType::F32, &[64, 300])], |t| {
            Ok(vec![t[0].softmax(-1)?.exp()?.sum(&[0], false)?])
        })
        .unwrap();
        let c = compile_graph(&g, &Target::cuda(90)).unwrap();
        let ptx: Vec<(String, String)> =
            c.kernels.iter().map(|k| (k.name.clone(), crate::render(k, 90).unwrap().source)).collect();
        assert!(ptx.len() >= 2, "{c}");
        let mut sources: Vec<Source> = ptx.iter().map(|(name, ptx)| Source { name, ptx }).collect();
        let bad = ptx[0].1.replace(".entry", ".entry_not_ptx");
        sources.push(Source { name: "broken", ptx: &bad });
        let made = cubins(&ptxas, &version, &sources, 90);
        assert_eq!(made.len(), sources.len());
        for image in &made[..ptx.len()] {
            assert!(image.as_ref().is_some_and(|i| i.starts_with(b"\x7fELF")), "a cubin is an ELF image");
        }
        assert!(made[ptx.len()].is_none(), "rejected PTX is left to the driver");
        let again = cubins(Path::new("/nonexistent/ptxas"), &version, &sources[..ptx.len()], 90);
        assert_eq!(again, made[..ptx.len()].to_vec(), "served from the cache");
        let other = cubins(Path::new("/nonexistent/ptxas"), "another ptxas", &sources[..1], 90);
        assert_eq!(other, vec![None], "keyed by ptxas's version");
    }
}
