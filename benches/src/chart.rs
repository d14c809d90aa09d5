//! The report's chart: per workload, each backend's compiled speedup over its own eager mode (kiln CUDA,
//! its CUDA-graph replay, kiln wgpu, torch.compile and its reduce-overhead mode), and the fraction of copy
//! bandwidth reached. SVG (text needs no font files, so it renders on any machine).

use crate::report::Report;
use plotters::prelude::*;

/// Draws the chart to `path` (SVG).
pub fn draw(report: &Report, path: &std::path::Path) -> Result<(), String> {
    let root = SVGBackend::new(path, (1400, 760)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let (top, bottom) = root.split_vertically(380);
    // (label, series, value) bars, grouped by workload: speedup of each non-eager mode over the same
    // backend's eager run, and the fraction of that backend's copy bandwidth.
    let mut speedups = Vec::new();
    let mut fractions = Vec::new();
    let mut workloads: Vec<&str> = Vec::new();
    for r in &report.results {
        if !workloads.contains(&r.workload.as_str()) {
            workloads.push(&r.workload);
        }
    }
    for w in workloads {
        for r in report.results.iter().filter(|r| r.workload == w) {
            let Some(series) = series(&r.backend, &r.mode) else { continue };
            if r.median_ms <= 0.0 {
                continue;
            }
            let eager = report.results.iter().find(|e| e.workload == w && e.backend == r.backend && e.mode == "eager");
            let label = format!("{w} {}", SERIES[series].0);
            if let Some(e) = eager {
                speedups.push((label.clone(), series, e.median_ms / r.median_ms));
            }
            if r.frac_copy > 0.05 {
                fractions.push((label, series, r.frac_copy * 100.0));
            }
        }
    }
    let legend: Vec<String> = SERIES.iter().map(|(k, what, _)| format!("{k}: {what}")).collect();
    bars(&top, &format!("speedup over the same backend's eager (x) — {}", legend.join(", ")), &speedups)?;
    bars(&bottom, "fraction of the same backend's copy bandwidth (%)", &fractions)?;
    root.present().map_err(|e| e.to_string())
}

/// Bar series: short label, what it is, colour.
const SERIES: [(&str, &str, RGBColor); 5] = [
    ("cu", "kiln CUDA", RGBColor(30, 70, 150)),
    ("cu-g", "kiln CUDA graph", RGBColor(100, 150, 220)),
    ("vk", "kiln wgpu", RGBColor(60, 150, 90)),
    ("tc", "torch.compile", RGBColor(200, 110, 40)),
    ("ro", "torch reduce-overhead", RGBColor(240, 175, 110)),
];

/// The series a result row belongs to (`None`: eager rows and the CPU reference are not drawn).
fn series(backend: &str, mode: &str) -> Option<usize> {
    match (backend, mode) {
        ("cuda", "compiled") => Some(0),
        ("cuda", "reduce-overhead") => Some(1),
        ("wgpu", "compiled") => Some(2),
        (b, "default") if b.starts_with("torch") => Some(3),
        (b, "reduce-overhead") if b.starts_with("torch") => Some(4),
        _ => None,
    }
}

fn bars(
    area: &DrawingArea<SVGBackend, plotters::coord::Shift>,
    title: &str,
    data: &[(String, usize, f64)],
) -> Result<(), String> {
    let max = data.iter().map(|d| d.2).fold(1.0f64, f64::max) * 1.15;
    let n = data.len().max(1);
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 14))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(50)
        .build_cartesian_2d((0usize..n).into_segmented(), 0.0..max)
        .map_err(|e| e.to_string())?;
    let labels: Vec<String> = data.iter().map(|d| d.0.clone()).collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n)
        .x_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) | SegmentValue::Exact(i) => labels.get(*i).cloned().unwrap_or_default(),
            SegmentValue::Last => String::new(),
        })
        .x_label_style(("sans-serif", 9))
        .draw()
        .map_err(|e| e.to_string())?;
    chart
        .draw_series(data.iter().enumerate().map(|(i, (_, series, v))| {
            let mut bar = Rectangle::new(
                [(SegmentValue::Exact(i), 0.0), (SegmentValue::Exact(i + 1), *v)],
                SERIES[*series].2.filled(),
            );
            bar.set_margin(0, 0, 2, 2);
            bar
        }))
        .map_err(|e| e.to_string())?;
    Ok(())
}
