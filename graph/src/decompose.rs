//! Decomposition: rewrites every composite node (softmax, layer norm, GELU, linear, ...) into primitives.
//!
//! Tracing keeps composites whole, so explain, export and the explorer speak the user's vocabulary and the
//! reference computes each one in a single careful f64 step. Fusion, lowering and the backends should only
//! have to understand the primitive families (source, pointwise, reduce, layout, matmul). This stage sits
//! between the two: after it no node is `OpFamily::Composite`, and a new composite costs one function here
//! instead of a case in every later stage.
//!
//! The rewrites are the numerically careful ones PyTorch uses: softmax subtracts the max before `exp`,
//! variance is two-pass, and half-precision composites compute in f32 and round back once. Shapes stay
//! symbolic: every dim comes from the graph, broadcasts are explicit `Reshape` + `Expand` (the IR's
//! invariants), and an element count over symbolic axes is computed by the graph rather than assumed.
//! Every new node keeps the composite's source location, and [`Decomposed::origin`] maps it back to the
//! user's op, so explain can say which primitives one call became.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::interp::reduce_dtype;
use crate::ir::{BinaryOp, GeluApprox, Graph, GraphInput, Node, NodeId, Op, OpFamily, PoolKind, ReduceOp, UnaryOp};
use crate::loc::SourceLoc;
use crate::shape::{reduced_shape, Shape};
use crate::sym::Expr;

/// A graph of primitives and where each of its nodes came from.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Decomposed {
    /// Same inputs, outputs, symbols and node types as the input graph, with no composite op left.
    pub graph: Graph,
    /// `origin[i]` is the node of the input graph that node `i` of `graph` came from.
    pub origin: Vec<NodeId>,
}

/// Rewrites `graph`'s composite nodes into primitives; other nodes are copied unchanged.
///
/// Fails only on a graph the public API cannot record (a composite of a non-float dtype, an axis out of
/// range, a malformed node), naming the node's source location.
pub fn decompose(graph: &Graph) -> Result<Decomposed> {
    decompose_for(graph, Attentions::AsTheyAre, false)
}

/// [`decompose`], every attention written as one [`Op::Attention`] node whatever the target: the forward
/// graph a gradient is taken of, so the attention's rule is flash attention's backward
/// (`attention_grad`). Compiling the joint graph writes out what its target does not fuse.
pub(crate) fn decompose_keeping_attention(graph: &Graph) -> Result<Decomposed> {
    decompose_for(graph, Attentions::Whole, false)
}

/// What decomposition does with attentions, written out or as attention nodes.
#[derive(Clone, Copy)]
pub enum Attentions<'a> {
    /// Nodes and written-out chains copied as they are (the reference computes every op).
    AsTheyAre,
    /// Every written-out attention becomes one [`Op::Attention`] node, whatever the target.
    Whole,
    /// For `target`: with `fuse`, each written-out attention that `target` runs fused (see `attention`)
    /// becomes one [`Op::Attention`] node in place of its final product (the chain before it is left
    /// without readers, and pruned with the other dead nodes); every attention node it does not run
    /// fused is written out.
    For {
        /// The device compiled for.
        target: &'a crate::target::Target,
        /// Whether attentions may be fused (the fused compile mode).
        fuse: bool,
    },
}

