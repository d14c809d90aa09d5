//! Split-K: a product whose output makes too few of the matmul template's workgroups to keep a GPU busy,
//! over a long depth, becomes a batch of partial products over pieces of the depth, summed by a
//! reduction.
//!
//! The template gives each workgroup one output tile and walks the whole depth through it, a step at a
//! time, each step waiting for its loads and a barrier. DenseNet's late convolutions have few outputs and
//! deep sums (block 4's 3 × 3 ones are 32 × 256 outputs over 1,152: 32 workgroups of 72 steps each); on an
//! H200 over Vulkan they ran at 0.3–3 TFLOP/s, most cores idle and the busy ones waiting on memory.
//! Cutting the depth into `s` pieces gives `s` times the workgroups, each `s` times shorter; the partial
//! sums (`s × m × n` values, kept in f32) cost one more pass that the reduction's kernel makes, with the
//! product's epilogue (a placement in a concatenation, an activation) fused into it.
//!
//! Decided here, before scheduling, from the target's aim ([`Target::split_k_groups`]) and the tile the
//! template will take ([`crate::matmul_tile::choose`]); only products the template runs (a GEMM library
//! splits its own) and only shapes known at compile time.

use crate::decompose::Builder;
use crate::dtype::DType;
use crate::ir::{Graph, GraphInput, NodeId, Op, ReduceOp};
use crate::loc::SourceLoc;
use crate::shape::Shape;
use crate::sym::Expr;
use crate::target::Target;

/// Fewest depth elements a piece keeps: two to four of the template's steps (8 or 16 deep by tile).
/// W6 over NVIDIA Vulkan took 4.71 ms at 32, 4.75 at 64 and 5.21 at 128 (`benches/NOTES.md`, session 43).
pub const MIN_DEPTH: i64 = 32;

/// Shallowest product cut: sixteen to thirty-two of the template's steps. A shallower one is over before
/// a second kernel (the sum) would pay for itself.
pub const MIN_SPLIT_DEPTH: i64 = 256;

/// Most pieces a product is cut into: the reduction then sums each output's partials in one serial pass.
pub const MAX_PIECES: i64 = crate::split_reduce::SERIAL_COLUMN as i64;

/// The number of pieces to cut matmul `n`'s depth into, or `None` to leave it whole. Only a product
/// that leaves a large GPU's cores idle (fewer than [`crate::matmul_tile::LARGE_MIN_GROUPS`] workgroups)
/// or takes the small tile (one output a thread, the least work between two waits), over at least
/// [`MIN_SPLIT_DEPTH`], is cut. Each count
/// of pieces (dividing the depth exactly, each at least [`MIN_DEPTH`] deep) is scored by the work the
/// device holds at once: workgroups, up to the target's aim ([`Target::split_k_groups`]), times the
/// outputs each thread of the tile the template then takes keeps; the best score wins, the fewest
/// pieces on a tie.
pub fn pieces(g: &Graph, n: NodeId, target: &Target) -> Option<i64> {
    let node = g.node(n);
    let aim = i64::from(target.split_k_groups);
    if aim == 0
        || node.op != Op::MatMul
        || !matches!(node.dtype, DType::F32 | DType::F16 | DType::BF16)
        || crate::gemm::wants_library(target, g, n)
    {
        return None;
    }
    let dims: Vec<i64> = node.shape.dims().iter().map(Expr::as_const).collect::<Option<_>>()?;
    let r = dims.len();
    if r < 2 {
        return None;
    }
    let depth = g.node(node.inputs[0]).shape.dims().last()?.as_const()?;
    let (batch, m, cols) = (dims[..r - 2].iter().product::<i64>(), dims[r - 2], dims[r - 1]);
    if batch * m * cols == 0 || depth < MIN_SPLIT_DEPTH {
        return None;
    }
    // Workgroups the template makes of `s` pieces, and the outputs a thread of its tile keeps.
    let schedule = |s: i64| {
        let (rows, columns) = (Expr::from(m), Expr::from(cols));
        let tile = crate::matmul_tile::choose(target, &Expr::from(batch * s), &rows, &columns, 4, [true, false]);
        let tiles = |e: i64, edge: u32| (e + i64::from(edge) - 1) / i64::from(edge);
        let [y, x] = tile.per_thread();
        (batch * s * tiles(m, tile.m) * tiles(cols, tile.n), i64::from(y * x))
    };
    let (whole, outputs) = schedule(1);
    if whole >= crate::matmul_tile::LARGE_MIN_GROUPS && outputs > 1 {
        return None;
    }
    let score = |(groups, outputs): (i64, i64)| groups.min(aim) * outputs;
    let mut best = (score((whole, outputs)), 1);
    for s in (2..=(depth / MIN_DEPTH).min(MAX_PIECES)).filter(|s| depth % s == 0) {
        let this = score(schedule(s));
        if this > best.0 {
            best = (this, s);
        }
    }
    (best.1 > 1).then_some(best.1)
}

