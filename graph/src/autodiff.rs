//! Reverse-mode automatic differentiation on the graph IR: a forward graph with one scalar output becomes
//! one joint graph computing the output and its gradient with respect to chosen inputs, so the backward
//! pass is fused, compiled and cached like any other graph (the AOTAutograd shape). Rules are written for
//! the primitives `decompose` leaves (composites differentiate through their decompositions).
//!
//! First slice of the training issue: pointwise ops, `where`, casts, sum/max/min reductions, reshape,
//! expand, permute, matmul, slices (any step), concatenation, padding, index selection (an embedding's
//! gradient) and gather. What a rule cannot do yet (sizes that are symbolic where it needs them
//! constant, a gather index smaller than its input) answers `Error::Unsupported` naming the op and the
//! user's line.

use crate::decompose::Builder;
use crate::error::{Error, Result};
use crate::ir::{BinaryOp, Graph, InputKind, NodeId, Op, ReduceOp, UnaryOp};
use crate::loc::SourceLoc;
use crate::shape::Shape;
use crate::sym::Expr;
use crate::trace::{capture, Tensor, TensorSpec};
use crate::DType;
use std::collections::HashSet;

/// The joint graph of `graph` (one output, a single element of a float dtype) and its gradient: outputs
/// are the value, then d value / d input for each input index in `wrt`, in that order (zeros for an input
/// the value does not depend on).
pub fn grad_graph(graph: &Graph, wrt: &[usize]) -> Result<Graph> {
    if graph.outputs.len() != 1 {
        return Err(unsupported("a gradient of a graph with other than one output", &SourceLoc::internal()));
    }
    Ok(joint_graph(graph, wrt, &HashSet::new())?.graph)
}

/// A joint graph built inside a trace ([`joint_graph`]), with what the trace needs to go on recording
/// on it.
pub(crate) struct Joint {
    /// Outputs: `graph`'s first output, its gradients (as [`grad_graph`]'s), then `graph`'s other outputs.
    pub graph: Graph,
    /// The nodes gradients must not flow through: the forward's nodes that came from the stopped ones,
    /// and every node the backward added (a gradient has no history of its own, as torch's `.grad`).
    pub stopped: HashSet<NodeId>,
    /// What the partitioner chose to read and to compute again ([`crate::remat::partition`]).
    pub partition: crate::remat::Partition,
}

/// [`grad_graph`] of `graph.outputs[0]`, keeping `graph`'s other outputs (the values a trace still holds)
/// and never differentiating through the nodes in `stop` (values made under `no_grad` or detached). The
/// forward part keeps its inputs in order, and the nodes before `Joint::graph`'s backward are
/// `graph`'s decomposed.
pub(crate) fn joint_graph(graph: &Graph, wrt: &[usize], stop: &HashSet<NodeId>) -> Result<Joint> {
    // Attentions stay whole, so their rule is flash attention's backward (see `attention_grad`).
    let decomposed = crate::decompose::decompose_keeping_attention(graph)?;
    let forward = decomposed.graph;
    let stopped: HashSet<NodeId> =
        (0..forward.nodes.len() as u32).map(NodeId).filter(|n| stop.contains(&decomposed.origin[n.index()])).collect();
    let Some((&out, kept)) = forward.outputs.split_first() else {
        return Err(unsupported("a gradient of a graph without an output", &SourceLoc::internal()));
    };
    let out_node = forward.node(out);
    if !out_node.dtype.is_float() || out_node.shape.numel().as_const() != Some(1) {
        return Err(unsupported(
            &format!("a gradient of a {} output of shape {} (needs one float element)", out_node.dtype, out_node.shape),
            &out_node.loc,
        ));
    }
    let n = forward.nodes.len();
    let inputs: Vec<NodeId> = wrt
        .iter()
        .map(|&w| {
            forward
                .nodes
                .iter()
                .position(|x| matches!(x.op, Op::Input { index } if index == w))
                .map(|i| NodeId(i as u32))
        })
        .collect::<Option<_>>()
        .ok_or_else(|| {
            unsupported("a gradient with respect to an input the graph does not have", &SourceLoc::internal())
        })?;
    // Which nodes depend on an input we differentiate by: only their rules run.
    let mut needed = vec![false; n];
    for &i in &inputs {
        needed[i.index()] = true;
    }
    for (i, node) in forward.nodes.iter().enumerate() {
        needed[i] |= node.dtype.is_float()
            && !stopped.contains(&NodeId(i as u32))
            && node.inputs.iter().any(|x| needed[x.index()]);
    }
    let mut b = Builder {
        origin: (0..n as u32).map(NodeId).collect(),
        graph: forward.clone(),
        from: out,
        loc: SourceLoc::internal(),
        // Reductions split when the backward graph is compiled (decomposition), not here.
        split_reductions: false,
        conv_row_products_bytes: 0,
        columns: crate::split_reduce::Columns::DEFAULT,
    };
    let mut grads: Vec<Option<NodeId>> = vec![None; n];
    grads[out.index()] = Some(b.constant_like(1.0, out));
    for i in (0..n).rev() {
        let Some(g) = grads[i] else { continue };
        let node = forward.nodes[i].clone();
        b.from = NodeId(i as u32);
        b.loc = node.loc.clone();
        for (k, contribution) in vjp(&mut b, NodeId(i as u32), g)? {
            let x = node.inputs[k];
            if !needed[x.index()] {
                continue;
            }
            grads[x.index()] = Some(match grads[x.index()] {
                Some(sum) => b.add(sum, contribution),
                None => contribution,
            });
        }
    }
    let mut outputs = vec![out];
    for &i in &inputs {
        outputs.push(grads[i.index()].unwrap_or_else(|| b.constant_like(0.0, i)));
    }
    outputs.extend_from_slice(kept);
    let mut joint = b.graph;
    joint.outputs = outputs;
    let (graph, partition) = crate::remat::partition(joint, n);
    let stopped = stopped.into_iter().chain((n as u32..graph.nodes.len() as u32).map(NodeId)).collect();
    Ok(Joint { graph, stopped, partition })
}

