//! The minimizer: a graph on which some backend gives a wrong answer, shrunk while it still does — as
//! torch's minifier and delta debugging do — into a reproducer a person can read: first one failing
//! output, then nodes cut (a node replaced by an input holding its reference value, so everything above
//! it goes) and bypassed (a node replaced by one of its inputs of the same shape and type), then its
//! sizes made small (the graph replayed through the ops at the new sizes), its constants and input values
//! plain. The result is saved as JSON with a generated Rust test that replays it.

use crate::backend::Backend;
use crate::check::{check_graph, CheckReport};
use crate::data::TensorData;
use crate::error::{Error, Result};
use crate::ir::{Graph, GraphInput, InputKind, Node, NodeId, Op};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// A graph and the inputs it runs on.
#[derive(Clone, Debug, PartialEq)]
pub struct Case {
    /// The graph.
    pub graph: Graph,
    /// One per graph input, in order.
    pub inputs: Vec<TensorData>,
}

/// The format [`Case::to_json`] writes.
const CASE_FORMAT: &str = "kiln-case/1";

#[derive(Serialize, Deserialize)]
struct CaseFile {
    format: String,
    what: String,
    graph: Graph,
    inputs: Vec<Values>,
}

/// An input's values as the file holds them (exact: every dtype's values are f64s).
#[derive(Serialize, Deserialize)]
struct Values {
    dtype: crate::DType,
    dims: Vec<usize>,
    #[serde(with = "crate::numbers::many")]
    values: Vec<f64>,
}

impl Case {
    /// The case as JSON, with a line saying what fails on it.
    pub fn to_json(&self, what: &str) -> String {
        let inputs = self
            .inputs
            .iter()
            .map(|d| Values { dtype: d.dtype(), dims: d.dims().to_vec(), values: d.values().to_vec() })
            .collect();
        let file = CaseFile { format: CASE_FORMAT.into(), what: what.into(), graph: self.graph.clone(), inputs };
        serde_json::to_string_pretty(&file).unwrap_or_default()
    }

    /// Reads [`Case::to_json`]'s output; anything else is a typed error.
    pub fn from_json(text: &str) -> Result<Case> {
        let bad = |msg: String| Error::Format { what: "a kiln check case".into(), msg };
        let file: CaseFile = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
        if file.format != CASE_FORMAT {
            return Err(bad(format!("format `{}`; this build reads `{CASE_FORMAT}`", file.format)));
        }
        let inputs = file
            .inputs
            .into_iter()
            .map(|v| TensorData::from_f64(v.values, &v.dims, v.dtype))
            .collect::<Result<Vec<_>>>()?;
        let c = Case { graph: file.graph, inputs };
        if c.inputs.len() != c.graph.inputs.len() {
            return Err(bad(format!("{} input values for {} graph inputs", c.inputs.len(), c.graph.inputs.len())));
        }
        Ok(c)
    }

    /// Ops in the graph (inputs not counted).
    pub fn ops(&self) -> usize {
        self.graph.op_count()
    }

    /// [`check_graph`] on this case.
    pub fn check(&self, targets: &[Arc<dyn Backend>]) -> Result<CheckReport> {
        check_graph(&self.graph, &self.inputs, targets)
    }
}

