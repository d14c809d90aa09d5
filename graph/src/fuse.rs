//! The scheduler: groups the nodes of a primitive graph into regions, each of which becomes one kernel.
//!
//! Policy, in the order it is applied:
//! 1. Layout nodes (reshape, permute, expand, slice, pad, concat, gathers) and sources (full, iota) are
//!    *transparent*: never a kernel of their own, folded into the index expressions of whoever reads them.
//!    Only compute nodes (pointwise ops, reductions, matmuls) belong to regions.
//! 2. Row regions: each reduction, with the other reductions over the same elements (softmax's max and
//!    sum, layer norm's two sums; and siblings that read a tensor in common, a layer norm's weight and
//!    bias gradients), their pointwise prologue and the pointwise epilogue that reads the reduced values
//!    back, becomes one kernel that walks each row once per reduction.
//! 3. Matmul regions: the matmul template plus its chain of single-consumer pointwise consumers of the
//!    same shape (bias, activation, residual, scale) as a fused epilogue. Operands are read through their
//!    views, so transposes and head splits need no copy.
//! 4. Pointwise regions: every other pointwise node, absorbing producers whose every consumer is in the
//!    region.
//!
//! A node is absorbed only when all its consumers end up in the same kernel, so nothing is computed twice
//! across kernels and no intermediate is written that was not written before (peak memory never rises).
//! A region never binds more buffers than the target allows: a producer that would exceed the limit stays
//! outside and is written by its own kernel.

use crate::error::{Error, Result};
use crate::ir::{Graph, NodeId, Op};
use crate::loc::SourceLoc;
use crate::shape::Shape;
use crate::target::Target;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// What kind of kernel a region becomes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum RegionKind {
    /// One thread per output element.
    Pointwise,
    /// Reductions over the same elements of each row, with prologue and epilogue.
    Rows {
        /// Shape of the reduced tensor.
        input_shape: Shape,
        /// Reduced axes.
        axes: Vec<usize>,
    },
    /// The matmul template with a fused epilogue.
    MatMul {
        /// The matmul node.
        node: NodeId,
    },
    /// The fused attention template (`kernel::Attention`): one node, and the partner whose output the
    /// same kernel writes beside it (`attention::partner`).
    Attention {
        /// The attention node.
        node: NodeId,
        /// The node whose output the kernel writes as its second.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        partner: Option<NodeId>,
    },
    /// A bucket of all-reduces ([`Op::AllReduce`]) issued as one collective call, launched as soon as
    /// its last input is made (see [`crate::bucket`]).
    Collective,
}

/// A group of nodes computed by one kernel.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Region {
    /// Kernel name, saying what it fuses.
    pub name: String,
    /// Kind.
    pub kind: RegionKind,
    /// Compute nodes computed here, in graph order.
    pub members: Vec<NodeId>,
    /// Nodes this kernel writes to memory (members read elsewhere, graph outputs).
    pub stored: Vec<NodeId>,
}

/// The result of scheduling.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Fusion {
    /// Regions in launch order.
    pub regions: Vec<Region>,
}

/// The role of a node for scheduling.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Graph input: a buffer.
    Input,
    /// Folded into index expressions.
    Transparent,
    /// Elementwise compute.
    Pointwise,
    /// Reduction.
    Reduce,
    /// Matrix product.
    MatMul,
    /// Fused attention: a region of its own.
    Attention,
    /// A collective across processes: buckets of their own.
    Collective,
}

/// How the scheduler treats node `n` of `g`: as its op says ([`op_role`]), except that a conversion of a
/// half-precision value to f32 is transparent ([`widens`]).
pub fn role(g: &Graph, n: NodeId) -> Role {
    let node = g.node(n);
    if widens(g, node) {
        Role::Transparent
    } else {
        op_role(&node.op)
    }
}

/// Whether `node` converts a half-precision value to f32: computed where it is read, as a view is, each
/// reader loading the narrow value and converting it. Stored, the conversion would write twice the bytes
/// of the value it converts and every reader would read them back (a bf16 training step's gradients,
/// read by a bias sum, a weight sum and the layer norm's backward, were each copied to f32 first). The
/// conversion is exact, so computing it in every reader changes no value. The eager baseline stores it
/// as the user's own op (the pipeline marks it materialised there).
pub fn widens(g: &Graph, node: &crate::ir::Node) -> bool {
    node.op == Op::Cast
        && node.dtype == crate::dtype::DType::F32
        && node
            .inputs
            .first()
            .is_some_and(|&x| matches!(g.node(x).dtype, crate::dtype::DType::BF16 | crate::dtype::DType::F16))
}

