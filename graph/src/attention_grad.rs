//! The attention in a training step: its gradient rule, what the backward ops compute, and their
//! written-out form for targets that do not fuse them.
//!
//! Written out, a training step keeps the `tq × tk` probabilities of every attention for its backward
//! pass and runs the softmax's gradient over them: at GPT-2 sizes that is hundreds of megabytes a layer.
//! Flash attention's backward keeps one number per query instead, the log-sum-exp of its scores
//! ([`Op::AttentionLse`]), and rebuilds the probabilities tile by tile where they are needed
//! ([`Op::AttentionGrad`]). The gradient rule is written once, here, in those ops; `decompose` either
//! keeps them (the target fuses them) or writes them out ([`WrittenAttentions`]), sharing the forward's
//! own scores and probabilities, so an unfused step computes the scores once. Written out, the scores and
//! `dp` are f32 products and `delta` is recomputed from them (see [`WrittenAttentions`]): more bytes than
//! half-precision products, for gradients within the tolerance rule.

use std::collections::HashMap;

use crate::autodiff::{matmul, transpose};
use crate::decompose::Builder;
use crate::ir::{AttentionPart, NodeId, Op, ReduceOp, UnaryOp};
use crate::shape::Shape;
use crate::DType;

/// The vector-Jacobian products of `out = attention(q, k, v)` for output gradient `g`: one
/// [`Op::AttentionGrad`] per operand, fed by the rows' log-sum-exp and `delta = sum(g * out, -1)`.
pub(crate) fn vjp(b: &mut Builder, out: NodeId, g: NodeId) -> Vec<(usize, NodeId)> {
    let node = b.graph.node(out).clone();
    let Op::Attention { scale, causal } = node.op else { return vec![] };
    let [q, k, v] = [node.inputs[0], node.inputs[1], node.inputs[2]];
    let lse = b.push(Op::AttentionLse { scale, causal }, &[q, k], DType::F32, without_last(&b.shape(q)));
    let delta = row_dot(b, g, out);
    let inputs = [q, k, v, g, lse, delta];
    [AttentionPart::Queries, AttentionPart::Keys, AttentionPart::Values]
        .into_iter()
        .enumerate()
        .map(|(i, part)| {
            let x = inputs[i];
            (i, b.push(Op::AttentionGrad { scale, causal, part }, &inputs, b.dtype(x), b.shape(x)))
        })
        .collect()
}

/// `sum(a * c, -1)` in f32: each query's `delta`.
fn row_dot(b: &mut Builder, a: NodeId, c: NodeId) -> NodeId {
    let (a, c) = (b.cast(a, DType::F32), b.cast(c, DType::F32));
    let p = b.mul(a, c);
    let r = b.shape(p).rank();
    b.reduce(ReduceOp::Sum, p, &[r - 1], false)
}

/// `shape` without its last axis: one value per row.
fn without_last(shape: &Shape) -> Shape {
    Shape(shape.dims()[..shape.rank() - 1].to_vec())
}

/// A per-row value (`[.., tq]`) broadcast along the rows of `shape` (`[.., tq, tk]`).
fn along_rows(b: &mut Builder, x: NodeId, shape: &Shape) -> NodeId {
    let mut kept = shape.dims().to_vec();
    kept[shape.rank() - 1] = 1usize.into();
    let x = b.reshape(x, Shape(kept));
    b.broadcast(x, shape)
}

/// One attention's operands and attributes, the key its written-out values are shared under.
type Key = (NodeId, NodeId, u64, bool);

/// The written-out scores and probabilities of each attention `decompose` has written out, so its
/// log-sum-exp and gradients read the forward's own values instead of computing them again.
///
/// Written out, an attention computes what the fused kernels compute: the scores and the probabilities
/// in f32, the probabilities rounded to the operands' dtype only where a product reads them (the
/// kernels' matrix instructions take them so), and each gradient's `p · (dp - delta)` in f32. Rounding
/// the scores or `dp` to half precision first (an ulp of 0.06 at 10) and then cancelling them against
/// values of the same size left bf16 gradients 10–20% of their scale off the exact ones. `delta` is
/// computed again as `sum_j p_ij dp_ij` from the same f32 values, so each row of `p · (dp - delta)` sums
/// to zero as the exact one does: the op's `delta` input (`sum(dout * out)`, which the fused kernels
/// read) carries the half-precision output's rounding, and where the forward too was written out that
/// put bf16 gradients up to 20% of their scale off. For f32 operands every cast is the operand itself.
#[derive(Default)]
pub(crate) struct WrittenAttentions {
    /// `(q, k, scale, causal)` → the scaled, masked scores, f32.
    scores: HashMap<Key, NodeId>,
    /// `(q, k, scale, causal)` → the probabilities, f32.
    probs: HashMap<Key, NodeId>,
    /// `(q, k, scale, causal)`, `v`, the output gradient, `lse`, `delta` → the scores' gradient, scaled,
    /// in the operands' dtype.
    score_grads: HashMap<(Key, [NodeId; 4]), NodeId>,
}

