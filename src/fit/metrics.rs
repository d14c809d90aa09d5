//! A run's metrics as it logs them: one row per optimizer step and one per epoch, written as CSV and
//! JSON, and the loss curves drawn as PNG and SVG at the end.

use crate::{Error, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// One optimizer step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    /// Optimizer step, from 1.
    pub step: u64,
    /// Epoch it belongs to, from 0.
    pub epoch: u64,
    /// Training loss of the step (the mean over its samples, micro-batches weighted by their sizes).
    pub loss: f64,
    /// Learning rate the update used.
    pub lr: f64,
}

/// One epoch.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EpochRecord {
    /// Epoch, from 0.
    pub epoch: u64,
    /// Optimizer steps taken by its end.
    pub step: u64,
    /// Mean training loss over its samples.
    pub train_loss: f64,
    /// Mean validation loss over the validation samples, when validated.
    pub val_loss: Option<f64>,
    /// Training samples a second over the epoch (the validation excluded).
    pub samples_per_s: f64,
}

/// Every step's and epoch's records so far.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct History {
    /// One per optimizer step, in order.
    pub steps: Vec<StepRecord>,
    /// One per finished epoch, in order.
    pub epochs: Vec<EpochRecord>,
}

fn io_error(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::Format { what: format!("metrics file {}", path.display()), msg: e.to_string() }
}

impl History {
    /// The value of metric `name` (`train_loss` or `val_loss`) at the end of the last epoch.
    pub fn last(&self, name: &str) -> Option<f64> {
        let e = self.epochs.last()?;
        match name {
            "train_loss" => Some(e.train_loss),
            "val_loss" => e.val_loss,
            _ => None,
        }
    }

    /// Writes `steps.csv`, `epochs.csv` and `metrics.json` into `dir`.
    pub fn write(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| io_error(dir, e))?;
        let steps: String =
            self.steps.iter().map(|s| format!("{},{},{},{}\n", s.step, s.epoch, s.loss, s.lr)).collect();
        let path = dir.join("steps.csv");
        std::fs::write(&path, format!("step,epoch,loss,lr\n{steps}")).map_err(|e| io_error(&path, e))?;
        let epochs: String = self
            .epochs
            .iter()
            .map(|e| {
                let val = e.val_loss.map_or(String::new(), |v| v.to_string());
                format!("{},{},{},{val},{}\n", e.epoch, e.step, e.train_loss, e.samples_per_s)
            })
            .collect();
        let path = dir.join("epochs.csv");
        std::fs::write(&path, format!("epoch,step,train_loss,val_loss,samples_per_s\n{epochs}"))
            .map_err(|e| io_error(&path, e))?;
        let path = dir.join("metrics.json");
        let json = serde_json::to_string_pretty(self).map_err(|e| io_error(&path, e))?;
        std::fs::write(&path, json).map_err(|e| io_error(&path, e))
    }

    /// Draws the step losses and the epochs' validation losses as `loss.png` and `loss.svg` in `dir`.
    pub fn plot(&self, dir: &Path, title: &str) -> Result<()> {
        use plotters::prelude::*;
        register_font()?;
        let png = dir.join("loss.png");
        draw(&BitMapBackend::new(&png, (800, 480)).into_drawing_area(), self, title).map_err(|e| io_error(&png, e))?;
        let svg = dir.join("loss.svg");
        let drawn = draw(&SVGBackend::new(&svg, (800, 480)).into_drawing_area(), self, title);
        drawn.map_err(|e| io_error(&svg, e))
    }
}

fn draw<DB: plotters::prelude::DrawingBackend>(
    area: &plotters::prelude::DrawingArea<DB, plotters::coord::Shift>,
    h: &History,
    title: &str,
) -> std::result::Result<(), String>
where
    DB::ErrorType: 'static,
{
    use plotters::prelude::*;
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    let vals = h.epochs.iter().filter_map(|e| e.val_loss.map(|v| (e.step, v)));
    let top = h.steps.iter().map(|s| s.loss).chain(vals.clone().map(|v| v.1)).fold(0.0f64, f64::max) * 1.05;
    let last = h.steps.last().map_or(2, |s| s.step.max(2));
    area.fill(&WHITE).map_err(e)?;
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(48)
        .build_cartesian_2d(1u64..last, 0.0..top.max(1e-3))
        .map_err(e)?;
    chart.configure_mesh().x_desc("step").y_desc("loss").draw().map_err(e)?;
    chart
        .draw_series(LineSeries::new(h.steps.iter().map(|s| (s.step, s.loss)), &BLUE))
        .map_err(e)?
        .label("training loss (each step)")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE));
    if vals.clone().next().is_some() {
        chart
            .draw_series(LineSeries::new(vals.clone(), RED.stroke_width(2)))
            .map_err(e)?
            .label("validation loss (each epoch)")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED));
        chart.draw_series(vals.map(|p| Circle::new(p, 3, RED.filled()))).map_err(e)?;
    }
    chart.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw().map_err(e)?;
    area.present().map_err(e)
}

/// Text in the PNG needs a TrueType font: DejaVu Sans (`fonts-dejavu-core`, which `scripts/deps.sh`
/// installs). Registered once per process.
pub fn register_font() -> Result<()> {
    static DONE: std::sync::OnceLock<std::result::Result<(), String>> = std::sync::OnceLock::new();
    let done = DONE.get_or_init(|| {
        let paths = ["/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf", "/usr/share/fonts/TTF/DejaVuSans.ttf"];
        let bytes = paths
            .iter()
            .find_map(|p| std::fs::read(p).ok())
            .ok_or("no DejaVu Sans font found: install fonts-dejavu-core")?;
        plotters::style::register_font(
            "sans-serif",
            plotters::style::FontStyle::Normal,
            Box::leak(bytes.into_boxed_slice()),
        )
        .map_err(|_| "DejaVu Sans could not be read".to_string())
    });
    done.clone().map_err(|msg| Error::Format { what: "the plot's font".into(), msg })
}