/// [`decompose`] with a choice for attentions (see [`Attentions`]). With `split_reductions`, a reduction
/// too long for one pass becomes a chain of passes (`split_reduce`).
pub fn decompose_for(graph: &Graph, attentions: Attentions<'_>, split_reductions: bool) -> Result<Decomposed> {
    let (finder, fusing) = match attentions {
        Attentions::AsTheyAre => (None, None),
        Attentions::Whole => (Some(None), None),
        Attentions::For { target, fuse: true } => (Some(Some(target)), Some(target)),
        Attentions::For { fuse: false, .. } => (None, None),
    };
    let writes_out = matches!(attentions, Attentions::For { .. });
    let readers = finder.map(|_| crate::attention::readers(graph));
    let mut b = Builder {
        graph: Graph { symbols: graph.symbols.clone(), ..Graph::default() },
        origin: Vec::with_capacity(graph.nodes.len()),
        from: NodeId(0),
        loc: SourceLoc::internal(),
        split_reductions,
        conv_row_products_bytes: fusing.map_or(0, |t| t.conv_row_products_bytes),
        columns: match attentions {
            Attentions::For { target, .. } => crate::split_reduce::Columns::of(target),
            _ => crate::split_reduce::Columns::DEFAULT,
        },
    };
    let mut written = crate::attention_grad::WrittenAttentions::default();
    // Attentions a gradient is taken of: (q, k) of every log-sum-exp and gradient node.
    let differentiated: std::collections::HashSet<(NodeId, NodeId)> = graph
        .nodes
        .iter()
        .filter(|n| matches!(n.op, Op::AttentionLse { .. } | Op::AttentionGrad { .. }) && n.inputs.len() >= 2)
        .map(|n| (n.inputs[0], n.inputs[1]))
        .collect();
    let mut map: Vec<NodeId> = Vec::with_capacity(graph.nodes.len());
    let lookup = |map: &[NodeId], id: NodeId, loc: &SourceLoc| {
        map.get(id.index()).copied().ok_or_else(|| Error::InvalidArgument {
            op: "decompose".into(),
            msg: format!("{id} is read before it is defined"),
            loc: loc.clone(),
        })
    };
    let mut permuted = crate::attention::PermutedOutputs::default();
    for (i, node) in graph.nodes.iter().enumerate() {
        let inputs = node.inputs.iter().map(|&a| lookup(&map, a, &node.loc)).collect::<Result<Vec<_>>>()?;
        b.from = NodeId(i as u32);
        b.loc = node.loc.clone();
        let inputs = permuted.read_back(&mut b, &node.op, inputs);
        let fused =
            finder.zip(readers.as_deref()).and_then(|(t, r)| crate::attention::find(graph, NodeId(i as u32), r, t));
        let new = if let Some(a) = fused {
            let qkv = [a.q, a.k, a.v].iter().map(|&n| lookup(&map, n, &node.loc)).collect::<Result<Vec<_>>>()?;
            b.push(Op::Attention { scale: a.scale, causal: a.causal }, &qkv, node.dtype, node.shape.clone())
        } else if let Some(out) =
            if writes_out { write_out(&mut b, &mut written, node, &inputs, fusing, &differentiated)? } else { None }
        {
            out
        } else if let Some(split) = match (&node.op, inputs.first()) {
            // A saved graph may record a reduction's dtype or shape other than the one its op yields:
            // such a node is copied as it is (the split's nodes are left without readers and pruned).
            (Op::Reduce { op, axes, keepdim }, Some(&x)) if split_reductions => {
                crate::split_reduce::split(&mut b, *op, x, axes, *keepdim)
                    .filter(|&v| b.dtype(v) == node.dtype && b.shape(v) == node.shape)
            }
            _ => None,
        } {
            split
        } else if node.op.family() == OpFamily::Composite {
            let out = b.composite(node, &inputs)?;
            let got = b.graph.node(out);
            if got.dtype != node.dtype || got.shape != node.shape {
                return Err(Error::Shape {
                    op: node.op.name().into(),
                    msg: format!(
                        "decomposition produced {} {}, the composite is {} {}",
                        got.dtype, got.shape, node.dtype, node.shape
                    ),
                    loc: node.loc.clone(),
                });
            }
            out
        } else {
            // A primitive whose attributes a saved graph may hold wrong: caught here, not by an index
            // panic in lowering.
            if let Op::Unfold { kernel, window, .. } = &node.op {
                let r = inputs.first().map_or(0, |&x| b.shape(x).rank()).saturating_sub(2);
                let fits = [kernel.len(), window.stride.len(), window.padding.len(), window.dilation.len()]
                    .iter()
                    .all(|&n| n == r && n > 0);
                if !fits || kernel.contains(&0) || window.stride.contains(&0) || window.dilation.contains(&0) {
                    return Err(Error::InvalidArgument {
                        op: "unfold".into(),
                        msg: format!("kernel {kernel:?} and {window:?} do not fit the input"),
                        loc: node.loc.clone(),
                    });
                }
            }
            b.push_node(Node { inputs, ..node.clone() })
        };
        permuted.note(&b, new);
        map.push(new);
    }
    let internal = SourceLoc::internal();
    b.graph.inputs = graph
        .inputs
        .iter()
        .map(|gi| Ok(GraphInput { node: lookup(&map, gi.node, &internal)?, kind: gi.kind.clone() }))
        .collect::<Result<_>>()?;
    b.graph.outputs = graph.outputs.iter().map(|&o| lookup(&map, o, &internal)).collect::<Result<_>>()?;
    Ok(Decomposed { graph: b.graph, origin: b.origin })
}

