//! The compile cache: structure-keyed (regional reuse without rewriting the model), persistent across
//! runs, and never trusting a corrupt or truncated entry. One test function: it owns KILN_CACHE_DIR.

use kiln::graph::workloads::{w4, w4_inputs};
use kiln::graph::{cache, capture, compile_cached, CompiledGraph, DType, FusionMode, Target, Tensor, TensorSpec};
use kiln::{compile, Backend};
use std::collections::BTreeSet;

fn f32s(d: &[usize]) -> TensorSpec {
    TensorSpec::new(DType::F32, d)
}

/// Kernels that differ only in name and in which values they bind are one structure.
fn distinct_structures(c: &CompiledGraph) -> usize {
    let shapes: BTreeSet<String> = c
        .kernels
        .iter()
        .map(|k| {
            let mut k = k.clone();
            k.name.clear();
            for b in &mut k.buffers {
                b.node = kiln::graph::NodeId(0);
            }
            serde_json::to_string(&k).unwrap()
        })
        .collect();
    shapes.len()
}

fn softmax_graph(n: usize) -> kiln::graph::Graph {
    capture(&[f32s(&[4, n])], |t| Ok(vec![t[0].mul(2.0)?.softmax(-1)?])).unwrap()
}

#[test]
fn structure_keyed_persistent_and_checked() {
    let dir = std::env::temp_dir().join(format!("kiln-cache-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::env::set_var("KILN_CACHE_DIR", &dir);
    let target = Target::interpreter();

    // Regional reuse: the 64-layer W4 model, compiled whole, is three distinct kernel structures.
    let t = std::time::Instant::now();
    let w4_graph = capture(&w4_inputs(10), w4).unwrap();
    let c = compile_cached(&w4_graph, &target, FusionMode::Fused).unwrap();
    let cold_ms = t.elapsed().as_secs_f64() * 1e3;
    assert_eq!(c.kernels.len(), 129);
    assert_eq!(distinct_structures(&c), 3, "first linear, linear+relu+sigmoid, linear+relu");
    eprintln!("W4 cold trace + compile: {cold_ms:.1} ms");

    // Warm from disk: a new process (here: a cleared memory cache) loads instead of compiling.
    let before = cache::stats();
    cache::clear_memory();
    let again = compile_cached(&w4_graph, &target, FusionMode::Fused).unwrap();
    assert_eq!(cache::stats().disk_hits, before.disk_hits + 1);
    assert_eq!(again.kernels, c.kernels);

    // The key ignores where the code was traced from: the same structure from another call site hits.
    let a = softmax_graph(64);
    let b = capture(&[f32s(&[4, 64])], |t| Ok(vec![t[0].mul(2.0)?.softmax(-1)?])).unwrap();
    assert_eq!(cache::key(&a, &target, FusionMode::Fused), cache::key(&b, &target, FusionMode::Fused));
    assert_ne!(cache::key(&a, &target, FusionMode::Fused), cache::key(&softmax_graph(65), &target, FusionMode::Fused));

    // A corrupt and a truncated entry are each reported and recompiled, and results stay right.
    let g = softmax_graph(48);
    compile_cached(&g, &target, FusionMode::Fused).unwrap();
    let file = dir.join(format!("{}.json", cache::key(&g, &target, FusionMode::Fused)));
    let text = std::fs::read_to_string(&file).unwrap();
    for (damage, why) in [
        (text.replacen("\\\"sum\\\"", "\\\"max\\\"", 1), "checksum mismatch"),
        (text[..text.len() / 2].to_string(), "unreadable"),
    ] {
        std::fs::write(&file, damage).unwrap();
        cache::clear_memory();
        let before = cache::stats();
        compile_cached(&g, &target, FusionMode::Fused).unwrap();
        let after = cache::stats();
        assert_eq!(after.compiled, before.compiled + 1, "recompiled after a bad entry");
        assert!(after.rejected.last().is_some_and(|r| r.contains(why)), "{:?}", after.rejected);
        // The rewritten entry is good again.
        cache::clear_memory();
        compile_cached(&g, &target, FusionMode::Fused).unwrap();
        assert_eq!(cache::stats().disk_hits, after.disk_hits + 1);
    }
    let x = Tensor::from_slice(&(0..192).map(|i| i as f32 / 100.0).collect::<Vec<_>>(), &[4, 48]).unwrap();
    let run = |b: Backend| -> Vec<f32> {
        compile(|x: &Tensor| x.mul(2.0)?.softmax(-1)).backend(b).call(&x).unwrap().to_vec().unwrap()
    };
    let (k, r) = (run(Backend::Kernels), run(Backend::Cpu));
    assert_eq!(k.len(), r.len());
    assert!(k.iter().zip(&r).all(|(a, b)| (a - b).abs() < 1e-6), "{k:?} vs {r:?}");

    // A cap on the directory: past it the least recently used entries go, the newest stay.
    let entry = std::fs::metadata(&file).unwrap().len();
    std::env::set_var("KILN_CACHE_MAX_BYTES", (3 * entry + entry / 2).to_string());
    let keys: Vec<String> = (100..106)
        .map(|n| {
            let g = softmax_graph(n);
            compile_cached(&g, &target, FusionMode::Fused).unwrap();
            cache::key(&g, &target, FusionMode::Fused)
        })
        .collect();
    let usage = cache::disk_usage();
    assert!(usage.bytes <= usage.max_bytes, "{usage:?}");
    assert!(dir.join(format!("{}.json", keys[5])).exists(), "the newest entry stays");
    assert!(!dir.join(format!("{}.json", keys[0])).exists(), "the oldest of the new ones went");
    // A full cache is not scanned at every store: eviction goes down to three quarters of the cap.
    std::env::set_var("KILN_CACHE_MAX_BYTES", (20 * entry).to_string());
    let scans = cache::stats().directory_scans;
    for n in 200..260 {
        compile_cached(&softmax_graph(n), &target, FusionMode::Fused).unwrap();
    }
    let scans = cache::stats().directory_scans - scans;
    assert!((1..=15).contains(&scans), "60 stores into a cache of 20 entries scanned it {scans} times");
    let usage = cache::disk_usage();
    assert!(usage.bytes <= usage.max_bytes, "{usage:?}");
    std::env::remove_var("KILN_CACHE_MAX_BYTES");

    // A driver's blob (compiled machine code) is an entry too: counted, checked, and cleared with the rest.
    let before = cache::disk_usage();
    cache::store_blob("cubin-test", b"machine code");
    assert_eq!(cache::load_blob("cubin-test").as_deref(), Some(&b"machine code"[..]));
    let usage = cache::disk_usage();
    assert_eq!(usage.entries, before.entries + 1, "{usage:?}");

    // `kiln cache stats` and `kiln cache clear`, as a user runs them.
    let kiln = |args: &[&str]| {
        let out =
            std::process::Command::new(env!("CARGO_BIN_EXE_kiln")).args(args).env("KILN_CACHE_DIR", &dir).output();
        let out = out.expect("the kiln command runs");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let stats = kiln(&["cache", "stats"]);
    assert!(stats.contains(&format!("entries:   {}", usage.entries)), "{stats}");
    assert!(kiln(&["cache", "clear"]).contains(&format!("removed {} entries", usage.entries)));
    assert_eq!(cache::disk_usage().entries, 0);
    let _ = std::fs::remove_dir_all(&dir);
}