/// Shrinks `case` while `fails` holds (`fails` must hold for `case` itself), trying at most `budget`
/// candidates. Each accepted step makes the graph strictly smaller or its inputs plainer.
pub fn minimize(case: Case, fails: &mut dyn FnMut(&Case) -> bool, budget: usize) -> Case {
    let mut best = prune(case);
    let mut tries = 0usize;
    let mut attempt = |c: Option<Case>, best: &mut Case, tries: &mut usize| -> bool {
        let Some(c) = c else { return false };
        if *tries >= budget {
            return false;
        }
        *tries += 1;
        let c = prune(c);
        if fails(&c) {
            *best = c;
            true
        } else {
            false
        }
    };
    // One failing output.
    if best.graph.outputs.len() > 1 {
        for o in best.graph.outputs.clone() {
            let mut c = best.clone();
            c.graph.outputs = vec![o];
            if attempt(Some(c), &mut best, &mut tries) {
                break;
            }
        }
    }
    loop {
        let before = (best.graph.nodes.len(), tries);
        // Cut from the outputs upward: a cut near an output removes the most.
        let mut i = best.graph.nodes.len();
        while i > 0 {
            i -= 1;
            if i < best.graph.nodes.len() && !matches!(best.graph.nodes[i].op, Op::Input { .. }) {
                let cut = cut(&best, NodeId(i as u32));
                attempt(cut, &mut best, &mut tries);
            }
        }
        let mut i = best.graph.nodes.len();
        while i > 0 {
            i -= 1;
            if i < best.graph.nodes.len() {
                let by = bypass(&best, NodeId(i as u32));
                attempt(by, &mut best, &mut tries);
            }
        }
        if best.graph.nodes.len() == before.0 || tries >= budget {
            break;
        }
    }
    // Smaller sizes: each size of an input, largest first, made 1, 2 or half of itself (and halved
    // again while that holds), every node's sizes following (see `crate::resize`).
    let mut sizes: Vec<usize> = best.inputs.iter().flat_map(|d| d.dims().to_vec()).filter(|&d| d > 1).collect();
    sizes.sort_unstable();
    sizes.dedup();
    while let Some(from) = sizes.pop() {
        for to in [1, 2, from / 2] {
            if to == 0 || to >= from {
                continue;
            }
            let c = crate::resize::resize(&best.graph, &best.inputs, from, to).ok();
            if attempt(c.map(|(graph, inputs)| Case { graph, inputs }), &mut best, &mut tries) {
                if to > 2 {
                    sizes.push(to);
                }
                break;
            }
        }
    }
    // Plain constants: 1, a whole number or one decimal read better than 0.7978845608.
    for i in 0..best.graph.nodes.len() {
        let Op::Full { value } = best.graph.nodes[i].op else { continue };
        for plain in [1.0, value.round(), (value * 10.0).round() / 10.0] {
            if plain == value || !plain.is_finite() {
                continue;
            }
            let mut c = best.clone();
            c.graph.nodes[i].op = Op::Full { value: c.graph.nodes[i].dtype.round(plain) };
            if attempt(Some(c), &mut best, &mut tries) {
                break;
            }
        }
    }
    // Plain input values: whole numbers, else two decimals, read better in a test and rarely hide the bug.
    for k in 0..best.inputs.len() {
        for scale in [1.0, 100.0] {
            let mut c = best.clone();
            let d = &c.inputs[k];
            let plain: Vec<f64> = d.values().iter().map(|v| (v * scale).round() / scale).collect();
            if plain.as_slice() == d.values() {
                break;
            }
            if let Ok(p) = TensorData::from_f64(plain, d.dims(), d.dtype()) {
                c.inputs[k] = p;
                if attempt(Some(c), &mut best, &mut tries) {
                    break;
                }
            }
        }
    }
    best
}

/// `case` with node `n` replaced by a new input holding the reference's value of `n`.
fn cut(case: &Case, n: NodeId) -> Option<Case> {
    let mut probe = case.graph.clone();
    probe.outputs = vec![n];
    let refs: Vec<&TensorData> = case.inputs.iter().collect();
    let value = crate::interp::run(&probe, &refs).ok()?.pop()?;
    let mut c = case.clone();
    let index = c.graph.inputs.len();
    let node = &mut c.graph.nodes[n.index()];
    node.op = Op::Input { index };
    node.inputs.clear();
    c.graph.inputs.push(GraphInput { node: n, kind: InputKind::Lifted });
    c.inputs.push(value);
    Some(c)
}

/// `case` with node `n` replaced, wherever it is used, by one of its inputs of the same type and shape.
fn bypass(case: &Case, n: NodeId) -> Option<Case> {
    let node = case.graph.node(n);
    let with = *node.inputs.iter().find(|x| {
        let x = case.graph.node(**x);
        x.dtype == node.dtype && x.shape == node.shape
    })?;
    let mut c = case.clone();
    for m in &mut c.graph.nodes {
        for x in &mut m.inputs {
            if *x == n {
                *x = with;
            }
        }
    }
    for o in &mut c.graph.outputs {
        if *o == n {
            *o = with;
        }
    }
    Some(c)
}

