//! Concatenations assembled in place: each part written straight into its rows of one buffer, and every
//! reader of the concatenation reading that buffer as it reads any stored value.
//!
//! A concatenation is otherwise a view folded into its reader: each element tests which part it falls in
//! and reads that part, a chain of comparisons and selects as long as the list of parts. DenseNet joins
//! up to 25 feature maps that way before every layer, and those chains were the largest kernels it had.
//! When the parts are stored anyway (a convolution's product is), nothing needs reading through a chain:
//! the products can land where the concatenation's buffer has them.
//!
//! Two steps. Before scheduling, [`outermost`] turns a concatenation along an inner axis whose parts are
//! mostly products into one along the outermost axis of the products' own order (a GEMM stores a
//! convolution channel-major, `[O, N*P]`): a permutation of an outermost concatenation of permuted parts,
//! which the index arithmetic folds back; a part that does not read a product as it lies is stored in that
//! order (a copy, or its producer writing in that order). After scheduling, [`assemble`] places every
//! concatenation along an outermost axis whose parts are stored: the largest of each family of
//! concatenations sharing parts owns the buffer, each part at its offset, each smaller concatenation at
//! the offset of its first part when its parts lie in the same order. The plan ([`crate::plan`]) binds
//! them at those offsets.

use crate::fuse::Fusion;
use crate::ir::{Graph, GraphInput, Node, NodeId, Op};
use crate::kernel::{Access, Kernel};
use crate::shape::Shape;
use crate::sym::Expr;
use crate::target::Target;
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// Where each part of an assembled concatenation lives: a value stored inside another's buffer.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Assembly {
    /// Each placed value (parts, and the concatenations read as buffers) and where it lives: the
    /// family's root (the concatenation owning the buffer) and the element offset in it. The root
    /// maps to itself at offset 0.
    pub home: BTreeMap<NodeId, (NodeId, Expr)>,
}

impl Assembly {
    /// The concatenations read as buffers (no kernel writes them; their parts' kernels do).
    pub fn concats<'a>(&'a self, g: &'a Graph) -> impl Iterator<Item = NodeId> + 'a {
        self.home.keys().copied().filter(|&n| matches!(g.node(n).op, Op::Concat { .. }))
    }

    /// The root of a family some kernel binds twice with one of the bindings written, and that kernel's
    /// index: a device that tracks buffer use per dispatch (WebGPU) rejects a buffer bound both writable
    /// and read-only, so such a family is not assembled as it is.
    pub fn conflict(&self, kernels: &[Kernel]) -> Option<(NodeId, usize)> {
        for (index, k) in kernels.iter().enumerate() {
            let mut seen: BTreeMap<NodeId, (usize, bool)> = BTreeMap::new();
            for b in &k.buffers {
                if let Some((root, _)) = self.home.get(&b.node) {
                    let e = seen.entry(*root).or_insert((0, false));
                    e.0 += 1;
                    e.1 |= b.access == Access::Write;
                }
            }
            if let Some((&root, _)) = seen.iter().find(|(_, &(n, written))| n > 1 && written) {
                return Some((root, index));
            }
        }
        None
    }
}

/// Byte alignment every part's start needs: the device's binding offset alignment, and 16 so vector
/// accesses and GEMM libraries see aligned rows.
fn alignment(target: &Target) -> i64 {
    target.binding_alignment.max(16) as i64
}

/// Whether the concatenation's parts are consecutive runs of its elements: every axis before `axis` is 1.
fn outermost_runs(shape: &Shape, axis: usize) -> bool {
    shape.dims()[..axis].iter().all(|d| d.as_const() == Some(1))
}

/// Each part's first element in a concatenation along `axis` once it runs along the outermost axis (the
/// axis moved first: every other axis is inside one step of it), and whether every one of them starts
/// aligned for `target`.
fn part_offsets(g: &Graph, concat: NodeId, target: &Target) -> (Vec<Expr>, bool) {
    let node = g.node(concat);
    let Op::Concat { axis } = node.op else { return (Vec::new(), false) };
    let dims = node.shape.dims();
    let step = (0..dims.len()).filter(|&a| a != axis).fold(Expr::from(1usize), |p, a| p * dims[a].clone());
    let (mut at, mut offsets) = (Expr::from(0usize), Vec::new());
    let mut aligned = true;
    for &p in &node.inputs {
        let start = at.clone() * step.clone();
        aligned &= (start.clone() * Expr::from(node.dtype.size_bytes())).is_divisible_by(alignment(target));
        offsets.push(start);
        at = at + g.node(p).shape.dims()[axis].clone();
    }
    (offsets, aligned)
}

