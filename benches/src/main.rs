//! kiln-bench: runs the workloads on the backends it finds, proves each result against the CPU reference
//! before timing it, and reports medians, achieved bandwidth as a fraction of a copy kernel measured in the
//! same run, kernel counts and compile times, as JSON (`kiln-bench/1`) and Markdown.

mod chart;
mod check;
mod device;
mod readme;
mod report;
mod timing;
mod train_step;
mod trials;

use kiln_graph::workloads;

use clap::Parser;
use device::Device;
use report::Report;
use std::path::PathBuf;

/// Command line.
#[derive(Parser, Debug, Clone)]
#[command(version, about = "kiln's headless bench")]
pub struct Cli {
    /// `best` (CUDA, else any wgpu adapter, else the CPU reference), `all`, `cuda`, `wgpu` or `cpu`.
    #[arg(long, default_value = "best")]
    backend: String,
    /// Workloads to run, e.g. `W1,W3` (default: all).
    #[arg(long, value_delimiter = ',')]
    workload: Vec<String>,
    /// Small sizes, for CI and first runs.
    #[arg(long)]
    quick: bool,
    /// Modes to measure besides `compiled` (always measured: the others derive from its plan), e.g.
    /// `reduce-overhead` or `max-autotune` (default: `reduce-overhead,eager`).
    #[arg(long, value_delimiter = ',', default_values_t = [String::from("reduce-overhead"), String::from("eager")])]
    pub modes: Vec<String>,
    /// Timed runs per measurement (after warm-up); the median is reported.
    #[arg(long, default_value_t = 20)]
    repeat: usize,
    /// Write the JSON report here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write the Markdown report here.
    #[arg(long)]
    md: Option<PathBuf>,
    /// Write the chart (SVG) here.
    #[arg(long)]
    chart: Option<PathBuf>,
    /// Redraw the chart of an earlier JSON report (no measuring) and exit.
    #[arg(long)]
    replot: Option<PathBuf>,
    /// Time every kernel of each compiled run and list where the time goes (devices with events).
    #[arg(long)]
    profile: bool,
    /// Merge a peer's results (`benches/peers/torch_compile.py --json`) into the report; several files
    /// of the same peer (runs in fresh processes) fold into one row each, with their min–max.
    #[arg(long)]
    peer: Vec<PathBuf>,
    /// Measure in this many fresh processes and report the median of their medians with the min–max.
    /// The first starts with every cache empty (its compile times are cold); the rest keep its caches
    /// (warm).
    #[arg(long, default_value_t = 1)]
    trials: usize,
    /// Launches back to back per device-time sample (the sample is their time divided by the count).
    #[arg(long, default_value_t = 10)]
    batch: usize,
    /// Expected outputs written by the peer (`--outputs`): each workload's full-size output is checked
    /// against `<id>.expected.safetensors` (else kiln's f64 reference), and the peer's rows against kiln's
    /// reference through `<id>.check.<mode>.safetensors`.
    #[arg(long)]
    expect: Option<PathBuf>,
    /// Merge these bench reports (parts of one run, e.g. split by workload) instead of measuring.
    #[arg(long, num_args = 1..)]
    merge: Vec<PathBuf>,
    /// Print the README's numbers section rendered from this report (no measuring); with
    /// `--write-readme FILE`, replace that section of FILE instead.
    #[arg(long)]
    readme: Option<PathBuf>,
    /// The README whose numbers section `--readme` replaces.
    #[arg(long)]
    write_readme: Option<PathBuf>,
}

