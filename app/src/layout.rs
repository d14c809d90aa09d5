//! Node positions for a graph view: a layered (Sugiyama) layout from `rust-sugiyama`, each connected part
//! placed beside the last. Computed once per shown graph and kept.

use egui::{Pos2, Rect, Vec2};

/// Size of a node's box.
pub const NODE: Vec2 = Vec2::new(150.0, 30.0);

/// Where each node's box is, by node index, and the rectangle holding them all.
#[derive(Clone, Debug)]
pub struct Layout {
    /// One box per node.
    pub boxes: Vec<Rect>,
    /// The bounds of every box.
    pub bounds: Rect,
}

/// Lays out `n` nodes with `edges` (input → user), inputs on top.
pub fn layered(n: usize, edges: &[(u32, u32)]) -> Layout {
    let vertices: Vec<(u32, (f64, f64))> = (0..n as u32).map(|i| (i, (f64::from(NODE.x), f64::from(NODE.y)))).collect();
    let config = rust_sugiyama::configure::Config { vertex_spacing: 40.0, ..Default::default() };
    let parts = rust_sugiyama::from_vertices_and_edges(&vertices, edges, &config);
    let mut boxes = vec![Rect::NOTHING; n];
    let mut x0 = 0.0f32;
    for (positions, width, _height) in parts {
        let min_x = positions.iter().map(|(_, (x, _))| *x as f32).fold(f32::INFINITY, f32::min);
        for (id, (x, y)) in positions {
            if let Some(b) = boxes.get_mut(id) {
                // rust-sugiyama places layers along y (inputs at the top); spread layers for the labels.
                let centre = Pos2::new(x0 + (x as f32 - min_x), y as f32 * 1.6);
                *b = Rect::from_center_size(centre, NODE);
            }
        }
        x0 += width as f32 + NODE.x + 60.0;
    }
    let bounds = boxes.iter().fold(Rect::NOTHING, |a, b| a.union(*b));
    Layout { boxes, bounds }
}