impl WrittenAttentions {
    /// `softmax(q @ kᵀ * scale [causal]) @ v` as explicit ops.
    pub(crate) fn attention(
        &mut self,
        b: &mut Builder,
        q: NodeId,
        k: NodeId,
        v: NodeId,
        scale: f64,
        causal: bool,
    ) -> NodeId {
        let p = self.probs(b, q, k, scale, causal, None);
        let p = b.cast(p, b.dtype(q));
        matmul(b, p, v)
    }

    /// [`Op::AttentionLse`] as explicit ops: max, then the log of the shifted sum.
    pub(crate) fn lse(&mut self, b: &mut Builder, q: NodeId, k: NodeId, scale: f64, causal: bool) -> NodeId {
        let s = self.scores(b, q, k, scale, causal);
        let r = b.shape(s).rank();
        let m = b.reduce(ReduceOp::Max, s, &[r - 1], true);
        let mb = b.broadcast(m, &b.shape(s));
        let shifted = b.sub(s, mb);
        let e = b.unary(UnaryOp::Exp, shifted);
        let sum = b.reduce(ReduceOp::Sum, e, &[r - 1], true);
        let log = b.unary(UnaryOp::Log, sum);
        let lse = b.add(log, m);
        let rows = without_last(&b.shape(lse));
        b.reshape(lse, rows)
    }

    /// [`Op::AttentionGrad`] as explicit ops (`inputs` as the op takes them).
    pub(crate) fn grad(
        &mut self,
        b: &mut Builder,
        inputs: &[NodeId],
        scale: f64,
        causal: bool,
        part: AttentionPart,
    ) -> NodeId {
        let [q, k, v, g, lse, delta] = [0, 1, 2, 3, 4, 5].map(|i| inputs[i]);
        let dtype = b.dtype(q);
        let p32 = self.probs(b, q, k, scale, causal, Some(lse));
        if part == AttentionPart::Values {
            let p = b.cast(p32, dtype);
            let pt = transpose(b, p);
            return matmul(b, pt, g);
        }
        let key = ((q, k, scale.to_bits(), causal), [v, g, lse, delta]);
        let ds = match self.score_grads.get(&key) {
            Some(&ds) => ds,
            None => {
                let vt = transpose(b, v);
                let (g32, vt32) = (b.cast(g, DType::F32), b.cast(vt, DType::F32));
                let dp = matmul(b, g32, vt32);
                let shape = b.shape(dp);
                // `delta` again, from the probabilities and `dp` it is subtracted from (see the type's doc).
                let pd = b.mul(p32, dp);
                let own = b.reduce(ReduceOp::Sum, pd, &[shape.rank() - 1], false);
                let d = along_rows(b, own, &shape);
                let centred = b.sub(dp, d);
                let ds = b.mul(p32, centred);
                let ds = b.scale(ds, scale);
                let ds = b.cast(ds, dtype);
                self.score_grads.insert(key, ds);
                ds
            }
        };
        match part {
            AttentionPart::Queries => matmul(b, ds, k),
            _ => {
                let dst = transpose(b, ds);
                matmul(b, dst, q)
            }
        }
    }

    /// `q @ kᵀ * scale` in f32, masked when `causal`.
    fn scores(&mut self, b: &mut Builder, q: NodeId, k: NodeId, scale: f64, causal: bool) -> NodeId {
        let key = (q, k, scale.to_bits(), causal);
        if let Some(&s) = self.scores.get(&key) {
            return s;
        }
        let kt = transpose(b, k);
        let (q32, kt32) = (b.cast(q, DType::F32), b.cast(kt, DType::F32));
        let s = matmul(b, q32, kt32);
        let s = b.scale(s, scale);
        let s = if causal { b.causal_mask(s) } else { s };
        self.scores.insert(key, s);
        s
    }