/// `f`'s value at `args` and its gradients with respect to `args[i]` for each `i` in `wrt` (the
/// functional form, as `jax.value_and_grad`): traces `f` once at these shapes and differentiates the
/// graph. Eagerly, the joint graph runs compiled and fused where eager ops on these tensors run (their
/// device, else the CPU reference). Inside a compiled function it joins the trace, so a whole train step
/// (forward, backward and the optimizer's update) is one graph, fused as one. Every tensor `f` reads
/// must be an argument (a captured weight is an error that says so); inside a trace the arguments'
/// shapes must be static (`Dynamic::Never`, or the first call's shapes).
#[track_caller]
pub fn value_and_grad(
    f: impl FnOnce(&[Tensor]) -> Result<Tensor>,
    args: &[Tensor],
    wrt: &[usize],
) -> Result<(Tensor, Vec<Tensor>)> {
    let loc = SourceLoc::caller();
    // Inside a trace the arguments' dims may be symbolic (a step compiled for every batch size): the
    // joint graph is built over the same symbols and spliced back into the trace that owns them.
    let specs: Vec<TensorSpec> = args.iter().map(|t| TensorSpec { dtype: t.dtype(), shape: t.shape() }).collect();
    let graph = capture(&specs, |t| Ok(vec![f(t)?]))?;
    if graph.inputs.iter().any(|i| !matches!(i.kind, InputKind::Arg { .. })) {
        return Err(unsupported(
            "a gradient of a function that reads a tensor it was not given (a captured weight): pass every tensor it reads as an argument",
            &loc,
        ));
    }
    let joint = joint_graph(&graph, wrt, &HashSet::new())?;
    let mut outs = match crate::trace::active() {
        Some(tracer) => {
            tracer.note_partition(joint.partition);
            crate::trace::splice(&joint.graph, args)?.into_iter()
        }
        None => run_joint(&joint.graph, args)?.into_iter(),
    };
    let value = outs.next().ok_or_else(|| unsupported("a joint graph without its value", &loc))?;
    Ok((value, outs.collect()))
}