/// How the scheduler treats an op, whatever its operands.
pub fn op_role(op: &Op) -> Role {
    match op {
        Op::Input { .. } => Role::Input,
        Op::Unary { .. } | Op::Binary { .. } | Op::Where | Op::Cast => Role::Pointwise,
        Op::Reduce { .. } | Op::ArgReduce { .. } => Role::Reduce,
        Op::MatMul => Role::MatMul,
        Op::Attention { .. } | Op::AttentionLse { .. } | Op::AttentionGrad { .. } => Role::Attention,
        Op::AllReduce { .. } => Role::Collective,
        _ => Role::Transparent,
    }
}

/// Graph facts the scheduler queries repeatedly.
struct Facts<'g> {
    graph: &'g Graph,
    role: Vec<Role>,
    /// Compute nodes and inputs reachable backwards through transparent nodes.
    producers: Vec<Vec<NodeId>>,
    /// Compute nodes reachable forwards through transparent nodes.
    consumers: Vec<Vec<NodeId>>,
    /// Graph outputs, and compute nodes that a transparent output reads.
    output_reach: Vec<bool>,
    /// Some node checks a value at run time (gather indices, integer division): its kernel may bind a
    /// fault word, one binding fewer for buffers.
    checks: bool,
}

/// Whether lowering `n` emits a run-time check ([`crate::kernel::FaultSite`]).
pub fn checks_at_run_time(g: &Graph, n: &crate::ir::Node) -> bool {
    match n.op {
        Op::Gather { .. } | Op::IndexSelect { .. } => true,
        Op::Binary { op: crate::ir::BinaryOp::Div } => g.node(n.inputs[0]).dtype.is_int(),
        _ => false,
    }
}

impl<'g> Facts<'g> {
    fn new(graph: &'g Graph, materialized: &BTreeSet<NodeId>, kept: &BTreeSet<NodeId>) -> Self {
        let n = graph.nodes.len();
        // A materialised layout node is computed (copied) like a pointwise op and stored.
        let role: Vec<Role> = graph
            .nodes
            .iter()
            .enumerate()
            .map(|(i, _)| {
                let n = NodeId(i as u32);
                if materialized.contains(&n) {
                    Role::Pointwise
                } else {
                    role(graph, n)
                }
            })
            .collect();
        let producers: Vec<Vec<NodeId>> = graph
            .nodes
            .iter()
            .map(|node| {
                let mut found = Vec::new();
                let mut seen = BTreeSet::new();
                let mut stack: Vec<NodeId> = node.inputs.clone();
                while let Some(p) = stack.pop() {
                    if !seen.insert(p) {
                        continue;
                    }
                    if role[p.index()] == Role::Transparent {
                        stack.extend(graph.node(p).inputs.iter().copied());
                    } else {
                        found.push(p);
                    }
                }
                found.sort();
                found
            })
            .collect();
        let mut consumers = vec![Vec::new(); n];
        for i in 0..n {
            if role[i] == Role::Transparent {
                continue;
            }
            for &p in &producers[i] {
                consumers[p.index()].push(NodeId(i as u32));
            }
        }
        let mut output_reach = vec![false; n];
        for k in kept {
            output_reach[k.index()] = true;
        }
        for &o in &graph.outputs {
            output_reach[o.index()] = true;
            // A layout output is written by its own kernel, which reads the compute nodes under it.
            if role[o.index()] == Role::Transparent {
                for &p in &producers[o.index()] {
                    output_reach[p.index()] = true;
                }
            }
        }
        let checks = graph.nodes.iter().any(|node| checks_at_run_time(graph, node));
        Facts { graph, role, producers, consumers, output_reach, checks }
    }

    fn shape(&self, n: NodeId) -> &Shape {
        &self.graph.node(n).shape
    }
}

/// Buffers a region with these members would bind: external reads plus writes.
fn buffer_count(f: &Facts, members: &BTreeSet<NodeId>) -> usize {
    let mut reads = BTreeSet::new();
    let mut writes = 0;
    for &m in members {
        for &p in &f.producers[m.index()] {
            if !members.contains(&p) {
                reads.insert(p);
            }
        }
        if f.output_reach[m.index()] || f.consumers[m.index()].iter().any(|c| !members.contains(c)) {
            writes += 1;
        }
    }
    reads.len() + writes
}

