//! ONNX's transformer ops (opset 23) as kiln ops. `Attention`: heads split from 3-D inputs, the key/value cache
//! concatenated (`past_key`/`past_value` → `present_*`), grouped-query heads repeated, boolean or additive
//! masks padded to the keys, the causal mask offset by the cache, per-entry key counts
//! (`nonpad_kv_seqlen`), softcap, and the four outputs. Written
//! as the ops a user would write (scores, mask, softmax, product), so `graph` fuses it as it fuses
//! attention written by hand.

use super::{invalid, reshape_to, unsupported, Node, OpResult};
use crate::value::Value;
use kiln_graph::sym::Expr;
use kiln_graph::{DType, Tensor};

/// The op types this family converts.
pub(super) const OPS: &[&str] = &["Attention", "RotaryEmbedding"];

/// The family; `None` when `op` is not one of it.
pub(super) fn run(node: &Node, op: &str) -> Option<OpResult<Vec<Value>>> {
    match op {
        "Attention" => Some(attention(node)),
        "RotaryEmbedding" => Some(rotary(node)),
        _ => None,
    }
}

/// `[batch, sequence, heads · head]` → `[batch, heads, sequence, head]`.
fn split_heads(x: &Tensor, heads: i64, what: &str) -> OpResult<Tensor> {
    let d = x.shape().dims().to_vec();
    let Some(hidden) = d[2].as_const() else {
        return unsupported(format!("Attention with a symbolic {what} width"));
    };
    if heads <= 0 || hidden % heads != 0 {
        return invalid(format!("{what} width {hidden} does not split into {heads} heads"));
    }
    let dims = [d[0].clone(), d[1].clone(), Expr::constant(heads), Expr::constant(hidden / heads)];
    Ok(reshape_to(x, &dims)?.permute(&[0, 2, 1, 3])?)
}

/// A constant size, or an error naming it.
fn known(e: &Expr, what: &str) -> OpResult<i64> {
    match e.as_const() {
        Some(v) => Ok(v),
        None => unsupported(format!("Attention with a symbolic {what}")),
    }
}