/// Runs a joint graph eagerly on `args`, compiled and fused where eager ops on them run (their device,
/// else the CPU reference).
pub(crate) fn run_joint(joint: &Graph, args: &[Tensor]) -> Result<Vec<Tensor>> {
    let refs: Vec<&Tensor> = args.iter().collect();
    let backend = crate::trace::eager_backend(&refs);
    let compiled = match backend.target() {
        Some(target) => Some(crate::pipeline::compile_cached(joint, target, crate::fuse::FusionMode::Fused)?),
        None => None,
    };
    let values = args
        .iter()
        .map(|t| t.value().ok_or_else(|| unsupported("a tensor of another trace", &SourceLoc::internal())))
        .collect::<Result<Vec<_>>>()?;
    let outs =
        crate::backend::execute(backend.as_ref(), joint, compiled.as_ref(), &values, crate::backend::Mode::Default)?;
    Ok(outs.into_iter().map(Tensor::from_value).collect())
}

fn unsupported(what: &str, loc: &SourceLoc) -> Error {
    Error::Unsupported { what: what.into(), loc: loc.clone() }
}

/// `(input position, contribution to its gradient)` for node `y` given its gradient `g`.
fn vjp(b: &mut Builder, y: NodeId, g: NodeId) -> Result<Vec<(usize, NodeId)>> {
    let node = b.graph.node(y).clone();
    let x = |k: usize| node.inputs[k];
    Ok(match &node.op {
        Op::Input { .. } | Op::Full { .. } | Op::Iota { .. } | Op::Rand { .. } => vec![],
        Op::Unary { op } => unary(b, *op, x(0), y, g).map(|c| vec![(0, c)]).unwrap_or_default(),
        Op::Binary { op } => binary(b, *op, x(0), x(1), y, g),
        Op::Where => {
            let zero = b.constant_like(0.0, g);
            let a = b.push(Op::Where, &[x(0), g, zero], b.dtype(g), b.shape(g));
            let c = b.push(Op::Where, &[x(0), zero, g], b.dtype(g), b.shape(g));
            vec![(1, a), (2, c)]
        }
        Op::Cast => {
            let to = b.dtype(x(0));
            if to.is_float() {
                vec![(0, b.cast(g, to))]
            } else {
                vec![]
            }
        }
        Op::Reduce { op, axes, keepdim } => {
            let shape = b.shape(x(0));
            let kept = crate::shape::reduced_shape(&shape, axes, true);
            let gk = if *keepdim { g } else { b.reshape(g, kept.clone()) };
            match op {
                ReduceOp::Sum => vec![(0, b.broadcast(gk, &shape))],
                ReduceOp::Max | ReduceOp::Min => {
                    // To the elements equal to the extreme, split evenly among ties (as PyTorch does).
                    let yk = if *keepdim { y } else { b.reshape(y, kept) };
                    let yb = b.broadcast(yk, &shape);
                    let hit = b.binary(BinaryOp::Eq, x(0), yb);
                    let one = b.constant_like(1.0, x(0));
                    let zero = b.constant_like(0.0, x(0));
                    let ones = b.push(Op::Where, &[hit, one, zero], b.dtype(x(0)), shape.clone());
                    let count = b.reduce(ReduceOp::Sum, ones, axes, true);
                    let share = b.div(gk, count);
                    let share = b.broadcast(share, &shape);
                    vec![(0, b.push(Op::Where, &[hit, share, zero], b.dtype(x(0)), shape))]
                }
            }
        }
        Op::Reshape => vec![(0, b.reshape(g, b.shape(x(0))))],
        // Each rank's loss reads the reduced value: the world's gradient of it is reduced the same way
        // (the sum of every rank's share for a sum, their mean for a mean), as torch's functional
        // collectives differentiate.
        Op::AllReduce { op } => vec![(0, b.push(Op::AllReduce { op: *op }, &[g], b.dtype(g), b.shape(g)))],
        Op::Expand => {
            let (from, to) = (b.shape(x(0)), b.shape(y));
            let one = Expr::from(1usize);
            let axes: Vec<usize> = (0..from.rank()).filter(|&a| from.dims()[a] == one && to.dims()[a] != one).collect();
            let summed = if axes.is_empty() {
                g
            } else {
                match summed_product(b, g, &axes, &from) {
                    Some(folded) => folded,
                    None => b.reduce(ReduceOp::Sum, g, &axes, true),
                }
            };
            vec![(0, summed)]
        }
        Op::Permute { perm } => {
            if let Some(t) = transposed_product(b, g, perm, &b.shape(x(0))) {
                return Ok(vec![(0, t)]);
            }
            let mut inverse = vec![0; perm.len()];
            for (i, &p) in perm.iter().enumerate() {
                inverse[p] = i;
            }
            vec![(0, b.push(Op::Permute { perm: inverse }, &[g], b.dtype(g), b.shape(x(0))))]
        }
        Op::MatMul => {
            let (a, c) = (x(0), x(1));
            let at = transpose(b, a);
            let ct = transpose(b, c);
            let ga = matmul(b, g, ct);
            let gc = matmul(b, at, g);
            vec![(0, ga), (1, gc)]
        }
        Op::Slice { axis, start, end, step } => {
            let len = b.shape(x(0)).dims()[*axis].as_const();
            let (Some(s), Some(_), Some(len)) = (start.as_const(), end.as_const(), len) else {
                return Err(unsupported("the gradient of a slice with symbolic bounds", &node.loc));
            };
            vec![(0, unslice(b, g, *axis, s as usize, *step, len as usize)?)]
        }
        Op::Concat { axis } => {
            let mut at = 0usize;
            let mut out = Vec::new();
            for (k, &part) in node.inputs.iter().enumerate() {
                let Some(len) = b.shape(part).dims()[*axis].as_const() else {
                    return Err(unsupported("the gradient of a concatenation of symbolic sizes", &node.loc));
                };
                out.push((k, slice(b, g, *axis, at, at + len as usize)));
                at += len as usize;
            }
            out
        }
        Op::Pad { pads, .. } => {
            let shape = b.shape(x(0));
            let mut gx = g;
            for (axis, &(before, _)) in pads.iter().enumerate() {
                let Some(len) = shape.dims()[axis].as_const() else {
                    return Err(unsupported("the gradient of a padding of a symbolic size", &node.loc));
                };
                if b.shape(gx).dims()[axis] != shape.dims()[axis] {
                    gx = slice(b, gx, axis, before, before + len as usize);
                }
            }
            vec![(0, gx)]
        }
        Op::Unfold { kernel, window, .. } => vec![(0, unfold_grad(b, x(0), g, kernel, window, &node.loc)?)],
        Op::IndexSelect { axis } => vec![(0, index_select_grad(b, x(0), x(1), *axis, g, &node.loc)?)],
        Op::Gather { axis } => vec![(0, gather_grad(b, x(0), x(1), *axis, g, &node.loc)?)],
        Op::Attention { .. } => crate::attention_grad::vjp(b, y, g),
        other => return Err(unsupported(&format!("the gradient of {} (no rule yet)", other.name()), &node.loc)),
    })
}