/// `node`, an attention node (or one of its backward pass) that `fusing` (the target, when attentions
/// may be fused) does not run fused, as explicit ops; `None` for any other node, or one it runs fused.
/// Head dims that are not constants are never fused. A forward pass only an f32 template would run
/// (lanes or registers, `attention::f32_fits`) is written out where its gradient is taken
/// (`differentiated`, by the graph's `(q, k)`): the backward is written out there too (neither has a
/// backward template), and written out beside it the forward shares its scores and probabilities —
/// computed once, and the gradients consistent with the output they are of (a fused output beside
/// recomputed probabilities differs from them by rounding, which the backward's `dP - delta`
/// amplifies: W5's training step failed its check both with WGSL's lanes and with CUDA's registers
/// forward, `benches/NOTES.md` sessions 35 and 42). An error when the written-out form disagrees with
/// the dtype or shape the graph recorded for the node (a malformed saved graph).
fn write_out(
    b: &mut Builder,
    written: &mut crate::attention_grad::WrittenAttentions,
    node: &Node,
    inputs: &[NodeId],
    fusing: Option<&crate::target::Target>,
    differentiated: &std::collections::HashSet<(NodeId, NodeId)>,
) -> Result<Option<NodeId>> {
    let head = |x: NodeId, b: &Builder| b.shape(x).dims().last().and_then(|e| e.as_const());
    // Whether `fits` (the forward's or the backward's) holds on the target for constant head dims.
    type Fits = fn(&crate::target::Target, DType, i64, i64) -> bool;
    let fused = |fits: Fits, dtype, d: Option<i64>, dv: Option<i64>| match (fusing, d, dv) {
        (Some(t), Some(d), Some(dv)) => fits(t, dtype, d, dv),
        _ => false,
    };
    let grad_fused = |dtype, d, dv| fused(crate::attention::grad_fits, dtype, d, dv);
    let out = match node.op {
        Op::Attention { scale, causal } => {
            let (d, dv) = (head(inputs[0], b), head(inputs[2], b));
            let on_matrix = fused(crate::attention::matrix_fits, node.dtype, d, dv);
            let on_f32 = fused(crate::attention::f32_fits, node.dtype, d, dv)
                && !differentiated.contains(&(node.inputs[0], node.inputs[1]));
            if on_matrix || on_f32 {
                return Ok(None);
            }
            written.attention(b, inputs[0], inputs[1], inputs[2], scale, causal)
        }
        Op::AttentionLse { scale, causal } => {
            let d = head(inputs[0], b);
            if grad_fused(b.dtype(inputs[0]), d, d) {
                return Ok(None);
            }
            written.lse(b, inputs[0], inputs[1], scale, causal)
        }
        Op::AttentionGrad { scale, causal, part } => {
            if grad_fused(node.dtype, head(inputs[0], b), head(inputs[2], b)) {
                return Ok(None);
            }
            written.grad(b, inputs, scale, causal, part)
        }
        _ => return Ok(None),
    };
    let got = b.graph.node(out);
    if got.dtype != node.dtype || got.shape != node.shape {
        return Err(Error::Shape {
            op: node.op.name().into(),
            msg: format!("written out as {} {}, the node records {} {}", got.dtype, got.shape, node.dtype, node.shape),
            loc: node.loc.clone(),
        });
    }
    Ok(Some(out))
}