    /// The probabilities in f32: the forward's softmax, or (for a gradient whose forward was not written
    /// out) `exp(scores - lse)`.
    fn probs(
        &mut self,
        b: &mut Builder,
        q: NodeId,
        k: NodeId,
        scale: f64,
        causal: bool,
        lse: Option<NodeId>,
    ) -> NodeId {
        let key = (q, k, scale.to_bits(), causal);
        if let Some(&p) = self.probs.get(&key) {
            return p;
        }
        let s = self.scores(b, q, k, scale, causal);
        let r = b.shape(s).rank();
        let p = match lse {
            None => b.softmax(s, r - 1, false, DType::F32),
            Some(lse) => {
                let shape = b.shape(s);
                let l = along_rows(b, lse, &shape);
                let shifted = b.sub(s, l);
                b.unary(UnaryOp::Exp, shifted)
            }
        };
        self.probs.insert(key, p);
        p
    }
}

/// A query's probabilities, rebuilt from its log-sum-exp (zeros past the row's last key):
/// `p_ij = exp(q_i · k_j * scale - lse_i)`.
fn probs_row(q: &[f64], k: &[f64], lse: f64, keys: usize, d: usize, scale: f64, tk: usize) -> Vec<f64> {
    let mut p = crate::attention::scores_row(q, k, keys, d, scale);
    for x in &mut p {
        *x = (*x - lse).exp();
    }
    p.resize(tk, 0.0);
    p
}

/// What [`Op::AttentionLse`] computes, in f64: `q` `[batch, tq, d]`, `k` `[batch, tk, d]`, row-major.
pub fn lse_reference(q: &[f64], k: &[f64], [batch, tq, tk, d]: [usize; 4], scale: f64, causal: bool) -> Vec<f64> {
    let mut out = Vec::with_capacity(batch * tq);
    for b in 0..batch {
        for i in 0..tq {
            let keys = if causal { tk.min(i + 1) } else { tk };
            let s = crate::attention::scores_row(&q[(b * tq + i) * d..][..d], &k[b * tk * d..], keys, d, scale);
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            out.push(if keys == 0 { f64::NEG_INFINITY } else { m + s.iter().map(|x| (x - m).exp()).sum::<f64>().ln() });
        }
    }
    out
}

/// The operands of [`grad_reference`], each row-major with the batch flattened.
pub struct GradOperands<'a> {
    /// `[batch, tq, d]`.
    pub q: &'a [f64],
    /// `[batch, tk, d]`.
    pub k: &'a [f64],
    /// `[batch, tk, dv]`.
    pub v: &'a [f64],
    /// The output's gradient, `[batch, tq, dv]`.
    pub dout: &'a [f64],
    /// `[batch, tq]`.
    pub lse: &'a [f64],
    /// `[batch, tq]`.
    pub delta: &'a [f64],
}