/// The gradient of an unfold (col2im): each tap's slice of `g` put back where the tap read it — the
/// strided-slice gradient per spatial axis into the padded input — summed over taps, then the padding
/// cut off.
fn unfold_grad(
    b: &mut Builder,
    x: NodeId,
    g: NodeId,
    kernel: &[usize],
    window: &crate::conv::Window,
    loc: &SourceLoc,
) -> Result<NodeId> {
    let xs = b.shape(x);
    let gs = b.shape(g);
    let lens: Option<Vec<usize>> = xs.dims()[2..].iter().map(|d| d.as_const().map(|v| v as usize)).collect();
    let Some(lens) = lens else {
        return Err(unsupported("the gradient of an unfold over symbolic spatial sizes", loc));
    };
    let taps: usize = kernel.iter().product();
    let mut tap_dims = gs.dims().to_vec();
    tap_dims.remove(2);
    let mut total = None;
    for t in 0..taps {
        let mut gt = if taps == 1 { g } else { slice(b, g, 2, t, t + 1) };
        gt = b.reshape(gt, Shape(tap_dims.clone()));
        for (a, off) in crate::conv::tap_offsets(t, kernel).into_iter().enumerate() {
            let padded = lens[a] + window.padding[a].0 + window.padding[a].1;
            gt = unslice(b, gt, 2 + a, off * window.dilation[a], window.stride[a], padded)?;
        }
        total = Some(match total {
            None => gt,
            Some(acc) => b.binary(BinaryOp::Add, acc, gt),
        });
    }
    let mut gx = total.ok_or_else(|| unsupported("an unfold with no taps", loc))?;
    for (a, &len) in lens.iter().enumerate() {
        let before = window.padding[a].0;
        if window.padding[a] != (0, 0) {
            gx = slice(b, gx, 2 + a, before, before + len);
        }
    }
    Ok(gx)
}