/// The dtype a composite of dtype `d` computes in: PyTorch's "opmath" type, so rounding to half precision
/// happens once at the end rather than after every step.
fn compute_dtype(d: DType) -> DType {
    match d {
        DType::F16 | DType::BF16 => DType::F32,
        d => d,
    }
}

/// Appends primitives to the output graph; each node it makes is attributed to `from` at `loc`. Also
/// the builder of backward graphs (`autodiff`).
pub(crate) struct Builder {
    pub(crate) graph: Graph,
    pub(crate) origin: Vec<NodeId>,
    pub(crate) from: NodeId,
    pub(crate) loc: SourceLoc,
    /// Whether [`Builder::reduce`] splits reductions too long for one pass (compiling for a device).
    pub(crate) split_reductions: bool,
    /// The target's `conv_row_products_bytes` (0: every convolution over a full im2col matrix).
    pub(crate) conv_row_products_bytes: u64,
    /// What the target offers column reductions (`split_reduce`).
    pub(crate) columns: crate::split_reduce::Columns,
}

impl Builder {
    pub(crate) fn push_node(&mut self, node: Node) -> NodeId {
        self.origin.push(self.from);
        self.graph.push(node)
    }

    pub(crate) fn push(&mut self, op: Op, inputs: &[NodeId], dtype: DType, shape: Shape) -> NodeId {
        self.push_node(Node { op, inputs: inputs.to_vec(), dtype, shape, loc: self.loc.clone() })
    }

    pub(crate) fn shape(&self, x: NodeId) -> Shape {
        self.graph.node(x).shape.clone()
    }

    pub(crate) fn dtype(&self, x: NodeId) -> DType {
        self.graph.node(x).dtype
    }

    pub(crate) fn unary(&mut self, op: UnaryOp, x: NodeId) -> NodeId {
        self.push(Op::Unary { op }, &[x], self.dtype(x), self.shape(x))
    }

    pub(crate) fn binary(&mut self, op: BinaryOp, a: NodeId, b: NodeId) -> NodeId {
        debug_assert_eq!(self.shape(a), self.shape(b), "pointwise inputs must be broadcast explicitly");
        let dtype = if op.is_comparison() { DType::Bool } else { self.dtype(a) };
        self.push(Op::Binary { op }, &[a, b], dtype, self.shape(a))
    }

    pub(crate) fn add(&mut self, a: NodeId, b: NodeId) -> NodeId {
        self.binary(BinaryOp::Add, a, b)
    }

    pub(crate) fn sub(&mut self, a: NodeId, b: NodeId) -> NodeId {
        self.binary(BinaryOp::Sub, a, b)
    }

    pub(crate) fn mul(&mut self, a: NodeId, b: NodeId) -> NodeId {
        self.binary(BinaryOp::Mul, a, b)
    }

    pub(crate) fn div(&mut self, a: NodeId, b: NodeId) -> NodeId {
        self.binary(BinaryOp::Div, a, b)
    }

    pub(crate) fn full(&mut self, value: f64, dtype: DType, shape: Shape) -> NodeId {
        self.push(Op::Full { value: dtype.round(value) }, &[], dtype, shape)
    }

    /// A constant of `x`'s dtype and shape: scalars are materialised where they are used, not broadcast.
    pub(crate) fn constant_like(&mut self, value: f64, x: NodeId) -> NodeId {
        self.full(value, self.dtype(x), self.shape(x))
    }

    /// `x * c`.
    pub(crate) fn scale(&mut self, x: NodeId, c: f64) -> NodeId {
        let c = self.constant_like(c, x);
        self.mul(x, c)
    }

    /// `c + x`.
    pub(crate) fn offset(&mut self, c: f64, x: NodeId) -> NodeId {
        let c = self.constant_like(c, x);
        self.add(c, x)
    }

    pub(crate) fn cast(&mut self, x: NodeId, dtype: DType) -> NodeId {
        if self.dtype(x) == dtype {
            return x;
        }
        self.push(Op::Cast, &[x], dtype, self.shape(x))
    }