struct Scheduler<'g> {
    f: Facts<'g>,
    target: &'g Target,
    assigned: Vec<Option<usize>>,
    regions: Vec<(RegionKind, BTreeSet<NodeId>)>,
    /// Consumers that must not join a row region (lowering found they read a reduction at another row) or
    /// a library GEMM's epilogue (an addend the library cannot read in place).
    refused: BTreeSet<NodeId>,
    /// Matmuls whose region takes no prologue (`Feedback::whole_operands`).
    whole_operands: BTreeSet<NodeId>,
    /// When set, only nodes of one group (the user-level op they came from) share a region: eager mode.
    groups: Option<&'g [NodeId]>,
}

impl<'g> Scheduler<'g> {
    fn free(&self, n: NodeId) -> bool {
        self.assigned[n.index()].is_none()
    }

    /// True when adding `c` to the region being grown would make regions depend on each other in a
    /// cycle: a path leaves the region (with `c`) and comes back into it. Regions committed so far run as
    /// units, so a path that reaches any of their members continues from all of them: a region computing
    /// two unrelated things (a row region's scalar loss beside its backward) can carry a path between
    /// nodes that no node-level path joins. Checking every addition this way keeps the graph of regions
    /// (committed ones contracted) acyclic, so a launch order always exists.
    fn closes_cycle(&self, members: &BTreeSet<NodeId>, c: NodeId) -> bool {
        let inside = |x: NodeId| x == c || members.contains(&x);
        let mut seen = vec![false; self.f.graph.nodes.len()];
        let mut seen_region = vec![false; self.regions.len()];
        let mut stack: Vec<NodeId> = members
            .iter()
            .chain(std::iter::once(&c))
            .flat_map(|m| self.f.producers[m.index()].iter().copied())
            .filter(|&p| !inside(p))
            .collect();
        while let Some(x) = stack.pop() {
            if inside(x) {
                return true;
            }
            if std::mem::replace(&mut seen[x.index()], true) {
                continue;
            }
            stack.extend(self.f.producers[x.index()].iter().copied());
            if let Some(r) = self.assigned[x.index()] {
                if !std::mem::replace(&mut seen_region[r], true) {
                    stack.extend(self.regions[r].1.iter().copied());
                }
            }
        }
        false
    }

    fn fits(&self, members: &BTreeSet<NodeId>, extra: NodeId) -> bool {
        if let (Some(g), Some(first)) = (self.groups, members.first()) {
            if g[extra.index()] != g[first.index()] {
                return false;
            }
        }
        let mut m = members.clone();
        m.insert(extra);
        buffer_count(&self.f, &m) + usize::from(self.f.checks) <= self.target.max_bindings as usize
    }

    fn commit(&mut self, kind: RegionKind, members: BTreeSet<NodeId>) {
        let idx = self.regions.len();
        for &m in &members {
            self.assigned[m.index()] = Some(idx);
        }
        self.regions.push((kind, members));
    }

    /// Adds the pointwise producers of `members` whose every consumer is a member (so nothing is computed
    /// twice or written that was not before); true if any joined. A row region (`rows`) takes no producer
    /// lowering refused it (one reading a reduction at another row).
    fn absorb_producers(&self, members: &mut BTreeSet<NodeId>, rows: bool) -> bool {
        let mut changed = false;
        let snapshot: Vec<NodeId> = members.iter().copied().collect();
        for m in snapshot {
            for &p in &self.f.producers[m.index()] {
                if members.contains(&p)
                    || !self.free(p)
                    || self.f.role[p.index()] != Role::Pointwise
                    || (rows && self.refused.contains(&p))
                {
                    continue;
                }
                let all_inside =
                    !self.f.output_reach[p.index()] && self.f.consumers[p.index()].iter().all(|c| members.contains(c));
                if all_inside && self.fits(members, p) {
                    members.insert(p);
                    changed = true;
                }
            }
        }
        changed
    }

    fn reduce_domain(&self, r: NodeId) -> Option<(Shape, Vec<usize>)> {
        let node = self.f.graph.node(r);
        let axes = match &node.op {
            Op::Reduce { axes, .. } => axes.clone(),
            Op::ArgReduce { axis, .. } => vec![*axis],
            _ => return None,
        };
        Some((self.f.shape(node.inputs[0]).clone(), axes))
    }

