//! A graph traced again through the ops at other sizes, for the minimizer: a reproducer reads best at
//! the smallest sizes that still fail. The IR keeps each node's shape, not how it was derived, so the
//! graph is replayed op by op through `Tensor`'s methods, which infer and check every shape: a size the
//! graph cannot take (a reshape that no longer divides, a slice past the end) is a typed error, and the
//! candidate is dropped.

use crate::data::TensorData;
use crate::error::{Error, Result};
use crate::ir::{ArgReduceOp, GeluApprox, Graph, Op, PoolKind, ReduceOp};
use crate::loc::SourceLoc;
use crate::trace::{capture, Tensor, TensorSpec};

/// `graph` with every constant size `from` (in its inputs' shapes and in the sizes its nodes name:
/// reshape and expand targets, constants' shapes, slice ends) made `to`, and `inputs` cut to their
/// leading corner at the new sizes. Graph inputs become arguments, in their order. An error where the
/// graph cannot be replayed at the new size, holds symbolic dims, or has an op whose meaning depends on
/// input values at the old size (an index into the resized axis).
pub fn resize(graph: &Graph, inputs: &[TensorData], from: usize, to: usize) -> Result<(Graph, Vec<TensorData>)> {
    if inputs.len() != graph.inputs.len() {
        return Err(Error::Unsupported {
            what: format!("resizing a graph of {} inputs given {} values", graph.inputs.len(), inputs.len()),
            loc: SourceLoc::internal(),
        });
    }
    let map = |d: usize| if d == from { to } else { d };
    let concrete =
        |n: &crate::ir::Node| n.shape.as_concrete().ok_or_else(|| unsupported("a graph with symbolic dims", &n.loc));
    let mut specs = Vec::with_capacity(graph.inputs.len());
    let mut data = Vec::with_capacity(graph.inputs.len());
    for (gi, d) in graph.inputs.iter().zip(inputs) {
        let node = graph.node(gi.node);
        let dims: Vec<usize> = concrete(node)?.into_iter().map(map).collect();
        data.push(corner(d, &dims)?);
        specs.push(TensorSpec::new(node.dtype, &dims));
    }
    let resized = capture(&specs, |args| {
        let mut made: Vec<Option<Tensor>> = vec![None; graph.nodes.len()];
        for (i, node) in graph.nodes.iter().enumerate() {
            let xs: Vec<Tensor> =
                node.inputs.iter().map(|x| made[x.index()].clone().expect("topological order")).collect();
            let t = match node.op {
                Op::Input { index } => args[index].clone(),
                _ => {
                    let old_in: Vec<Vec<usize>> =
                        node.inputs.iter().map(|x| concrete(graph.node(*x))).collect::<Result<_>>()?;
                    let target: Vec<usize> = concrete(node)?.into_iter().map(map).collect();
                    SourceLoc::attributed(node.loc.clone(), || replay(&node.op, &xs, &old_in, &target, node))?
                }
            };
            made[i] = Some(t);
        }
        Ok(graph.outputs.iter().map(|o| made[o.index()].clone().expect("outputs are nodes")).collect())
    })?;
    Ok((resized, data))
}

fn unsupported(what: &str, loc: &SourceLoc) -> Error {
    Error::Unsupported { what: format!("resizing {what}"), loc: loc.clone() }
}

