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

/// Edges of `graph` (input → user) for the layout. A report read from a file may be malformed: an input
/// that names no node, or the node itself, draws no edge (the layout would fail on it).
pub fn edges(graph: &Graph) -> Vec<(u32, u32)> {
    let n = graph.nodes.len();
    graph
        .nodes
        .iter()
        .enumerate()
        .flat_map(|(i, node)| node.inputs.iter().map(move |x| (x.0, i as u32)))
        .filter(|&(x, i)| (x as usize) < n && x != i)
        .collect()
}

/// A node's one-line label: `%3 layer_norm`.
pub fn node_label(graph: &Graph, i: usize) -> String {
    format!("%{i} {}", graph.nodes[i].op.name())
}

/// What the view draws: one box per node, or one per fused region when regions are collapsed.
#[derive(Clone, Debug, PartialEq)]
pub struct Boxes {
    /// Each box's text.
    pub labels: Vec<String>,
    /// Each box's hover text.
    pub hovers: Vec<String>,
    /// The kernel computing each box (its colour).
    pub regions: Vec<Option<usize>>,
    /// Edges between boxes (producer → user), without repeats.
    pub edges: Vec<(u32, u32)>,
    /// The box each node of the shown graph is drawn in.
    pub of_node: Vec<usize>,
}

/// The boxes for `g` (its captured or decomposed graph); `collapse` draws each fused region as one box.
pub fn boxes(g: &GraphReport, decomposed: bool, collapse: bool) -> Boxes {
    let graph = shown(g, decomposed);
    let regions = regions_of(g, decomposed);
    let hover = |i: usize| {
        let n = &graph.nodes[i];
        format!("{}\n{} {}\n{}", n.op.name(), n.dtype, n.shape, n.loc)
    };
    if !collapse {
        let n = graph.nodes.len();
        return Boxes {
            labels: (0..n).map(|i| node_label(graph, i)).collect(),
            hovers: (0..n).map(hover).collect(),
            regions,
            edges: edges(graph),
            of_node: (0..n).collect(),
        };
    }
    let mut b = Boxes { labels: vec![], hovers: vec![], regions: vec![], edges: vec![], of_node: vec![] };
    let mut region_box: std::collections::BTreeMap<usize, usize> = Default::default();
    for (i, r) in regions.iter().enumerate() {
        let at = match r {
            Some(k) => *region_box.entry(*k).or_insert_with(|| {
                let name = g.kernels.get(*k).map_or_else(|| format!("region {k}"), |kr| kr.name.clone());
                b.labels.push(name);
                b.hovers.push(String::new());
                b.regions.push(Some(*k));
                b.labels.len() - 1
            }),
            None => {
                b.labels.push(node_label(graph, i));
                b.hovers.push(hover(i));
                b.regions.push(None);
                b.labels.len() - 1
            }
        };
        b.of_node.push(at);
    }
    for (i, n) in graph.nodes.iter().enumerate() {
        if let Some(k) = regions[i] {
            let h = &mut b.hovers[b.of_node[i]];
            if h.is_empty() {
                *h = format!("kernel {k}: {}", g.kernels.get(k).map_or("", |kr| kr.name.as_str()));
            }
            h.push_str(&format!("\n%{i} {} {}", n.op.name(), n.loc));
        }
    }
    let mut seen = std::collections::BTreeSet::new();
    for (from, to) in edges(graph) {
        let (a, z) = (b.of_node[from as usize] as u32, b.of_node[to as usize] as u32);
        if a != z && seen.insert((a, z)) {
            b.edges.push((a, z));
        }
    }
    b
}

/// Draws `boxes` with `layout`; returns the box clicked this frame. `highlight` boxes are outlined.
///
/// Only what is on screen is drawn, and boxes too small on screen to read (zoomed far out) are drawn as
/// plain coloured rectangles without text: a graph of thousands of nodes stays smooth to pan and zoom.
pub fn show(
    ui: &mut egui::Ui,
    boxes: &Boxes,
    layout: &Layout,
    selected: Option<usize>,
    highlight: &[usize],
    scene_rect: &mut egui::Rect,
) -> Option<usize> {
    let mut clicked = None;
    egui::Scene::new().zoom_range(0.05..=4.0).show(ui, scene_rect, |ui| {
        let painter = ui.painter().clone();
        // The visible part of the scene, in its own coordinates, and how many screen points a scene point is.
        let visible = ui.clip_rect();
        let scale = ui.ctx().layer_transform_to_global(ui.layer_id()).map_or(1.0, |t| t.scaling);
        let readable = NODE_TEXT_POINTS <= crate::layout::NODE.y * scale;
        let edge = Stroke::new(1.0 / scale.max(0.05), Color32::from_gray(140));
        for &(x, i) in &boxes.edges {
            let (Some(a), Some(b)) = (layout.boxes.get(x as usize), layout.boxes.get(i as usize)) else { continue };
            let (p, q) = (a.center_bottom(), b.center_top());
            if visible.intersects(egui::Rect::from_two_pos(p, q)) {
                painter.line_segment([p, q], edge);
            }
        }
        let lit: std::collections::HashSet<usize> = highlight.iter().copied().collect();
        for (i, rect) in layout.boxes.iter().enumerate() {
            if !visible.intersects(*rect) {
                continue;
            }
            let fill = region_colour(boxes.regions.get(i).copied().flatten());
            let outline = if Some(i) == selected {
                Stroke::new(3.0, Color32::WHITE)
            } else if lit.contains(&i) {
                Stroke::new(3.0, Color32::YELLOW)
            } else {
                Stroke::NONE
            };
            let r = if readable {
                let button = egui::Button::new(egui::RichText::new(&boxes.labels[i]).color(Color32::BLACK))
                    .fill(fill)
                    .stroke(outline);
                ui.put(*rect, button)
            } else {
                painter.rect(*rect, 2.0, fill, outline, egui::StrokeKind::Inside);
                ui.interact(*rect, ui.id().with(("node", i)), egui::Sense::click())
            };
            let r = r.on_hover_ui(|ui| {
                if !readable {
                    ui.strong(&boxes.labels[i]);
                }
                ui.label(&boxes.hovers[i]);
            });
            if r.clicked() {
                clicked = Some(i);
            }
        }
    });
    clicked
}

/// Below this many screen points of box height, node labels are not drawn (they could not be read).
const NODE_TEXT_POINTS: f32 = 9.0;