/// `case` without nodes no output needs and without inputs nothing reads (inputs renumbered).
fn prune(case: Case) -> Case {
    let (g, _) = case.graph.without_dead_nodes();
    let used: Vec<bool> = {
        let mut used = vec![false; g.nodes.len()];
        for n in &g.nodes {
            for x in &n.inputs {
                used[x.index()] = true;
            }
        }
        for o in &g.outputs {
            used[o.index()] = true;
        }
        used
    };
    // Rebuild with only the inputs something uses, in their old order.
    let mut out = Graph { symbols: g.symbols.clone(), ..Graph::default() };
    let mut remap = vec![NodeId(u32::MAX); g.nodes.len()];
    let mut inputs = Vec::new();
    for (i, node) in g.nodes.iter().enumerate() {
        let is_input = matches!(node.op, Op::Input { .. });
        if is_input && !used[i] {
            continue;
        }
        let mut node: Node = node.clone();
        node.inputs = node.inputs.iter().map(|x| remap[x.index()]).collect();
        if let Op::Input { index } = node.op {
            let gi = &g.inputs[index];
            let new = out.inputs.len();
            node.op = Op::Input { index: new };
            let id = out.push(node);
            out.inputs.push(GraphInput { node: id, kind: gi.kind.clone() });
            inputs.push(case.inputs[index].clone());
            remap[i] = id;
        } else {
            remap[i] = out.push(node);
        }
    }
    out.outputs = g.outputs.iter().map(|o| remap[o.index()]).collect();
    Case { graph: out, inputs }
}

/// Writes `case` as `<dir>/<name>.json` and a Rust test `<dir>/<name>.rs` that replays it on every
/// backend this machine has and fails while any of them is wrong; returns both paths.
pub fn write_reproducer(
    case: &Case,
    what: &str,
    dir: &std::path::Path,
    name: &str,
) -> Result<(std::path::PathBuf, std::path::PathBuf)> {
    let io = |e: std::io::Error| Error::Format { what: dir.display().to_string(), msg: e.to_string() };
    std::fs::create_dir_all(dir).map_err(io)?;
    let json = dir.join(format!("{name}.json"));
    let rs = dir.join(format!("{name}.rs"));
    std::fs::write(&json, case.to_json(what)).map_err(io)?;
    let test = format!(
        "//! Minimized by `kiln check`: {what}\n//! ({} op(s); the graph and its inputs are in {name}.json.)\n\n\
         #[test]\nfn {name}() {{\n    \
         let case = kiln::graph::minimize::Case::from_json(include_str!(\"{name}.json\")).unwrap();\n    \
         let report = case.check(&kiln::check_targets()).unwrap();\n    \
         assert!(report.passed(), \"{{report}}\");\n}}\n",
        case.ops()
    );
    std::fs::write(&rs, test).map_err(io)?;
    Ok((json, rs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cases_with_nan_and_infinite_inputs_round_trip() {
        let mut g = Graph::new();
        let x = g.add_input(
            crate::DType::F32,
            crate::shape::Shape::from_dims(&[4]),
            InputKind::Arg { index: 0 },
            crate::loc::SourceLoc::internal(),
        );
        g.outputs = vec![x];
        let data = TensorData::from_f64(vec![1.5, f64::NAN, f64::INFINITY, f64::NEG_INFINITY], &[4], crate::DType::F32)
            .expect("data");
        let case = Case { graph: g, inputs: vec![data] };
        let back = Case::from_json(&case.to_json("test")).expect("reads back");
        let v = back.inputs[0].values();
        assert_eq!(v[0], 1.5);
        assert!(v[1].is_nan() && v[2] == f64::INFINITY && v[3] == f64::NEG_INFINITY, "{v:?}");
        assert!(Case::from_json(&case.to_json("test").replace("\"nan\"", "\"nope\"")).is_err());
    }
}
