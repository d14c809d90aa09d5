//! Fused attention: where `softmax(q @ kᵀ * scale [causal]) @ v`, written out as separate ops, becomes
//! one [`Op::Attention`] node, and what that node computes.
//!
//! Written out, attention stores a `tq × tk` score matrix per head, reads it back for the softmax, stores
//! the probabilities and reads them again for the second product: at GPT-2 sizes that traffic and three
//! launches are most of the attention's time. One flash-attention-style kernel (tiles of keys streamed
//! past a block of queries, an online softmax, nothing `tq × tk` in memory) removes all of it. The
//! decision is made here, once, from the graph and the [`Target`]; a backend only renders the kernel the
//! lowering describes (`kernel::Attention`).
//!
//! The pattern is matched on the traced graph (composites whole), at the final matmul: its left operand is
//! a last-axis softmax of, in either order, at most one scalar scale and at most one causal mask over
//! `q @ kᵀ`, and each of those intermediate values is read only by the next. A gradient is taken of the
//! forward graph with its attentions whole (`attention_grad`), so a training step's backward pass never
//! reads the probabilities.

use crate::decompose::Builder;
use crate::dtype::DType;
use crate::ir::{BinaryOp, Graph, NodeId, Op};
use crate::kernel::{AttentionPass, AttentionTile, AttentionUnits};
use crate::target::Target;

/// The largest head dim the fused kernel keeps in registers (one row of `q` and of the output per group
/// of four threads).
pub const MAX_HEAD_DIM: i64 = 128;

/// An attention found in a graph: the operands and what the softmax saw.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Found {
    /// Queries, `[.., tq, d]`.
    pub q: NodeId,
    /// Keys, `[.., tk, d]` (before the transpose the product read).
    pub k: NodeId,
    /// Values, `[.., tk, dv]`.
    pub v: NodeId,
    /// The scores' multiplier.
    pub scale: f64,
    /// Whether a causal mask was applied.
    pub causal: bool,
}

/// Whether `target` runs attention over `dtype` with head dims `d` and `dv` as one fused kernel: on
/// matrix units ([`matrix_fits`]) or, in f32, forward only ([`f32_fits`]).
pub fn fits(target: &Target, dtype: DType, d: i64, dv: i64) -> bool {
    matrix_fits(target, dtype, d, dv) || f32_fits(target, dtype, d, dv)
}

/// Whether an f32 template without a backward (lanes, [`lanes_fits`], or registers,
/// [`registers_fits`]) runs this attention's forward pass.
pub fn f32_fits(target: &Target, dtype: DType, d: i64, dv: i64) -> bool {
    lanes_fits(target, dtype, d, dv) || registers_fits(target, dtype, d, dv)
}

/// Whether the registers template (`AttentionUnits::Registers`) takes it: the target renders it
/// (`Target::register_attention`), the dtype is f32 and the tile [`tile`] plans is that template's (it
/// fits the head dims, `AttentionTile::registers_unfit`, and the target's shared memory).
pub fn registers_fits(target: &Target, dtype: DType, d: i64, dv: i64) -> bool {
    f32_tile(target, dtype, d, dv).is_some_and(|t| t.units == AttentionUnits::Registers)
}

/// Whether the registers template's eight threads of a row (adjacent lanes) can meet by subgroup
/// shuffles on `target`: its subgroups hold whole groups of eight (a warp on CUDA; WGSL where the
/// adapter has subgroups).
pub fn rows_shuffle(target: &Target) -> bool {
    target.subgroup_size.is_some_and(|s| s % crate::kernel::REGISTER_COLUMN_THREADS == 0)
}

/// The tile [`tile`] plans for an f32 attention of head dims `d` and `dv` (rows aligned to nothing).
fn f32_tile(target: &Target, dtype: DType, d: i64, dv: i64) -> Option<AttentionTile> {
    let (d, dv) = (u32::try_from(d).ok()?, u32::try_from(dv).ok()?);
    (dtype == DType::F32).then(|| tile(target, dtype, d, dv, 1)).flatten()
}

/// Whether the matrix-unit template takes it: the target has matrix units (the kernel's products are
/// matrix-multiply-accumulate instructions), the dtype is one they take, both head dims are multiples
/// of 16 (one instruction's depth) no larger than [`MAX_HEAD_DIM`], and a tile fits the target's shared
/// memory ([`tile`]).
pub fn matrix_fits(target: &Target, dtype: DType, d: i64, dv: i64) -> bool {
    let dim_ok = |x: i64| x > 0 && x % 16 == 0 && x <= MAX_HEAD_DIM;
    target.matrix_units
        && matches!(dtype, DType::F16 | DType::BF16)
        && dim_ok(d)
        && dim_ok(dv)
        && tile(target, dtype, d as u32, dv as u32, 1).is_some()
}

