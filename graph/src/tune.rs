//! `Mode::MaxAutotune`: each kernel's schedule chosen by timing candidates on the device, at compile time.
//!
//! The candidates are the same graph compiled for variants of the target that differ in one schedule knob
//! (the matmul template's largest tile and stages, threads per row of a row reduction, vector widths, the
//! attention templates' divisions, the GEMM library or the template). Fusion and the memory plan do not
//! depend on them (a variant whose kernels do not correspond is dropped), so variant kernel `i` computes
//! what the default's kernel `i` computes, from the same buffers. Each variant runs once per candidate on
//! the call's own inputs with every launch timed alone (`Runtime::profile`, best of three), and each
//! kernel keeps the fastest variant's schedule (2% faster than the default at least). Choices are
//! kept in the cache directory (`tuning.json`), keyed by the target and the kernel's structure, so a later
//! process compiles the tuned graph without timing anything; devices that cannot time themselves, and
//! graphs with collectives (timing runs one rank alone), keep the default schedules.

use crate::error::Result;
use crate::pipeline::CompiledGraph;
use crate::target::{LaneAttention, RegisterAttention, Target};
use crate::value::Value;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// What tuning one graph did (its caller times it: candidates compiled on a device that cannot time
/// them cost time too).
#[derive(Clone, Debug, Default)]
pub struct Tuned {
    /// Kernels whose candidates were timed here (0 when every choice came from the tuning cache).
    pub measured: usize,
    /// Kernels that took a schedule other than the default.
    pub changed: usize,
}

/// How much faster than the best so far a candidate must time to be chosen (best of three launches
/// spreads ~1% on an H200).
const MARGIN: f64 = 0.02;

/// A candidate: a label (as the tuning cache stores it) and the target it compiles for.
fn candidates(target: &Target) -> Vec<(String, Target)> {
    let mut v = vec![("default".to_string(), target.clone())];
    for cap in [64, 16] {
        if cap < target.matmul_tile {
            v.push((format!("matmul_tile={cap}"), Target { matmul_tile: cap, ..target.clone() }));
        }
    }
    // The other count of the matmul template's operand stages (one where two fit is the other's
    // trade: half the workgroup memory for a barrier a step), where the large tile's two fit (under
    // WebGPU's 16 KiB only the small tile's do, and it is a few products' schedule).
    let stages = 3 - target.matmul_stages.clamp(1, 2);
    let two = Target { matmul_stages: 2, ..target.clone() };
    let n = crate::sym::Expr::from(4096i64);
    if crate::matmul_tile::choose(&two, &crate::sym::Expr::from(1i64), &n, &n, 4, [true, false]).stages == 2 {
        v.push((format!("matmul_stages={stages}"), Target { matmul_stages: stages, ..target.clone() }));
    }
    // Narrower vectors (fewer bytes in flight a thread, more threads), down to none.
    let mut lanes = target.max_vector_lanes / 2;
    while lanes >= 1 {
        v.push((format!("max_vector_lanes={lanes}"), Target { max_vector_lanes: lanes, ..target.clone() }));
        lanes /= 2;
    }
    // The matmul template for a product the target would give its GEMM library (where fusion comes out
    // the same, so the kernels correspond: the template's epilogue then holds what the call's did).
    if target.library_gemm {
        v.push(("library_gemm=false".to_string(), Target { library_gemm: false, ..target.clone() }));
    }
    for threads in [target.row_threads / 2, target.row_threads * 2] {
        if (32..=target.max_threads_per_group).contains(&threads) {
            v.push((format!("row_threads={threads}"), Target { row_threads: threads, ..target.clone() }));
        }
    }
    // The lanes attention's division: half the queries a workgroup, twice the keys a chunk, a query
    // split across two threads where subgroups allow (each measured slower on an H200 over NVIDIA
    // Vulkan, `benches/NOTES.md` session 35; other GPUs may differ).
    if let Some(la) = target.lane_attention {
        let split = if target.subgroup_size.is_some() && la.split == 1 { 2 } else { la.split };
        for (label, other) in [
            (format!("lane_attention.rows={}", la.rows / 2), LaneAttention { rows: la.rows / 2, ..la }),
            (format!("lane_attention.chunk={}", la.chunk * 2), LaneAttention { chunk: la.chunk * 2, ..la }),
            (format!("lane_attention.split={split}"), LaneAttention { split, ..la }),
        ] {
            if other != la && other.rows >= 32 && other.chunk > 0 && la.keys % other.chunk == 0 {
                v.push((label, Target { lane_attention: Some(other), ..target.clone() }));
            }
        }
    }
    // The registers attention's other division (four queries a thread for eight, or eight for four), or
    // on a target that plans lanes, the registers template itself (slower than lanes over NVIDIA Vulkan,
    // `benches/NOTES.md` session 42; other GPUs' compilers may differ).
    let thread_rows = match target.register_attention {
        Some(ra) if ra.thread_rows == 8 => Some(4),
        Some(_) => Some(8),
        None if target.lane_attention.is_some() => Some(4),
        None => None,
    };
    if let Some(thread_rows) = thread_rows {
        let other = Target { register_attention: Some(RegisterAttention { thread_rows }), ..target.clone() };
        v.push((format!("register_attention.thread_rows={thread_rows}"), other));
    }
    v
}

