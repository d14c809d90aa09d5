//! What a screenshot of the real window must show (CI runs the app under Xvfb and checks its picture):
//! not a blank or single-colour frame, text in the side panel, and — with a report open — the graph's
//! nodes drawn in their regions' colours in the central panel.

use crate::graph_view::region_colour;

/// Checks `img`; says what it found, or what is missing.
pub fn check_screenshot(img: &image::RgbaImage, graph_shown: bool) -> Result<String, String> {
    let (w, h) = img.dimensions();
    if w < 400 || h < 300 {
        return Err(format!("{w}×{h} is too small to hold the panels"));
    }
    let background = *img.get_pixel(w - 2, h - 2);
    let mut distinct = std::collections::HashSet::new();
    for p in img.pixels() {
        distinct.insert(p.0);
    }
    if distinct.len() < 8 {
        return Err(format!("only {} distinct colours: a blank frame", distinct.len()));
    }
    // The side panel is the left 220 points: its labels differ from the background.
    let side = (0..220.min(w))
        .flat_map(|x| (40..h).map(move |y| (x, y)))
        .filter(|&(x, y)| *img.get_pixel(x, y) != background)
        .count();
    if side < 500 {
        return Err(format!("the side panel is empty ({side} drawn pixels)"));
    }
    let mut what = format!("{} colours, side panel {side} drawn pixels", distinct.len());
    if graph_shown {
        let palette: Vec<[u8; 4]> = (0..8).map(|r| region_colour(Some(r)).to_array()).collect();
        let nodes = img.enumerate_pixels().filter(|(x, _, p)| *x > 240 && palette.contains(&p.0)).count();
        if nodes < 200 {
            return Err(format!("no region-coloured nodes in the central panel ({nodes} pixels)"));
        }
        what += &format!(", {nodes} region-coloured node pixels");
    }
    Ok(what)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blank_frames_and_empty_panels_fail_and_a_drawn_one_passes() {
        let blank = image::RgbaImage::from_pixel(800, 600, image::Rgba([27, 27, 27, 255]));
        assert!(check_screenshot(&blank, false).unwrap_err().contains("blank"));
        let mut drawn = blank.clone();
        // Noise in the top bar only: many colours, nothing in the side panel.
        for x in 0..800u32 {
            drawn.put_pixel(x, 5, image::Rgba([(x % 250) as u8, 0, 0, 255]));
        }
        assert!(check_screenshot(&drawn, false).unwrap_err().contains("side panel"));
        for x in 10..200 {
            for y in 50..60 {
                drawn.put_pixel(x, y, image::Rgba([220, 220, 220, 255]));
            }
        }
        assert!(check_screenshot(&drawn, false).is_ok());
        assert!(check_screenshot(&drawn, true).unwrap_err().contains("node"));
        let node = region_colour(Some(2)).to_array();
        for x in 400..500 {
            for y in 300..330 {
                drawn.put_pixel(x, y, image::Rgba(node));
            }
        }
        assert!(check_screenshot(&drawn, true).is_ok());
    }
}