fn attention(node: &Node) -> OpResult<Vec<Value>> {
    let (q, k, v) = (node.tensor(0)?, node.tensor(1)?, node.tensor(2)?);
    let mask = node.opt_tensor(3)?;
    let (past_k, past_v) = (node.opt_tensor(4)?, node.opt_tensor(5)?);
    if [&mask, &past_k, &past_v].into_iter().flatten().any(|t| t.rank() < 2)
        || [&past_k, &past_v].into_iter().flatten().any(|t| t.rank() != 4)
    {
        return invalid("a mask of rank below 2, or a key/value cache of rank other than 4");
    }
    let rank = q.rank();
    if k.rank() != rank || v.rank() != rank || !(rank == 3 || rank == 4) {
        return invalid(format!("Q, K and V of ranks {}, {}, {} (3 or 4, all alike)", rank, k.rank(), v.rank()));
    }
    let (q, k, v) = if rank == 3 {
        let (qh, kvh) = (node.int("q_num_heads", 0), node.int("kv_num_heads", 0));
        if qh <= 0 || kvh <= 0 {
            return invalid("3-D inputs need q_num_heads and kv_num_heads");
        }
        (split_heads(&q, qh, "query")?, split_heads(&k, kvh, "key")?, split_heads(&v, kvh, "value")?)
    } else {
        (q, k, v)
    };
    let dtype = q.dtype();
    let head = known(&q.shape().dims()[3], "head size")?;
    let scale = node.attr("scale").map_or(1.0 / (head as f64).sqrt(), |a| f64::from(a.f()));
    // The cache: past entries first.
    let past = match &past_k {
        Some(p) => known(&p.shape().dims()[2], "cache length")?,
        None => 0,
    };
    let k = match &past_k {
        Some(p) => Tensor::concat(&[p, &k], 2)?,
        None => k,
    };
    let v = match &past_v {
        Some(p) => Tensor::concat(&[p, &v], 2)?,
        None => v,
    };
    let (present_k, present_v) = (k.clone(), v.clone());
    // Grouped-query attention: each key/value head serves `q_heads / kv_heads` consecutive query heads.
    let (qh, kvh) = (known(&q.shape().dims()[1], "head count")?, known(&k.shape().dims()[1], "head count")?);
    let (k, v) = if qh != kvh {
        if kvh == 0 || qh % kvh != 0 || known(&v.shape().dims()[1], "head count")? != kvh {
            return invalid(format!("{qh} query heads over {kvh} key/value heads"));
        }
        let repeat = |x: &Tensor| -> OpResult<Tensor> {
            let mut dims = x.shape().dims().to_vec();
            let expanded = x.unsqueeze(2)?.expand(&[-1, -1, (qh / kvh) as isize, -1, -1])?;
            dims[1] = Expr::constant(qh);
            reshape_to(&expanded, &dims)
        };
        (repeat(&k)?, repeat(&v)?)
    } else {
        (k, v)
    };
    let (q_len, total) = (known(&q.shape().dims()[2], "query length")?, known(&k.shape().dims()[2], "key length")?);
    let scores = q.matmul(&k.transpose(-1, -2)?)?.mul(scale)?;
    // The additive bias: the mask (a boolean one as 0 / -inf), padded with -inf to the keys, then the
    // causal mask (key j visible to query i when j <= i + the cache's length). Without a cache the causal
    // mask is kiln's own `causal_mask` on the scores, the pattern `graph` fuses into one attention kernel.
    let mut bias: Option<Tensor> = None;
    if let Some(m) = mask {
        let m = if m.dtype() == DType::Bool { m.where_(0.0, f64::NEG_INFINITY)?.cast(dtype)? } else { m.cast(dtype)? };
        let have = known(&m.shape().dims()[m.rank() - 1], "mask length")?;
        let m = match total - have {
            0 => m,
            short if short > 0 => {
                let mut pads = vec![(0usize, 0usize); m.rank()];
                pads[m.rank() - 1] = (0, short as usize);
                m.pad(&pads, f64::NEG_INFINITY)?
            }
            _ => return invalid(format!("a mask over {have} keys for {total}")),
        };
        bias = Some(m);
    }
    let causal = node.int("is_causal", 0) != 0;
    if causal && past > 0 {
        let i = Tensor::arange(0.0, q_len as f64, 1.0, DType::I64)?.reshape(&[q_len as isize, 1])?;
        let j = Tensor::arange(0.0, total as f64, 1.0, DType::I64)?.reshape(&[1, total as isize])?;
        let causal = j.sub(&i)?.le(past as f64)?.where_(0.0, f64::NEG_INFINITY)?.cast(dtype)?;
        bias = Some(match bias {
            Some(b) => b.add(&causal)?,
            None => causal,
        });
    }
    // `nonpad_kv_seqlen` (opset 24): batch entry b sees only its first n_b keys.
    if let Some(n) = node.opt_tensor(6)? {
        let batch = known(&q.shape().dims()[0], "batch")?;
        let j = Tensor::arange(0.0, total as f64, 1.0, DType::I64)?.reshape(&[1, total as isize])?;
        let keep = j.lt(&n.cast(DType::I64)?.reshape(&[batch as isize, 1])?)?;
        let padding =
            keep.where_(0.0, f64::NEG_INFINITY)?.cast(dtype)?.reshape(&[batch as isize, 1, 1, total as isize])?;
        bias = Some(match bias {
            Some(b) => b.add(&padding)?,
            None => padding,
        });
    }
    let biased = match &bias {
        Some(b) => scores.add(b)?,
        None => scores.clone(),
    };
    let biased = if causal && past == 0 { biased.causal_mask()? } else { biased };
    let softcap = node.float("softcap", 0.0);
    let capped = if softcap > 0.0 { biased.div(softcap)?.tanh()?.mul(softcap)? } else { biased.clone() };
    // `softmax_precision` (an ONNX dtype number): the softmax in f32 where the inputs are narrower.
    let widen = node.attr("softmax_precision").is_some() && dtype != DType::F32;
    let probs = if widen { capped.cast(DType::F32)?.softmax(-1)?.cast(dtype)? } else { capped.softmax(-1)? };
    let qk_output = match node.int("qk_matmul_output_mode", 0) {
        0 => scores,
        1 => biased,
        2 => capped,
        3 => probs.clone(),
        other => return invalid(format!("qk_matmul_output_mode {other} (0 to 3)")),
    };
    let y = probs.matmul(&v)?;
    let y = if rank == 3 {
        let d = y.shape().dims().to_vec();
        let width = Expr::constant(qh * known(&d[3], "value head size")?);
        reshape_to(&y.permute(&[0, 2, 1, 3])?, &[d[0].clone(), d[2].clone(), width])?
    } else {
        y
    };
    Ok([y, present_k, present_v, qk_output].into_iter().map(Value::Tensor).collect())
}

