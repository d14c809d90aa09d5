//! The report's chart: per workload, each configuration's device time relative to torch's best mode on
//! that workload (1.0 = parity, lower is better), with whiskers from the fastest to the slowest trial.
//! Written as SVG and PNG; text is laid out with a system TrueType font (DejaVu Sans, which
//! `scripts/deps.sh` installs, or the platform's Arial).

use crate::report::Report;
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::Path;

/// Bar series: (backend, mode) it draws, legend label, colour.
const SERIES: [(&str, &str, &str, RGBColor); 6] = [
    ("cuda", "compiled", "kiln CUDA", RGBColor(30, 70, 150)),
    ("cuda", "reduce-overhead", "kiln CUDA graph", RGBColor(100, 150, 220)),
    ("wgpu", "compiled", "kiln wgpu", RGBColor(60, 150, 90)),
    ("torch-cuda", "default", "torch.compile", RGBColor(200, 110, 40)),
    ("torch-cuda", "reduce-overhead", "torch reduce-overhead", RGBColor(240, 175, 110)),
    ("torch-cuda", "max-autotune-no-cudagraphs", "torch max-autotune", RGBColor(150, 60, 30)),
];

/// One bar: its group (workload), series, ratio and whisker range.
struct Bar {
    group: usize,
    series: usize,
    ratio: f64,
    lo: f64,
    hi: f64,
}

/// Draws the chart to `path` (SVG) and next to it as PNG (same name, `.png`).
pub fn draw(report: &Report, path: &Path) -> Result<(), String> {
    font().map_err(|e| format!("the chart needs a TrueType font ({e}): install fonts-dejavu-core"))?;
    let (groups, bars) = bars(report);
    let size = (1400, 640);
    {
        let root = SVGBackend::new(path, size).into_drawing_area();
        draw_on(&root, &groups, &bars)?;
        root.present().map_err(|e| e.to_string())?;
    }
    let png = path.with_extension("png");
    let root = BitMapBackend::new(&png, size).into_drawing_area();
    draw_on(&root, &groups, &bars)?;
    root.present().map_err(|e| format!("{}: {e}", png.display()))
}

/// Registers a TrueType font for bitmap text (once), from the usual system locations.
fn font() -> Result<(), String> {
    static DONE: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    DONE.get_or_init(|| {
        const PATHS: [&str; 4] = [
            "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
            "/usr/share/fonts/TTF/DejaVuSans.ttf",
            "/System/Library/Fonts/Supplemental/Arial.ttf",
            "C:\\Windows\\Fonts\\arial.ttf",
        ];
        let bytes = PATHS
            .iter()
            .find_map(|p| std::fs::read(p).ok())
            .ok_or_else(|| format!("none of {} exists", PATHS.join(", ")))?;
        plotters::style::register_font("sans-serif", FontStyle::Normal, Box::leak(bytes.into_boxed_slice()))
            .map_err(|_| "the font did not load".to_string())
    })
    .clone()
}

/// Workloads (SDPA variants under their workload) and the bars relative to torch's best device time.
fn bars(report: &Report) -> (Vec<String>, Vec<Bar>) {
    let torch = crate::trials::best_rows(report, &|r| r.backend.starts_with("torch"), &|r| Some(r.median_ms));
    let mut groups: Vec<String> = Vec::new();
    let mut out = Vec::new();
    for r in &report.results {
        let id = r.workload.trim_end_matches("-sdpa");
        let Some(best) = torch.get(id) else { continue };
        let Some(series) = SERIES.iter().position(|s| s.0 == r.backend && s.1 == r.mode) else { continue };
        // One bar per series and workload: the faster attention variant.
        let group = match groups.iter().position(|g| g == id) {
            Some(g) => g,
            None => {
                groups.push(id.to_string());
                groups.len() - 1
            }
        };
        let rel = |v: f64| v / best.median_ms;
        let bar = Bar {
            group,
            series,
            ratio: rel(r.median_ms),
            lo: rel(r.min_ms.unwrap_or(r.median_ms)),
            hi: rel(r.max_ms.unwrap_or(r.median_ms)),
        };
        match out.iter_mut().find(|b: &&mut Bar| b.group == group && b.series == series) {
            Some(b) if b.ratio > bar.ratio => *b = bar,
            Some(_) => {}
            None => out.push(bar),
        }
    }
    (groups, out)
}

fn draw_on<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, groups: &[String], bars: &[Bar]) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    area.fill(&WHITE).map_err(e)?;
    // Room above the tallest whisker for the legend; ratios past 8x are cut (their value is in the tables).
    let top = bars.iter().map(|b| b.hi).fold(1.2f64, f64::max).min(8.0) * 1.35;
    // Only the series this report has take a slot in each group.
    let present: Vec<usize> = (0..SERIES.len()).filter(|s| bars.iter().any(|b| b.series == *s)).collect();
    let slot = |s: usize| present.iter().position(|&p| p == s).unwrap_or(0);
    let per_group = present.len() + 1;
    let slots = (groups.len().max(1) * per_group) as f64;
    let mut chart = ChartBuilder::on(area)
        .caption(
            "device time relative to torch.compile's best mode (1.0 = parity, lower is better; whiskers: fastest to slowest trial)",
            ("sans-serif", 16),
        )
        .margin(12)
        .x_label_area_size(30)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..slots, 0.0..top)
        .map_err(e)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .y_desc("time ÷ torch best")
        .label_style(("sans-serif", 13))
        .draw()
        .map_err(e)?;
    chart
        .draw_series(std::iter::once(PathElement::new([(0.0, 1.0), (slots, 1.0)], BLACK.stroke_width(1))))
        .map_err(e)?;
    let x = |b: &Bar| (b.group * per_group + slot(b.series)) as f64 + 0.5;
    for (s, (_, _, label, colour)) in SERIES.iter().enumerate() {
        let mine: Vec<&Bar> = bars.iter().filter(|b| b.series == s).collect();
        if mine.is_empty() {
            continue;
        }
        chart
            .draw_series(mine.iter().map(|b| {
                Rectangle::new([(x(b) - 0.5 + 0.08, 0.0), (x(b) + 0.5 - 0.08, b.ratio.min(top))], colour.filled())
            }))
            .map_err(e)?
            .label(*label)
            .legend(move |(px, py)| Rectangle::new([(px, py - 5), (px + 12, py + 5)], colour.filled()));
        chart
            .draw_series(mine.iter().map(|b| {
                ErrorBar::new_vertical(x(b), b.lo.min(top), b.ratio.min(top), b.hi.min(top), BLACK.filled(), 6)
            }))
            .map_err(e)?;
    }
    chart
        .draw_series(groups.iter().enumerate().map(|(g, name)| {
            // Just above the group's tallest whisker, so the legend (upper left) never covers a label.
            let centre = (g * per_group) as f64 + present.len() as f64 / 2.0 - 0.3;
            let above = bars.iter().filter(|b| b.group == g).map(|b| b.hi.min(top)).fold(0.0, f64::max);
            Text::new(name.clone(), (centre, (above + top * 0.06).min(top * 0.97)), ("sans-serif", 15).into_font())
        }))
        .map_err(e)?;
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .margin(28)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .label_font(("sans-serif", 13))
        .draw()
        .map_err(e)?;
    Ok(())
}
