//! Timelines: how long each graph's compile phases took, and when each buffer of the selected graph's
//! memory plan is alive (from its first writer to its last reader), with the bytes in use at each kernel
//! and their peak.

use kiln::graph::report::GraphReport;
use kiln::graph::CompiledGraph;

/// One buffer of a memory plan: alive from kernel `from` through kernel `through`, `bytes` large (`None`
/// when its size depends on symbolic dims).
#[derive(Clone, Debug, PartialEq)]
pub struct BufferSpan {
    /// Index in the plan.
    pub buffer: usize,
    /// First kernel (launch position) it is alive in.
    pub from: usize,
    /// Last kernel it is alive in.
    pub through: usize,
    /// Its size.
    pub bytes: Option<u64>,
}

/// The plan's buffers and the bytes in use at each launch (buffers of unknown size count as 0).
pub fn memory_profile(c: &CompiledGraph) -> (Vec<BufferSpan>, Vec<u64>) {
    let spans: Vec<BufferSpan> = c
        .plan
        .buffers
        .iter()
        .zip(&c.plan.live)
        .enumerate()
        .map(|(i, (b, &(from, through)))| BufferSpan {
            buffer: i,
            from,
            through,
            bytes: b.bytes.as_const().and_then(|v| u64::try_from(v).ok()),
        })
        .collect();
    let steps = c.plan.launches.len().max(1);
    let in_use = (0..steps)
        .map(|k| spans.iter().filter(|s| s.from <= k && k <= s.through).map(|s| s.bytes.unwrap_or(0)).sum())
        .collect();
    (spans, in_use)
}

/// Reads one phase's time.
type PhaseOf = fn(&kiln::graph::pipeline::PhaseTimes) -> f64;

/// Draws the compile timeline of `graphs` and the memory timeline of `selected`.
pub fn show(ui: &mut egui::Ui, graphs: &[&GraphReport], selected: Option<&GraphReport>) {
    ui.strong("compile phases per graph (ms)");
    let phases: [(&str, PhaseOf); 4] = [
        ("decompose", |t| t.decompose_ms),
        ("fuse", |t| t.fuse_ms),
        ("lower", |t| t.lower_ms),
        ("plan", |t| t.plan_ms),
    ];
    let mut charts: Vec<egui_plot::BarChart> = Vec::new();
    for (name, get) in phases {
        let bars = graphs
            .iter()
            .enumerate()
            .map(|(i, g)| egui_plot::Bar::new(i as f64, g.compiled.as_ref().map_or(0.0, |c| get(&c.timings))))
            .collect();
        let chart = egui_plot::BarChart::new(name, bars).horizontal();
        let below: Vec<&egui_plot::BarChart> = charts.iter().collect();
        let chart = chart.stack_on(&below);
        charts.push(chart);
    }
    egui_plot::Plot::new("compile timeline").height(140.0).legend(egui_plot::Legend::default()).show(ui, |p| {
        for c in charts {
            p.bar_chart(c);
        }
    });
    let Some(c) = selected.and_then(|g| g.compiled.as_ref()) else {
        ui.label("The selected graph was not compiled (CPU reference): no memory plan.");
        return;
    };
    let (spans, in_use) = memory_profile(c);
    let peak = in_use.iter().copied().max().unwrap_or(0);
    ui.strong(format!(
        "memory plan: {} buffers over {} kernels, peak {:.2} MiB ({} reused)",
        spans.len(),
        c.plan.launches.len(),
        peak as f64 / 1048576.0,
        c.plan.reused
    ));
    let bars: Vec<egui_plot::Bar> = spans
        .iter()
        .map(|s| {
            egui_plot::Bar::new(s.buffer as f64, (s.through.saturating_sub(s.from) + 1) as f64)
                .base_offset(s.from as f64)
                .name(format!(
                    "buffer {}: kernels {}..={}, {}",
                    s.buffer,
                    s.from,
                    s.through,
                    s.bytes.map_or("symbolic size".into(), |b| format!("{b} B"))
                ))
        })
        .collect();
    egui_plot::Plot::new("buffer lifetimes").height(180.0).x_axis_label("kernel").y_axis_label("buffer").show(
        ui,
        |p| {
            p.bar_chart(egui_plot::BarChart::new("alive", bars).horizontal());
        },
    );
    let points: Vec<[f64; 2]> = in_use.iter().enumerate().map(|(k, b)| [k as f64, *b as f64 / 1048576.0]).collect();
    egui_plot::Plot::new("bytes in use").height(140.0).x_axis_label("kernel").y_axis_label("MiB").show(ui, |p| {
        p.line(egui_plot::Line::new("in use", points));
    });
}
