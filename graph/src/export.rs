//! Graph export: versioned JSON (for tools, the explorer and tests) and Graphviz DOT (for people), each
//! node with its op, shape, dtype and the user's source line.

use crate::error::{Error, Result};
use crate::fuse::Fusion;
use crate::ir::{Graph, Op, OpFamily};
use serde::{Deserialize, Serialize};
use std::fmt::Write;

/// The JSON format's name; readers check it.
pub const GRAPH_FORMAT: &str = "kiln-graph";
/// The JSON format's version; bumped on any incompatible change.
pub const GRAPH_FORMAT_VERSION: u32 = 1;

#[derive(Serialize, Deserialize)]
struct GraphDocument {
    format: String,
    version: u32,
    graph: Graph,
}

/// The graph as pretty-printed, versioned JSON.
pub fn to_json(graph: &Graph) -> String {
    let doc = GraphDocument { format: GRAPH_FORMAT.into(), version: GRAPH_FORMAT_VERSION, graph: graph.clone() };
    serde_json::to_string_pretty(&doc).expect("a graph always serialises: every field is plain data")
}

/// Reads a graph written by [`to_json`]; a wrong format, version or structure is a `Format` error.
pub fn from_json(text: &str) -> Result<Graph> {
    let fmt_err = |msg: String| Error::Format { what: "kiln graph JSON".into(), msg };
    let doc: GraphDocument = serde_json::from_str(text).map_err(|e| fmt_err(e.to_string()))?;
    if doc.format != GRAPH_FORMAT || doc.version != GRAPH_FORMAT_VERSION {
        return Err(fmt_err(format!(
            "expected {GRAPH_FORMAT} version {GRAPH_FORMAT_VERSION}, found {} version {}",
            doc.format, doc.version
        )));
    }
    let n = doc.graph.nodes.len();
    for (i, node) in doc.graph.nodes.iter().enumerate() {
        if let Some(bad) = node.inputs.iter().find(|a| a.index() >= i) {
            return Err(fmt_err(format!("node %{i} reads {bad}, which is not an earlier node")));
        }
    }
    if let Some(bad) = doc.graph.outputs.iter().chain(doc.graph.inputs.iter().map(|g| &g.node)).find(|o| o.index() >= n)
    {
        return Err(fmt_err(format!("{bad} is not a node of the graph")));
    }
    Ok(doc.graph)
}

fn window_attrs(w: &crate::conv::Window) -> String {
    format!("stride={:?}, padding={:?}, dilation={:?}", w.stride, w.padding, w.dilation)
}

/// The op's attributes in a short `key=value` form (empty when it has none).
pub fn op_attrs(op: &Op) -> String {
    match op {
        Op::Input { index } => format!("index={index}"),
        Op::Full { value } => format!("value={value}"),
        Op::Iota { axis } | Op::Concat { axis } | Op::IndexSelect { axis } | Op::Gather { axis } => {
            format!("axis={axis}")
        }
        Op::Softmax { axis } | Op::LogSoftmax { axis } => format!("axis={axis}"),
        Op::Reduce { axes, keepdim, .. } | Op::Mean { axes, keepdim } => format!("axes={axes:?}, keepdim={keepdim}"),
        Op::Var { axes, correction, keepdim } => format!("axes={axes:?}, correction={correction}, keepdim={keepdim}"),
        Op::ArgReduce { axis, keepdim, .. } => format!("axis={axis}, keepdim={keepdim}"),
        Op::Permute { perm } => format!("perm={perm:?}"),
        Op::Slice { axis, start, end, step } => format!("axis={axis}, start={start}, end={end}, step={step}"),
        Op::Pad { pads, value } => format!("pads={pads:?}, value={value}"),
        Op::LayerNorm { dims, eps, affine } => format!("dims={dims}, eps={eps}, affine={affine}"),
        Op::Linear { bias } => format!("bias={bias}"),
        Op::Conv { window, groups, bias } => format!("{}, groups={groups}, bias={bias}", window_attrs(window)),
        Op::Pool { mode, kernel, window } => format!("{mode:?}, kernel={kernel:?}, {}", window_attrs(window)),
        Op::Unfold { kernel, window, value } => format!("kernel={kernel:?}, {}, value={value}", window_attrs(window)),
        Op::Rand { stream } => format!("stream={stream}"),
        Op::Attention { scale, causal } | Op::AttentionLse { scale, causal } => {
            format!("scale={scale}, causal={causal}")
        }
        Op::AttentionGrad { scale, causal, part } => format!("scale={scale}, causal={causal}, part={part:?}"),
        Op::AllReduce { op } => format!("op={op:?}"),
        Op::Unary { .. }
        | Op::Binary { .. }
        | Op::Where
        | Op::Cast
        | Op::Reshape
        | Op::Expand
        | Op::MatMul
        | Op::Gelu { .. }
        | Op::Silu
        | Op::CausalMask => String::new(),
    }
}

