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
        if let Some(e) = eager {
            speedups.push((format!("{} {} {}", r.workload, r.backend, r.mode), e.median_ms / r.median_ms));
        }
        if r.frac_copy > 0.0 {
            fractions.push((format!("{} {} {}", r.workload, r.backend, r.mode), r.frac_copy * 100.0));
        }
    }
    bars(&top, "speedup over eager (x)", &speedups)?;
    bars(&bottom, "fraction of copy bandwidth (%)", &fractions)?;
    root.present().map_err(|e| e.to_string())
}

fn bars(
    area: &DrawingArea<SVGBackend, plotters::coord::Shift>,
    title: &str,
    data: &[(String, f64)],
) -> Result<(), String> {
    let max = data.iter().map(|d| d.1).fold(1.0f64, f64::max) * 1.15;
    let n = data.len().max(1);
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(90)
        .y_label_area_size(50)
        .build_cartesian_2d(0usize..n, 0.0..max)
        .map_err(|e| e.to_string())?;
    let labels: Vec<String> = data.iter().map(|d| d.0.clone()).collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n)
        .x_label_formatter(&|i| labels.get(*i).cloned().unwrap_or_default())
        .x_label_style(("sans-serif", 11).into_font().transform(FontTransform::Rotate90))
        .draw()
        .map_err(|e| e.to_string())?;
    chart
        .draw_series(data.iter().enumerate().map(|(i, (label, v))| {
            let colour = if label.contains("torch") { RGBColor(200, 120, 60) } else { RGBColor(60, 110, 190) };
            Rectangle::new([(i, 0.0), (i + 1, *v)], colour.filled())
        }))
        .map_err(|e| e.to_string())?;
    Ok(())
}