/// `x[start..end]` along `axis` (constant bounds, step 1).
fn slice(b: &mut Builder, x: NodeId, axis: usize, start: usize, end: usize) -> NodeId {
    let mut dims = b.shape(x).dims().to_vec();
    dims[axis] = Expr::from(end - start);
    let op = Op::Slice { axis, start: Expr::from(start), end: Expr::from(end), step: 1 };
    b.push(op, &[x], b.dtype(x), Shape(dims))
}

/// Zero padding of `x` along one axis.
fn pad(b: &mut Builder, x: NodeId, axis: usize, before: usize, after: usize) -> Result<NodeId> {
    if before == 0 && after == 0 {
        return Ok(x);
    }
    let s = b.shape(x);
    let mut pads = vec![(0, 0); s.rank()];
    pads[axis] = (before, after);
    let mut dims = s.dims().to_vec();
    dims[axis] = dims[axis].checked_add(&Expr::from(before + after))?;
    Ok(b.push(Op::Pad { pads, value: 0.0 }, &[x], b.dtype(x), Shape(dims)))
}

/// The gradient of `x[start::step]` along `axis` (`len` long): `g` put back where the slice took its
/// elements, zeros elsewhere. A step of k spreads `g` first (each element followed by k − 1 zeros: a new
/// axis padded to k, then merged).
fn unslice(b: &mut Builder, g: NodeId, axis: usize, start: usize, step: usize, len: usize) -> Result<NodeId> {
    let shape = b.shape(g);
    let m = shape.dims()[axis].as_const().unwrap_or(0) as usize;
    let mut spread = g;
    let mut span = m;
    if step > 1 && m > 0 {
        let mut dims = shape.dims().to_vec();
        dims.insert(axis + 1, Expr::from(1usize));
        let r = b.reshape(g, Shape(dims));
        let p = pad(b, r, axis + 1, 0, step - 1)?;
        let mut merged = shape.dims().to_vec();
        merged[axis] = Expr::from(m * step);
        spread = b.reshape(p, Shape(merged));
        span = m * step;
    }
    if start + span > len {
        spread = slice(b, spread, axis, 0, len - start);
        span = len - start;
    }
    pad(b, spread, axis, start, len - start - span)
}

/// The gradient of `gather(x, axis, index)` for `x`: `g` added back at the positions `index` names along
/// `axis` (repeats add up), through a one-hot comparison along a new last axis of `x`'s length, summed
/// over `axis`. Needs `index` as large as `x` on the other axes (what `gather` over a whole tensor uses).
fn gather_grad(b: &mut Builder, x: NodeId, index: NodeId, axis: usize, g: NodeId, loc: &SourceLoc) -> Result<NodeId> {
    let (xs, gs) = (b.shape(x), b.shape(g));
    let r = xs.rank();
    let others_match = (0..r).all(|a| a == axis || xs.dims()[a] == gs.dims()[a]);
    let len = xs.dims()[axis].clone();
    if !others_match || len.as_const().is_none() {
        return Err(unsupported("the gradient of a gather whose index is smaller than its input on other axes", loc));
    }
    let dtype = b.dtype(g);
    let mut wide = gs.dims().to_vec();
    wide.push(len.clone());
    let wide = Shape(wide);
    let mut column = gs.dims().to_vec();
    column.push(Expr::from(1usize));
    let idx = b.reshape(index, Shape(column.clone()));
    let idx = b.broadcast(idx, &wide);
    let iota = b.push(Op::Iota { axis: r }, &[], b.dtype(index), wide.clone());
    let hit = b.binary(BinaryOp::Eq, idx, iota);
    let ge = b.reshape(g, Shape(column));
    let ge = b.broadcast(ge, &wide);
    let zero = b.full(0.0, dtype, wide.clone());
    let spread = b.push(Op::Where, &[hit, ge, zero], dtype, wide);
    // [.., 1 at axis, .., len] -> swap axis and the last -> [.., len at axis, .., 1] -> x's shape.
    let summed = b.reduce(ReduceOp::Sum, spread, &[axis], true);
    let mut perm: Vec<usize> = (0..=r).collect();
    perm.swap(axis, r);
    let mut dims = b.shape(summed).dims().to_vec();
    dims.swap(axis, r);
    let swapped = b.push(Op::Permute { perm }, &[summed], dtype, Shape(dims));
    Ok(b.reshape(swapped, xs))
}