fn family_colour(f: OpFamily) -> &'static str {
    match f {
        OpFamily::Source => "#e8e8e8",
        OpFamily::Pointwise => "#cfe8ff",
        OpFamily::Reduce => "#ffe0b3",
        OpFamily::Layout => "#e0f0d0",
        OpFamily::Matmul => "#f4c7c3",
        OpFamily::Composite => "#e6d5f5",
        OpFamily::Collective => "#fff2a8",
    }
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

/// The graph in Graphviz DOT: a box per node (op and attributes, dtype and shape, source line), coloured
/// by op family, edges from inputs, outputs drawn with a double border.
pub fn to_dot(graph: &Graph) -> String {
    dot(graph, |i| (family_colour(graph.nodes[i].op.family()).to_string(), None))
}

/// Distinct fills for regions, cycled.
const REGION_COLOURS: [&str; 10] =
    ["#8dd3c7", "#ffffb3", "#bebada", "#fb8072", "#80b1d3", "#fdb462", "#b3de69", "#fccde5", "#bc80bd", "#ccebc5"];

/// A primitive graph in DOT with every node coloured by the region (kernel) that computes it and the
/// kernel's name in its label; layout and source nodes, folded into index expressions, stay white.
pub fn to_dot_regions(graph: &Graph, fusion: &Fusion) -> String {
    let mut region = vec![None; graph.nodes.len()];
    for (k, r) in fusion.regions.iter().enumerate() {
        for n in r.members.iter().chain(&r.stored) {
            region[n.index()] = Some(k);
        }
    }
    dot(graph, |i| match region[i] {
        Some(k) => (REGION_COLOURS[k % REGION_COLOURS.len()].to_string(), Some(fusion.regions[k].name.clone())),
        None => ("#ffffff".to_string(), None),
    })
}

/// DOT with `style(i)` giving node `i`'s fill colour and an optional extra label line.
fn dot(graph: &Graph, style: impl Fn(usize) -> (String, Option<String>)) -> String {
    let mut s =
        String::from("digraph kiln {\n  rankdir=TB;\n  node [shape=box, style=filled, fontname=\"monospace\"];\n");
    for (i, n) in graph.nodes.iter().enumerate() {
        let attrs = op_attrs(&n.op);
        let head = if attrs.is_empty() { n.op.name().to_string() } else { format!("{} {{{attrs}}}", n.op.name()) };
        let (fill, extra) = style(i);
        let mut lines =
            vec![format!("%{i} {head}"), format!("{}{}", n.dtype, n.shape), format!("{}:{}", n.loc.file, n.loc.line)];
        lines.extend(extra.map(|k| format!("[{k}]")));
        let label: Vec<String> = lines.iter().map(|l| escape(l)).collect();
        let peripheries = if graph.outputs.iter().any(|o| o.index() == i) { 2 } else { 1 };
        let _ =
            writeln!(s, "  n{i} [label=\"{}\", fillcolor=\"{fill}\", peripheries={peripheries}];", label.join("\\n"));
        for a in &n.inputs {
            let _ = writeln!(s, "  n{} -> n{i};", a.index());
        }
    }
    s.push_str("}\n");
    s
}