    pub(crate) fn reshape(&mut self, x: NodeId, shape: Shape) -> NodeId {
        // A reshape to the shape `x` has is `x`: as a node it would be a view, and a graph output that
        // is a view is copied into a buffer of its own.
        if self.shape(x) == shape {
            return x;
        }
        self.push(Op::Reshape, &[x], self.dtype(x), shape)
    }

    /// `op` over `axes` of `x`: split into passes the device can spread (`split_reduce`) when the
    /// builder splits reductions, else one pass.
    pub(crate) fn reduce(&mut self, op: ReduceOp, x: NodeId, axes: &[usize], keepdim: bool) -> NodeId {
        let split = self.split_reductions.then(|| crate::split_reduce::split(self, op, x, axes, keepdim)).flatten();
        split.unwrap_or_else(|| self.reduce_whole(op, x, axes, keepdim))
    }

    /// `op` over `axes` of `x` in one pass.
    pub(crate) fn reduce_whole(&mut self, op: ReduceOp, x: NodeId, axes: &[usize], keepdim: bool) -> NodeId {
        let shape = reduced_shape(&self.shape(x), axes, keepdim);
        let dtype = reduce_dtype(op, self.dtype(x));
        self.push(Op::Reduce { op, axes: axes.to_vec(), keepdim }, &[x], dtype, shape)
    }

    /// Broadcasts `x` to `to` PyTorch-style: leading size-1 axes by `Reshape`, then `Expand`; nothing when
    /// the shapes already agree. A keepdim reduction's result needs only the `Expand`.
    pub(crate) fn broadcast(&mut self, x: NodeId, to: &Shape) -> NodeId {
        let s = self.shape(x);
        let mut x = x;
        if s.rank() < to.rank() {
            let mut dims = vec![Expr::from(1usize); to.rank() - s.rank()];
            dims.extend(s.dims().iter().cloned());
            x = self.reshape(x, Shape(dims));
        }
        if &self.shape(x) == to {
            return x;
        }
        self.push(Op::Expand, &[x], self.dtype(x), to.clone())
    }

    /// The mean of `x` over `axes`: `sum / count`.
    pub(crate) fn mean(&mut self, x: NodeId, axes: &[usize], keepdim: bool) -> Result<NodeId> {
        let s = self.reduce(ReduceOp::Sum, x, axes, keepdim);
        let n = self.count(x, axes, keepdim, 0)?;
        Ok(self.div(s, n))
    }

    /// How many elements a reduction of `x` over `axes` combines, less `minus`, at the reduced shape.
    ///
    /// A constant count is a constant; over symbolic axes the graph counts by summing ones, which a
    /// fused reduction gets almost for free and which serves every size the symbols take. Where nothing
    /// is left to divide by (count <= minus) the result is NaN, as the reference gives.
    pub(crate) fn count(&mut self, x: NodeId, axes: &[usize], keepdim: bool, minus: usize) -> Result<NodeId> {
        let shape = self.shape(x);
        let dtype = self.dtype(x);
        let mut n = Expr::from(1usize);
        for &a in axes {
            n = n.checked_mul(&shape.dims()[a])?;
        }
        let out = reduced_shape(&shape, axes, keepdim);
        if let Some(n) = n.as_const() {
            let d = n - minus as i64;
            // Dividing by NaN makes every result NaN, whatever the sum was.
            return Ok(self.full(if d > 0 { d as f64 } else { f64::NAN }, dtype, out));
        }
        let ones = self.full(1.0, dtype, shape);
        let n = self.reduce(ReduceOp::Sum, ones, axes, keepdim);
        if minus == 0 {
            // A count of zero gives 0/0 = NaN already.
            return Ok(n);
        }
        let m = self.constant_like(minus as f64, n);
        let d = self.sub(n, m);
        let zero = self.constant_like(0.0, d);
        let positive = self.binary(BinaryOp::Gt, d, zero);
        let nan = self.constant_like(f64::NAN, d);
        Ok(self.push(Op::Where, &[positive, d, nan], dtype, self.shape(d)))
    }