    fn row_regions(&mut self) {
        let n = self.f.graph.nodes.len();
        for i in 0..n {
            let r = NodeId(i as u32);
            if self.f.role[i] != Role::Reduce || !self.free(r) {
                continue;
            }
            let Some((input_shape, axes)) = self.reduce_domain(r) else { continue };
            let rows = self.f.shape(r).numel();
            let mut members = BTreeSet::from([r]);
            let mut row_level = BTreeSet::from([r]);
            loop {
                let mut changed = false;
                // Forward: consumers over the same elements or the same rows.
                let snapshot: Vec<NodeId> = members.iter().copied().collect();
                for m in snapshot {
                    for &c in &self.f.consumers[m.index()] {
                        if members.contains(&c) || !self.free(c) || self.refused.contains(&c) {
                            continue;
                        }
                        let ok = match self.f.role[c.index()] {
                            Role::Reduce => self.reduce_domain(c) == Some((input_shape.clone(), axes.clone())),
                            Role::Pointwise => {
                                let element = *self.f.shape(c) == input_shape;
                                let row = self.f.shape(c).numel() == rows
                                    && self.f.producers[c.index()]
                                        .iter()
                                        .filter(|p| members.contains(p))
                                        .all(|p| row_level.contains(p));
                                if row && !element {
                                    row_level.insert(c);
                                }
                                element || row
                            }
                            _ => false,
                        };
                        if ok && !self.closes_cycle(&members, c) && self.fits(&members, c) {
                            if self.f.role[c.index()] == Role::Reduce {
                                row_level.insert(c);
                            }
                            members.insert(c);
                            changed = true;
                        }
                    }
                }
                // Backward: pointwise producers all of whose consumers are here.
                changed |= self.absorb_producers(&mut members, true);
                if !changed {
                    break;
                }
            }
            self.join_sibling_reductions(&mut members, &(input_shape.clone(), axes.clone()));
            self.release_tips(&mut members);
            self.commit(RegionKind::Rows { input_shape, axes }, members);
        }
    }

    /// Joins to a row region the free reductions over the same elements that read a tensor of those
    /// elements the region reads too, each with the pointwise producers only it reads: a layer norm's
    /// weight gradient `Σ dy·x̂` and its bias gradient `Σ dy` (two column sums of one `dy`, split alike)
    /// are then one kernel that reads `dy` once, where each was a kernel reading it. Like every join, a
    /// sibling comes only if no cycle closes and the buffers fit; nothing is computed twice.
    fn join_sibling_reductions(&self, members: &mut BTreeSet<NodeId>, domain: &(Shape, Vec<usize>)) {
        let elements = domain.0.numel();
        let full_inputs = |set: &BTreeSet<NodeId>| -> BTreeSet<NodeId> {
            set.iter()
                .flat_map(|m| self.f.producers[m.index()].iter().copied())
                .filter(|p| !set.contains(p) && self.f.shape(*p).numel() == elements)
                .collect()
        };
        let mut inputs = full_inputs(members);
        for i in 0..self.f.graph.nodes.len() {
            let s = NodeId(i as u32);
            if self.f.role[i] != Role::Reduce
                || !self.free(s)
                || members.contains(&s)
                || self.refused.contains(&s)
                || self.reduce_domain(s).as_ref() != Some(domain)
            {
                continue;
            }
            let mut sibling = BTreeSet::from([s]);
            while self.absorb_producers(&mut sibling, true) {}
            if full_inputs(&sibling).is_disjoint(&inputs) {
                continue;
            }
            // Producers first (ids ascend), so each join is checked against what it reads.
            let mut trial = members.clone();
            let joins = sibling.iter().all(|&c| {
                let ok = !self.closes_cycle(&trial, c) && self.fits(&trial, c);
                trial.insert(c);
                ok
            });
            if joins {
                *members = trial;
                inputs = full_inputs(members);
            }
        }
    }

    /// Takes out of a grown row region each pointwise member that it would store for one reader
    /// elsewhere, when that reader computes elementwise or reduces and so can compute the member itself:
    /// the member then joins the reader's kernel as a producer (from the region's inputs and the per-row
    /// values the region stores), instead of being written here and read back there. A training step's
    /// layer norm is the case: growing forward over the same elements, the forward's kernel took the
    /// backward's `x - mean` and `(x - mean) · rstd` (computed again in the backward, `remat`) and wrote
    /// both in f32 for the backward, two f32 tensors kept across the whole step where the bf16 input and
    /// two numbers a row were kept anyway. Repeated, so a chain leaves whole.
    fn release_tips(&self, members: &mut BTreeSet<NodeId>) {
        let tip = |members: &BTreeSet<NodeId>| {
            let takes_producers = |c: NodeId| {
                !members.contains(&c)
                    && self.free(c)
                    && matches!(self.f.role[c.index()], Role::Pointwise | Role::Reduce)
            };
            members.iter().copied().find(|&m| {
                self.f.role[m.index()] == Role::Pointwise
                    && !self.f.output_reach[m.index()]
                    && matches!(self.f.consumers[m.index()][..], [c] if takes_producers(c))
            })
        };
        while let Some(t) = tip(members) {
            members.remove(&t);
        }
    }

