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

/// What [`render_and_assemble`] makes of one item: its PTX (`None`: it has none) and its cubin (`None`:
/// no PTX, or ptxas refused it).
pub(crate) type Made<E> = (Option<Result<String, E>>, Option<Vec<u8>>);

/// The cache entry of one kernel's cubin.
fn key(ptx: &str, sm: u32, version: &str) -> String {
    let mut h = blake3::Hasher::new();
    h.update(version.as_bytes());
    h.update(&sm.to_le_bytes());
    h.update(ptx.as_bytes());
    format!("cubin-sm{sm}-{}", &h.finalize().to_hex()[..32])
}

/// Each item's PTX (`render`: `None` for an item with none, such as a library GEMM) and its cubin for
/// `sm_<sm>` (`None` where there is no PTX or ptxas failed). One worker per core takes items heaviest
/// first (`weight`: ptxas's time grows with the PTX, so no core is left with a long kernel at the end
/// while the others idle) and renders, then assembles, each: ptxas starts on the slowest kernel while
/// the others still render (a training step's forward attention takes a quarter of a second of ptxas;
/// rendering every kernel first put ~60 ms in front of it). Cubins come from kiln's cache when there.
///
/// `side` runs on a thread of its own started after the workers, and its result comes back with theirs:
/// opening cuBLAS there (a `dlopen` of hundreds of MB) before the workers existed held their creation
/// up behind the dynamic loader's lock for as long as it took (57–247 ms on an H200, session 37).
pub(crate) fn render_and_assemble<K: Sync, E: Send, S: Send>(
    items: &[K],
    weight: impl Fn(&K) -> usize,
    render: impl Fn(&K) -> Option<Result<String, E>> + Sync,
    name: impl Fn(&K) -> &str + Sync,
    (ptxas, version, sm): (&Path, &str, u32),
    side: impl FnOnce() -> S + Send,
) -> (Vec<Made<E>>, S) {
    let out: Vec<Mutex<Option<Made<E>>>> = items.iter().map(|_| Mutex::new(None)).collect();
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(weight(&items[i])));
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get()).min(items.len());
    let next = AtomicUsize::new(0);
    let side = std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| loop {
                let Some(&i) = order.get(next.fetch_add(1, Ordering::Relaxed)) else { return };
                let rendered = render(&items[i]);
                let cubin = match &rendered {
                    Some(Ok(ptx)) => {
                        let key = key(ptx, sm, version);
                        kiln_graph::cache::load_blob(&key).or_else(|| {
                            let clock = std::time::Instant::now();
                            let made = crate::ptxas::cubin(ptxas, name(&items[i]), ptx, sm);
                            let ms = clock.elapsed().as_secs_f64() * 1e3;
                            tracing::debug!(target: "kiln::graph", kernel = name(&items[i]), ptx_bytes = ptx.len(), ms, "ptxas");
                            match made {
                                Ok(image) => {
                                    kiln_graph::cache::store_blob(&key, &image);
                                    Some(image)
                                }
                                Err(e) => {
                                    tracing::debug!(target: "kiln::graph", kernel = name(&items[i]), "ptxas failed, the driver's JIT will try: {e}");
                                    None
                                }
                            }
                        })
                    }
                    _ => None,
                };
                if let Ok(mut slot) = out[i].lock() {
                    *slot = Some((rendered, cubin));
                }
            });
        }
        scope.spawn(side).join()
    });
    let made = out.into_iter().map(|m| m.into_inner().unwrap_or_else(|e| e.into_inner()).unwrap_or((None, None)));
    (made.collect(), side.unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One kernel to assemble: its name and PTX.
    struct Source<'a> {
        name: &'a str,
        ptx: &'a str,
    }

    /// Each source's cubin for `sm_<sm>` (`None` where ptxas failed): from the cache, else assembled by up
    /// to one ptxas process per core.
    fn cubins(ptxas: &Path, version: &str, sources: &[Source], sm: u32) -> Vec<Option<Vec<u8>>> {
        let assembled = render_and_assemble(
            sources,
            |s| s.ptx.len(),
            |s| Some(Ok::<_, ()>(s.ptx.to_string())),
            |s| s.name,
            (ptxas, version, sm),
            || (),
        );
        assembled.0.into_iter().map(|(_, cubin)| cubin).collect()
    }

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