/// `g` with every product [`pieces`] splits rewritten as partial products summed over the pieces; each
/// new node's origin is the product's. Returns `g` as it is when none splits.
pub fn split_products(g: &Graph, origin: &[NodeId], target: &Target) -> (Graph, Vec<NodeId>) {
    let split: Vec<Option<i64>> = (0..g.nodes.len() as u32).map(|i| pieces(g, NodeId(i), target)).collect();
    if split.iter().all(Option::is_none) {
        return (g.clone(), origin.to_vec());
    }
    let mut b = Builder {
        graph: Graph { symbols: g.symbols.clone(), ..Graph::default() },
        origin: Vec::with_capacity(g.nodes.len()),
        from: NodeId(0),
        loc: SourceLoc::internal(),
        split_reductions: false,
        conv_row_products_bytes: 0,
        columns: crate::split_reduce::Columns::of(target),
    };
    let mut remap: Vec<NodeId> = Vec::with_capacity(g.nodes.len());
    for (i, node) in g.nodes.iter().enumerate() {
        b.from = origin[i];
        b.loc = node.loc.clone();
        let inputs: Vec<NodeId> = node.inputs.iter().map(|a| remap[a.index()]).collect();
        let new = match split[i] {
            Some(s) => partial_products(&mut b, inputs[0], inputs[1], s, node.dtype),
            None => b.push_node(crate::ir::Node { inputs, ..node.clone() }),
        };
        remap.push(new);
    }
    b.graph.inputs =
        g.inputs.iter().map(|gi| GraphInput { node: remap[gi.node.index()], kind: gi.kind.clone() }).collect();
    b.graph.outputs = g.outputs.iter().map(|o| remap[o.index()]).collect();
    (b.graph, b.origin)
}

/// `a @ w` (`[..., m, k]` by `[..., k, n]`) as `s` products over pieces of `k`, a batch axis in front,
/// summed over it: partials in f32 for half-precision operands (the template's accumulator), rounded
/// once at the end.
fn partial_products(b: &mut Builder, a: NodeId, w: NodeId, s: i64, dtype: DType) -> NodeId {
    let acc = if dtype.is_half() { DType::F32 } else { dtype };
    let (a, w) = (b.cast(a, acc), b.cast(w, acc));
    let (sa, sw) = (b.shape(a), b.shape(w));
    let r = sa.rank();
    let k = sa.dims()[r - 1].clone();
    let piece = Expr::from((k.as_const().unwrap_or(0) / s) as usize);
    let pieces = Expr::from(s as usize);
    // A: [..., m, k] → [..., m, s, k/s] → [s, ..., m, k/s].
    let mut a_dims = sa.dims()[..r - 1].to_vec();
    a_dims.extend([pieces.clone(), piece.clone()]);
    let a = b.reshape(a, Shape(a_dims));
    let a_perm: Vec<usize> = std::iter::once(r - 1).chain(0..r - 1).chain(std::iter::once(r)).collect();
    let a = permute(b, a, &a_perm);
    // B: [..., k, n] → [..., s, k/s, n] → [s, ..., k/s, n].
    let mut w_dims = sw.dims()[..r - 2].to_vec();
    w_dims.extend([pieces, piece, sw.dims()[r - 1].clone()]);
    let w = b.reshape(w, Shape(w_dims));
    let w_perm: Vec<usize> = std::iter::once(r - 2).chain(0..r - 2).chain([r - 1, r]).collect();
    let w = permute(b, w, &w_perm);
    let mut out = b.shape(a).dims()[..r].to_vec();
    out.push(b.shape(w).dims()[r].clone());
    let partials = b.push(Op::MatMul, &[a, w], acc, Shape(out));
    let sum = b.reduce_whole(ReduceOp::Sum, partials, &[0], false);
    b.cast(sum, dtype)
}

/// `x` with its axes reordered: axis `k` of the result is axis `perm[k]` of `x` (`x` itself for the
/// identity).
fn permute(b: &mut Builder, x: NodeId, perm: &[usize]) -> NodeId {
    if perm.iter().enumerate().all(|(k, &p)| k == p) {
        return x;
    }
    let dims = b.shape(x).dims().to_vec();
    let shape = Shape(perm.iter().map(|&p| dims[p].clone()).collect());
    b.push(Op::Permute { perm: perm.to_vec() }, &[x], b.dtype(x), shape)
}

