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

    /// The chart: one bar per row, device time in ms.
    pub fn show(&self, ui: &mut egui::Ui) {
        ui.label(format!("{}: {} rows", self.source, self.rows.len()));
        let bars: Vec<egui_plot::Bar> = self
            .rows
            .iter()
            .enumerate()
            .map(|(i, r)| egui_plot::Bar::new(i as f64, r.ms).name(&r.label).width(0.7))
            .collect();
        let labels: Vec<String> = self.rows.iter().map(|r| r.label.clone()).collect();
        egui_plot::Plot::new("bench chart")
            .y_axis_label("device ms")
            .x_axis_formatter(label_axis(labels))
            .show(ui, |plot| plot.bar_chart(egui_plot::BarChart::new("device time", bars)));
    }
}
