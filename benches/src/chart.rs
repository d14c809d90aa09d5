//! The report's chart: per workload, kiln's compiled speedup over its eager mode and each peer's, and the
//! fraction of copy bandwidth reached. SVG (text needs no font files, so it renders on any machine).

use crate::report::Report;
use plotters::prelude::*;

/// Draws the chart to `path` (SVG).
pub fn draw(report: &Report, path: &std::path::Path) -> Result<(), String> {
    let root = SVGBackend::new(path, (1000, 720)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let (top, bottom) = root.split_vertically(360);
    // (label, value) bars: speedup of each non-eager mode over the same backend's eager run.
    let mut speedups = Vec::new();
    let mut fractions = Vec::new();
    for r in &report.results {
        if r.mode == "eager" || r.median_ms <= 0.0 {
            continue;
        }
        let eager =
            report.results.iter().find(|e| e.workload == r.workload && e.backend == r.backend && e.mode == "eager");
        let label = format!("{} {}", r.workload, short(&r.backend, &r.mode));
        if let Some(e) = eager {
            speedups.push((label.clone(), e.median_ms / r.median_ms));
        }
        if r.frac_copy > 0.01 {
            fractions.push((label, r.frac_copy * 100.0));
        }
    }
    let legend = "k: kiln compiled (wgpu), tc: torch.compile, ro: torch reduce-overhead";
    bars(&top, &format!("speedup over the same backend's eager (x) — {legend}"), &speedups)?;
    bars(&bottom, "fraction of the same backend's copy bandwidth (%)", &fractions)?;
    root.present().map_err(|e| e.to_string())
}

/// A short bar label: `k`, `tc`, `ro`, or the backend and mode.
fn short(backend: &str, mode: &str) -> String {
    match (backend.starts_with("torch"), mode) {
        (false, "compiled") => "k".into(),
        (true, "default") => "tc".into(),
        (true, "reduce-overhead") => "ro".into(),
        _ => format!("{backend} {mode}"),
    }
}

fn bars(
    area: &DrawingArea<SVGBackend, plotters::coord::Shift>,
    title: &str,
    data: &[(String, f64)],
) -> Result<(), String> {
    let max = data.iter().map(|d| d.1).fold(1.0f64, f64::max) * 1.15;
    let n = data.len().max(1);
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 15))
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
        .x_label_style(("sans-serif", 11))
        .draw()
        .map_err(|e| e.to_string())?;
    chart
        .draw_series(data.iter().enumerate().map(|(i, (label, v))| {
            let colour = if label.ends_with(" tc") || label.ends_with(" ro") || label.contains("torch") {
                RGBColor(200, 120, 60)
            } else {
                RGBColor(60, 110, 190)
            };
            let mut bar =
                Rectangle::new([(SegmentValue::Exact(i), 0.0), (SegmentValue::Exact(i + 1), *v)], colour.filled());
            bar.set_margin(0, 0, 4, 4);
            bar
        }))
        .map_err(|e| e.to_string())?;
    Ok(())
}
