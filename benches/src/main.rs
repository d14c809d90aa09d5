//! kiln-bench: runs the workloads on the backends it finds, proves each result against the CPU reference
//! before timing it, and reports medians, achieved bandwidth as a fraction of a copy kernel measured in the
//! same run, kernel counts and compile times, as JSON (`kiln-bench/1`) and Markdown.

mod chart;
mod report;
mod wgpu_timing;

use kiln_graph::workloads;

use clap::Parser;
use report::Report;
use std::path::PathBuf;

/// Command line.
#[derive(Parser, Debug, Clone)]
#[command(version, about = "kiln's headless bench")]
pub struct Cli {
    /// `best` (CUDA, else any wgpu adapter, else the CPU reference), `all`, `wgpu` or `cpu`.
    #[arg(long, default_value = "best")]
    backend: String,
    /// Workloads to run, e.g. `W1,W3` (default: all).
    #[arg(long, value_delimiter = ',')]
    workload: Vec<String>,
    /// Small sizes, for CI and first runs.
    #[arg(long)]
    quick: bool,
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
    /// Merge a peer's results (`benches/peers/torch_compile.py --json`) into the report.
    #[arg(long)]
    peer: Vec<PathBuf>,
}

fn main() {
    let cli = Cli::parse();
    if let (Some(json), Some(out)) = (&cli.replot, &cli.chart) {
        let report = std::fs::read_to_string(json)
            .map_err(|e| e.to_string())
            .and_then(|t| serde_json::from_str::<Report>(&t).map_err(|e| e.to_string()))
            .and_then(|r| chart::draw(&r, out));
        if let Err(e) = report {
            eprintln!("kiln-bench: {e}");
            std::process::exit(2);
        }
        return;
    }
    match run(&cli) {
        Ok(report) => {
            let failed = report.results.iter().any(|r| !r.correct);
            println!("{}", report.markdown());
            if failed {
                eprintln!("kiln-bench: a result disagreed with the reference (see max_rel_err)");
                std::process::exit(1);
            }
        }
        Err(e) => {
            eprintln!("kiln-bench: {e}");
            std::process::exit(2);
        }
    }
}

fn run(cli: &Cli) -> kiln::Result<Report> {
    // A cache directory of the bench's own, empty at start, so cold compiles are cold and warm ones read it.
    let cache = std::env::temp_dir().join(format!("kiln-bench-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&cache);
    std::env::set_var("KILN_CACHE_DIR", &cache);
    let chosen: Vec<workloads::Workload> = workloads::all()
        .into_iter()
        .filter(|w| cli.workload.is_empty() || cli.workload.iter().any(|x| x.eq_ignore_ascii_case(w.id)))
        .collect();
    let mut report = Report::new(cli.quick);
    let want_wgpu = matches!(cli.backend.as_str(), "best" | "all" | "wgpu");
    let gpu = if want_wgpu {
        kiln_wgsl::WgpuBackend::new()
    } else {
        Err(kiln::Error::Unsupported { what: "not requested".into(), loc: kiln::SourceLoc::internal() })
    };
    let mut quick = cli.quick;
    match gpu {
        Ok(gpu) => {
            report.devices.push(format!("wgpu: {}", gpu.gpu().describe()));
            if !quick && gpu.gpu().is_software() {
                // Full sizes take hours on a CPU Vulkan driver (lavapipe): measure the quick sizes instead.
                quick = true;
                report.quick = true;
                report.notes.push("the only adapter is a CPU driver: quick sizes used".into());
            }
            let cli = &Cli { quick, ..cli.clone() };
            let copy = wgpu_timing::copy_bandwidth(&gpu, cli)?;
            report.copy_gbps.insert("wgpu".into(), copy);
            let bar = indicatif::ProgressBar::new(chosen.len() as u64).with_style(
                indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}")
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            for w in &chosen {
                bar.set_message(format!("{}: {}", w.id, w.what));
                for row in wgpu_timing::measure(&gpu, w, cli, copy)? {
                    report.results.push(row);
                }
                bar.inc(1);
            }
            bar.finish_and_clear();
        }
        Err(e) if cli.backend == "wgpu" => return Err(e),
        Err(e) => report.devices.push(format!("wgpu: unavailable ({e})")),
    }
    if cli.backend == "cpu" || cli.backend == "all" || (cli.backend == "best" && report.results.is_empty()) {
        report.devices.push("cpu: the f64 reference interpreter".into());
        for w in &chosen {
            report.results.push(report::cpu_reference_row(w)?);
        }
    }
    for note in [
        "W5 runs forward only (f32 and bf16): the training step waits for autodiff. W6 (densenet) waits for convolution support.",
        "cuda: PTX kernels are generated and ptxas-checked, but the CUDA runtime has not landed yet: no CUDA rows.",
    ] {
        report.notes.push(note.into());
    }
    for p in &cli.peer {
        report.merge_peer(p)?;
    }
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
