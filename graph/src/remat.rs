//! Recomputation in the backward pass: which forward values the backward reads again from memory and
//! which it computes again from narrower ones.
//!
//! A vector-Jacobian rule reads the forward values its op was built from. After decomposition those are
//! often wide intermediates of a composite: a bf16 model's GELU, `x·½·(1 + erf(x/√2))` computed in f32,
//! leaves `1 + erf(x/√2)`, `x·½` and `x/√2` for the backward, three f32 tensors the forward kernel must
//! write and the backward kernel read, where `x` itself (bf16, stored anyway) is a quarter of their bytes.
//! Here each forward value the backward reads is replaced, for the backward's readers, by a copy of the
//! pointwise arithmetic that makes it from narrower values, when those are fewer bytes per element than
//! the value (as PyTorch's partitioner recomputes cheap pointwise ops rather than saving them). Fusion
//! then computes the copy inside the backward's kernel.
//!
//! At equal width the copy still pays when the forward would write the value only for the backward and
//! the copy reads values stored anyway (a product's output, an input): an f32 GELU after a `Linear`
//! leaves the same three intermediates, each as wide as the product's output, and the forward wrote
//! four tensors in four kernels where one writes the activation; its backward read three where it now
//! reads the product's output once.

use crate::ir::{Graph, Node, NodeId, OpFamily};
use std::collections::{BTreeSet, HashMap};

/// Nodes one recomputation may copy: a short chain of pointwise arithmetic.
const MOST: usize = 12;

/// `joint` (forward nodes `0..forward_len`, then the backward's) with the backward reading recomputed
/// copies of the forward values that are cheaper to compute again than to read.
pub(crate) fn recompute_in_backward(joint: Graph, forward_len: usize) -> Graph {
    let Graph { nodes, inputs, outputs, symbols } = joint;
    let mut g = Graph { nodes: nodes[..forward_len].to_vec(), inputs, outputs: Vec::new(), symbols };
    let mut map: Vec<NodeId> = (0..forward_len as u32).map(NodeId).collect();
    // Readers that compute elementwise or reduce (and views, which their readers compute through) each
    // get copies of their own: every such reader then holds the only reader of its copy, and fusion
    // computes the copy inside that reader's kernel, whichever kernel that is. One copy shared by a layer
    // norm's weight gradient and its input gradient, two kernels, was stored by the forward's kernel
    // instead. A product or an attention reads its operands from memory: one copy is stored for all.
    let mut shared: HashMap<NodeId, Option<NodeId>> = HashMap::new();
    let exact = compared(&nodes, forward_len);
    let kept = stored_anyway(&g, &outputs);
    for (i, node) in nodes.iter().enumerate().skip(forward_len) {
        let mut node = node.clone();
        let own = node.op.family() != OpFamily::Matmul;
        let mut mine: HashMap<NodeId, Option<NodeId>> = HashMap::new();
        for x in &mut node.inputs {
            *x = if x.index() >= forward_len {
                map[x.index()]
            } else if exact[i] {
                *x
            } else {
                let copies = if own { &mut mine } else { &mut shared };
                recomputed(&mut g, *x, copies, &kept).unwrap_or(*x)
            };
        }
        map.push(g.push(node));
    }
    g.outputs = outputs.iter().map(|o| map[o.index()]).collect();
    g
}

/// For each node, whether a backward comparison reads its inputs' exact forward values, directly or
/// through layout nodes: a max's gradient tests `x == max(x)`, and a copy of `x` computed in another
/// kernel may round differently (a multiply-add contracted in one kernel and not the other), which would
/// silently zero the gradient of a whole row.
fn compared(nodes: &[Node], forward_len: usize) -> Vec<bool> {
    let mut exact = vec![false; nodes.len()];
    for i in (forward_len..nodes.len()).rev() {
        let comparison = matches!(&nodes[i].op, crate::ir::Op::Binary { op } if op.is_comparison());
        if comparison || (exact[i] && nodes[i].op.family() == OpFamily::Layout) {
            exact[i] = true;
            for x in &nodes[i].inputs {
                if x.index() >= forward_len && nodes[x.index()].op.family() == OpFamily::Layout {
                    exact[x.index()] = true;
                }
            }
        }
    }
    exact
}

/// A copy of forward value `p` computed from narrower values (pushed onto `g`), or `None` when reading
/// `p` is as cheap. `copies` remembers each forward node's copy, so backward readers share one.
fn recomputed(g: &mut Graph, p: NodeId, copies: &mut HashMap<NodeId, Option<NodeId>>, kept: &[bool]) -> Option<NodeId> {
    if let Some(&known) = copies.get(&p) {
        return known;
    }
    let cone = cone(g, p, kept);
    if let Some(cone) = &cone {
        // In id order: each copy's producers are copied (or forward values) before it.
        for &q in cone {
            // Part of an earlier copy already (cones overlap: one cast feeding several values).
            if let Some(Some(_)) = copies.get(&q) {
                continue;
            }
            let mut node: Node = g.node(q).clone();
            for x in &mut node.inputs {
                if let Some(Some(c)) = copies.get(x) {
                    *x = *c;
                }
            }
            let c = g.push(node);
            copies.insert(q, Some(c));
        }
    }
    let copy = cone.and_then(|_| copies.get(&p).copied().flatten());
    copies.insert(p, copy);
    copy
}