fn main() {
    // KILN_LOGS=graph shows, among others, how a cold compile's loading divides (render, ptxas, load).
    kiln::init_logs();
    let cli = Cli::parse();
    let fail = |e: String| -> ! {
        eprintln!("kiln-bench: {e}");
        std::process::exit(2);
    };
    if let Some(json) = &cli.readme {
        let done = Report::load(json).map_err(|e| e.to_string()).and_then(|r| match &cli.write_readme {
            Some(path) => readme::write(&r, json, path),
            None => {
                println!("{}", readme::render(&r, json));
                Ok(())
            }
        });
        if let Err(e) = done {
            fail(e);
        }
        return;
    }
    if let (Some(json), Some(out)) = (&cli.replot, &cli.chart) {
        if let Err(e) = Report::load(json).map_err(|e| e.to_string()).and_then(|r| chart::draw(&r, out)) {
            fail(e);
        }
        return;
    }
    let cold = caches();
    let result = if !cli.merge.is_empty() {
        merge(&cli).and_then(|r| finish(&cli, r))
    } else if cli.trials > 1 {
        run_trials(&cli)
    } else {
        run(&cli, cold).and_then(|r| finish(&cli, r))
    };
    match result {
        Ok(report) => {
            let failed = report.results.iter().any(|r| r.correct == Some(false) && !r.backend.starts_with("torch"));
            println!("{}", report.markdown());
            if failed {
                eprintln!("kiln-bench: an output disagreed with the expected one (see max rel err)");
                std::process::exit(1);
            }
        }
        Err(e) => fail(e.to_string()),
    }
}