/// One node's op on its replayed inputs `xs` (`old_in`: their sizes before; `target`: the node's own
/// sizes, resized).
fn replay(op: &Op, xs: &[Tensor], old_in: &[Vec<usize>], target: &[usize], node: &crate::ir::Node) -> Result<Tensor> {
    let isize_of = |v: &[usize]| v.iter().map(|&d| d as isize).collect::<Vec<_>>();
    let x = &xs[0];
    Ok(match op {
        Op::Input { .. } => unreachable!("inputs are arguments"),
        Op::Full { value } => Tensor::full(*value, target, node.dtype)?,
        Op::Rand { stream } => Tensor::rand_in(target, x, *stream)?,
        Op::Unary { op } => x.unary(*op, SourceLoc::caller())?,
        Op::Binary { op } => x.binary(*op, &xs[1], SourceLoc::caller())?,
        Op::Where => x.where_(&xs[1], &xs[2])?,
        Op::Cast => x.cast(node.dtype)?,
        Op::Reduce { op, axes, keepdim } => {
            let axes = isize_of(axes);
            match op {
                ReduceOp::Sum => x.sum(&axes, *keepdim)?,
                ReduceOp::Max => x.max(&axes, *keepdim)?,
                ReduceOp::Min => x.min(&axes, *keepdim)?,
            }
        }
        Op::ArgReduce { op: ArgReduceOp::ArgMax, axis, keepdim } => x.argmax(*axis as isize, *keepdim)?,
        Op::ArgReduce { op: ArgReduceOp::ArgMin, axis, keepdim } => x.argmin(*axis as isize, *keepdim)?,
        Op::Reshape => x.reshape(&isize_of(target))?,
        Op::Permute { perm } => x.permute(&isize_of(perm))?,
        Op::Expand => x.expand(&isize_of(target))?,
        Op::Slice { axis, start, end, step } => {
            let (Some(start), Some(end)) = (start.as_const(), end.as_const()) else {
                return Err(unsupported("a slice with symbolic bounds", &node.loc));
            };
            // A slice to the end of its axis still ends there; other bounds stay (and may now be past it).
            let (old, new) = (old_in[0][*axis] as i64, x.shape().as_concrete().map_or(0, |d| d[*axis]) as i64);
            let end = if end == old { new } else { end };
            if start > new || end > new {
                return Err(unsupported("a slice past its axis's new end", &node.loc));
            }
            x.slice(*axis as isize, start as isize, Some(end as isize), *step)?
        }
        Op::Concat { axis } => Tensor::concat(&xs.iter().collect::<Vec<_>>(), *axis as isize)?,
        Op::Pad { pads, value } => x.pad(pads, *value)?,
        Op::MatMul => x.matmul(&xs[1])?,
        Op::AllReduce { op } => x.all_reduce(*op)?,
        // Decomposition and gradients write these; a graph holding one is minimized at its own sizes.
        Op::Attention { .. } | Op::AttentionLse { .. } | Op::AttentionGrad { .. } => {
            return Err(unsupported("a fused attention node", &node.loc))
        }
        Op::Softmax { axis } => x.softmax(*axis as isize)?,
        Op::LogSoftmax { axis } => x.log_softmax(*axis as isize)?,
        Op::LayerNorm { dims, eps, affine } => {
            let (w, b) = if *affine { (xs.get(1), xs.get(2)) } else { (None, None) };
            x.layer_norm(*dims, w, b, *eps)?
        }
        Op::Gelu { approx: GeluApprox::Erf } => x.gelu()?,
        Op::Gelu { approx: GeluApprox::Tanh } => x.gelu_tanh()?,
        Op::Silu => x.silu()?,
        Op::Linear { bias } => x.linear(&xs[1], if *bias { xs.get(2) } else { None })?,
        Op::Mean { axes, keepdim } => x.mean(&isize_of(axes), *keepdim)?,
        Op::Var { axes, correction, keepdim } => x.var(&isize_of(axes), *correction, *keepdim)?,
        Op::CausalMask => x.causal_mask()?,
        Op::Conv { window, groups, bias } => x.conv(&xs[1], if *bias { xs.get(2) } else { None }, window, *groups)?,
        Op::Pool { mode: PoolKind::Max, kernel, window } => x.max_pool(kernel, window)?,
        Op::Pool { mode: PoolKind::Avg { count_include_pad }, kernel, window } => {
            x.avg_pool(kernel, window, *count_include_pad)?
        }
        // Index values chosen for the old sizes may point past the new ones; an iota's or an unfold's
        // sizes are derived ones the replay cannot map.
        Op::IndexSelect { .. } | Op::Gather { .. } | Op::Iota { .. } | Op::Unfold { .. } => {
            return Err(unsupported(&format!("`{}`", op.name()), &node.loc))
        }
    })
}