/// RotaryEmbedding: `x` as `[batch, heads, sequence, head]`, or `[batch, sequence, heads · head]` with
/// `num_heads`; each head's first `rotary_embedding_dim` elements (all by default) rotated pairwise by the
/// angles whose cosines and sines the caches hold (`[positions, dim / 2]` read at `position_ids`, or
/// `[batch, sequence, dim / 2]` as they are), the rest passed through.
fn rotary(node: &Node) -> OpResult<Vec<Value>> {
    let (x, cos, sin) = (node.tensor(0)?, node.tensor(1)?, node.tensor(2)?);
    let ids = node.opt_tensor(3)?;
    let dims: Vec<i64> = x.shape().dims().iter().map(|d| known(d, "RotaryEmbedding size")).collect::<OpResult<_>>()?;
    let x4 = match dims.len() {
        4 => x.permute(&[0, 2, 1, 3])?,
        3 => {
            let heads = node.int("num_heads", 0);
            if heads <= 0 || dims[2] % heads != 0 {
                return invalid(format!("a width of {} in {heads} heads (num_heads)", dims[2]));
            }
            x.reshape(&[dims[0] as isize, dims[1] as isize, heads as isize, (dims[2] / heads) as isize])?
        }
        r => return invalid(format!("a rank-{r} input (3 or 4)")),
    };
    let [batch, seq, _, head] = [0, 1, 2, 3].map(|a| known(&x4.shape().dims()[a], "size").unwrap_or(0));
    let rd = match node.int("rotary_embedding_dim", 0) {
        0 => head,
        d if d > 0 && d <= head && d % 2 == 0 => d,
        d => return invalid(format!("rotary_embedding_dim {d} for heads of {head}")),
    };
    let half = rd / 2;
    let cache = |c: Tensor| -> OpResult<Tensor> {
        let c = match &ids {
            Some(ids) => c.index_select(0, &ids.reshape(&[-1])?)?,
            None => c,
        };
        Ok(c.reshape(&[batch as isize, seq as isize, 1, half as isize])?)
    };
    let (cos, sin) = (cache(cos)?, cache(sin)?);
    let rot = x4.narrow(3, 0, rd as usize)?;
    let interleaved = node.int("interleaved", 0) != 0;
    let (x1, x2) = if interleaved {
        (rot.slice(3, 0, None, 2)?, rot.slice(3, 1, None, 2)?)
    } else {
        (rot.narrow(3, 0, half as usize)?, rot.narrow(3, half as usize, half as usize)?)
    };
    let real = cos.mul(&x1)?.sub(&sin.mul(&x2)?)?;
    let imag = sin.mul(&x1)?.add(&cos.mul(&x2)?)?;
    let rotated = if interleaved {
        Tensor::concat(&[&real.unsqueeze(-1)?, &imag.unsqueeze(-1)?], -1)?.reshape(&[
            batch as isize,
            seq as isize,
            -1,
            rd as isize,
        ])?
    } else {
        Tensor::concat(&[&real, &imag], -1)?
    };
    let out = if rd < head {
        Tensor::concat(&[&rotated, &x4.narrow(3, rd as usize, (head - rd) as usize)?], -1)?
    } else {
        rotated
    };
    let out = if dims.len() == 4 {
        out.permute(&[0, 2, 1, 3])?
    } else {
        out.reshape(&dims.iter().map(|&d| d as isize).collect::<Vec<_>>())?
    };
    Ok(vec![Value::Tensor(out)])
}
