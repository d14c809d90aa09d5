//! The explorer used as a person uses it, through egui's test harness (the AccessKit tree: labels, clicks).

use egui_kittest::kittest::Queryable;
use egui_kittest::Harness;
use kiln_app::{Explorer, Tab};

fn harness(app: Explorer) -> Harness<'static, Explorer> {
    Harness::builder().with_size([1400.0, 900.0]).build_ui_state(|ui, app: &mut Explorer| app.show(ui), app)
}

/// W3 opened (compiled on a worker; the test waits for it) and shown.
fn w3() -> Harness<'static, Explorer> {
    let mut h = harness(Explorer::default());
    h.run_steps(2);
    h.get_by_label("W3").click();
    h.run_steps(2);
    assert!(h.state().busy(), "compiling happens on the worker");
    h.state_mut().wait_for_work();
    h.run_steps(3);
    assert!(h.state().error.is_none(), "{:?}", h.state().error);
    h
}

#[test]
fn w3_is_one_fused_layernorm_gelu_region_and_a_node_shows_its_line() {
    let mut h = w3();
    let g = h.state().selected_graph().expect("a graph").clone();
    assert_eq!(g.kernels.len(), 1, "{:?}", g.kernels.iter().map(|k| &k.name).collect::<Vec<_>>());
    let name = g.kernels[0].name.clone();
    assert!(name.contains("layernorm") && name.contains("gelu"), "{name}");
    // The kernel is listed, and the graph's nodes are buttons: select the layer norm.
    h.get_by_label(&name);
    let ln = g.captured.nodes.iter().position(|n| n.op.name() == "layer_norm").expect("a layer_norm node");
    h.get_by_label(&format!("%{ln} layer_norm")).click_accesskit();
    h.run_steps(2);
    assert_eq!(h.state().node, Some(ln));
    let shown = h.query_by_label_contains("source: ").expect("the node's source line is shown");
    let text = format!("{shown:?}");
    assert!(text.contains("workloads.rs"), "{text}");
}

#[test]
fn a_kernel_shows_its_ir_wgsl_ptx_and_lines_and_a_line_lights_up_its_nodes() {
    let mut h = w3();
    let name = h.state().selected_graph().unwrap().kernels[0].name.clone();
    h.get_by_label(&name).click();
    h.run_steps(2);
    assert_eq!(h.state().tab, Tab::Kernel);
    let count = |h: &Harness<'static, Explorer>, lang: &str| -> usize {
        let wanted = format!("{lang} (");
        let label = format!("{:?}", h.query_by_label_contains(&wanted).unwrap_or_else(|| panic!("a {lang} pane")));
        let start = label.find(&format!("{lang} (")).unwrap() + lang.len() + 2;
        label[start..].split(' ').next().unwrap().parse().unwrap()
    };
    assert!(count(&h, "WGSL") > 10 && count(&h, "PTX") > 10 && count(&h, "KERNEL IR") > 3);
    let k = h.state().selected_kernel().unwrap().clone();
    assert!(!k.lines.is_empty());
    let line = k.lines[0].to_string();
    h.get_by_label(&line).click();
    h.run_steps(2);
    assert_eq!(h.state().tab, Tab::Graph, "a line click goes to the graph");
    assert!(!h.state().highlight.is_empty(), "with that line's nodes lit up");
}