/// The node whose storage `n` is, element for element: following reshapes and permutations down to the
/// first other node, when the composed index map is the identity (a convolution's `[N, O, H, W]` result
/// permuted to `[O, N, H, W]` is its `[O, N*P]` product as it lies).
pub fn identity_source(g: &Graph, n: NodeId) -> Option<NodeId> {
    let numel = g.node(n).shape.numel();
    // Nothing to read in an empty view (and no index symbol ranges over nothing).
    if numel.as_const().is_some_and(|c| c <= 0) {
        return None;
    }
    let mut table = g.symbols.clone();
    let i = table.new_symbol("i", 0, numel.as_const().map(|c| c - 1));
    if numel.as_const().is_none() {
        table.set_extent(i, numel.clone());
    }
    let (mut index, mut at) = (Expr::sym(i), n);
    loop {
        let node = g.node(at);
        match &node.op {
            Op::Reshape => {}
            Op::Permute { perm } => {
                let (dims, from) = (node.shape.dims(), g.node(node.inputs[0]).shape.clone());
                let strides = Shape(dims.to_vec()).contiguous_strides();
                let mut src = vec![Expr::from(0usize); dims.len()];
                for (k, &a) in perm.iter().enumerate() {
                    let q = index.floor_div(&strides[k]);
                    src[a] = if k == 0 { q } else { q.modulo(&dims[k]) };
                }
                let from_strides = from.contiguous_strides();
                index = src
                    .iter()
                    .zip(&from_strides)
                    .fold(Expr::from(0usize), |acc, (m, s)| acc + m.clone() * s.clone())
                    .simplify_in(&table);
            }
            _ => break,
        }
        at = node.inputs[0];
    }
    (at != n && index == Expr::sym(i) && g.node(at).shape.numel() == numel).then_some(at)
}

/// The first node under `n` that is not a layout view (reshape, permute, slice, pad).
fn view_source(g: &Graph, mut n: NodeId) -> NodeId {
    while matches!(g.node(n).op, Op::Reshape | Op::Permute { .. } | Op::Slice { .. } | Op::Pad { .. }) {
        n = g.node(n).inputs[0];
    }
    n
}

/// Whether part `p` is a product a GEMM stores anyway (its own, or the residual sum of products it
/// ends, as a convolution by kernel rows is).
fn from_product(g: &Graph, p: NodeId) -> bool {
    let at = view_source(g, p);
    let s = g.node(at);
    stored_product(g, at) || (matches!(s.op, Op::Binary { .. }) && s.inputs.iter().any(|&i| stored_product(g, i)))
}

/// Whether `n` is a product as its kernel stores it: a matmul, or the sum of a split one's partials
/// ([`crate::split_k`]).
fn stored_product(g: &Graph, n: NodeId) -> bool {
    g.node(n).op == Op::MatMul || crate::split_k::is_partial_sum(g, n)
}