    /// One composite node, whose inputs are already in the output graph; returns its replacement.
    pub(crate) fn composite(&mut self, node: &Node, inputs: &[NodeId]) -> Result<NodeId> {
        let name = node.op.name();
        let bad =
            |msg: String| Error::Unsupported { what: format!("decomposing `{name}`: {msg}"), loc: node.loc.clone() };
        // A max pool is a max of slices, exact in any numeric dtype, and a convolution products, which
        // integers accumulate exactly; the rest compute in floats.
        let any_numeric = matches!(node.op, Op::Pool { mode: PoolKind::Max, .. } | Op::Conv { .. });
        if !any_numeric && (!node.dtype.is_float() || inputs.iter().any(|&i| !self.dtype(i).is_float())) {
            return Err(bad(format!("composites take float tensors, this one is {}", node.dtype)));
        }
        let arity = match &node.op {
            Op::LayerNorm { affine: true, .. } | Op::Linear { bias: true } | Op::Conv { bias: true, .. } => 3,
            Op::Linear { bias: false } | Op::Conv { bias: false, .. } => 2,
            _ => 1,
        };
        if inputs.len() != arity {
            return Err(bad(format!("expected {arity} input(s), got {}", inputs.len())));
        }
        let x = inputs[0];
        let rank = self.shape(x).rank();
        let axes_ok = |axes: &[usize]| axes.iter().all(|&a| a < rank);
        match &node.op {
            Op::Softmax { axis } | Op::LogSoftmax { axis } if !axes_ok(&[*axis]) => {
                return Err(bad(format!("axis {axis} of a rank-{rank} tensor")));
            }
            Op::Mean { axes, .. } | Op::Var { axes, .. } if !axes_ok(axes) => {
                return Err(bad(format!("axes {axes:?} of a rank-{rank} tensor")));
            }
            Op::LayerNorm { dims, .. } if *dims == 0 || *dims > rank => {
                return Err(bad(format!("normalising the last {dims} axes of a rank-{rank} tensor")));
            }
            Op::CausalMask if rank < 2 => return Err(bad(format!("needs rank >= 2, got {rank}"))),
            Op::Conv { window, .. } | Op::Pool { window, .. }
                if rank != window.stride.len() + 2
                    || window.padding.len() != window.stride.len()
                    || window.dilation.len() != window.stride.len()
                    || matches!(&node.op, Op::Pool { kernel, .. } if kernel.len() != window.stride.len()) =>
            {
                return Err(bad(format!("window {window:?} does not fit a rank-{rank} tensor")));
            }
            Op::LayerNorm { dims, affine: true, .. }
                if inputs[1..].iter().any(|&p| self.shape(p).dims() != &self.shape(x).dims()[rank - dims..]) =>
            {
                return Err(bad(format!("weight and bias must be shaped like the last {dims} axes")));
            }
            Op::Linear { bias } if !self.linear_fits(x, inputs[1], bias.then(|| inputs[2])) => {
                let (xs, ws) = (self.shape(x), self.shape(inputs[1]));
                return Err(bad(format!("input {xs} and weight {ws} are not [..., in] and [out, in]")));
            }
            // A select moves values without arithmetic, so it runs in any dtype.
            Op::CausalMask => return Ok(self.causal_mask(x)),
            // MatMul already accumulates exactly and rounds once (the reference and cuBLAS both do), so
            // widening a half-precision weight to f32 would only double its memory traffic.
            Op::Linear { bias } => return Ok(self.linear(x, inputs[1], bias.then(|| inputs[2]))),
            // Like linear: the matmul accumulates exactly and rounds once; max pooling only selects.
            Op::Conv { window, groups, bias } => {
                return Ok(self.conv(x, inputs[1], bias.then(|| inputs[2]), window, *groups));
            }
            Op::Pool { mode: PoolKind::Max, kernel, window } => {
                return Ok(self.pool(x, PoolKind::Max, kernel, window));
            }
            _ => {}
        }
        let ct = compute_dtype(node.dtype);
        let xs: Vec<NodeId> = inputs.iter().map(|&i| self.cast(i, ct)).collect();
        let x = xs[0];
        let y = match &node.op {
            Op::Softmax { axis } => self.softmax(x, *axis, false, node.dtype),
            Op::LogSoftmax { axis } => self.softmax(x, *axis, true, node.dtype),
            Op::LayerNorm { dims, eps, .. } => self.layer_norm(x, *dims, *eps, xs.get(1..).filter(|a| a.len() == 2))?,
            Op::Mean { axes, keepdim } => self.mean(x, axes, *keepdim)?,
            Op::Var { axes, correction, keepdim } => self.var(x, axes, *correction, *keepdim)?,
            Op::Gelu { approx } => self.gelu(x, *approx),
            Op::Pool { mode, kernel, window } => self.pool(x, *mode, kernel, window),
            Op::Silu => {
                let s = self.unary(UnaryOp::Sigmoid, x);
                self.mul(x, s)
            }
            _ => return Err(bad("no decomposition is known".into())),
        };
        Ok(self.cast(y, node.dtype))
    }