/// Whether `n` is the sum of a split product's partials (as it lies, the product's `[..., m, n]`
/// result): stored as the product itself would be. A half-precision product's rounding of the sum is
/// not: a conversion may be computed in its one reader (`fuse`), so a concatenation takes it as a copy.
pub fn is_partial_sum(g: &Graph, n: NodeId) -> bool {
    let node = g.node(n);
    matches!(&node.op, Op::Reduce { op: ReduceOp::Sum, axes, keepdim: false } if axes[..] == [0])
        && node.inputs.first().is_some_and(|&p| g.node(p).op == Op::MatMul)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{capture, interp, workloads, TensorSpec};

    fn product(m: usize, k: usize, n: usize, dtype: DType) -> Graph {
        let specs = [TensorSpec::new(dtype, &[m, k]), TensorSpec::new(dtype, &[k, n])];
        capture(&specs, |t| Ok(vec![t[0].matmul(&t[1])?])).unwrap()
    }

    fn matmul_of(g: &Graph) -> NodeId {
        NodeId(g.nodes.iter().position(|n| n.op == Op::MatMul).expect("a matmul") as u32)
    }

    #[test]
    fn idle_or_small_tiled_products_split_toward_larger_tiles() {
        let t = Target::webgpu_default();
        let cut = |m, k, n, t: &Target| {
            let g = product(m, k, n, DType::F32);
            pieces(&g, matmul_of(&g), t)
        };
        // DenseNet's 3 × 3 convolutions (32 output channels, depth 1,152). Block 4's 32 × 256 outputs make
        // 32 small tiles; only small ones fit 32 columns of 256, and 8 pieces make the aim's 256.
        assert_eq!(cut(32, 1152, 256, &t), Some(8));
        // Block 2's 32 × 4,096 make 512 small tiles already, but 8 pieces make 256 narrow ones (4 × 4
        // outputs a thread).
        assert_eq!(cut(32, 1152, 4096, &t), Some(8));
        // Block 1's 32 × 16,384 make 128 narrow tiles: 2 pieces make 256.
        assert_eq!(cut(32, 1152, 16384, &t), Some(2));
        // A depth with few divisors takes the best it has: 992 = 31 × 32 (block 4's 1 × 1 ones).
        assert_eq!(cut(128, 992, 256, &t), Some(31));
        // Enough workgroups of a tile that is not the small one: whole (W5's 4,096 × 768 projections
        // make 384 half tiles; its MLP 768 large ones).
        assert_eq!(cut(4096, 768, 768, &t), None);
        assert_eq!(cut(4096, 768, 3072, &t), None);
        // A shallow product is quick whole (a linear layer of 128 inputs makes 8 medium tiles).
        assert_eq!(cut(128, 128, 256, &t), None);
        // The aim turned off, and a product a GEMM library runs: never.
        assert_eq!(cut(32, 1152, 256, &Target { split_k_groups: 0, ..t.clone() }), None);
        assert_eq!(cut(32, 1152, 256, &Target::cuda(90)), None);
    }

    #[test]
    fn a_split_product_computes_the_same_values() {
        let t = Target::webgpu_default();
        for dtype in [DType::F32, DType::BF16] {
            let g = product(32, 1152, 256, dtype);
            let origin: Vec<NodeId> = (0..g.nodes.len() as u32).map(NodeId).collect();
            let (split, split_origin) = split_products(&g, &origin, &t);
            assert_eq!(split_origin.len(), split.nodes.len());
            let out = split.outputs[0];
            let sum = if dtype == DType::F32 { out } else { split.node(out).inputs[0] };
            assert!(is_partial_sum(&split, sum), "{:?}", split.node(sum).op);
            assert_eq!((split.node(out).dtype, &split.node(out).shape), (dtype, &g.node(g.outputs[0]).shape));
            let data: Vec<_> = [TensorSpec::new(dtype, &[32, 1152]), TensorSpec::new(dtype, &[1152, 256])]
                .iter()
                .enumerate()
                .map(|(i, s)| workloads::data(s, i))
                .collect();
            let refs: Vec<_> = data.iter().collect();
            let (want, got) = (interp::run(&g, &refs).unwrap(), interp::run(&split, &refs).unwrap());
            let (w, v) = (want[0].values(), got[0].values());
            let worst = w.iter().zip(v).map(|(a, b)| (a - b).abs() / (1.0 + a.abs())).fold(0.0, f64::max);
            // Partials rounded to f32 (the reference sums in f64 and rounds once); bf16 rounds once too.
            let bound = if dtype == DType::BF16 { 1e-2 } else { 1e-5 };
            assert!(worst < bound, "{dtype}: {worst}");
        }
    }
}