/// The leading corner of `d` at `dims` (each no larger than `d`'s own).
fn corner(d: &TensorData, dims: &[usize]) -> Result<TensorData> {
    let old = d.dims();
    if dims.len() != old.len() || dims.iter().zip(old).any(|(n, o)| n > o) {
        return Err(Error::Unsupported {
            what: format!("resizing an input of {old:?} to {dims:?}"),
            loc: SourceLoc::internal(),
        });
    }
    let strides = crate::shape::concrete_strides(old);
    let count: usize = dims.iter().product();
    let mut values = Vec::with_capacity(count);
    let mut at = vec![0usize; dims.len()];
    for _ in 0..count {
        values.push(d.values()[at.iter().zip(&strides).map(|(i, s)| i * s).sum::<usize>()]);
        // Odometer over `dims`, last axis fastest.
        for k in (0..dims.len()).rev() {
            at[k] += 1;
            if at[k] < dims[k] {
                break;
            }
            at[k] = 0;
        }
    }
    TensorData::from_f64(values, dims, d.dtype())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;

    #[test]
    fn a_graph_replays_at_a_smaller_size_with_its_inputs_cut() {
        let specs = [TensorSpec::new(DType::F32, &[4, 6]), TensorSpec::new(DType::F32, &[6])];
        let g = capture(&specs, |t| {
            let y = t[0].add(&t[1])?.softmax(-1)?.reshape(&[2, 2, 6])?.sum(&[1], false)?;
            Ok(vec![y.slice(1, 1, None, 1)?.tanh()?])
        })
        .expect("traces");
        let x = TensorData::from_f64((0..24).map(f64::from).collect(), &[4, 6], DType::F32).expect("x");
        let b = TensorData::from_f64((0..6).map(f64::from).collect(), &[6], DType::F32).expect("b");
        let (small, data) = resize(&g, &[x, b], 6, 3).expect("resizes");
        assert_eq!(data[0].dims(), &[4, 3]);
        assert_eq!(data[0].values(), &[0.0, 1.0, 2.0, 6.0, 7.0, 8.0, 12.0, 13.0, 14.0, 18.0, 19.0, 20.0]);
        assert_eq!(data[1].values(), &[0.0, 1.0, 2.0]);
        let out = small.node(small.outputs[0]);
        assert_eq!(out.shape.as_concrete(), Some(vec![2, 2]), "{small}");
        // The small graph computes what the same function does at the small size.
        let refs: Vec<&TensorData> = data.iter().collect();
        let got = crate::interp::run(&small, &refs).expect("runs");
        let want = {
            let x: Vec<f64> =
                data[0].values().iter().zip(data[1].values().iter().cycle()).map(|(a, b)| a + b).collect();
            let rows: Vec<Vec<f64>> = x
                .chunks(3)
                .map(|r| {
                    let m = r.iter().cloned().fold(f64::MIN, f64::max);
                    let e: Vec<f64> = r.iter().map(|v| (v - m).exp()).collect();
                    let s: f64 = e.iter().sum();
                    e.iter().map(|v| v / s).collect()
                })
                .collect();
            // [4, 3] as [2, 2, 3], summed over axis 1, then columns 1.. and tanh.
            (0..2)
                .flat_map(|i| (1..3).map(move |j| (i, j)))
                .map(|(i, j)| (rows[2 * i][j] + rows[2 * i + 1][j]).tanh())
                .collect::<Vec<_>>()
        };
        for (g, w) in got[0].values().iter().zip(&want) {
            assert!((g - w).abs() < 1e-6, "{:?} vs {want:?}", got[0].values());
        }
    }

    #[test]
    fn sizes_the_graph_cannot_take_are_errors() {
        let specs = [TensorSpec::new(DType::F32, &[4, 6])];
        let g = capture(&specs, |t| Ok(vec![t[0].reshape(&[8, 3])?])).expect("traces");
        let x = TensorData::from_f64(vec![0.0; 24], &[4, 6], DType::F32).expect("x");
        // [4, 5] has 20 elements: no [8, 3].
        assert!(resize(&g, std::slice::from_ref(&x), 6, 5).is_err());
        let g = capture(&specs, |t| Ok(vec![t[0].slice(1, 4, Some(6), 1)?])).expect("traces");
        assert!(resize(&g, std::slice::from_ref(&x), 6, 3).is_err(), "the slice starts past the new end");
        assert!(resize(&g, &[x], 6, 5).is_ok(), "its end follows the axis");
    }
}