#[test]
fn the_guards_tab_reports_a_recompile_reason_for_a_changed_dim() {
    // A report with a recompile: a function called with two widths under Dynamic::Never.
    kiln::register_renderers();
    let f = kiln::compile(|x: &kiln::Tensor| x.exp()).backend(kiln::Backend::Kernels).dynamic(kiln::Dynamic::Never);
    for n in [8usize, 16] {
        let x = kiln::Tensor::from_slice(&vec![0.5f32; n], &[n]).unwrap();
        let _: kiln::Tensor = f.call(&x).unwrap();
    }
    let mut app = Explorer::default();
    app.open_report_text(&f.report().to_json(), "a test report");
    let mut h = harness(app);
    h.run_steps(2);
    h.get_by_label("Guards").click();
    h.run_steps(2);
    let why = h.query_by_label_contains("recompile 1:").expect("the recompile is listed");
    assert!(format!("{why:?}").contains("16"), "{why:?}");
    // The "try these shapes" box: a width the entries know runs; a new one says what would recompile.
    for (shape, want) in [("[16]", "runs entry 1"), ("[32]", "expected size 8, got 32")] {
        h.state_mut().shapes = shape.into();
        h.get_by_label("Check").click();
        h.run_steps(2);
        let v = h.query_by_label_contains("verdict: ").expect("a verdict");
        assert!(format!("{v:?}").contains(want), "{shape}: {v:?}");
    }
}

#[test]
fn auto_dynamic_says_which_dim_would_become_symbolic() {
    kiln::register_renderers();
    let f = kiln::compile(|x: &kiln::Tensor| x.exp()).backend(kiln::Backend::Kernels);
    let _: kiln::Tensor = f.call(&kiln::Tensor::from_slice(&[0.5f32; 12], &[3, 4]).unwrap()).unwrap();
    let v = f.report().try_shapes(&[vec![5, 4]]);
    assert_eq!((v.runs, v.becomes_symbolic), (None, Some((0, 0))), "{v}");
    assert!(v.to_string().contains("becomes symbolic"), "{v}");
}

#[test]
fn a_bench_json_charts_one_bar_per_row() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../benches/results/2026-11-23-h200-compare.json");
    let text = std::fs::read_to_string(path).unwrap();
    let rows = serde_json::from_str::<serde_json::Value>(&text).unwrap()["results"].as_array().unwrap().len();
    let mut app = Explorer::default();
    app.open_bench_text(&text, "h200");
    let mut h = harness(app);
    h.run_steps(2);
    assert_eq!(h.state().tab, Tab::Bench);
    assert_eq!(h.state().benches[0].bars().len(), rows);
    h.get_by_label(&format!("h200: {rows} rows"));
}