    /// Each attention with its partner (`attention::partner`: the log-sum-exps beside the forward pass,
    /// the values' gradient beside the keys'), each with the permute it is stored as
    /// (`attention::stored_as`; materialised from the first round, see `pipeline`).
    fn attention_regions(&mut self) {
        let readers = crate::attention::readers(self.f.graph);
        let partners: Vec<Option<NodeId>> =
            (0..self.f.graph.nodes.len()).map(|i| crate::attention::partner(self.f.graph, NodeId(i as u32))).collect();
        // Nodes with a partner first, so a partner that comes earlier in the graph is not taken alone.
        let order = (0..partners.len()).filter(|&i| partners[i].is_some()).chain(0..partners.len());
        for i in order {
            let node = NodeId(i as u32);
            if self.f.role[i] != Role::Attention || !self.free(node) {
                continue;
            }
            let mut members = BTreeSet::from([node]);
            let partner = partners[i]
                .filter(|&p| self.free(p) && self.f.role[p.index()] == Role::Attention && !self.refused.contains(&p))
                .filter(|&p| self.fits(&members, p));
            members.extend(partner);
            for x in [Some(node), partner].into_iter().flatten() {
                let permute = crate::attention::stored_as(self.f.graph, x, &readers);
                members.extend(permute.filter(|&p| self.free(p) && self.f.role[p.index()] == Role::Pointwise));
            }
            self.commit(RegionKind::Attention { node, partner }, members);
        }
    }

    fn matmul_regions(&mut self) {
        for i in 0..self.f.graph.nodes.len() {
            let m = NodeId(i as u32);
            if self.f.role[i] != Role::MatMul || !self.free(m) {
                continue;
            }
            // The epilogue: pointwise consumers over the output's elements, grown forward.
            let shape = self.f.shape(m).clone();
            let mut members = BTreeSet::from([m]);
            // A library GEMM is one call: only what the library adds inside it (a bias, a residual) joins;
            // the rest of its epilogue starts the next region.
            let library = crate::gemm::wants_library(self.target, self.f.graph, m);
            if library && self.target.library_epilogue {
                self.library_epilogue(&mut members, m);
            }
            // The prologue: pointwise ops only the template's operands read, computed in its loads.
            if !library && self.target.matmul_prologue && !self.whole_operands.contains(&m) {
                while self.absorb_prologue(&mut members) {}
            }
            let mut grow = !library;
            while grow {
                let mut changed = false;
                let snapshot: Vec<NodeId> = members.iter().copied().collect();
                for x in snapshot {
                    for &c in &self.f.consumers[x.index()] {
                        let ok = !members.contains(&c)
                            && self.free(c)
                            && !self.refused.contains(&c)
                            && self.f.role[c.index()] == Role::Pointwise
                            && *self.f.shape(c) == shape
                            && !self.closes_cycle(&members, c)
                            && self.fits(&members, c);
                        if ok {
                            members.insert(c);
                            changed = true;
                        }
                    }
                }
                grow = changed;
            }
            self.commit(RegionKind::MatMul { node: m }, members);
        }
    }

    /// Adds to a template matmul's region the pointwise ops its members read through views, when every
    /// reader of each is a member (nothing computed twice outside, nothing written that was not); true if
    /// any joined. The walk stops at concatenations, which DenseNet assembles in place: read through
    /// its parts, a concatenation would no longer be one stored buffer (`in_place`). Layout copies the
    /// scheduler stores (role pointwise) stay stored. A node refused a row region's epilogue (it reads
    /// the reduction at another row) may join: a product's operand reads stored values at any index.
    fn absorb_prologue(&self, members: &mut BTreeSet<NodeId>) -> bool {
        let g = self.f.graph;
        let mut found = Vec::new();
        let mut seen = BTreeSet::new();
        for &m in members.iter() {
            let mut stack: Vec<NodeId> = g.node(m).inputs.clone();
            while let Some(p) = stack.pop() {
                if !seen.insert(p) {
                    continue;
                }
                let node = g.node(p);
                if self.f.role[p.index()] == Role::Transparent {
                    if !matches!(node.op, Op::Concat { .. }) {
                        stack.extend(node.inputs.iter().copied());
                    }
                } else if op_role(&node.op) == Role::Pointwise && !members.contains(&p) {
                    found.push(p);
                }
            }
        }
        let mut changed = false;
        for p in found {
            let all_inside =
                !self.f.output_reach[p.index()] && self.f.consumers[p.index()].iter().all(|c| members.contains(c));
            let ok = !members.contains(&p)
                && self.free(p)
                && self.f.role[p.index()] == Role::Pointwise
                && all_inside
                && !self.closes_cycle(members, p)
                && self.fits(members, p);
            if ok {
                members.insert(p);
                changed = true;
            }
        }
        changed
    }

