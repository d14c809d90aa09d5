//! The graph view: the captured (or decomposed) graph laid out in layers, each node coloured by the fused
//! region that computes it, pan and zoom, hover for op/shape/dtype/line, click to select.

use crate::layout::Layout;
use egui::{Color32, Stroke};
use kiln::graph::report::GraphReport;
use kiln::graph::Graph;

/// A colour per region (kernel), cycling; grey for nodes no kernel computes (inputs, views).
pub fn region_colour(region: Option<usize>) -> Color32 {
    const PALETTE: [Color32; 8] = [
        Color32::from_rgb(66, 133, 244),
        Color32::from_rgb(219, 68, 55),
        Color32::from_rgb(244, 180, 0),
        Color32::from_rgb(15, 157, 88),
        Color32::from_rgb(171, 71, 188),
        Color32::from_rgb(0, 172, 193),
        Color32::from_rgb(255, 112, 67),
        Color32::from_rgb(124, 179, 66),
    ];
    region.map_or(Color32::from_gray(90), |r| PALETTE[r % PALETTE.len()])
}

/// Which kernel computes each node of the shown graph (captured: through the kernels' node lists;
/// decomposed: the regions' members).
pub fn regions_of(g: &GraphReport, decomposed: bool) -> Vec<Option<usize>> {
    let n = shown(g, decomposed).nodes.len();
    let mut of = vec![None; n];
    if decomposed {
        if let Some(c) = &g.compiled {
            for (k, r) in c.fusion.regions.iter().enumerate() {
                for m in &r.members {
                    if let Some(slot) = of.get_mut(m.0 as usize) {
                        *slot = Some(k);
                    }
                }
            }
        }
    } else {
        for (k, kr) in g.kernels.iter().enumerate() {
            for &node in &kr.nodes {
                if let Some(slot) = of.get_mut(node) {
                    slot.get_or_insert(k);
                }
            }
        }
    }
    of
}

/// The graph the view shows.
pub fn shown(g: &GraphReport, decomposed: bool) -> &Graph {
    match (&g.compiled, decomposed) {
        (Some(c), true) => &c.primitive.graph,
        _ => &g.captured,
    }
}

/// Edges of `graph` (input → user) for the layout.
pub fn edges(graph: &Graph) -> Vec<(u32, u32)> {
    graph.nodes.iter().enumerate().flat_map(|(i, n)| n.inputs.iter().map(move |x| (x.0, i as u32))).collect()
}

/// A node's one-line label: `%3 layer_norm`.
pub fn node_label(graph: &Graph, i: usize) -> String {
    format!("%{i} {}", graph.nodes[i].op.name())
}

/// Draws `graph` with `layout`; returns the node clicked this frame. `highlight` nodes are outlined.
pub fn show(
    ui: &mut egui::Ui,
    graph: &Graph,
    layout: &Layout,
    regions: &[Option<usize>],
    selected: Option<usize>,
    highlight: &[usize],
    scene_rect: &mut egui::Rect,
) -> Option<usize> {
    let mut clicked = None;
    egui::Scene::new().zoom_range(0.05..=4.0).show(ui, scene_rect, |ui| {
        let painter = ui.painter().clone();
        for (i, n) in graph.nodes.iter().enumerate() {
            for x in &n.inputs {
                let (Some(a), Some(b)) = (layout.boxes.get(x.0 as usize), layout.boxes.get(i)) else { continue };
                painter.line_segment([a.center_bottom(), b.center_top()], Stroke::new(1.0, Color32::from_gray(140)));
            }
        }
        for (i, rect) in layout.boxes.iter().enumerate() {
            let node = &graph.nodes[i];
            let fill = region_colour(regions.get(i).copied().flatten());
            let outline = if Some(i) == selected {
                Stroke::new(3.0, Color32::WHITE)
            } else if highlight.contains(&i) {
                Stroke::new(3.0, Color32::YELLOW)
            } else {
                Stroke::NONE
            };
            let button = egui::Button::new(egui::RichText::new(node_label(graph, i)).color(Color32::BLACK))
                .fill(fill)
                .stroke(outline);
            let r = ui.put(*rect, button).on_hover_text(format!(
                "{}\n{} {}\n{}",
                node.op.name(),
                node.dtype,
                node.shape,
                node.loc
            ));
            if r.clicked() {
                clicked = Some(i);
            }
        }
    });
    clicked
}