/// The largest head dim the lanes template takes: a thread keeps its query's row of `q` and of the
/// output in registers, 128 of them at 64 each, beside a chunk's scores.
pub const MAX_LANES_HEAD_DIM: i64 = 64;

/// Whether the lanes template (`AttentionUnits::Lanes`) takes it: the target renders it
/// (`Target::lane_attention`), the dtype is f32, both head dims are multiples of 4 (rows are read as
/// 4-lane vectors) no larger than [`MAX_LANES_HEAD_DIM`], and a tile fits the target's shared memory.
pub fn lanes_fits(target: &Target, dtype: DType, d: i64, dv: i64) -> bool {
    let dim_ok = |x: i64| x > 0 && x % 4 == 0 && x <= MAX_LANES_HEAD_DIM;
    target.lane_attention.is_some()
        && dim_ok(d)
        && dim_ok(dv)
        && f32_tile(target, dtype, d, dv).is_some_and(|t| t.units == AttentionUnits::Lanes)
}

/// The template's work division for `dtype` and head dims `d` and `dv` on `target`, where every row of
/// every operand starts on a multiple of `align` elements.
///
/// Half precision, on matrix units: four warps (64 queries) a workgroup, and the most keys a step (64,
/// 32 or 16) whose tiles fit the target's shared memory within the 48 KiB a kernel may declare
/// statically; 16-byte loads when rows are aligned to 8 elements, and then two copies of the key and
/// value tiles where they fit, so the next tile is copied while the current one is computed on.
///
/// f32, on lanes (`Target::lane_attention` gives the largest division): its queries a workgroup, the
/// most keys a tile (halving down to one chunk) that fit, 16-byte loads when rows are aligned to 4
/// elements. f32 on registers (`Target::register_attention`, preferred to lanes where both fit): 64
/// queries a workgroup, `thread_rows` a thread, 64 keys a tile, 16-byte loads when rows are aligned to
/// 4 elements, a row's threads meeting by subgroup shuffles where subgroups hold groups of eight.
/// `None` when no tile fits.
pub fn tile(target: &Target, dtype: DType, d: u32, dv: u32, align: u32) -> Option<AttentionTile> {
    let budget = target.template_shared_bytes();
    // f32: the registers template where the target renders it and its tile fits, else lanes.
    if let (DType::F32, Some(ra)) = (dtype, target.register_attention) {
        let t = AttentionTile {
            // 64 queries: eight threads a row of queries, `thread_rows` queries a thread.
            // (A division other than 4 or 8 queries a thread is refused by `registers_unfit`.)
            warps: 64 / (ra.thread_rows.clamp(1, 64) * 32 / crate::kernel::REGISTER_COLUMN_THREADS).max(1),
            keys: 64,
            vector: if align % 4 == 0 { 4 } else { 1 },
            stages: 1,
            units: AttentionUnits::Registers,
            // Eight depth steps an iteration (four where the head dim allows no more): the products'
            // loops fully unrolled made W5's attention 295 KB of PTX and 0.75 s of ptxas on the GPU host.
            chunk: if d % 8 == 0 { 8 } else { 4 },
            split: 1,
            thread_rows: ra.thread_rows,
            row_shuffles: rows_shuffle(target),
        };
        if t.registers_unfit(d, dv).is_none() && t.shared_bytes(d, dv) <= budget {
            return Some(t);
        }
    }
    if dtype == DType::F32 {
        let la = target.lane_attention?;
        let lanes = |keys: u32, split: u32| AttentionTile {
            warps: la.rows * split / 32,
            keys,
            vector: if align % 4 == 0 { 4 } else { 1 },
            stages: 1,
            units: AttentionUnits::Lanes,
            chunk: la.chunk,
            split,
            thread_rows: 0,
            row_shuffles: false,
        };
        // A query split across threads where the tile's rule allows it (subgroups to sum the partial
        // scores, head dims in 4-lane vectors a thread); else one thread a query.
        let fits = |t: &AttentionTile| t.lanes_unfit(d, dv, target.subgroup_size).is_none();
        let split = if fits(&lanes(la.keys, la.split)) { la.split } else { 1 };
        let threads = la.rows * split;
        if la.rows == 0 || threads % 32 != 0 || threads > target.max_threads_per_group {
            return None;
        }
        return std::iter::successors(Some(la.keys), |&k| (k / 2 % la.chunk.max(1) == 0 && k / 2 > 0).then_some(k / 2))
            .map(|keys| lanes(keys, split))
            .find(|t| fits(t) && t.shared_bytes(d, dv) <= budget);
    }
    let aligned = align % 8 == 0;
    let stages: &[u32] = if aligned { &[2, 1] } else { &[1] };
    [64, 32, 16]
        .into_iter()
        .flat_map(|keys| {
            stages.iter().map(move |&stages| AttentionTile {
                warps: 4,
                keys,
                vector: if aligned { 8 } else { 1 },
                stages,
                units: AttentionUnits::Matrix,
                chunk: 0,
                split: 1,
                thread_rows: 0,
                row_shuffles: false,
            })
        })
        .find(|t| t.shared_bytes(d, dv) <= budget)
}