    /// Grows a library GEMM's region by the adds the library performs inside the call: a chain from the
    /// product, each link the only reader of the one before, at most one bias and one residual; or by a
    /// stored widening of the plain product ([`crate::kernel::Gemm::widened`]).
    fn library_epilogue(&self, members: &mut BTreeSet<NodeId>, m: NodeId) {
        let (mut tip, mut kinds) = (m, Vec::new());
        while !self.f.output_reach[tip.index()] {
            let [c] = self.f.consumers[tip.index()][..] else { break };
            let Some((kind, _)) = crate::gemm::addend(self.f.graph, c, tip) else { break };
            let ok = !kinds.contains(&kind)
                && self.free(c)
                && !self.refused.contains(&c)
                && self.f.role[c.index()] == Role::Pointwise
                && !self.closes_cycle(members, c)
                && self.fits(members, c);
            if !ok {
                break;
            }
            kinds.push(kind);
            members.insert(c);
            tip = c;
        }
        // A plain product whose one reader widens it to f32 and is stored anyway (a collective reads
        // it: a bf16 step's weight gradient, averaged across the world) is written wide by the call
        // itself: a copy kernel less, and the f32 sum is not rounded to the narrow dtype on the way.
        if kinds.is_empty() && !self.f.output_reach[m.index()] {
            if let [c] = self.f.consumers[m.index()][..] {
                let node = self.f.graph.node(c);
                let collective = |r: &NodeId| matches!(self.f.graph.node(*r).op, Op::AllReduce { .. });
                let ok = widens(self.f.graph, node)
                    && node.inputs[0] == m
                    && self.f.consumers[c.index()].iter().any(collective)
                    && self.f.role[c.index()] == Role::Pointwise
                    && self.free(c)
                    && !self.refused.contains(&c)
                    && self.fits(members, c);
                if ok {
                    members.insert(c);
                }
            }
        }
    }

    fn pointwise_regions(&mut self) {
        for i in (0..self.f.graph.nodes.len()).rev() {
            let seed = NodeId(i as u32);
            if self.f.role[i] != Role::Pointwise || !self.free(seed) {
                continue;
            }
            let mut members = BTreeSet::from([seed]);
            loop {
                while self.absorb_producers(&mut members, false) {}
                if !self.absorb_siblings(&mut members, seed) {
                    break;
                }
            }
            self.commit(RegionKind::Pointwise, members);
        }
    }

    /// Grows a pointwise region over the free pointwise nodes of the seed's shape that it shares values
    /// with: a member's other readers (forward), and a producer whose readers are all members or such
    /// nodes. The region then writes several outputs in one pass over the elements (AdamW's parameter
    /// and both moments from one read of the gradient), where absorbing producers alone would split
    /// at every value that is both stored and read again. Every node added would otherwise be in a
    /// pointwise region of its own (row and matmul regions are already formed), so the kernels this
    /// makes are unions of those: nothing is computed twice and nothing is written that was not before.
    /// True if any joined.
    fn absorb_siblings(&self, members: &mut BTreeSet<NodeId>, seed: NodeId) -> bool {
        let shape = self.f.shape(seed).clone();
        let joins = |x: NodeId| {
            self.free(x)
                && !members.contains(&x)
                && self.f.role[x.index()] == Role::Pointwise
                && *self.f.shape(x) == shape
                && !self.refused.contains(&x)
        };
        let mut candidates: Vec<NodeId> = Vec::new();
        for &m in members.iter() {
            candidates.extend(self.f.consumers[m.index()].iter().copied().filter(|&c| joins(c)));
            for &p in &self.f.producers[m.index()] {
                let readers_join = self.f.consumers[p.index()].iter().all(|&c| members.contains(&c) || joins(c));
                if joins(p) && readers_join {
                    candidates.push(p);
                }
            }
        }
        let mut changed = false;
        for c in candidates {
            if !members.contains(&c) && !self.closes_cycle(members, c) && self.fits(members, c) {
                members.insert(c);
                changed = true;
            }
        }
        changed
    }