/// What [`Op::AttentionGrad`] computes, in f64, for sizes `[batch, tq, tk, d, dv]`.
pub fn grad_reference(
    x: &GradOperands<'_>,
    [batch, tq, tk, d, dv]: [usize; 5],
    scale: f64,
    causal: bool,
    part: AttentionPart,
) -> Vec<f64> {
    let width = match part {
        AttentionPart::Queries => tq * d,
        AttentionPart::Keys => tk * d,
        AttentionPart::Values => tk * dv,
    };
    let mut out = vec![0.0; batch * width];
    for b in 0..batch {
        let (q, k) = (&x.q[b * tq * d..][..tq * d], &x.k[b * tk * d..][..tk * d]);
        let v = &x.v[b * tk * dv..][..tk * dv];
        let o = &mut out[b * width..][..width];
        for i in 0..tq {
            let keys = if causal { tk.min(i + 1) } else { tk };
            let row = b * tq + i;
            let p = probs_row(&q[i * d..][..d], k, x.lse[row], keys, d, scale, tk);
            let gi = &x.dout[row * dv..][..dv];
            for j in 0..keys {
                if part == AttentionPart::Values {
                    for (c, g) in gi.iter().enumerate() {
                        o[j * dv + c] += p[j] * g;
                    }
                    continue;
                }
                let dp: f64 = gi.iter().zip(&v[j * dv..][..dv]).map(|(a, c)| a * c).sum();
                let ds = p[j] * (dp - x.delta[row]) * scale;
                let (dst, src) = match part {
                    AttentionPart::Queries => (i, &k[j * d..][..d]),
                    _ => (j, &q[i * d..][..d]),
                };
                for (c, s) in src.iter().enumerate() {
                    o[dst * d + c] += ds * s;
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use crate::decompose::{decompose_for, Attentions};
    use crate::ir::Op;
    use crate::trace::{capture, TensorSpec};
    use crate::{DType, Target};

    /// A joint graph whose gradient op records a shape its written-out form does not give (a malformed
    /// saved graph) is a typed error naming the op, not a node copied through to lowering.
    #[test]
    fn a_gradient_op_recorded_with_the_wrong_shape_is_an_error() {
        let specs = [TensorSpec::new(DType::F32, &[2, 5, 4]), TensorSpec::new(DType::F32, &[2, 6, 4])];
        let g = capture(&specs, |t| {
            let s = t[0].matmul(&t[1].transpose(-1, -2)?)?.softmax(-1)?.matmul(&t[1])?;
            Ok(vec![s.sum(&[0, 1, 2], false)?])
        })
        .unwrap();
        let mut joint = crate::autodiff::grad_graph(&g, &[0]).unwrap();
        let target = Target::cuda(90);
        assert!(decompose_for(&joint, Attentions::For { target: &target, fuse: true }, true).is_ok());
        let grad = joint.nodes.iter_mut().find(|n| matches!(n.op, Op::AttentionGrad { .. })).unwrap();
        grad.shape = crate::shape::Shape(vec![7usize.into()]);
        let err = decompose_for(&joint, Attentions::For { target: &target, fuse: true }, true).unwrap_err();
        assert!(err.to_string().contains("attention_grad"), "{err}");
    }

    /// Test operands: the conformance suite's hash pattern, in [-2, 2].
    fn seeded(dtype: DType, dims: &[usize], salt: u32) -> crate::data::TensorData {
        let n: usize = dims.iter().product();
        let v = (0..n as u32).map(|i| ((i.wrapping_mul(2654435761) ^ salt) % 4001) as f64 / 1000.0 - 2.0).collect();
        crate::data::TensorData::from_f64(v, dims, dtype).unwrap()
    }

    /// Written out for a target that does not fuse it, a bf16 attention computes its scores and
    /// probabilities in f32 as the fused kernel does: within kiln's tolerance rule of the whole op's f64
    /// value, and no further from it than the model's own bf16 ops (which round the scores).
    #[test]
    fn a_written_out_bf16_attention_stays_within_the_rule_of_the_whole_op() {
        use crate::tolerance::{compare, Expected, Tolerance};
        let dt = DType::BF16;
        let specs = [
            TensorSpec::new(dt, &[2, 130, 64]),
            TensorSpec::new(dt, &[2, 130, 64]),
            TensorSpec::new(dt, &[2, 130, 64]),
        ];
        let g = capture(&specs, |t| {
            let s = t[0].matmul(&t[1].transpose(-1, -2)?)?.mul(0.125)?.causal_mask()?;
            Ok(vec![s.softmax(-1)?.matmul(&t[2])?])
        })
        .unwrap();
        let whole = decompose_for(&g, Attentions::Whole, false).unwrap().graph;
        assert!(whole.nodes.iter().any(|n| matches!(n.op, Op::Attention { .. })));
        let target = Target::webgpu_default();
        let written = decompose_for(&whole, Attentions::For { target: &target, fuse: true }, false).unwrap().graph;
        assert!(!written.nodes.iter().any(|n| matches!(n.op, Op::Attention { .. })), "written out");
        let ins = [seeded(dt, &[2, 130, 64], 44), seeded(dt, &[2, 130, 64], 45), seeded(dt, &[2, 130, 64], 46)];
        let refs: Vec<&crate::data::TensorData> = ins.iter().collect();
        let [want, got, user] = [&whole, &written, &g].map(|x| crate::interp::run(x, &refs).unwrap().remove(0));
        let outcome = compare(&got, &Expected::of(&want, "whole op"), Tolerance::of(&g).unwrap());
        assert!(outcome.correct, "{outcome:?}");
        let worst = |a: &crate::data::TensorData| {
            a.values().iter().zip(want.values()).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max)
        };
        assert!(worst(&got) <= worst(&user), "written out {} vs the model's ops {}", worst(&got), worst(&user));
    }
}