/// `g` with every concatenation along an inner axis whose parts are mostly products ([`from_product`],
/// or shared by several concatenations) rewritten as a permutation of one along the outermost axis, when
/// the target can bind each part at its offset. Returns the new graph, each node's origin (a rewritten
/// concatenation's new nodes carry its origin), `skip` renumbered for it, and the permuted parts that are
/// not a product as it lies, which the scheduler must store. `skip` are concatenations left alone (the
/// binding-limit split's, which the scheduler stores).
pub fn outermost(
    g: &Graph,
    origin: &[NodeId],
    skip: &BTreeSet<NodeId>,
    target: &Target,
) -> (Graph, Vec<NodeId>, BTreeSet<NodeId>, BTreeSet<NodeId>) {
    let mut uses: HashMap<NodeId, usize> = HashMap::new();
    for n in &g.nodes {
        if matches!(n.op, Op::Concat { .. }) {
            for &p in &n.inputs {
                *uses.entry(p).or_default() += 1;
            }
        }
    }
    let wanted = |c: NodeId| {
        let node = g.node(c);
        let Op::Concat { axis } = node.op else { return false };
        let parts = &node.inputs;
        let stored = parts.iter().filter(|&&p| from_product(g, p) || uses.get(&p).is_some_and(|&u| u > 1)).count();
        axis > 0
            && parts.len() >= 2
            && !outermost_runs(&node.shape, axis)
            && !skip.contains(&c)
            && !parts.iter().any(|p| skip.contains(p))
            && 2 * stored >= parts.len()
            && part_offsets(g, c, target).1
    };
    let rewrite: Vec<NodeId> = (0..g.nodes.len() as u32).map(NodeId).filter(|&c| wanted(c)).collect();
    if rewrite.is_empty() {
        return (g.clone(), origin.to_vec(), skip.clone(), BTreeSet::new());
    }
    let mut out = Graph { symbols: g.symbols.clone(), ..Graph::default() };
    let mut out_origin = Vec::with_capacity(g.nodes.len());
    let mut remap: Vec<NodeId> = Vec::with_capacity(g.nodes.len());
    let mut permuted: HashMap<(NodeId, usize), NodeId> = HashMap::new();
    let mut copies = BTreeSet::new();
    for (i, node) in g.nodes.iter().enumerate() {
        let mut node = node.clone();
        node.inputs = node.inputs.iter().map(|a| remap[a.index()]).collect();
        if let (Op::Concat { axis }, true) = (&node.op, rewrite.binary_search(&NodeId(i as u32)).is_ok()) {
            let axis = *axis;
            let rank = node.shape.rank();
            let perm: Vec<usize> = std::iter::once(axis).chain((0..rank).filter(|&a| a != axis)).collect();
            let moved = |s: &Shape| Shape(perm.iter().map(|&a| s.dims()[a].clone()).collect());
            let mut parts = Vec::with_capacity(node.inputs.len());
            for &p in &node.inputs {
                let q = *permuted.entry((p, axis)).or_insert_with(|| {
                    let n = &out.nodes[p.index()];
                    let q = Node {
                        op: Op::Permute { perm: perm.clone() },
                        inputs: vec![p],
                        dtype: n.dtype,
                        shape: moved(&n.shape),
                        loc: n.loc.clone(),
                    };
                    let q = out.push(q);
                    out_origin.push(origin[i]);
                    if identity_source(&out, q).is_none_or(|s| !stored_product(&out, s)) {
                        copies.insert(q);
                    }
                    q
                });
                parts.push(q);
            }
            let joined = Node {
                op: Op::Concat { axis: 0 },
                inputs: parts,
                dtype: node.dtype,
                shape: moved(&node.shape),
                loc: node.loc.clone(),
            };
            let joined = out.push(joined);
            out_origin.push(origin[i]);
            let mut inverse = vec![0; rank];
            for (k, &a) in perm.iter().enumerate() {
                inverse[a] = k;
            }
            node.op = Op::Permute { perm: inverse };
            node.inputs = vec![joined];
        }
        remap.push(out.push(node));
        out_origin.push(origin[i]);
    }
    out.inputs = g.inputs.iter().map(|gi| GraphInput { node: remap[gi.node.index()], kind: gi.kind.clone() }).collect();
    out.outputs = g.outputs.iter().map(|o| remap[o.index()]).collect();
    let skip = skip.iter().map(|n| remap[n.index()]).collect();
    (out, out_origin, skip, copies)
}

