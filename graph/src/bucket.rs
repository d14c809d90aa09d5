//! Gradient buckets: how a compiled step's all-reduces ([`Op::AllReduce`]) become collective calls.
//! One NCCL call per gradient would pay a collective's fixed cost (tens of microseconds) fifty times a
//! step; one call for all of them would wait for the last gradient, the embedding's, made at the very
//! end of the backward pass. So, as torch's DDP does, the all-reduces are taken in the order the
//! schedule makes their inputs and cut into buckets of about [`BUCKET_BYTES`]; each bucket is one
//! region (one call) that the launch order puts right after its last input is made, and the runtime
//! runs it beside the kernels after it. The schedule of the backward pass decides the buckets, not
//! the order the user's code happened to record the reductions in.

use crate::ir::{Graph, NodeId, Op};
use std::collections::BTreeSet;

/// The size a bucket is filled to before the next one starts, by default (torch DDP's default
/// `bucket_cap_mb`; [`crate::Target::bucket_bytes`] says it for a device).
pub const BUCKET_BYTES: u64 = 25 << 20;

/// The all-reduce `nodes` cut into buckets: ordered by `ready` (the schedule position of the region
/// making a node's input; `None` for a graph input, which is ready first), filled up to `cap` bytes by
/// `bytes`, each node alone when `alone` (the eager baseline). A node that would close a cycle with a
/// bucket (`closes_cycle`: a path from the bucket's outputs back to that node's input) starts the
/// next one.
pub fn buckets(
    nodes: &[NodeId],
    ready: impl Fn(NodeId) -> Option<usize>,
    bytes: impl Fn(NodeId) -> u64,
    cap: u64,
    alone: bool,
    closes_cycle: impl Fn(&BTreeSet<NodeId>, NodeId) -> bool,
) -> Vec<BTreeSet<NodeId>> {
    let mut order: Vec<(Option<usize>, NodeId)> = nodes.iter().map(|&n| (ready(n), n)).collect();
    order.sort();
    let mut out: Vec<BTreeSet<NodeId>> = Vec::new();
    let mut filled = 0u64;
    for (_, n) in order {
        let b = bytes(n);
        let fits = out.last().is_some_and(|last| !alone && filled.saturating_add(b) <= cap && !closes_cycle(last, n));
        match (fits, out.last_mut()) {
            (true, Some(last)) => {
                last.insert(n);
                filled = filled.saturating_add(b);
            }
            _ => {
                out.push(BTreeSet::from([n]));
                filled = b;
            }
        }
    }
    out
}

/// The node whose buffer a collective reads for `n`'s input: the input itself, or through reshapes the
/// stored value it renames (same bytes in the same order); `None` when the input is a view a collective
/// cannot read as one contiguous run (it is stored by a copy first: see `pipeline`).
pub fn source(graph: &Graph, n: NodeId, transparent: impl Fn(NodeId) -> bool) -> Option<NodeId> {
    let mut x = graph.node(n).inputs[0];
    while transparent(x) {
        let node = graph.node(x);
        if node.op != Op::Reshape {
            return None;
        }
        x = node.inputs[0];
    }
    Some(x)
}

/// The views that all-reduces in `graph` read and cannot read in place: each must be stored first.
pub fn views_to_store(graph: &Graph, transparent: impl Fn(NodeId) -> bool) -> Vec<NodeId> {
    (0..graph.nodes.len() as u32)
        .map(NodeId)
        .filter(|&n| matches!(graph.node(n).op, Op::AllReduce { .. }))
        .filter(|&n| source(graph, n, &transparent).is_none())
        .map(|n| graph.node(n).inputs[0])
        .collect()
}