/// The largest head dim the backward kernels take: a warp keeps two operands' fragments and two
/// accumulators of its 16 rows, and a score tile and its gradient, in registers.
pub const MAX_GRAD_HEAD_DIM: i64 = 64;

/// Whether `target` runs an attention's backward pass (its log-sum-exps and gradients) over `dtype` with
/// head dims `d` and `dv` as fused kernels: as [`matrix_fits`] (the backward has no lanes template),
/// with both head dims at most [`MAX_GRAD_HEAD_DIM`] and a [`grad_tile`].
pub fn grad_fits(target: &Target, dtype: DType, d: i64, dv: i64) -> bool {
    matrix_fits(target, dtype, d, dv)
        && d <= MAX_GRAD_HEAD_DIM
        && dv <= MAX_GRAD_HEAD_DIM
        && grad_tile(target, d as u32, dv as u32, false).is_some()
}

/// The backward kernels' work division: four warps owning 64 rows (queries, or keys), and the most rows
/// a streamed tile (64, 32 or 16) for which both blocks, both tiles and the tile's log-sum-exps and
/// deltas fit the target's shared memory within 48 KiB.
pub fn grad_tile(target: &Target, d: u32, dv: u32, aligned: bool) -> Option<AttentionTile> {
    let budget = target.template_shared_bytes();
    [64, 32, 16]
        .into_iter()
        .map(|keys| AttentionTile {
            warps: 4,
            keys,
            vector: if aligned { 8 } else { 1 },
            stages: 1,
            units: AttentionUnits::Matrix,
            chunk: 0,
            split: 1,
            thread_rows: 0,
            row_shuffles: false,
        })
        .find(|t| t.grad_shared_bytes(d, dv) <= budget)
}

/// How many nodes read each node, graph outputs counted as readers.
pub fn readers(g: &Graph) -> Vec<usize> {
    let mut n = vec![0usize; g.nodes.len()];
    for node in &g.nodes {
        for &i in &node.inputs {
            n[i.index()] += 1;
        }
    }
    for &o in &g.outputs {
        n[o.index()] += 1;
    }
    n
}

/// The scalar a node holds everywhere, when it is a constant (through reshapes and expands of one).
fn constant(g: &Graph, mut n: NodeId) -> Option<f64> {
    loop {
        let node = g.node(n);
        match node.op {
            Op::Full { value } => return Some(value),
            Op::Reshape | Op::Expand if node.inputs.len() == 1 => n = node.inputs[0],
            _ => return None,
        }
    }
}