/// Places every concatenation along an outermost axis whose parts are each a stored value as it lies
/// (and no graph input or output), largest first, as the module describes. `materialized` are the
/// layout nodes stored as copies (such a concatenation is a copy, not assembled); `refused` the roots a
/// kernel binds in conflict ([`Assembly::conflict`]), with every concatenation sharing their parts.
pub fn assemble(
    g: &Graph,
    fusion: &Fusion,
    materialized: &BTreeSet<NodeId>,
    refused: &BTreeSet<NodeId>,
    target: &Target,
) -> Assembly {
    let stored: BTreeSet<NodeId> = fusion.regions.iter().flat_map(|r| r.stored.iter().copied()).collect();
    let outside: BTreeSet<NodeId> = g.inputs.iter().map(|gi| gi.node).chain(g.outputs.iter().copied()).collect();
    let mut candidates: Vec<(NodeId, Vec<(NodeId, Expr)>)> = Vec::new();
    for (i, node) in g.nodes.iter().enumerate() {
        let c = NodeId(i as u32);
        let Op::Concat { axis } = node.op else { continue };
        if !outermost_runs(&node.shape, axis) || materialized.contains(&c) || outside.contains(&c) {
            continue;
        }
        let (offsets, aligned) = part_offsets(g, c, target);
        let sources: Option<Vec<NodeId>> = node
            .inputs
            .iter()
            .map(|&p| match stored.contains(&p) {
                true => Some(p),
                false => identity_source(g, p).filter(|s| stored.contains(s)),
            })
            .map(|s| s.filter(|s| !outside.contains(s)))
            .collect();
        let Some(sources) = sources.filter(|s| aligned && s.iter().collect::<BTreeSet<_>>().len() == s.len()) else {
            continue;
        };
        candidates.push((c, sources.into_iter().zip(offsets).collect()));
    }
    // Widest first: a family's root is the concatenation holding every part the others hold (by count of
    // parts, then size, so symbolic sizes order too).
    candidates.sort_by_key(|(c, parts)| {
        std::cmp::Reverse((parts.len(), g.node(*c).shape.numel().as_const().unwrap_or(i64::MAX)))
    });
    // A refused family stays apart: no concatenation sharing a part with a refused one is placed.
    let banned: BTreeSet<NodeId> =
        candidates.iter().filter(|(c, _)| refused.contains(c)).flat_map(|(_, p)| p.iter().map(|(s, _)| *s)).collect();
    candidates.retain(|(_, parts)| !parts.iter().any(|(s, _)| banned.contains(s)));
    let mut home: BTreeMap<NodeId, (NodeId, Expr)> = BTreeMap::new();
    for (c, parts) in candidates {
        let placed: Vec<Option<&(NodeId, Expr)>> = parts.iter().map(|(s, _)| home.get(s)).collect();
        if placed.iter().all(Option::is_none) {
            home.insert(c, (c, Expr::from(0usize)));
            for (s, off) in parts {
                home.insert(s, (c, off));
            }
            continue;
        }
        // Inside a family: every part where the family has it, at the same distance from the first.
        let Some((root, first)) = placed[0].cloned() else { continue };
        let start = first - parts[0].1.clone();
        let fits = placed
            .iter()
            .zip(&parts)
            .all(|(at, (_, off))| at.is_some_and(|(r, o)| *r == root && *o == start.clone() + off.clone()));
        if fits {
            home.insert(c, (root, start));
        }
    }
    Assembly { home }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{capture, DType, Tensor, TensorSpec};

    #[test]
    fn a_convolution_result_permuted_channel_first_is_its_product_as_it_lies() {
        let specs = [TensorSpec::new(DType::F32, &[2, 4, 5, 5]), TensorSpec::new(DType::F32, &[8, 4, 3, 3])];
        let g = capture(&specs, |t| {
            let y = t[0].conv(&t[1], None, &crate::conv::Window::uniform(2, 1, 1, 1), 1)?;
            Ok(vec![y.permute(&[1, 0, 2, 3])?])
        })
        .unwrap();
        let d = crate::decompose::decompose_for(&g, crate::decompose::Attentions::AsTheyAre, true).unwrap().graph;
        let out = d.outputs[0];
        let s = identity_source(&d, out).expect("the permuted result reads the product as it lies");
        assert!(matches!(d.node(s).op, Op::MatMul), "{:?}", d.node(s).op);
        // The result itself ([N, O, H, W]) is not the product's order.
        let Op::Permute { .. } = d.node(out).op else { panic!("{:?}", d.node(out).op) };
        assert_eq!(identity_source(&d, d.node(out).inputs[0]), None);
    }

    #[test]
    fn a_transpose_is_not_an_identity() {
        let g = capture(&[TensorSpec::new(DType::F32, &[3, 4])], |t| Ok(vec![t[0].permute(&[1, 0])?])).unwrap();
        assert_eq!(identity_source(&g, g.outputs[0]), None);
        let g =
            capture(&[TensorSpec::new(DType::F32, &[1, 4])], |t: &[Tensor]| Ok(vec![t[0].permute(&[1, 0])?])).unwrap();
        assert!(identity_source(&g, g.outputs[0]).is_some(), "a permutation moving a unit axis keeps the order");
    }
}
