//! Fitting a graph to a device that binds few buffers to a kernel (WebGPU's default is 8 a stage). A
//! concatenation is a view: it folds into whichever kernel reads it, and that kernel binds every source.
//! A wide one (DenseNet's blocks join up to 25 tensors) is therefore split, before scheduling, into a tree
//! of concatenations of at most `k` sources each, the inner ones marked for materialisation: scheduled as
//! copies of their sources, kept in a kernel of their own or fused into their reader only while the
//! binding limit allows (traffic the wide view would not cost, paid only where the device demands it).

use crate::ir::{Graph, GraphInput, NodeId, Op};
use crate::shape::Shape;
use crate::sym::Expr;
use std::collections::BTreeSet;

/// Sources one concatenation may join on a device binding `max_bindings` buffers: half of them, so its
/// reader keeps room for its other inputs, its output and a fault word.
pub fn concat_fan_in(max_bindings: u32) -> usize {
    (max_bindings as usize / 2).max(2)
}

/// `g` with every concatenation of more than `k` (≥ 2) sources split into a tree of at most `k`, each
/// new node's origin that of the concatenation it came from; and the inner concatenations, which the
/// scheduler must store (materialise). Topological order is kept: a tree's nodes come before its root.
pub fn split_wide_concats(g: &Graph, origin: &[NodeId], k: usize) -> (Graph, Vec<NodeId>, BTreeSet<NodeId>) {
    let k = k.max(2);
    if !g.nodes.iter().any(|n| matches!(n.op, Op::Concat { .. }) && n.inputs.len() > k) {
        return (g.clone(), origin.to_vec(), BTreeSet::new());
    }
    let mut out = Graph { symbols: g.symbols.clone(), ..Graph::default() };
    let mut out_origin = Vec::with_capacity(g.nodes.len());
    let mut inner = BTreeSet::new();
    let mut remap = Vec::with_capacity(g.nodes.len());
    for (i, node) in g.nodes.iter().enumerate() {
        let mut node = node.clone();
        node.inputs = node.inputs.iter().map(|a| remap[a.index()]).collect();
        if let Op::Concat { axis } = node.op {
            while node.inputs.len() > k {
                let mut joined = Vec::new();
                for chunk in node.inputs.chunks(k) {
                    if chunk.len() == 1 {
                        joined.push(chunk[0]);
                        continue;
                    }
                    let mut dims = out.node(chunk[0]).shape.dims().to_vec();
                    dims[axis] =
                        chunk.iter().fold(Expr::from(0usize), |sum, c| sum + out.node(*c).shape.dims()[axis].clone());
                    let part = crate::ir::Node {
                        op: Op::Concat { axis },
                        inputs: chunk.to_vec(),
                        dtype: node.dtype,
                        shape: Shape(dims),
                        loc: node.loc.clone(),
                    };
                    let id = out.push(part);
                    out_origin.push(origin[i]);
                    inner.insert(id);
                    joined.push(id);
                }
                node.inputs = joined;
            }
        }
        remap.push(out.push(node));
        out_origin.push(origin[i]);
    }
    out.inputs = g.inputs.iter().map(|gi| GraphInput { node: remap[gi.node.index()], kind: gi.kind.clone() }).collect();
    out.outputs = g.outputs.iter().map(|o| remap[o.index()]).collect();
    (out, out_origin, inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{capture, interp, workloads, DType, TensorSpec};

    #[test]
    fn a_wide_concat_becomes_a_tree_with_the_same_values() {
        let specs: Vec<TensorSpec> = (0..11).map(|i| TensorSpec::new(DType::F32, &[2, i % 3 + 1])).collect();
        let g = capture(&specs, |t| {
            let refs: Vec<&crate::Tensor> = t.iter().collect();
            Ok(vec![crate::Tensor::concat(&refs, 1)?.exp()?])
        })
        .unwrap();
        let origin: Vec<NodeId> = (0..g.nodes.len() as u32).map(NodeId).collect();
        let (split, split_origin, inner) = split_wide_concats(&g, &origin, 4);
        assert_eq!(split_origin.len(), split.nodes.len());
        let widest = split.nodes.iter().filter(|n| matches!(n.op, Op::Concat { .. })).map(|n| n.inputs.len()).max();
        assert_eq!(widest, Some(4), "11 sources: chunks of 4, 4, 3 under a root of 3");
        assert_eq!(inner.len(), 3);
        assert!(inner.iter().all(|&n| matches!(split.node(n).op, Op::Concat { .. })));
        for (i, n) in split.nodes.iter().enumerate() {
            assert!(n.inputs.iter().all(|a| a.index() < i), "topological order");
        }
        let data: Vec<_> = specs.iter().enumerate().map(|(i, s)| workloads::data(s, i)).collect();
        let refs: Vec<_> = data.iter().collect();
        assert_eq!(interp::run(&split, &refs).unwrap(), interp::run(&g, &refs).unwrap());
        let (same, _, none) = split_wide_concats(&g, &origin, 11);
        assert_eq!((same, none.len()), (g.clone(), 0), "a concat within the limit is left alone");
        // Two at a time: 11 → 6 → 3 → 2 sources, three levels of inner joins.
        let (deep, _, inner) = split_wide_concats(&g, &origin, 2);
        assert!(deep.nodes.iter().all(|n| !matches!(n.op, Op::Concat { .. }) || n.inputs.len() <= 2));
        assert_eq!(inner.len(), 9, "5 + 3 + 1 inner joins under the root");
        assert_eq!(interp::run(&deep, &refs).unwrap(), interp::run(&g, &refs).unwrap());
    }

    /// W6 (DenseNet's blocks join up to 25 tensors) compiled for a target binding 8 buffers: no kernel
    /// binds more (counting a fault word), without a GPU.
    #[test]
    fn densenet_fits_eight_bindings() {
        let w = workloads::all().into_iter().find(|w| w.id == "W6").expect("W6");
        let g = capture(&w.check, w.f).unwrap();
        let target = crate::target::Target::interpreter().with_max_bindings(8);
        let c = crate::compile_graph(&g, &target).unwrap();
        for k in &c.kernels {
            let bound = k.buffers.len() + usize::from(!k.faults.is_empty());
            assert!(bound <= 8, "{} binds {bound}", k.name);
        }
    }
}