fn bench_json(name: &str) -> String {
    std::fs::read_to_string(format!("{}/../benches/results/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

#[test]
fn two_bench_jsons_chart_side_by_side_and_the_chart_exports_as_png() {
    let mut app = Explorer::default();
    app.open_bench_text(&bench_json("2026-11-23-h200-compare.json"), "h200");
    app.open_bench_text(&bench_json("runs/h200-A/A.json"), "part A");
    let (labels, series) = kiln_app::side_by_side(&app.benches);
    assert_eq!(series.iter().map(|(s, _)| s.as_str()).collect::<Vec<_>>(), ["h200", "part A"]);
    // Every row is one bar on the shared axis; rows both reports have share a label.
    for (t, (_, bars)) in app.benches.iter().zip(&series) {
        assert_eq!(bars.len(), t.rows.len());
        assert!(bars.iter().zip(&t.rows).all(|(&(i, ms), r)| labels[i] == r.label && ms == r.ms));
    }
    let shared = app.benches[0].rows.iter().filter(|r| app.benches[1].rows.iter().any(|q| q.label == r.label)).count();
    assert!(shared > 0, "the two runs share workloads");
    assert_eq!(labels.len(), app.benches[0].rows.len() + app.benches[1].rows.len() - shared);
    let png = std::env::temp_dir().join(format!("kiln-chart-test-{}.png", std::process::id()));
    let _ = std::fs::remove_file(&png);
    app.chart_path = png.display().to_string();
    // A renderer (wgpu: lavapipe in CI) so the window's screenshot is real.
    let mut h =
        Harness::builder().with_size([1400.0, 900.0]).wgpu().build_ui_state(|ui, app: &mut Explorer| app.show(ui), app);
    h.run_steps(3);
    h.get_by_label("part A: 23 rows");
    h.get_by_label("Export PNG").click();
    h.run_steps(4);
    assert!(h.state().error.is_none(), "{:?}", h.state().error);
    let status = h.state().status.clone().expect("the export says what it saved");
    assert!(status.starts_with("saved "), "{status}");
    let img = image::open(&png).expect("a PNG").to_rgba8();
    assert!(img.width() > 400 && img.height() > 200, "{}×{}", img.width(), img.height());
    let colours: std::collections::BTreeSet<[u8; 4]> = img.pixels().map(|p| p.0).collect();
    assert!(colours.len() > 20, "a drawn chart, not a blank image: {} colours", colours.len());
    let _ = std::fs::remove_file(&png);
}

/// An in-memory stand-in for the desktop app's saved state.
#[derive(Default)]
struct Memory(std::collections::HashMap<String, String>);

impl eframe::Storage for Memory {
    fn get_string(&self, key: &str) -> Option<String> {
        self.0.get(key).cloned()
    }
    fn set_string(&mut self, key: &str, value: String) {
        self.0.insert(key.into(), value);
    }
    fn remove_string(&mut self, key: &str) {
        self.0.remove(key);
    }
    fn flush(&mut self) {}
}

#[test]
fn opened_files_are_remembered_across_runs() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../benches/results/");
    let (a, b) = (format!("{dir}runs/h200-A/A.json"), format!("{dir}2026-11-23-h200-compare.json"));
    let mut app = Explorer::default();
    app.open_path(&a);
    app.open_path(&b);
    app.open_path(&a);
    app.open_path("/no/such/kiln/report.json");
    assert_eq!(app.recent, [a.clone(), b.clone()], "newest first, once each, failures left out");
    let mut saved = Memory::default();
    app.save(&mut saved);
    let mut next = Explorer::default();
    next.restore(&saved);
    assert_eq!(next.recent, [a.clone(), b]);
    // The top bar's menu opens one.
    let mut h = harness(next);
    h.run_steps(2);
    h.get_by_label("Recent").click();
    h.run_steps(2);
    h.get_by_label(&a).click();
    h.run_steps(2);
    assert_eq!(h.state().benches.len(), 1);
    assert_eq!(h.state().benches[0].source, a);
}

#[test]
fn bad_files_show_an_error_and_never_crash() {
    let mut app = Explorer::default();
    let mut h = harness(std::mem::take(&mut app));
    for (text, what) in [
        ("{ not json", "malformed compile report"),
        ("{\"version\": 99}", "version 99"),
        ("{\"schema\": \"kiln-bench/1\", \"results\": []}", "kiln-bench/2"),
        ("{\"schema\": \"kiln-bench/2\", \"results\": [{\"workload\": \"W1\"}]}", "median_ms"),
    ] {
        h.state_mut().open_text(text, "bad.json");
        h.run_steps(2);
        let e = h.query_by_label_contains("error: ").unwrap_or_else(|| panic!("an error for {text}"));
        assert!(format!("{e:?}").contains(what), "{text}: {e:?}");
    }
    h.state_mut().open_path("/no/such/kiln/report.json");
    h.run_steps(2);
    assert!(h.query_by_label_contains("error: /no/such").is_some());
}

#[test]
fn the_source_view_annotates_lines_with_their_kernels_and_a_search_finds_ops() {
    let mut h = w3();
    h.get_by_label("Source").click();
    h.run_steps(2);
    let k = h.state().selected_graph().unwrap().kernels[0].clone();
    let line = k.lines[0].line;
    let wanted = format!("➡ {}", k.name);
    assert!(h.query_by_label_contains(&wanted).is_some(), "the kernel's line is annotated");
    assert!(h.query_by_label_contains("annotated line(s)").is_some());
    // A click on the annotated line number lights up its nodes in the graph.
    h.get_by_label(&format!("{line:4}")).click_accesskit();
    h.run_steps(2);
    assert_eq!(h.state().tab, Tab::Graph);
    assert!(!h.state().highlight.is_empty());
    // Search by op name.
    h.state_mut().search = "gelu".into();
    h.run_steps(2);
    assert!(h.query_by_label_contains("1 match(es)").is_some());
}

#[test]
fn the_timelines_show_compile_phases_and_the_memory_plan_with_its_peak() {
    let mut h = w3();
    let c = h.state().selected_graph().unwrap().compiled.clone().expect("compiled");
    let (spans, in_use) = kiln_app::memory_profile(&c);
    // W3 at its check size: x [64, 4096], w, b in; one output of x's size; one kernel.
    assert_eq!(in_use.len(), 1);
    let x = 64 * 4096 * 4;
    assert_eq!(spans.iter().filter_map(|s| s.bytes).max(), Some(x));
    assert_eq!(in_use[0], spans.iter().map(|s| s.bytes.unwrap()).sum::<u64>());
    h.get_by_label("Timelines").click();
    h.run_steps(2);
    let wanted = format!("memory plan: {} buffers over 1 kernels", spans.len());
    assert!(h.query_by_label_contains(&wanted).is_some(), "{wanted}");
}

#[test]
fn a_live_run_times_eager_compiled_and_reduce_overhead_on_the_kernel_backend() {
    // W4 (64 layers of 10×10): many kernels, tiny tensors — quick on the CPU kernel interpreter.
    let mut app = Explorer::default();
    app.open_workload("W4");
    app.wait_for_work();
    app.run_calls = 2;
    let mut h = harness(app);
    h.run_steps(2);
    h.get_by_label("Run").click();
    h.run_steps(2);
    h.get_by_label("Run at check size").click();
    h.run_steps(1);
    h.state_mut().wait_for_run();
    h.run_steps(2);
    let (_, r) = h.state().run_result.clone().expect("a result");
    let run = r.expect("the run succeeds");
    let times = &run.times;
    assert_eq!(times.iter().map(|t| t.mode).collect::<Vec<_>>(), ["eager", "compiled", "reduce-overhead"]);
    assert!(times.iter().all(|t| t.ms > 0.0 && t.ms.is_finite()));
    // Each mode's share of a copy moving as many bytes on this device.
    assert!(
        run.bytes.is_some_and(|b| b > 0) && run.copy_rate.is_some_and(|r| r > 0.0),
        "{:?} {:?}",
        run.bytes,
        run.copy_rate
    );
    assert!(times.iter().all(|t| run.copy_share(t).is_some_and(|s| s > 0.0)));
    assert_eq!(h.query_all_by_label_contains("% of the copy rate").count(), 3);
    assert!(h.query_by_label_contains("compiled:").is_some());
    assert_eq!(h.query_all_by_label_contains("× eager").count(), 3);
    // The run profiled the compiled function: every kernel has its time, and the list shows the shares.
    let g = h.state().selected_graph().expect("the profiled report").clone();
    assert!(g.profiled_with.is_some(), "profiled");
    assert!(g.kernels.len() > 10 && g.kernels.iter().all(|k| k.device_ms.is_some()));
    assert!(h.query_by_label_contains("ms a run (host wall time").is_some());
    let first = format!("{} — ", g.kernels[0].name);
    assert!(h.query_by_label_contains(&first).is_some(), "{first}");
    assert_eq!(h.state().workload.as_deref(), Some("W4"), "the profiled report is still the workload's");
}

#[test]
fn collapsing_regions_draws_one_box_per_kernel() {
    let mut h = w3();
    let g = h.state().selected_graph().unwrap().clone();
    let boxes = kiln_app::graph_boxes(&g, false, true);
    // W3: three inputs (no kernel) and one fused kernel for layer_norm + gelu.
    assert_eq!(boxes.labels.len(), 4, "{:?}", boxes.labels);
    assert_eq!(boxes.regions.iter().filter(|r| r.is_some()).count(), 1);
    assert_eq!(boxes.edges.len(), 3, "each input feeds the kernel once");
    h.state_mut().collapse = true;
    h.run_steps(2);
    let name = g.kernels[0].name.clone();
    assert_eq!(h.query_all_by_label(&name).count(), 2, "the kernel's box beside its entry in the list");
}

#[test]
fn a_malformed_but_readable_report_is_drawn_without_crashing() {
    let mut r = kiln_app::workload_report("W3").expect("W3 compiles");
    let g = &mut r.entries[0].graphs[0];
    let last = g.captured.nodes.len() - 1;
    g.captured.nodes[last].inputs.push(kiln::graph::NodeId(999));
    g.captured.nodes[last].inputs.push(kiln::graph::NodeId(last as u32));
    if let Some(c) = g.compiled.as_mut() {
        c.plan.live[0] = (3, 0);
    }
    let mut app = Explorer::default();
    app.open_report_text(&r.to_json(), "edited.json");
    assert!(app.error.is_none(), "{:?}", app.error);
    let mut h = harness(app);
    for (collapse, tab) in [(false, "Graph"), (true, "Graph"), (false, "Timelines"), (false, "Source")] {
        h.state_mut().collapse = collapse;
        h.get_by_label(tab).click();
        h.run_steps(2);
    }
    let boxes = kiln_app::graph_boxes(h.state().selected_graph().unwrap(), false, false);
    assert!(boxes.edges.iter().all(|&(a, b)| a != b && (a as usize) < boxes.labels.len()));
}

#[test]
fn the_demo_runs_a_workload_and_an_expression_checked_and_rejects_bad_lines() {
    // The browser page's landing view, on the CPU kernel interpreter (the page's fallback without WebGPU).
    let mut app = Explorer::default();
    app.run_backend = kiln::Backend::Kernels;
    app.run_calls = 2;
    app.tab = Tab::Demo;
    let mut h = harness(app);
    h.run_steps(2);
    h.get_by_label("Run W4").click();
    h.run_steps(1);
    assert!(!h.state().runs_idle(), "the run is under way on a worker");
    h.state_mut().wait_for_run();
    h.run_steps(2);
    let (title, run) = h.state().runs.last().cloned().expect("a run");
    let run = run.expect("W4 runs");
    assert_eq!(title, "W4 (quick size) on Kernels");
    assert!(run.correct(), "{:?}", run.times);
    assert_eq!(run.times.iter().map(|t| t.mode).collect::<Vec<_>>(), ["eager", "compiled", "reduce-overhead"]);
    assert!(h.query_by_label_contains("✔ matches the reference").is_some());
    // Its report opens: the Graph tab shows what kiln made of it.
    h.get_by_label("graph & kernels").click();
    h.run_steps(2);
    assert_eq!(h.state().tab, Tab::Graph);
    assert!(h.state().selected_graph().is_some_and(|g| !g.kernels.is_empty()));

    // Bad lines are rejected under the line, naming what was wrong; nothing runs.
    h.get_by_label("Demo").click();
    h.run_steps(1);
    for (line, says) in [
        ("x +* 2", "column 4: expected a number, an input or `(`, found `*`"),
        ("frobnicate(x)", "unknown function `frobnicate`"),
        ("x + w", "shapes [256, 1024] and [1024, 256] cannot be broadcast together"),
    ] {
        h.state_mut().expression = line.into();
        h.run_steps(1);
        h.get_by_label("Compile and run").click();
        h.run_steps(2);
        let shown = h.query_by_label_contains("rejected: ").map(|n| format!("{n:?}")).unwrap_or_default();
        assert!(shown.contains(says), "{line}: {shown}");
        assert!(h.state().runs_idle(), "{line} queued nothing");
    }
    // A good line compiles, runs and matches the reference.
    h.state_mut().expression = "gelu(x*1.5+0.5)*sigmoid(x)".into();
    h.run_steps(1);
    h.get_by_label("Compile and run").click();
    h.run_steps(1);
    assert!(h.query_by_label_contains("rejected: ").is_none());
    h.state_mut().wait_for_run();
    h.run_steps(2);
    let (title, run) = h.state().runs.last().cloned().expect("a run");
    assert_eq!(title, "`gelu(x*1.5+0.5)*sigmoid(x)` on Kernels");
    let run = run.expect("the expression runs");
    assert!(run.correct(), "{:?}", run.times);
    let kernels = run.report.as_ref().map_or(0, kiln_app::live::kernel_count);
    assert_eq!(kernels, 1, "one fused kernel");
    let json = h.state().runs_json();
    assert_eq!(json["correct"], true);
    assert_eq!(json["runs"].as_array().map(Vec::len), Some(2));
}

#[test]
fn live_runs_offer_every_wgpu_adapter_and_run_on_the_one_chosen() {
    if std::env::var("KILN_WGPU_TESTS").as_deref() == Ok("skip") {
        eprintln!("KILN_WGPU_TESTS=skip: wgpu tests skipped on request");
        return;
    }
    let adapters = kiln::wgpu_adapters();
    assert!(!adapters.is_empty(), "no wgpu adapter: install Mesa's Vulkan drivers, or set KILN_WGPU_TESTS=skip");
    let mut h = w3();
    h.state_mut().run_calls = 2;
    h.get_by_label("Run").click();
    h.run_steps(2);
    // The combo lists each adapter by name; the last one is chosen.
    h.get_by_value("Kernels").click();
    h.run_steps(2);
    let labels: Vec<String> = adapters.iter().enumerate().map(|(n, a)| format!("wgpu:{n} {a}")).collect();
    for label in &labels {
        assert!(h.query_by_label(label).is_some(), "{label} is offered");
    }
    h.get_by_label(labels.last().unwrap()).click();
    h.run_steps(2);
    assert_eq!(h.state().run_backend, kiln::Backend::WgpuAdapter(adapters.len() - 1));
    h.get_by_label("Run at quick size").click();
    h.run_steps(1);
    h.state_mut().wait_for_run();
    h.run_steps(2);
    let (title, run) = h.state().runs.last().cloned().expect("a run");
    let run = run.unwrap_or_else(|e| panic!("{title}: {e}"));
    assert!(title.ends_with(labels.last().unwrap().as_str()), "{title}");
    assert!(run.correct(), "{:?}", run.times);
}

#[test]
fn the_examples_open_with_their_breaks_and_convolutions() {
    let mut h = harness(Explorer::default());
    h.run_steps(2);
    // `examples/graph_breaks.rs`' own function, on inputs taking both of its paths.
    h.get_by_label("graph breaks").click();
    h.run_steps(1);
    h.state_mut().wait_for_work();
    h.run_steps(3);
    assert!(h.state().error.is_none(), "{:?}", h.state().error);
    let (_, report) = h.state().report.clone().expect("a report");
    let breaks: Vec<_> = report.entries.iter().flat_map(|e| &e.breaks).collect();
    assert!(!breaks.is_empty(), "the value read breaks the graph");
    assert!(breaks.iter().all(|b| b.loc.file.ends_with("graph_breaks.rs")), "{breaks:?}");
    assert!(h.query_all_by_label_contains("break at").next().is_some(), "the break is listed");
    // The graph view draws the trace: graph 0, the cut at the user's line, graph 1; a click opens graph 1.
    let cut = format!("✂ {}", breaks[0].loc);
    assert!(h.query_by_label_contains(&cut).is_some(), "the cut is drawn: {cut}");
    let second = format!("graph 1 ({} ops)", report.entries[0].graphs[1].captured.nodes.len());
    h.get_by_label(&second).click();
    h.run_steps(2);
    assert_eq!(h.state().graph, (0, 1));
    // The digits CNN exported from PyTorch: its graph holds the convolutions.
    h.get_by_label("digits CNN (ONNX)").click();
    h.run_steps(1);
    h.state_mut().wait_for_work();
    h.run_steps(3);
    assert!(h.state().error.is_none(), "{:?}", h.state().error);
    let g = h.state().selected_graph().expect("a graph").clone();
    let ops: Vec<String> = g.captured.op_histogram().into_iter().map(|(n, _)| n.to_string()).collect();
    assert!(ops.iter().any(|o| o == "conv"), "{ops:?}");
    assert!(!g.kernels.is_empty());
}

#[test]
fn browse_opens_a_report_picked_in_the_file_dialog() {
    let dir = std::env::temp_dir().join(format!("kiln-browse-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let report = kiln_app::workload_report("W1").unwrap();
    std::fs::write(dir.join("w1-report.json"), serde_json::to_string(&report).unwrap()).unwrap();
    std::fs::write(dir.join("notes.txt"), "not JSON").unwrap();
    let mut app = Explorer::default();
    app.file_dialog = kiln_app::json_dialog(Some(dir.clone()));
    let mut h = harness(app);
    h.run_steps(2);
    h.get_by_label("Browse…").click();
    // The dialog lists the folder (read on a thread) with only JSON files shown.
    let mut listed = false;
    for _ in 0..200 {
        h.run_steps(1);
        if h.query_by_label_contains("w1-report.json").is_some() {
            listed = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(listed, "the dialog lists the report");
    assert!(h.query_by_label_contains("notes.txt").is_none(), "the filter hides other files");
    h.get_by_label_contains("w1-report.json").click();
    h.run_steps(2);
    // The dialog's own button (the top bar has an "Open" too).
    h.get_by_label("🗀  Open").click();
    h.run_steps(3);
    assert!(h.state().error.is_none(), "{:?}", h.state().error);
    let (name, opened) = h.state().report.clone().expect("the picked report is open");
    assert!(name.contains("w1-report.json"), "{name}");
    assert_eq!(opened.entries.len(), report.entries.len());
    std::fs::remove_dir_all(&dir).ok();
}

/// A compiled training step (`backward()` inside the function) lists its backward's partition: the bytes
/// it reads of the forward's values against keeping every value its rules use.
#[test]
fn a_training_step_shows_its_backward_partition() {
    use kiln::{DType, Tensor};
    let w = Tensor::from_data(kiln::graph::workloads::data(&kiln::graph::TensorSpec::new(DType::F32, &[256, 128]), 1));
    let w = w.requires_grad_(true).unwrap();
    let step = kiln::compile(|x: &Tensor| {
        let l = x.matmul(&w)?.gelu()?.mean(&[0, 1], false)?;
        l.backward()?;
        Ok(l)
    })
    .backend(kiln::graph::KernelInterpreter::default().runtime());
    let x = Tensor::from_data(kiln::graph::workloads::data(&kiln::graph::TensorSpec::new(DType::F32, &[512, 256]), 2));
    let _: Tensor = step.call(&x).unwrap();
    let json = step.report().to_json();
    let mut h = harness(Explorer::default());
    h.state_mut().open_report_text(&json, "train_step.json");
    h.run_steps(3);
    assert!(h.state().error.is_none(), "{:?}", h.state().error);
    let shown = h.query_by_label_contains("backward: reads").expect("the partition is listed");
    // The GELU's intermediates come back from the product's output (stored anyway).
    let text = format!("{shown:?}");
    assert!(text.contains("computed again") && !text.contains(" 0 node(s)"), "{text}");
    if let Ok(dir) = std::env::var("KILN_UI_SHOTS") {
        let img = h.render().expect("a frame");
        img.save(std::path::Path::new(&dir).join("partition.png")).expect("written");
    }
}