    /// `exp(x - m) / sum(exp(x - m))`, or its log `(x - m) - log(sum(exp(x - m)))`, with `m` the max
    /// along `axis`: the shift keeps `exp` finite for large inputs and cancels out of the result.
    /// `stored` is the dtype the result is rounded to: when it is a half type, the division becomes a
    /// product with each row's reciprocal (taken once a row), since `e · (1/s)` is within 1.5 ulp of
    /// the f32 quotient and rounding to 8 or 11 significant bits hides that (a correctly rounded f32
    /// quotient costs a persistent-row kernel about a third of its time in bf16).
    pub(crate) fn softmax(&mut self, x: NodeId, axis: usize, log: bool, stored: DType) -> NodeId {
        let shape = self.shape(x);
        let m = self.reduce(ReduceOp::Max, x, &[axis], true);
        let m = self.broadcast(m, &shape);
        let shifted = self.sub(x, m);
        let e = self.unary(UnaryOp::Exp, shifted);
        let s = self.reduce(ReduceOp::Sum, e, &[axis], true);
        if log {
            // The log is taken per row, before broadcasting, so it runs once per row.
            let ls = self.unary(UnaryOp::Log, s);
            let ls = self.broadcast(ls, &shape);
            self.sub(shifted, ls)
        } else if stored.is_half() {
            let r = self.unary(UnaryOp::Reciprocal, s);
            let r = self.broadcast(r, &shape);
            self.mul(e, r)
        } else {
            let s = self.broadcast(s, &shape);
            self.div(e, s)
        }
    }

    /// Two-pass variance: `sum((x - mean)^2) / (count - correction)`. The one-pass `E[x^2] - E[x]^2`
    /// cancels catastrophically when the mean is large next to the spread.
    pub(crate) fn var(&mut self, x: NodeId, axes: &[usize], correction: usize, keepdim: bool) -> Result<NodeId> {
        let shape = self.shape(x);
        let mean = self.mean(x, axes, true)?;
        let mean = self.broadcast(mean, &shape);
        let d = self.sub(x, mean);
        let sq = self.mul(d, d);
        let ss = self.reduce(ReduceOp::Sum, sq, axes, keepdim);
        let n = self.count(x, axes, keepdim, correction)?;
        Ok(self.div(ss, n))
    }

    /// `(x - mean) * rsqrt(var + eps)` over the last `dims` axes (two-pass, biased variance), then
    /// `* w + b` when `affine` holds `[w, b]`.
    pub(crate) fn layer_norm(&mut self, x: NodeId, dims: usize, eps: f64, affine: Option<&[NodeId]>) -> Result<NodeId> {
        let shape = self.shape(x);
        let axes: Vec<usize> = (shape.rank() - dims..shape.rank()).collect();
        let mean = self.mean(x, &axes, true)?;
        let mean = self.broadcast(mean, &shape);
        let d = self.sub(x, mean);
        let sq = self.mul(d, d);
        let var = self.mean(sq, &axes, true)?;
        // eps and rsqrt are applied per row, before broadcasting.
        let var = self.offset(eps, var);
        let rstd = self.unary(UnaryOp::Rsqrt, var);
        let rstd = self.broadcast(rstd, &shape);
        let y = self.mul(d, rstd);
        let Some(&[w, b]) = affine else { return Ok(y) };
        let w = self.broadcast(w, &shape);
        let b = self.broadcast(b, &shape);
        let y = self.mul(y, w);
        Ok(self.add(y, b))
    }