/// Points kiln's compile cache and the CUDA driver's JIT cache at the bench's own directory —
/// `KILN_BENCH_CACHE` when a `--trials` parent shares one between its trials, else a fresh one — before
/// any device is opened. Returns whether it was empty: compile times in this process are then cold.
fn caches() -> bool {
    let dir = match std::env::var_os("KILN_BENCH_CACHE") {
        Some(d) => PathBuf::from(d),
        None => {
            let d = std::env::temp_dir().join(format!("kiln-bench-cache-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&d);
            d
        }
    };
    let cold = std::fs::read_dir(&dir).map_or(true, |mut d| d.next().is_none());
    // Single-threaded still: no device is open and no other thread reads the environment.
    std::env::set_var("KILN_CACHE_DIR", dir.join("kiln"));
    std::env::set_var("CUDA_CACHE_PATH", dir.join("nv"));
    cold
}

/// `--merge`: several reports of one run (split by workload) as one; a later report's rows replace an
/// earlier one's of the same workload, backend and mode.
fn merge(cli: &Cli) -> kiln::Result<Report> {
    let mut all: Option<Report> = None;
    for p in &cli.merge {
        let r = Report::load(p).map_err(|msg| kiln::Error::Format { what: p.display().to_string(), msg })?;
        match &mut all {
            None => all = Some(r),
            Some(a) => a.supersede(r),
        }
    }
    let mut all = all.ok_or_else(|| kiln::Error::Format { what: "--merge".into(), msg: "no reports".into() })?;
    // Parts measured by a binary that had no training step said so; the merged report has the rows.
    let has_train = all.results.iter().any(|r| r.workload.starts_with("W5-train"));
    all.notes.retain(|n| !(has_train && n.starts_with("W5 runs forward only")));
    // Likewise W6, measured by a later binary than a part that said it waited for convolutions.
    let has_w6 = all.results.iter().any(|r| r.workload == "W6");
    all.notes.retain(|n| !(has_w6 && n.contains("W6 (densenet) waits")));
    let mut seen = std::collections::HashSet::new();
    all.notes.retain(|n| seen.insert(n.clone()));
    Ok(all)
}

fn run(cli: &Cli, cold: bool) -> kiln::Result<Report> {
    let chosen: Vec<workloads::Workload> = workloads::all()
        .into_iter()
        .chain(train_step::all())
        .filter(|w| cli.workload.is_empty() || cli.workload.iter().any(|x| x.eq_ignore_ascii_case(w.id)))
        .collect();
    let mut report = Report::new(cli.quick);
    const MODES: [&str; 4] = ["compiled", "reduce-overhead", "max-autotune", "eager"];
    if let Some(m) = cli.modes.iter().find(|m| !MODES.contains(&m.as_str())) {
        return Err(kiln::Error::InvalidArgument {
            op: "--modes".into(),
            msg: format!("`{m}` is not one of {}", MODES.join(", ")),
            loc: kiln::SourceLoc::internal(),
        });
    }
    if !["best", "all", "cuda", "wgpu", "cpu"].contains(&cli.backend.as_str()) {
        return Err(kiln::Error::InvalidArgument {
            op: "--backend".into(),
            msg: format!("`{}` is not one of best, all, cuda, wgpu, cpu", cli.backend),
            loc: kiln::SourceLoc::internal(),
        });
    }
    if wants(cli, &report, "cuda") {
        match kiln::Backend::Cuda.runtime() {
            Ok(Some(rt)) => {
                report.devices.push(format!("cuda: {}", rt.driver().describe()));
                run_device(&Device { rt }, &mut report, &chosen, cli, cold)?;
            }
            Ok(None) => {}
            Err(e) if cli.backend == "cuda" => return Err(e),
            Err(e) => report.devices.push(format!("cuda: unavailable ({e})")),
        }
    }
    if wants(cli, &report, "wgpu") {
        match kiln::Backend::Wgpu.runtime() {
            Ok(Some(rt)) => {
                report.devices.push(format!("wgpu: {}", rt.driver().describe()));
                let software = rt.driver().as_any().downcast_ref::<kiln_wgsl::Gpu>().is_some_and(|g| g.is_software());
                let mut cli = cli.clone();
                if !cli.quick && software {
                    // Full sizes take hours on a CPU Vulkan driver (lavapipe): measure the quick sizes.
                    cli.quick = true;
                    report.quick = true;
                    report.notes.push("the only adapter is a CPU driver: quick sizes used".into());
                }
                run_device(&Device { rt }, &mut report, &chosen, &cli, cold)?;
            }
            Ok(None) => {}
            Err(e) if cli.backend == "wgpu" => return Err(e),
            Err(e) => report.devices.push(format!("wgpu: unavailable ({e})")),
        }
    }
    if wants(cli, &report, "cpu") {
        report.devices.push("cpu: the f64 reference interpreter".into());
        for w in &chosen {
            report.results.push(report::cpu_reference_row(w)?);
        }
    }
    for note in [
        "W5-train is one training step (forward, mean-square loss, backward, AdamW at step 10; f32; the loss, parameters and both moments all checked); torch's side (torch_compile.py: the module compiled, F.mse_loss, backward, fused AdamW) checks the same 151 outputs. W5-train-bf16 is the same step with everything bf16 (inputs, parameters, moments; the update computed in f32), torch's side the same in bf16 (fused AdamW on bf16 parameters).",
        "cuda: f32 convolutions round their operands to TF32 on the matrix units and sum in f32, as torch's cuDNN convolutions do by default (kiln's Target::tf32_convolutions; KILN_CUDA_CONV_TF32=0 turns it off); f32 matmuls keep full f32 precision on both sides.",
        "cuda: reduce-overhead replays the compiled graph as one CUDA graph. Compile times are the first compile of the workload in its process (trace, compile, load, first run); cold in a process that started with kiln's compile cache and the CUDA driver's JIT cache (CUDA_CACHE_PATH) empty, warm in a later one with both kept.",
    ] {
        report.notes.push(note.into());
    }
    Ok(report)
}

/// Peers merged, trials folded, then the chart, JSON and Markdown written.
fn finish(cli: &Cli, mut report: Report) -> kiln::Result<Report> {
    for p in &cli.peer {
        report.merge_peer(p)?;
    }
    if let Some(dir) = &cli.expect {
        check::peer_rows(&mut report.results, dir)?;
    }
    report.results = trials::fold(std::mem::take(&mut report.results));
    if let Some(p) = &cli.chart {
        chart::draw(&report, p).map_err(|msg| kiln::Error::Format { what: "chart".into(), msg })?;
    }
    if let Some(p) = &cli.json {
        std::fs::write(p, report.json())
            .map_err(|e| kiln::Error::Format { what: "JSON report".into(), msg: e.to_string() })?;
    }
    if let Some(p) = &cli.md {
        std::fs::write(p, report.markdown())
            .map_err(|e| kiln::Error::Format { what: "Markdown report".into(), msg: e.to_string() })?;
    }
    Ok(report)
}

/// `--trials N`: the same measurement in N fresh processes (this binary, the same arguments, each writing
/// its JSON to a temporary file), folded into one report.
fn run_trials(cli: &Cli) -> kiln::Result<Report> {
    let exe = std::env::current_exe()
        .map_err(|e| kiln::Error::Format { what: "the bench's own path".into(), msg: e.to_string() })?;
    // The child measures only: outputs, peers and trials are the parent's.
    let mut args: Vec<String> = Vec::new();
    let mut skip = false;
    for a in std::env::args().skip(1) {
        if std::mem::take(&mut skip) {
            continue;
        }
        let flag = a.split('=').next().unwrap_or_default();
        if ["--trials", "--json", "--md", "--chart", "--peer"].contains(&flag) {
            skip = !a.contains('=');
            continue;
        }
        args.push(a);
    }
    // One cache directory for every trial: the first finds it empty (cold), the rest warm.
    let cache = std::env::temp_dir().join(format!("kiln-bench-trials-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&cache);
    let mut merged: Option<Report> = None;
    for t in 0..cli.trials {
        let json = std::env::temp_dir().join(format!("kiln-bench-trial-{}-{t}.json", std::process::id()));
        eprintln!("kiln-bench: trial {}/{} (a fresh process)", t + 1, cli.trials);
        let status = std::process::Command::new(&exe)
            .args(&args)
            .arg("--json")
            .arg(&json)
            .env("KILN_BENCH_CACHE", &cache)
            .stdout(std::process::Stdio::null())
            .status();
        let bad = |msg: String| kiln::Error::Format { what: format!("trial {}", t + 1), msg };
        let status = status.map_err(|e| bad(e.to_string()))?;
        let text = std::fs::read_to_string(&json).map_err(|e| bad(format!("{e} (exit {status})")))?;
        let _ = std::fs::remove_file(&json);
        let report: Report = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        match &mut merged {
            None => merged = Some(report),
            Some(m) => m.absorb(report),
        }
    }
    let _ = std::fs::remove_dir_all(&cache);
    let mut report = merged.ok_or_else(|| kiln::Error::Format { what: "trials".into(), msg: "none ran".into() })?;
    report.notes.push(format!(
        "{} trials, each a fresh process: every time is the median of the trials' medians, with their min–max; copy bandwidth is the lowest trial's; the first trial's compiles are cold, the others' warm.",
        cli.trials
    ));
    finish(cli, report)
}

/// Whether backend `b` runs: asked for by name or `all`, or `best` and nothing better has run.
fn wants(cli: &Cli, report: &Report, b: &str) -> bool {
    cli.backend == b || cli.backend == "all" || (cli.backend == "best" && report.results.is_empty())
}

/// Copy bandwidth, then every chosen workload on one device, with a progress bar.
fn run_device(
    dev: &Device,
    report: &mut Report,
    chosen: &[workloads::Workload],
    cli: &Cli,
    cold: bool,
) -> kiln::Result<()> {
    let (kernel, native) = timing::copy_bandwidth(dev, cli)?;
    // Fractions are quoted against the better of kiln's copy kernel and the device's own copy.
    let copy = native.map_or(kernel, |n| n.max(kernel));
    if let Some(n) = native {
        report.devices.push(report::copy_line_text(dev.name(), kernel, n));
    }
    report.copy_gbps.insert(dev.name().into(), copy);
    let bar = indicatif::ProgressBar::new(chosen.len() as u64).with_style(
        indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    for w in chosen {
        bar.set_message(format!("{} {}: {}", dev.name(), w.id, w.what));
        report.results.extend(timing::measure(dev, w, cli, copy, cold)?);
        bar.inc(1);
    }
    if cli.workload.is_empty() || cli.workload.iter().any(|x| x.eq_ignore_ascii_case("W3-dynamic")) {
        bar.set_message(format!("{} W3 over 20 row counts (dynamic shapes)", dev.name()));
        report.results.push(timing::measure_dynamic(dev, cli, cold)?);
    }
    bar.finish_and_clear();
    Ok(())
}