    /// All-reduces grouped into buckets ([`crate::bucket::buckets`]), in the order the rest of the
    /// schedule makes their inputs; the eager baseline issues each alone.
    fn collective_regions(&mut self) {
        let nodes: Vec<NodeId> = (0..self.f.graph.nodes.len() as u32)
            .map(NodeId)
            .filter(|&n| self.f.role[n.index()] == Role::Collective)
            .collect();
        if nodes.is_empty() {
            return;
        }
        // Where each all-reduce's inputs are made in the schedule so far (collectives left out: the
        // regions after them do not wait for them yet).
        let position: Vec<Option<usize>> = match launch_order(&self.f, &self.regions, &self.assigned) {
            Some(order) => {
                let mut at = vec![None; self.regions.len()];
                for (i, &r) in order.iter().enumerate() {
                    at[r] = Some(i);
                }
                at
            }
            None => vec![None; self.regions.len()],
        };
        let ready = |n: NodeId| {
            self.f.producers[n.index()].iter().filter_map(|p| self.assigned[p.index()].and_then(|r| position[r])).max()
        };
        let bytes = |n: NodeId| {
            let node = self.f.graph.node(n);
            node.shape.numel().as_const().map_or(u64::MAX, |e| e.max(0) as u64 * node.dtype.size_bytes() as u64)
        };
        let alone = self.groups.is_some();
        // A call reduces one way: sums and means go in buckets of their own.
        let op = |n: NodeId| matches!(self.f.graph.node(n).op, Op::AllReduce { op: crate::ir::CollectiveOp::Sum });
        let mut made = Vec::new();
        for sums in [true, false] {
            let these: Vec<NodeId> = nodes.iter().copied().filter(|&n| op(n) == sums).collect();
            let cap = self.target.bucket_bytes;
            made.extend(crate::bucket::buckets(&these, ready, bytes, cap, alone, |m, n| self.apart(m, n)));
        }
        for bucket in made {
            self.commit(RegionKind::Collective, bucket);
        }
    }

    /// Whether all-reduce `n` must not join the bucket `members`: one reads another's result (one call
    /// issues its parts together, so a part cannot read what another writes), or a path leaves the
    /// bucket and comes back ([`Scheduler::closes_cycle`]).
    fn apart(&self, members: &BTreeSet<NodeId>, n: NodeId) -> bool {
        let reads = |a: NodeId, b: NodeId| self.f.producers[a.index()].contains(&b);
        members.iter().any(|&m| reads(n, m) || reads(m, n)) || self.closes_cycle(members, n)
    }

    /// Graph outputs that are layout or source nodes get a pointwise region that writes them. (No output
    /// is an input here: the pipeline gives such an output a copy node first, so no kernel stores into
    /// the buffer it loads from.)
    fn transparent_outputs(&mut self) {
        let outputs: Vec<NodeId> = self.f.graph.outputs.clone();
        for o in outputs {
            if self.f.role[o.index()] == Role::Transparent && self.free(o) {
                self.commit(RegionKind::Pointwise, BTreeSet::from([o]));
            }
        }
    }
}

/// Which stored nodes a region writes.
fn stored_nodes(f: &Facts, members: &BTreeSet<NodeId>) -> Vec<NodeId> {
    members
        .iter()
        .copied()
        .filter(|&m| {
            f.output_reach[m.index()]
                || f.consumers[m.index()].iter().any(|c| !members.contains(c))
                || f.role[m.index()] == Role::Transparent
        })
        .collect()
}

/// Orders regions so each runs after the regions whose outputs it reads; `None` if they form a cycle
/// (which the growth rules are meant to exclude).
fn launch_order(
    f: &Facts,
    regions: &[(RegionKind, BTreeSet<NodeId>)],
    assigned: &[Option<usize>],
) -> Option<Vec<usize>> {
    let k = regions.len();
    let mut deps = vec![BTreeSet::new(); k];
    for (ri, (_, members)) in regions.iter().enumerate() {
        for &m in members {
            // Transparent inputs are evaluated in place, so only compute producers order kernels.
            for p in &f.producers[m.index()] {
                if let Some(pr) = assigned[p.index()] {
                    if pr != ri {
                        deps[ri].insert(pr);
                    }
                }
            }
        }
    }
    let mut order = Vec::with_capacity(k);
    let mut done = vec![false; k];
    // A collective runs beside the kernels after it (on a stream of its own), so it goes as early as
    // its inputs allow, and what reads its results as late as it can: the device waits for a collective
    // at its first reader, so gradients are all-reduced while the rest of the backward pass runs and
    // the updates that read them come after it, as an optimizer's step follows the backward pass.
    let collective = |r: usize| regions[r].0 == RegionKind::Collective;
    let waits: Vec<bool> = deps.iter().map(|d| d.iter().any(|&p| collective(p))).collect();
    let priority = |r: usize| match (collective(r), waits[r]) {
        (true, _) => 0,
        (false, false) => 1,
        (false, true) => 2,
    };
    while order.len() < k {
        let ready =
            (0..k).filter(|&r| !done[r] && deps[r].iter().all(|&d| done[d])).min_by_key(|&r| (priority(r), r))?;
        done[ready] = true;
        order.push(ready);
    }
    Some(order)
}