/// The attention whose final product is node `out` of `g`, if it is one that `target` fuses, or any
/// attention with no target (`readers` from [`readers`]).
pub fn find(g: &Graph, out: NodeId, readers: &[usize], target: Option<&Target>) -> Option<Found> {
    let node = g.node(out);
    if node.op != Op::MatMul || node.inputs.len() != 2 {
        return None;
    }
    let only_here = |n: NodeId| readers[n.index()] == 1;
    let (probs, v) = (node.inputs[0], node.inputs[1]);
    let sm = g.node(probs);
    let rank = sm.shape.rank();
    if sm.op != (Op::Softmax { axis: rank.wrapping_sub(1) }) || !only_here(probs) || rank < 2 {
        return None;
    }
    // Back from the softmax through at most one scale and one mask, in either order.
    let (mut at, mut scale, mut causal) = (sm.inputs[0], None, false);
    loop {
        if !only_here(at) {
            return None;
        }
        let n = g.node(at);
        match n.op {
            Op::CausalMask if !causal => causal = true,
            Op::Binary { op: op @ (BinaryOp::Mul | BinaryOp::Div) } if scale.is_none() => {
                let (x, c) = match (constant(g, n.inputs[0]), constant(g, n.inputs[1])) {
                    (_, Some(c)) => (n.inputs[0], c),
                    (Some(c), None) if op == BinaryOp::Mul => (n.inputs[1], c),
                    _ => return None,
                };
                let s = if op == BinaryOp::Div { 1.0 / c } else { c };
                // A mask after a non-positive scale would not stay `-inf`; such a model is not attention.
                if !(s.is_finite() && s > 0.0) {
                    return None;
                }
                scale = Some(s);
                at = x;
                continue;
            }
            _ => break,
        }
        at = n.inputs[0];
    }
    let scores = g.node(at);
    if scores.op != Op::MatMul {
        return None;
    }
    let (q, kt) = (scores.inputs[0], scores.inputs[1]);
    let t = g.node(kt);
    let mut swap: Vec<usize> = (0..rank).collect();
    swap.swap(rank - 1, rank - 2);
    if t.op != (Op::Permute { perm: swap }) || !only_here(kt) {
        return None;
    }
    let k = t.inputs[0];
    let [qs, ks, vs] = [q, k, v].map(|n| g.node(n).shape.dims().to_vec());
    let batch_ok = qs.len() == rank && ks.len() == rank && vs.len() == rank && qs[..rank - 2] == ks[..rank - 2];
    if !batch_ok || vs[..rank - 2] != qs[..rank - 2] || qs[rank - 1] != ks[rank - 1] || ks[rank - 2] != vs[rank - 2] {
        return None;
    }
    let dtype = node.dtype;
    if [q, k, v, at, probs].iter().any(|&n| g.node(n).dtype != dtype) {
        return None;
    }
    let (d, dv) = (qs[rank - 1].as_const()?, vs[rank - 1].as_const()?);
    target.is_none_or(|t| fits(t, dtype, d, dv)).then_some(Found { q, k, v, scale: scale.unwrap_or(1.0), causal })
}

/// The permute the attention node `node` is stored as, when its one reader (`readers` from [`readers`];
/// a graph output counts as one) is a permute that keeps the last axis: heads put back into rows. The
/// kernel writes each output row where the permuted tensor keeps it, so the permute costs no copy and a
/// reshape after it stays a view a GEMM reads in place.
pub fn stored_as(g: &Graph, node: NodeId, readers: &[usize]) -> Option<NodeId> {
    if readers[node.index()] != 1 {
        return None;
    }
    let r = g.node(node).shape.rank();
    let (i, p) = g.nodes.iter().enumerate().find(|(_, n)| n.inputs.contains(&node))?;
    match &p.op {
        Op::Permute { perm } if perm.len() == r && perm[r - 1] == r - 1 => Some(NodeId(i as u32)),
        _ => None,
    }
}

/// An attention's output read both as heads put back into rows (the permute its kernel can write,
/// [`stored_as`]) and as it is (a training step's backward reads the forward's output for `delta`): each
/// later reader of the attention reads the permute back instead, through the inverse permute (a view).
/// The permute is then the attention's one reader, so the kernel writes rows where the permute keeps
/// them and no copy kernel makes the layout the next GEMM reads (W5's training step had four, one a
/// layer). Kept while decomposing, where nodes are made in order: the inverse permute is made after the
/// permute and before the first reader that needs it.
#[derive(Default)]
pub(crate) struct PermutedOutputs {
    /// Attention node → (the permute storing it, the inverse permute made for its other readers).
    stored: std::collections::HashMap<NodeId, (NodeId, Option<NodeId>)>,
}

impl PermutedOutputs {
    /// Records `new`, a node just made, when it is a last-axis-keeping permute of an attention that has
    /// none yet.
    pub(crate) fn note(&mut self, b: &Builder, new: NodeId) {
        let node = b.graph.node(new);
        let (Op::Permute { perm }, &[x]) = (&node.op, &node.inputs[..]) else { return };
        let r = perm.len();
        let attention = matches!(b.graph.node(x).op, Op::Attention { .. } | Op::AttentionGrad { .. });
        if attention && r > 0 && perm[r - 1] == r - 1 && !self.stored.contains_key(&x) {
            self.stored.insert(x, (new, None));
        }
    }

