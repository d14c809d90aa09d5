//! The compile report: what a compiled function did, as the explorer and `KILN_REPORT` files read it.

use kiln::{compile, Backend, CompileReport, Dynamic, Tensor};

fn host(rows: usize, cols: usize) -> Tensor {
    let v: Vec<f32> = (0..rows * cols).map(|i| ((i * 37 % 101) as f32) / 50.0 - 1.0).collect();
    Tensor::from_slice(&v, &[rows, cols]).unwrap()
}

/// The line of `layernorm_gelu`'s body.
const LAYERNORM_GELU_LINE: u32 = line!() + 3;
/// W3's shape of function: layer norm then GELU, fused into one kernel.
fn layernorm_gelu(x: &Tensor) -> kiln::Result<Tensor> {
    x.layer_norm(1, None, None, 1e-5)?.gelu()
}

#[test]
fn a_fused_kernel_names_its_ops_lines_and_sources() {
    let f = compile(layernorm_gelu).backend(Backend::Kernels).dynamic(Dynamic::Never);
    let _: Tensor = f.call(&host(8, 64)).unwrap();
    let r = f.report();
    assert_eq!(r.version, kiln::graph::report::REPORT_VERSION);
    assert!(r.function.file.ends_with("report.rs"), "{:?}", r.function);
    assert_eq!((r.entries.len(), r.entries[0].graphs.len()), (1, 1));
    let g = &r.entries[0].graphs[0];
    assert!(g.compiled.is_some(), "the kernel backend compiles");
    assert_eq!(g.kernels.len(), 1, "{:?}", g.kernels.iter().map(|k| &k.name).collect::<Vec<_>>());
    let k = &g.kernels[0];
    assert!(k.name.contains("layernorm") && k.name.contains("gelu"), "{}", k.name);
    assert_eq!(k.kind, "rows");
    // Both ops' nodes and the one line of this file they came from.
    assert!(k.nodes.len() >= 2, "{:?}", k.nodes);
    let ops: Vec<&str> = k.nodes.iter().map(|n| g.captured.nodes[*n].op.name()).collect();
    assert!(ops.contains(&"layer_norm") && ops.contains(&"gelu"), "{ops:?}");
    assert!(k.lines.iter().any(|l| l.file.ends_with("report.rs") && l.line == LAYERNORM_GELU_LINE), "{:?}", k.lines);
    // 8 rows of 64 f32 in, the same out.
    assert_eq!((k.bytes_read.as_str(), k.bytes_written.as_str()), ("2048", "2048"));
    let wgsl = k.source("wgsl").expect("WGSL rendered");
    assert!(wgsl.contains("@compute"), "{wgsl}");
    let ptx = k.source("ptx").expect("PTX rendered");
    assert!(ptx.contains(".entry"), "{ptx}");
    assert!(!r.entries[0].guard_lines().is_empty());
}

#[test]
fn recompiles_are_reported_with_their_reasons() {
    let f = compile(layernorm_gelu).backend(Backend::Kernels).dynamic(Dynamic::Never);
    let _: Tensor = f.call(&host(4, 16)).unwrap();
    let _: Tensor = f.call(&host(4, 32)).unwrap();
    let r = f.report();
    assert_eq!(r.entries.len(), 2, "a new shape under Dynamic::Never is a new entry");
    assert!(r.entries.iter().all(|e| e.cached()));
    assert_eq!(r.stats.recompiles, 1);
    assert!(r.stats.guard_failures[0].contains("32"), "{:?}", r.stats.guard_failures);
    assert!(r.entries[1].guard_lines().iter().any(|g| g.contains("[4, 32]")), "{:?}", r.entries[1].guard_lines());
}

#[test]
fn graph_breaks_are_reported_with_their_lines() {
    let item_line = line!() + 2;
    let f = compile(|x: &Tensor| {
        let s: f32 = x.sum(&[0, 1], false)?.item()?;
        x.mul(1.0 / s)
    })
    .backend(Backend::Kernels);
    let _: Tensor = f.call(&host(4, 4)).unwrap();
    let r = f.report();
    assert_eq!(r.entries.len(), 1, "the latest trace, though not cached");
    let e = &r.entries[0];
    assert!(!e.cached() && e.guard_lines().is_empty());
    assert_eq!(e.breaks.len(), 1);
    assert!(e.breaks[0].loc.file.ends_with("report.rs") && e.breaks[0].loc.line == item_line, "{:?}", e.breaks[0]);
    assert_eq!(e.graphs.len(), 2, "the graph before the break and the one after");
    assert!(e.graphs[0].ended_by.is_some() && e.graphs[1].ended_by.is_none());
    assert!(e.graphs.iter().all(|g| !g.kernels.is_empty()));
}