/// The gradient of `index_select(x, axis, index)` for `x`: each selected row's gradient added back to
/// the row it came from (repeats add up), as `g` contracted with the one-hot matrix of `index`.
fn index_select_grad(
    b: &mut Builder,
    x: NodeId,
    index: NodeId,
    axis: usize,
    g: NodeId,
    loc: &SourceLoc,
) -> Result<NodeId> {
    let (xs, gs) = (b.shape(x), b.shape(g));
    let (len, n) = (xs.dims()[axis].clone(), gs.dims()[axis].clone());
    let idt = b.dtype(index);
    let dtype = b.dtype(g);
    // The rows selected may be symbolic (a batch of varying size: the contraction below runs over
    // them); the table's own length must be static.
    if len.as_const().is_none() {
        return Err(unsupported("the gradient of an index_select from a table of symbolic length", loc));
    }
    // one_hot[i, j] = (index[i] == j), [n, len], in g's dtype.
    let grid = Shape(vec![n.clone(), len.clone()]);
    let iota = b.push(Op::Iota { axis: 1 }, &[], idt, grid.clone());
    let column = b.reshape(index, Shape(vec![n.clone(), Expr::from(1usize)]));
    let column = b.broadcast(column, &grid);
    let hit = b.binary(BinaryOp::Eq, column, iota);
    let one = b.full(1.0, dtype, grid.clone());
    let zero = b.full(0.0, dtype, grid.clone());
    let one_hot = b.push(Op::Where, &[hit, one, zero], dtype, grid);
    // Move `axis` last, contract with the one-hot matrix, move it back.
    let r = gs.rank();
    let mut perm: Vec<usize> = (0..r).filter(|&a| a != axis).collect();
    perm.push(axis);
    let moved_dims: Vec<Expr> = perm.iter().map(|&a| gs.dims()[a].clone()).collect();
    let mut moved = b.push(Op::Permute { perm: perm.clone() }, &[g], dtype, Shape(moved_dims.clone()));
    if r == 1 {
        moved = b.reshape(moved, Shape(vec![Expr::from(1usize), n.clone()]));
    }
    let ms = b.shape(moved);
    let mut batch = ms.dims()[..ms.rank() - 2].to_vec();
    batch.extend([n.clone(), len.clone()]);
    let one_hot = b.broadcast(one_hot, &Shape(batch));
    let summed = matmul(b, moved, one_hot);
    let mut back_dims = moved_dims;
    *back_dims.last_mut().expect("rank >= 1") = len;
    let summed = if r == 1 { b.reshape(summed, Shape(back_dims.clone())) } else { summed };
    let mut inverse = vec![0; r];
    for (i, &p) in perm.iter().enumerate() {
        inverse[p] = i;
    }
    Ok(b.push(Op::Permute { perm: inverse }, &[summed], dtype, xs))
}

/// A batched product summed over all its batch axes, `sum_b p_b @ q_b`, as one product over the batch
/// folded into the reduction: `[K, B·M] @ [B·M, N]`. A linear layer's weight gradient is this (the weight
/// is broadcast over the batch, so its gradient sums one product per batch entry): one GEMM with a deep
/// reduction instead of `B` products written out and summed by another kernel, as torch computes it.
/// The batched product `g` is left unread (the pipeline drops dead nodes). `None` unless `g` is such a
/// product and `axes` are exactly its batch axes.
fn summed_product(b: &mut Builder, g: NodeId, axes: &[usize], to: &Shape) -> Option<NodeId> {
    let node = b.graph.node(g).clone();
    let r = node.shape.rank();
    if node.op != Op::MatMul || r < 3 || axes != (0..r - 2).collect::<Vec<_>>().as_slice() {
        return None;
    }
    let (p, q) = (node.inputs[0], node.inputs[1]);
    let (ps, qs) = (b.shape(p), b.shape(q));
    if ps.rank() != r || qs.rank() != r || ps.dims()[..r - 2] != qs.dims()[..r - 2] {
        return None;
    }
    let (k, m, n) = (ps.dims()[r - 2].clone(), ps.dims()[r - 1].clone(), qs.dims()[r - 1].clone());
    let rows = ps.dims()[..r - 2].iter().fold(m.clone(), |acc, d| acc * d.clone());
    // p's rows (K) first, then its batch and columns in order: `(b, m)` runs as q's rows do.
    let mut perm = vec![r - 2];
    perm.extend(0..r - 2);
    perm.push(r - 1);
    let mut dims: Vec<Expr> = vec![k.clone()];
    dims.extend(ps.dims()[..r - 2].iter().cloned());
    dims.push(m);
    let pt = b.push(Op::Permute { perm }, &[p], b.dtype(p), Shape(dims));
    let pf = b.reshape(pt, Shape(vec![k, rows.clone()]));
    let qf = b.reshape(q, Shape(vec![rows, n]));
    let product = matmul(b, pf, qf);
    Some(b.reshape(product, to.clone()))
}