    /// `inputs` of a node of op `op` about to be made, with every attention whose output is stored as a
    /// permute replaced by that permute read back (the permute itself, or a second permute of the same
    /// attention, reads the attention).
    pub(crate) fn read_back(&mut self, b: &mut Builder, op: &Op, mut inputs: Vec<NodeId>) -> Vec<NodeId> {
        if matches!(op, Op::Permute { .. }) || self.stored.is_empty() {
            return inputs;
        }
        for x in &mut inputs {
            let Some((permute, back)) = self.stored.get(x).copied() else { continue };
            let back = back.unwrap_or_else(|| {
                let Op::Permute { perm } = &b.graph.node(permute).op else { unreachable!("a permute was noted") };
                let mut inverse = vec![0; perm.len()];
                for (i, &p) in perm.iter().enumerate() {
                    inverse[p] = i;
                }
                let (dtype, shape) = (b.dtype(*x), b.shape(*x));
                b.push(Op::Permute { perm: inverse }, &[permute], dtype, shape)
            });
            self.stored.insert(*x, (permute, Some(back)));
            *x = back;
        }
        inputs
    }
}

/// The attention node of `g` whose output one kernel computes beside `node`'s, when there is one: the
/// log-sum-exps of a forward attention (the online softmax ends with each query's running max and sum,
/// so storing them costs one f32 a query where a pass of their own recomputes every score), or the
/// values' gradient beside the keys' (both walk the same query tiles with the same probabilities, so one
/// kernel computes them once). Partners have the same operands, scale and mask.
pub fn partner(g: &Graph, node: NodeId) -> Option<NodeId> {
    let n = g.node(node);
    let (pass, scale, causal) = AttentionPass::of(&n.op)?;
    let second = pass.second()?;
    let wanted = second.op(scale, causal);
    // The log-sum-exps read `q` and `k` only.
    let inputs: &[NodeId] = if second == AttentionPass::Lse { n.inputs.get(..2)? } else { &n.inputs };
    let found = g.nodes.iter().position(|x| x.op == wanted && x.inputs == inputs)?;
    Some(NodeId(found as u32))
}

/// Every permute an attention of `g` is stored as ([`stored_as`]): the pipeline materialises them from
/// the first scheduling round, so the attention's kernel writes them and their readers load them.
pub fn stored_permutes(g: &Graph) -> impl Iterator<Item = NodeId> + '_ {
    let readers = readers(g);
    (0..g.nodes.len())
        .filter(|&i| matches!(g.nodes[i].op, Op::Attention { .. } | Op::AttentionGrad { .. }))
        .filter_map(move |i| stored_as(g, NodeId(i as u32), &readers))
}

/// One query's scores against the first `keys` keys (rows of `d` in `k`), in f64: `q · k_j * scale`.
pub(crate) fn scores_row(q: &[f64], k: &[f64], keys: usize, d: usize, scale: f64) -> Vec<f64> {
    (0..keys).map(|j| q.iter().zip(&k[j * d..][..d]).map(|(x, y)| x * y).sum::<f64>() * scale).collect()
}

/// What [`Op::Attention`] computes, in f64 (the reference): `q` `[batch, tq, d]`, `k` `[batch, tk, d]`,
/// `v` `[batch, tk, dv]`, row-major, batch flattened. A row with no key (`tk = 0`) is zeros, as the
/// written-out form's empty product gives.
pub fn reference(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    [batch, tq, tk, d, dv]: [usize; 5],
    scale: f64,
    causal: bool,
) -> Vec<f64> {
    let mut out = vec![0.0; batch * tq * dv];
    let mut s = vec![0.0; tk];
    for b in 0..batch {
        for i in 0..tq {
            let keys = if causal { tk.min(i + 1) } else { tk };
            let row = scores_row(&q[(b * tq + i) * d..][..d], &k[b * tk * d..], keys, d, scale);
            s[..keys].copy_from_slice(&row);
            let m = s[..keys].iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let mut total = 0.0;
            for sj in &mut s[..keys] {
                *sj = (*sj - m).exp();
                total += *sj;
            }
            let o = &mut out[(b * tq + i) * dv..][..dv];
            for (j, p) in s[..keys].iter().enumerate() {
                let vj = &v[(b * tk + j) * dv..][..dv];
                for (x, y) in o.iter_mut().zip(vj) {
                    *x += p / total * y;
                }
            }
        }
    }
    out
}