/// Whether `variant`'s kernels stand one for one for `base`'s: the same regions, buffers and launches.
fn corresponds(base: &CompiledGraph, variant: &CompiledGraph) -> bool {
    base.kernels.len() == variant.kernels.len()
        && base.plan.launches == variant.plan.launches
        && base
            .kernels
            .iter()
            .zip(&variant.kernels)
            .all(|(a, b)| a.buffers == b.buffers && a.launched_in == b.launched_in)
}

/// The tuning cache's file, and the choices read from it (none when absent or unreadable: a corrupt file
/// costs a re-tune, never an error).
fn cache_file() -> Option<std::path::PathBuf> {
    crate::cache::directory().map(|d| d.join("tuning.json"))
}

fn load_choices() -> BTreeMap<String, String> {
    cache_file()
        .and_then(|f| std::fs::read_to_string(f).ok())
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default()
}

/// Adds `choices` to the tuning cache (a failure to write is logged: the tuned graph is still used).
fn store_choices(choices: &BTreeMap<String, String>) {
    // One writer at a time within a process; across processes the rename keeps the file whole.
    static WRITING: Mutex<()> = Mutex::new(());
    let _held = WRITING.lock().unwrap_or_else(|e| e.into_inner());
    let Some(file) = cache_file() else { return };
    let mut all = load_choices();
    all.extend(choices.iter().map(|(k, v)| (k.clone(), v.clone())));
    let written = file.parent().map_or(Ok(()), std::fs::create_dir_all).and_then(|()| {
        let tmp = file.with_extension(format!("json.{}", std::process::id()));
        std::fs::write(&tmp, serde_json::to_string_pretty(&all).unwrap_or_default())?;
        std::fs::rename(&tmp, &file)
    });
    if let Err(e) = written {
        tracing::warn!(target: "kiln::graph", error = %e, "tuning cache not written");
    }
}

/// The cache key of kernel `i` of `base`.
fn key(base: &CompiledGraph, i: usize) -> String {
    format!("{}/{:016x}", base.target.name, base.kernel_ids()[i])
}