/// `g` transposed (`perm` swaps its last two axes) as the product computed the other way round,
/// `(p q)ᵀ = qᵀ pᵀ`, reshaped to `to`, when `g` is a product (through reshapes that keep its last two dims)
/// made by the backward pass. Such a product is a cotangent, read by this rule alone; computed transposed,
/// the GEMM writes the layout its reader wants instead of every reader loading it at a stride. A linear
/// layer's weight gradient is this: its product is `[in, out]`, the weight `[out, in]`, and the optimizer
/// read each element 3072 elements from the last (half its bandwidth on W5's train step).
fn transposed_product(b: &mut Builder, g: NodeId, perm: &[usize], to: &Shape) -> Option<NodeId> {
    let r = perm.len();
    let swaps = r >= 2 && perm[..r - 2].iter().enumerate().all(|(i, &p)| p == i) && perm[r - 2..] == [r - 1, r - 2];
    if !swaps {
        return None;
    }
    let last_two = |s: &Shape| s.dims()[s.rank().saturating_sub(2)..].to_vec();
    let mut at = g;
    while b.graph.node(at).op == Op::Reshape && b.shape(at).rank() >= 2 {
        let inner = b.graph.node(at).inputs[0];
        if b.shape(inner).rank() < 2 || last_two(&b.shape(inner)) != last_two(&b.shape(at)) {
            return None;
        }
        at = inner;
    }
    let node = b.graph.node(at).clone();
    if node.op != Op::MatMul {
        return None;
    }
    let (p, q) = (node.inputs[0], node.inputs[1]);
    let (ps, qs) = (b.shape(p), b.shape(q));
    if ps.rank() != qs.rank() || ps.dims()[..ps.rank() - 2] != qs.dims()[..qs.rank() - 2] {
        return None;
    }
    let (pt, qt) = (transpose(b, p), transpose(b, q));
    let product = matmul(b, qt, pt);
    Some(b.reshape(product, to.clone()))
}

/// The last two axes swapped.
pub(crate) fn transpose(b: &mut Builder, x: NodeId) -> NodeId {
    let s = b.shape(x);
    let r = s.rank();
    let mut perm: Vec<usize> = (0..r).collect();
    perm.swap(r - 2, r - 1);
    let mut dims = s.dims().to_vec();
    dims.swap(r - 2, r - 1);
    b.push(Op::Permute { perm }, &[x], b.dtype(x), Shape(dims))
}

/// `[.., m, k] @ [.., k, n]` with equal batch dims.
pub(crate) fn matmul(b: &mut Builder, a: NodeId, c: NodeId) -> NodeId {
    let (sa, sc) = (b.shape(a), b.shape(c));
    let mut dims = sa.dims()[..sa.rank() - 1].to_vec();
    dims.push(sc.dims()[sc.rank() - 1].clone());
    b.push(Op::MatMul, &[a, c], b.dtype(a), Shape(dims))
}