#[test]
fn reports_round_trip_and_bad_ones_are_typed_errors() {
    let f = compile(layernorm_gelu).backend(Backend::Kernels);
    let _: Tensor = f.call(&host(2, 16)).unwrap();
    let r = f.report();
    let back = CompileReport::from_json(&r.to_json()).expect("reads back");
    // (Floats such as phase times may differ in their last bit through JSON: compare what people read.)
    let kernels = |r: &CompileReport| -> Vec<kiln::graph::report::KernelReport> {
        r.entries.iter().flat_map(|e| &e.graphs).flat_map(|g| g.kernels.clone()).collect()
    };
    assert!(kernels(&back) == kernels(&r), "kernels, their lines and sources read back");
    assert!(
        back.entries[0].guards == r.entries[0].guards
            && back.entries[0].graphs[0].captured == r.entries[0].graphs[0].captured
    );
    assert_eq!((back.stats.calls, back.function), (r.stats.calls, r.function.clone()));
    let wrong = r.to_json().replacen("\"version\":1", "\"version\":99", 1);
    let e = CompileReport::from_json(&wrong).unwrap_err();
    assert!(matches!(e, kiln::Error::Format { .. }) && e.to_string().contains("version 99"), "{e}");
    for bad in ["", "{", "[1, 2]", "{\"version\": 1}", "{\"kernels\": []}"] {
        assert!(matches!(CompileReport::from_json(bad), Err(kiln::Error::Format { .. })), "{bad:?}");
    }
}

#[test]
fn kiln_report_writes_a_file_per_compiled_function() {
    let dir = std::env::temp_dir().join(format!("kiln-report-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // Other tests of this binary may write reports here too while it is set; this one looks for its own.
    std::env::set_var("KILN_REPORT", &dir);
    let f = compile(|x: &Tensor| x.exp()?.add(1.0)).backend(Backend::Kernels);
    let line = line!() - 1;
    let _: Tensor = f.call(&host(2, 2)).unwrap();
    std::env::remove_var("KILN_REPORT");
    let path = std::fs::read_dir(&dir)
        .expect("the directory was made")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.to_string_lossy().ends_with(&format!("report_rs-{line}.json")))
        .expect("a report named for this compile call");
    let r = CompileReport::from_json(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert_eq!(r.function.line, line);
    assert_eq!(r.kernel_count(), 1);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn profile_times_every_kernel_and_the_text_form_shows_the_shares() {
    let f = compile(layernorm_gelu).backend(Backend::Kernels).dynamic(Dynamic::Never);
    let x = host(8, 64);
    let _: Tensor = f.call(&x).unwrap();
    let g = &f.report().entries[0].graphs[0];
    assert!(g.profiled_with.is_none() && g.kernels.iter().all(|k| k.device_ms.is_none()), "not profiled yet");
    let y: Tensor = f.profile(&x).unwrap();
    let want: Tensor = f.call(&x).unwrap();
    assert_eq!(
        y.to_vec().unwrap() as Vec<f32>,
        want.to_vec().unwrap() as Vec<f32>,
        "a profiled call returns the result"
    );
    let r = f.report();
    assert_eq!(r.entries.len(), 1, "profiling compiles nothing new");
    let g = &r.entries[0].graphs[0];
    assert!(g.profiled_with.as_deref().is_some_and(|t| t.contains("wall time")), "{:?}", g.profiled_with);
    assert!(g.kernels.iter().all(|k| k.device_ms.is_some_and(|ms| ms > 0.0)), "{:?}", g.kernels);
    let total = g.device_ms().unwrap();
    assert!((total - g.kernels.iter().filter_map(|k| k.device_ms).sum::<f64>()).abs() < 1e-12);
    let text = g.to_string();
    assert!(text.contains("profile (host wall time") && text.contains("100.0%"), "{text}");
    // The times survive the JSON form the explorer reads.
    let back = CompileReport::from_json(&r.to_json()).unwrap();
    assert_eq!(back.entries[0].graphs[0].kernels[0].device_ms, g.kernels[0].device_ms);
}

#[test]
fn the_report_says_which_cache_level_served_a_compile() {
    // A shape no other test here uses, so the first compile is this test's own.
    let x = host(3, 77);
    let first = compile(layernorm_gelu).backend(Backend::Kernels).dynamic(Dynamic::Never);
    let _: Tensor = first.call(&x).unwrap();
    let level = |f: &kiln::Compiled<fn(&Tensor) -> kiln::Result<Tensor>>| {
        f.report().entries[0].graphs[0].cache_level.map(|l| l.to_string())
    };
    let again = compile(layernorm_gelu as fn(&Tensor) -> kiln::Result<Tensor>)
        .backend(Backend::Kernels)
        .dynamic(Dynamic::Never);
    let _: Tensor = again.call(&x).unwrap();
    assert_eq!(level(&again).as_deref(), Some("memory"), "a second function with the same graph");
    assert!(again.report().entries[0].graphs[0].to_string().contains("served from the memory cache"));
    kiln::graph::cache::clear_memory();
    let third = compile(layernorm_gelu as fn(&Tensor) -> kiln::Result<Tensor>)
        .backend(Backend::Kernels)
        .dynamic(Dynamic::Never);
    let _: Tensor = third.call(&x).unwrap();
    if kiln::graph::cache::directory().is_some() {
        assert_eq!(level(&third).as_deref(), Some("disk"), "the persistent level after memory was cleared");
    }
}