/// For each forward node, whether the forward writes its value whatever the backward reads: a graph
/// output, a value (or a view of it) read by a product, an attention or a collective (they read their
/// operands from memory; a reduction's row kernel computes its own), or a product with the adds a library GEMM
/// performs inside its call ([`crate::gemm::addend`]: a bias, a residual), whose last sum the call
/// writes. Other pointwise values are written only when some other kernel reads them.
fn stored_anyway(g: &Graph, outputs: &[NodeId]) -> Vec<bool> {
    let (nodes, forward_len) = (&g.nodes, g.nodes.len());
    let mut kept = vec![false; forward_len];
    let mut readers: Vec<Vec<NodeId>> = vec![Vec::new(); forward_len];
    for (i, n) in nodes[..forward_len].iter().enumerate() {
        for x in &n.inputs {
            readers[x.index()].push(NodeId(i as u32));
        }
    }
    for o in outputs {
        if o.index() < forward_len {
            kept[o.index()] = true;
        }
    }
    // Readers come after what they read: walking backwards, a view is kept once any reader of it is.
    for i in (0..forward_len).rev() {
        let n = &nodes[i];
        let family = n.op.family();
        if family == OpFamily::Matmul {
            let (mut tip, mut kinds) = (NodeId(i as u32), Vec::new());
            while let [c] = readers[tip.index()][..] {
                match crate::gemm::addend(g, c, tip) {
                    Some((kind, _)) if !kinds.contains(&kind) => {
                        kinds.push(kind);
                        tip = c;
                    }
                    _ => break,
                }
            }
            kept[tip.index()] = true;
        }
        // A reduction is left out: its row kernel computes the pointwise values it reduces.
        if !matches!(family, OpFamily::Pointwise | OpFamily::Layout | OpFamily::Reduce)
            || (family == OpFamily::Layout && kept[i])
        {
            for x in &n.inputs {
                kept[x.index()] = true;
            }
        }
    }
    kept
}

/// The pointwise nodes that compute `p` again (`p` included) from values the backward reads instead:
/// values narrower than it when they are fewer bytes per element than `p`; or, when that fails and
/// the forward writes `p` only for the backward, values stored anyway (`kept`, see [`stored_anyway`])
/// at most as many bytes per element as `p`, so the forward no longer writes it. `None` otherwise.
fn cone(g: &Graph, p: NodeId, kept: &[bool]) -> Option<BTreeSet<NodeId>> {
    // A chain too long to copy (`MOST`) through wide values may be short up to the values stored anyway.
    if let Some(narrower) = cone_from(g, p, None) {
        if narrower.bytes < narrower.width {
            return Some(narrower.nodes);
        }
    }
    if kept.get(p.index()).copied().unwrap_or(true) {
        return None;
    }
    let stored = cone_from(g, p, Some(kept))?;
    (stored.bytes <= stored.width && stored.leaves_kept).then_some(stored.nodes)
}

/// A candidate copy of `p`: its nodes, what it reads per element against `p`'s width, and whether
/// every value it reads per element is stored anyway.
struct Cone {
    nodes: BTreeSet<NodeId>,
    bytes: usize,
    width: usize,
    leaves_kept: bool,
}

/// The pointwise nodes at least as wide as `p` that compute it, grown through its inputs; with `kept`,
/// a value stored anyway (other than `p`) is read, not grown through.
fn cone_from(g: &Graph, p: NodeId, kept: Option<&[bool]>) -> Option<Cone> {
    let target = g.node(p);
    let (width, numel) = (target.dtype.size_bytes(), target.shape.numel());
    let is_kept = |q: NodeId| kept.is_some_and(|k| k.get(q.index()).copied().unwrap_or(false));
    let wide = |n: &Node| n.op.family() == OpFamily::Pointwise && n.dtype.is_float() && n.dtype.size_bytes() >= width;
    if !wide(target) {
        return None;
    }
    let (mut nodes, mut leaves) = (BTreeSet::new(), BTreeSet::new());
    let mut stack = vec![p];
    while let Some(q) = stack.pop() {
        if nodes.contains(&q) || leaves.contains(&q) {
            continue;
        }
        if wide(g.node(q)) && (q == p || !is_kept(q)) {
            nodes.insert(q);
            if nodes.len() > MOST {
                return None;
            }
            stack.extend(g.node(q).inputs.iter().copied());
        } else {
            leaves.insert(q);
        }
    }
    // What the copy reads per element: a leaf's bytes when it is (a view of) a tensor as large as `p`;
    // constants and broadcast vectors cost nothing per element.
    let (mut bytes, mut leaves_kept) = (0, true);
    for &l in &leaves {
        let mut base = l;
        while g.node(base).op.family() == OpFamily::Layout && !g.node(base).inputs.is_empty() {
            base = g.node(base).inputs[0];
        }
        let b = g.node(base);
        let full = b.op.family() != OpFamily::Source || matches!(b.op, crate::ir::Op::Input { .. });
        // Free only when known smaller (a symbolic size counts as large as `p`).
        let smaller = matches!((b.shape.numel().as_const(), numel.as_const()), (Some(a), Some(n)) if a < n);
        if full && !smaller {
            bytes += b.dtype.size_bytes();
            leaves_kept &= is_kept(base) || matches!(b.op, crate::ir::Op::Input { .. });
        }
    }
    Some(Cone { nodes, bytes, width, leaves_kept })
}
