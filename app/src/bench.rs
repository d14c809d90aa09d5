//! A `kiln-bench` report (schema `kiln-bench/2`) as the rows the app charts.

/// An x axis that names bar `i` by `labels[i]` at integer marks and says nothing between them.
pub fn label_axis(labels: Vec<String>) -> impl Fn(egui_plot::GridMark, &std::ops::RangeInclusive<f64>) -> String {
    move |mark, _range| {
        let i = mark.value.round();
        if (mark.value - i).abs() < 1e-6 && i >= 0.0 {
            labels.get(i as usize).cloned().unwrap_or_default()
        } else {
            String::new()
        }
    }
}

/// One measured configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct BenchRow {
    /// `W3 cuda reduce-overhead`.
    pub label: String,
    /// Device time, ms (median, or the median of trial medians).
    pub ms: f64,
    /// Whether its output was checked and correct (`None`: not checked).
    pub correct: Option<bool>,
}

/// A bench report's rows, in file order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BenchTable {
    /// Where it came from.
    pub source: String,
    /// Its rows.
    pub rows: Vec<BenchRow>,
}

impl BenchTable {
    /// Reads a bench JSON; anything else (another schema, malformed rows) is an error message.
    pub fn parse(text: &str, source: &str) -> Result<BenchTable, String> {
        let v: serde_json::Value = serde_json::from_str(text).map_err(|e| format!("{source}: not JSON: {e}"))?;
        match v.get("schema").and_then(|s| s.as_str()) {
            Some("kiln-bench/2") => {}
            Some(other) => return Err(format!("{source}: schema `{other}`; this app reads `kiln-bench/2`")),
            None => return Err(format!("{source}: no `schema` field: not a kiln-bench report")),
        }
        let results = v.get("results").and_then(|r| r.as_array()).ok_or(format!("{source}: no `results` list"))?;
        let rows = results
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let s = |k: &str| r.get(k).and_then(|x| x.as_str()).unwrap_or("?").to_string();
                let ms =
                    r.get("median_ms").and_then(|x| x.as_f64()).ok_or(format!("{source}: row {i} has no median_ms"))?;
                Ok(BenchRow {
                    label: format!("{} {} {}", s("workload"), s("backend"), s("mode")),
                    ms,
                    correct: r.get("correct").and_then(|c| c.as_bool()),
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(BenchTable { source: source.into(), rows })
    }

    /// One bar per row, as the chart draws them (label, ms).
    pub fn bars(&self) -> Vec<(String, f64)> {
        self.rows.iter().map(|r| (r.label.clone(), r.ms)).collect()
    }
}

/// One report's bars on a shared axis: its source and, per row, (label index, ms).
pub type Series = (String, Vec<(usize, f64)>);

/// Several bench reports on one axis: the union of their row labels (in order of first appearance) and,
/// per report, its bars.
pub fn side_by_side(tables: &[BenchTable]) -> (Vec<String>, Vec<Series>) {
    let mut labels: Vec<String> = Vec::new();
    let mut series = Vec::with_capacity(tables.len());
    for t in tables {
        let mut bars = Vec::with_capacity(t.rows.len());
        for r in &t.rows {
            let i = labels.iter().position(|l| *l == r.label).unwrap_or_else(|| {
                labels.push(r.label.clone());
                labels.len() - 1
            });
            bars.push((i, r.ms));
        }
        series.push((t.source.clone(), bars));
    }
    (labels, series)
}

/// The chart of every open bench report: one bar per row, the reports' bars side by side under each
/// label, device time in ms. Returns the plot's rectangle (for exporting it).
pub fn show(ui: &mut egui::Ui, tables: &[BenchTable]) -> egui::Rect {
    let (labels, series) = side_by_side(tables);
    let n = series.len().max(1) as f64;
    let width = 0.8 / n;
    let charts: Vec<egui_plot::BarChart> = series
        .iter()
        .enumerate()
        .map(|(j, (source, bars))| {
            // Bars of report j sit at j's slot of each label's 0.8-wide group.
            let offset = -0.4 + width * (j as f64 + 0.5);
            let bars = bars
                .iter()
                .map(|&(i, ms)| egui_plot::Bar::new(i as f64 + offset, ms).name(&labels[i]).width(width * 0.9))
                .collect();
            egui_plot::BarChart::new(source.as_str(), bars)
        })
        .collect();
    egui_plot::Plot::new("bench chart")
        .y_axis_label("device ms")
        .legend(egui_plot::Legend::default())
        .x_axis_formatter(label_axis(labels))
        .show(ui, |plot| {
            for c in charts {
                plot.bar_chart(c);
            }
        })
        .response
        .rect
}