/// The contribution of a unary op's gradient; `None` where it is zero or undefined (rounding, bools).
fn unary(b: &mut Builder, op: UnaryOp, x: NodeId, y: NodeId, g: NodeId) -> Option<NodeId> {
    use UnaryOp as U;
    Some(match op {
        U::Neg => b.unary(U::Neg, g),
        U::Exp => b.mul(g, y),
        U::Log => b.div(g, x),
        U::Sqrt => {
            let two_y = b.scale(y, 2.0);
            b.div(g, two_y)
        }
        U::Rsqrt => {
            let y2 = b.mul(y, y);
            let y3 = b.mul(y2, y);
            let d = b.scale(y3, -0.5);
            b.mul(g, d)
        }
        U::Sin => {
            let c = b.unary(U::Cos, x);
            b.mul(g, c)
        }
        U::Cos => {
            let s = b.unary(U::Sin, x);
            let s = b.unary(U::Neg, s);
            b.mul(g, s)
        }
        U::Tanh => {
            let y2 = b.mul(y, y);
            let one = b.constant_like(1.0, y);
            let d = b.sub(one, y2);
            b.mul(g, d)
        }
        U::Sigmoid => {
            let one = b.constant_like(1.0, y);
            let rest = b.sub(one, y);
            let d = b.mul(y, rest);
            b.mul(g, d)
        }
        U::Erf => {
            let x2 = b.mul(x, x);
            let e = b.unary(U::Neg, x2);
            let e = b.unary(U::Exp, e);
            let d = b.scale(e, 2.0 / std::f64::consts::PI.sqrt());
            b.mul(g, d)
        }
        U::Relu => {
            let zero = b.constant_like(0.0, x);
            let on = b.binary(BinaryOp::Gt, x, zero);
            b.push(Op::Where, &[on, g, zero], b.dtype(g), b.shape(g))
        }
        U::Reciprocal => {
            let y2 = b.mul(y, y);
            let d = b.unary(U::Neg, y2);
            b.mul(g, d)
        }
        U::Abs => {
            let zero = b.constant_like(0.0, x);
            let pos = b.binary(BinaryOp::Gt, x, zero);
            let neg = b.binary(BinaryOp::Lt, x, zero);
            let minus = b.unary(U::Neg, g);
            let low = b.push(Op::Where, &[neg, minus, zero], b.dtype(g), b.shape(g));
            b.push(Op::Where, &[pos, g, low], b.dtype(g), b.shape(g))
        }
        U::Floor | U::Ceil | U::Round | U::Not | U::IsNan => return None,
    })
}

/// The contributions of a binary op's gradient to its two inputs (none for comparisons and logic).
fn binary(b: &mut Builder, op: BinaryOp, x: NodeId, z: NodeId, y: NodeId, g: NodeId) -> Vec<(usize, NodeId)> {
    use BinaryOp as B;
    if b.dtype(y) == DType::Bool {
        return vec![];
    }
    match op {
        B::Add => vec![(0, g), (1, g)],
        B::Sub => vec![(0, g), (1, b.unary(UnaryOp::Neg, g))],
        B::Mul => vec![(0, b.mul(g, z)), (1, b.mul(g, x))],
        B::Div => {
            let gx = b.div(g, z);
            let q = b.mul(gx, y);
            vec![(0, gx), (1, b.unary(UnaryOp::Neg, q))]
        }
        B::Pow => {
            // d(x^z)/dx = z·x^(z−1); d(x^z)/dz = x^z·ln x.
            let one = b.constant_like(1.0, z);
            let zm1 = b.sub(z, one);
            let p = b.binary(B::Pow, x, zm1);
            let d = b.mul(z, p);
            let gx = b.mul(g, d);
            let ln = b.unary(UnaryOp::Log, x);
            let d = b.mul(y, ln);
            vec![(0, gx), (1, b.mul(g, d))]
        }
        B::Max | B::Min => {
            // To the larger (smaller) operand; half to each on a tie, as PyTorch does.
            let wins = b.binary(if op == B::Max { B::Gt } else { B::Lt }, x, z);
            let tie = b.binary(B::Eq, x, z);
            let zero = b.constant_like(0.0, g);
            let half = b.scale(g, 0.5);
            let tie_share = b.push(Op::Where, &[tie, half, zero], b.dtype(g), b.shape(g));
            let gx = b.push(Op::Where, &[wins, g, tie_share], b.dtype(g), b.shape(g));
            let loses = b.binary(if op == B::Max { B::Lt } else { B::Gt }, x, z);
            let gz = b.push(Op::Where, &[loses, g, tie_share], b.dtype(g), b.shape(g));
            vec![(0, gx), (1, gz)]
        }
        _ => vec![],
    }
}