    pub(crate) fn gelu(&mut self, x: NodeId, approx: GeluApprox) -> NodeId {
        let inner = match approx {
            // erf(x / sqrt 2)
            GeluApprox::Erf => {
                let t = self.scale(x, std::f64::consts::FRAC_1_SQRT_2);
                self.unary(UnaryOp::Erf, t)
            }
            // tanh(sqrt(2/pi) * (x + 0.044715 x^3)); the cube is two multiplies because `pow` of a
            // negative base is NaN on some targets (WGSL).
            GeluApprox::Tanh => {
                let x2 = self.mul(x, x);
                let x3 = self.mul(x2, x);
                let c = self.scale(x3, 0.044715);
                let u = self.add(x, c);
                let u = self.scale(u, (2.0 / std::f64::consts::PI).sqrt());
                self.unary(UnaryOp::Tanh, u)
            }
        };
        let p = self.offset(1.0, inner);
        let half = self.scale(x, 0.5);
        self.mul(half, p)
    }

    /// `x @ w^T (+ b)` with `w` `[out, in]`: `w^T` is broadcast over `x`'s batch dims (MatMul reads
    /// equal batch dims), a rank-1 `x` becomes one row and back.
    pub(crate) fn linear(&mut self, x: NodeId, w: NodeId, bias: Option<NodeId>) -> NodeId {
        let dtype = self.dtype(x);
        let ws = self.shape(w);
        let (out_f, in_f) = (ws.dims()[0].clone(), ws.dims()[1].clone());
        let wt = self.push(Op::Permute { perm: vec![1, 0] }, &[w], dtype, Shape(vec![in_f.clone(), out_f.clone()]));
        let xs = self.shape(x);
        let vector = xs.rank() == 1;
        let x = if vector { self.reshape(x, Shape(vec![Expr::from(1usize), in_f.clone()])) } else { x };
        let mut out = self.shape(x).dims().to_vec();
        let r = out.len();
        let mut dims = out[..r - 2].to_vec();
        dims.extend([in_f, out_f.clone()]);
        let wt = self.broadcast(wt, &Shape(dims));
        out[r - 1] = out_f.clone();
        let mut y = self.push(Op::MatMul, &[x, wt], dtype, Shape(out));
        if vector {
            y = self.reshape(y, Shape(vec![out_f]));
        }
        match bias {
            Some(b) => {
                let b = self.broadcast(b, &self.shape(y));
                self.add(y, b)
            }
            None => y,
        }
    }

    pub(crate) fn linear_fits(&self, x: NodeId, w: NodeId, bias: Option<NodeId>) -> bool {
        let (xs, ws) = (self.shape(x), self.shape(w));
        xs.rank() >= 1
            && ws.rank() == 2
            && xs.dims()[xs.rank() - 1] == ws.dims()[1]
            && bias.is_none_or(|b| self.shape(b).dims() == &ws.dims()[..1])
    }

    /// `x` where column <= row in the last two axes, `-inf` above the diagonal. The mask is built once at
    /// `[q, k]` and broadcast over the batch axes.
    pub(crate) fn causal_mask(&mut self, x: NodeId) -> NodeId {
        let shape = self.shape(x);
        let r = shape.rank();
        let qk = Shape(shape.dims()[r - 2..].to_vec());
        let rows = self.push(Op::Iota { axis: 0 }, &[], DType::I64, qk.clone());
        let cols = self.push(Op::Iota { axis: 1 }, &[], DType::I64, qk);
        let keep = self.binary(BinaryOp::Le, cols, rows);
        let keep = self.broadcast(keep, &shape);
        let masked = self.constant_like(f64::NEG_INFINITY, x);
        self.push(Op::Where, &[keep, x, masked], self.dtype(x), shape)
    }
}