/// A readable kernel name from the user-level ops a region computes: `k3_fused_layernorm_gelu`.
fn region_name(index: usize, kind: &RegionKind, members: &BTreeSet<NodeId>, op_names: &[String]) -> String {
    let mut names: Vec<String> = Vec::new();
    for m in members {
        let n = op_names[m.index()].replace('_', "");
        if !names.contains(&n) {
            names.push(n);
        }
    }
    let more = names.len().saturating_sub(5);
    names.truncate(5);
    let mut desc = names.join("_");
    if more > 0 {
        desc.push_str(&format!("_and{more}more"));
    }
    let fused = names.len() > 1 || (matches!(kind, RegionKind::MatMul { .. }) && members.len() > 1);
    if fused {
        format!("k{index}_fused_{desc}")
    } else {
        format!("k{index}_{desc}")
    }
}

/// How much to fuse.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FusionMode {
    /// Everything the policy allows.
    #[default]
    Fused,
    /// One kernel per user-level op (a softmax is one kernel, a chain of pointwise calls is one kernel
    /// each), intermediates in device memory: the eager baseline every speedup is measured against, as
    /// PyTorch eager is for torch.compile.
    PerOp,
}

/// What lowering told the scheduler in earlier rounds (the pipeline's feedback loop).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Feedback {
    /// Consumers that must not join row regions (they read a reduction at another row).
    pub refused: BTreeSet<NodeId>,
    /// Layout nodes computed as copies rather than folded as views: a GEMM library cannot read the view
    /// in place, or (from the start) a wide concatenation split to fit the binding limit (`fan_in`).
    pub materialized: BTreeSet<NodeId>,
    /// Nodes stored whatever reads them, as outputs are: the copies a concatenation assembled in place
    /// is made of (`in_place`), which no reader may compute for itself.
    pub kept: BTreeSet<NodeId>,
    /// Template matmuls that read their operands stored, with no prologue: computing it in the product's
    /// loads made the kernel bind a concatenation assembled in place both read and written
    /// (`in_place::Assembly::conflict`).
    pub whole_operands: BTreeSet<NodeId>,
}

/// Schedules a primitive graph into regions for `target`. `op_names[i]` names the user-level op that
/// node `i` came from (for kernel names); `feedback` carries what lowering asked for in earlier rounds;
/// with `per_op`, `origin[i]` (the user-level op of node `i`) bounds every region.
pub fn fuse(
    graph: &Graph,
    op_names: &[String],
    target: &Target,
    feedback: &Feedback,
    per_op: Option<&[NodeId]>,
) -> Result<Fusion> {
    let mut s = Scheduler {
        f: Facts::new(graph, &feedback.materialized, &feedback.kept),
        target,
        assigned: vec![None; graph.nodes.len()],
        regions: Vec::new(),
        refused: feedback.refused.clone(),
        whole_operands: feedback.whole_operands.clone(),
        groups: per_op,
    };
    s.attention_regions();
    s.row_regions();
    s.matmul_regions();
    s.pointwise_regions();
    s.transparent_outputs();
    s.collective_regions();
    let order = launch_order(&s.f, &s.regions, &s.assigned).ok_or_else(|| Error::Unsupported {
        what: "the scheduler grouped nodes into regions that depend on each other in a cycle".into(),
        loc: graph.outputs.first().map_or_else(SourceLoc::internal, |o| graph.node(*o).loc.clone()),
    })?;
    let regions = order
        .iter()
        .enumerate()
        .map(|(i, &r)| {
            let (kind, members) = &s.regions[r];
            Region {
                name: region_name(i, kind, members, op_names),
                kind: kind.clone(),
                members: members.iter().copied().collect(),
                stored: stored_nodes(&s.f, members),
            }
        })
        .collect();
    Ok(Fusion { regions })
}