/// `base` (compiled from `graph` for `target`) with each kernel's schedule the fastest candidate's on
/// `inputs`, or `base` itself where the backend has no runtime or its device cannot time launches.
/// (`Mode::MaxAutotune` calls it as it traces; the bench calls it on a captured graph.)
pub fn tune(
    graph: &crate::ir::Graph,
    target: &Target,
    backend: &dyn crate::backend::Backend,
    inputs: &[Arc<Value>],
    base: Arc<CompiledGraph>,
) -> Result<(Arc<CompiledGraph>, Tuned)> {
    let mut tuned = Tuned::default();
    let Some(rt) = backend.runtime() else { return Ok((base, tuned)) };
    // Timing a graph runs it several times on this rank alone: its collectives would wait for the others.
    if base.has_collectives() {
        return Ok((base, tuned));
    }
    let n = base.kernels.len();
    let mut variants: Vec<(String, Arc<CompiledGraph>)> = Vec::new();
    for (label, t) in candidates(target).into_iter().skip(1) {
        let v = crate::pipeline::compile_cached(graph, &t, crate::fuse::FusionMode::Fused)?;
        if corresponds(&base, &v) {
            variants.push((label, v));
        }
    }
    // Kernels every candidate renders alike need no timing.
    let differs = |i: usize| variants.iter().any(|(_, v)| v.kernels[i] != base.kernels[i]);
    let cached = load_choices();
    let mut chosen: Vec<Option<String>> = (0..n).map(|i| (!differs(i)).then(|| "default".to_string())).collect();
    for (i, c) in chosen.iter_mut().enumerate() {
        if c.is_none() {
            *c = cached
                .get(&key(&base, i))
                .filter(|l| *l == "default" || variants.iter().any(|(v, _)| v == *l))
                .cloned();
        }
    }
    if chosen.iter().any(Option::is_none) {
        let devs = Value::all_on(inputs, &rt)?;
        // Best of three of each launch, summed by kernel; `None` where the device cannot time itself.
        let time = |c: &Arc<CompiledGraph>| -> Result<Option<Vec<f64>>> {
            let p = rt.prepare(c, &devs)?;
            let mut best = vec![f64::INFINITY; n];
            for _ in 0..3 {
                let Some(launches) = rt.profile(&p)? else { return Ok(None) };
                let mut per = vec![0.0; n];
                for l in launches {
                    per[l.kernel] += l.ms;
                }
                for (b, t) in best.iter_mut().zip(per) {
                    *b = b.min(t);
                }
            }
            Ok(Some(best))
        };
        let Some(base_times) = time(&base)? else {
            tracing::info!(target: "kiln::graph", "max-autotune: the device cannot time launches; default schedules kept");
            return Ok((base, tuned));
        };
        let mut best: Vec<(String, f64)> = base_times.into_iter().map(|t| ("default".to_string(), t)).collect();
        for (label, v) in &variants {
            let Some(times) = time(v)? else { break };
            for (i, t) in times.into_iter().enumerate() {
                // A variant must be faster by more than the timing's noise, not merely as fast, to
                // replace the default: kernels that differ only in a field their launch ignores (a
                // library call's vector width) timed apart by noise and were "tuned" half the time.
                if chosen[i].is_none() && t < best[i].1 * (1.0 - MARGIN) {
                    best[i] = (label.clone(), t);
                }
            }
        }
        let mut learned = BTreeMap::new();
        for (i, c) in chosen.iter_mut().enumerate() {
            if c.is_none() {
                *c = Some(best[i].0.clone());
                learned.insert(key(&base, i), best[i].0.clone());
                tuned.measured += 1;
            }
        }
        store_choices(&learned);
    }
    let kernels: Vec<crate::kernel::Kernel> = chosen
        .iter()
        .enumerate()
        .map(|(i, label)| match variants.iter().find(|(l, _)| Some(l) == label.as_ref()) {
            Some((_, v)) => {
                tuned.changed += 1;
                v.kernels[i].clone()
            }
            None => base.kernels[i].clone(),
        })
        .collect();
    if tuned.changed == 0 {
        return Ok((base, tuned));
    }
    Ok((Arc::new(base.with_kernels(kernels)), tuned))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_differ_from_the_default_in_one_knob_each() {
        let t = Target::webgpu_default();
        let c = candidates(&t);
        assert_eq!(c[0].1, t);
        assert!(c.iter().skip(1).all(|(_, v)| v != &t));
        let labels: Vec<&str> = c.iter().map(|(l, _)| l.as_str()).collect();
        assert!(labels.contains(&"matmul_tile=64") && labels.contains(&"matmul_tile=16"), "{labels:?}");
        // Under WebGPU's 16 KiB the large tile takes one stage whatever is asked: no stages candidate;
        // with an adapter's 48 KiB the other count.
        assert!(labels.iter().all(|l| !l.starts_with("matmul_stages")), "{labels:?}");
        let roomy = Target { shared_memory_bytes: 48 * 1024, ..t.clone() };
        assert!(candidates(&roomy).iter().any(|(l, v)| l == "matmul_stages=1" && v.matmul_stages == 1));
        // The lanes attention's rows and chunk; no split without subgroups, a split with them.
        assert!(labels.contains(&"lane_attention.rows=64") && labels.contains(&"lane_attention.chunk=8"), "{labels:?}");
        assert!(!labels.iter().any(|l| l.starts_with("lane_attention.split")), "{labels:?}");
        let sub = Target { subgroup_size: Some(32), ..t.clone() };
        assert!(candidates(&sub).iter().any(|(l, _)| l == "lane_attention.split=2"));
        // A malformed lanes division (chunks of 0, from the knob) offers no chunk candidate, and no panic.
        let zero = Target { lane_attention: Some(LaneAttention { chunk: 0, ..LaneAttention::default() }), ..t.clone() };
        assert!(candidates(&zero).iter().all(|(l, _)| !l.starts_with("lane_attention.chunk")));
        // A target capped at 16 has no smaller matmul tile to try.
        let capped = Target { matmul_tile: 16, ..t };
        assert!(candidates(&capped).iter().all(|(l, _)| !l.starts_with("matmul_tile")));
        // CUDA's registers attention: the other number of queries a thread, and no lanes candidates.
        let cuda = candidates(&Target::cuda(90));
        let other = cuda.iter().find(|(l, _)| l == "register_attention.thread_rows=8");
        assert_eq!(other.and_then(|(_, t)| t.register_attention), Some(RegisterAttention { thread_rows: 8 }));
        assert!(cuda.iter().all(|(l, _)| !l.starts_with("lane_attention")));
        assert!(cuda.iter().any(|(l, t)| l == "matmul_stages=2" && t.matmul_stages == 2));
        // A WGSL target (lanes) tries the registers template.
        assert!(labels.contains(&"register_attention.thread_rows=4"), "{labels:?}");
        // Narrower vectors down to none; the template against the library only where there is one.
        let widest = t.max_vector_lanes;
        assert!(widest >= 2 && labels.contains(&"max_vector_lanes=1"), "{labels:?}");
        assert!(!labels.contains(&"library_gemm=false"), "{labels:?}");
        assert!(cuda.iter().any(|(l, t)| l == "library_gemm=false" && !t.library_gemm));
    }
}
