//! Charts saved as PNG. The app asks the window for a screenshot and keeps the chart's rectangle of it,
//! so the file holds exactly what the user sees (the same plot, legend and labels), on any renderer.

use std::path::PathBuf;

/// A pending export: where to write it and which part of the window it is.
#[derive(Clone, Debug)]
pub struct ChartShot {
    /// The PNG to write.
    pub path: PathBuf,
    /// The chart's rectangle, in points.
    pub rect: egui::Rect,
}

/// Asks for a screenshot of the window for `shot`; [`take`] saves it when it arrives (a frame later).
pub fn request(ctx: &egui::Context, shot: ChartShot) {
    ctx.send_viewport_cmd(egui::ViewportCommand::Screenshot(egui::UserData::new(shot)));
}

/// Saves the chart of a screenshot that arrived this frame for a [`request`]: the path and size written,
/// or why not.
pub fn take(ctx: &egui::Context) -> Option<Result<String, String>> {
    let ppp = ctx.pixels_per_point();
    ctx.input(|i| {
        i.events.iter().find_map(|e| match e {
            egui::Event::Screenshot { image, user_data, .. } => {
                let shot = user_data.data.as_ref()?.downcast_ref::<ChartShot>()?;
                Some(save(&crop(image, shot.rect, ppp), shot))
            }
            _ => None,
        })
    })
}

/// The pixels of `rect` (points) in `image`, clamped to the image.
pub fn crop(image: &egui::ColorImage, rect: egui::Rect, pixels_per_point: f32) -> egui::ColorImage {
    let [w, h] = image.size;
    let px = |v: f32, max: usize| ((v * pixels_per_point).round().max(0.0) as usize).min(max);
    let (x0, x1) = (px(rect.min.x, w), px(rect.max.x, w));
    let (y0, y1) = (px(rect.min.y, h), px(rect.max.y, h));
    image.region_by_pixels([x0, y0], [x1.saturating_sub(x0), y1.saturating_sub(y0)])
}

fn save(image: &egui::ColorImage, shot: &ChartShot) -> Result<String, String> {
    let [w, h] = image.size;
    if w == 0 || h == 0 {
        return Err("the chart is not on screen".into());
    }
    let rgba: Vec<u8> = image.pixels.iter().flat_map(|p| p.to_array()).collect();
    let img = image::RgbaImage::from_raw(w as u32, h as u32, rgba).ok_or("the screenshot had the wrong size")?;
    img.save(&shot.path).map_err(|e| format!("saving {}: {e}", shot.path.display()))?;
    Ok(format!("saved {} ({w}×{h})", shot.path.display()))
}
