//! ONNX's recurrent layers — `RNN`, `GRU`, `LSTM` — unrolled over the sequence (its length is static):
//! the input's products with every gate's weights for all steps at once (one matmul), then a step's
//! product with the recurrent weights and its gates per time step, forward, reverse or both ways.
//! Per-sequence lengths (`sequence_lens`) hold a finished sequence's state and write zeros past its
//! end (forward direction; the reverse direction needs every sequence full).

use super::{invalid, unsupported, Node, OpResult};
use crate::value::Value;
use kiln_graph::Tensor;

/// The op types this family converts.
pub(super) const OPS: &[&str] = &["RNN", "GRU", "LSTM"];

/// The longest sequence unrolled (each step is a handful of graph nodes), as `Loop`'s bound.
pub(super) const MAX_STEPS: usize = crate::model::MAX_LOOP_ITERATIONS;

/// The family; `None` when `op` is not one of it.
pub(super) fn run(node: &Node, op: &str) -> Option<OpResult<Vec<Value>>> {
    let kind = match op {
        "RNN" => Kind::Rnn,
        "GRU" => Kind::Gru,
        "LSTM" => Kind::Lstm,
        _ => return None,
    };
    Some(recurrent(node, kind))
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Rnn,
    Gru,
    Lstm,
}

impl Kind {
    /// Gates stacked in the weights.
    fn gates(self) -> usize {
        match self {
            Kind::Rnn => 1,
            Kind::Gru => 3,
            Kind::Lstm => 4,
        }
    }

    /// ONNX's default activations of one direction.
    fn default_activations(self) -> &'static [&'static str] {
        match self {
            Kind::Rnn => &["Tanh"],
            Kind::Gru => &["Sigmoid", "Tanh"],
            Kind::Lstm => &["Sigmoid", "Tanh", "Tanh"],
        }
    }
}

/// An activation by its ONNX name (those without parameters).
fn activate(name: &str, x: &Tensor) -> OpResult<Tensor> {
    Ok(match name {
        "Sigmoid" => x.sigmoid()?,
        "Tanh" => x.tanh()?,
        "Relu" => x.relu()?,
        other => return unsupported(format!("activation {other:?}")),
    })
}

/// Columns `k * h .. (k + 1) * h` of `x` (`[batch, gates * h]`): gate `k`.
fn gate(x: &Tensor, k: usize, h: usize) -> kiln_graph::Result<Tensor> {
    x.narrow(1, k * h, h)
}

fn recurrent(node: &Node, kind: Kind) -> OpResult<Vec<Value>> {
    let (x, w, r) = (node.tensor(0)?, node.tensor(1)?, node.tensor(2)?);
    let (b, lens, h0) = (node.opt_tensor(3)?, node.opt_tensor(4)?, node.opt_tensor(5)?);
    let (c0, peep) = match kind {
        Kind::Lstm => (node.opt_tensor(6)?, node.opt_tensor(7)?),
        _ => (None, None),
    };
    if kind == Kind::Lstm && node.int("input_forget", 0) != 0 {
        return unsupported("LSTM with input_forget");
    }
    let batchwise = node.int("layout", 0) != 0;
    let x = if batchwise { x.transpose(0, 1)? } else { x };
    let Some(xd) = x.shape().as_concrete() else { return unsupported("a recurrence over symbolic dims") };
    let Some(wd) = w.shape().as_concrete() else { return unsupported("symbolic recurrent weights") };
    let g = kind.gates();
    if xd.len() != 3 || wd.len() != 3 || wd[1] % g != 0 || wd[2] != xd[2] {
        return invalid(format!("input {xd:?} and weights {wd:?}"));
    }
    let (seq, batch, dirs, h) = (xd[0], xd[1], wd[0], wd[1] / g);
    if seq > MAX_STEPS {
        return unsupported(format!("a sequence of {seq} steps (unrolled: at most {MAX_STEPS})"));
    }
    let direction = node.string("direction").unwrap_or_else(|| "forward".into());
    let ways: Vec<bool> = match (direction.as_str(), dirs) {
        ("forward", 1) => vec![false],
        ("reverse", 1) => vec![true],
        ("bidirectional", 2) => vec![false, true],
        (d, n) => return invalid(format!("direction {d:?} with weights for {n}")),
    };
    if node.int("hidden_size", h as i64) != h as i64 {
        return invalid(format!("hidden_size {} for weights of {h}", node.int("hidden_size", 0)));
    }
    let acts: Vec<String> = match node.proto.attribute.iter().find(|a| a.name() == "activations") {
        Some(a) => a.strings.iter().map(|s| String::from_utf8_lossy(s).into_owned()).collect(),
        None => ways.iter().flat_map(|_| kind.default_activations().iter().map(|s| s.to_string())).collect(),
    };
    let per = kind.default_activations().len();
    if acts.len() != per * dirs {
        return invalid(format!("{} activations for {dirs} direction(s)", acts.len()));
    }
    let clip = node.proto.attribute.iter().any(|a| a.name() == "clip").then(|| node.float("clip", 0.0));
    let clipped = |t: Tensor| -> kiln_graph::Result<Tensor> {
        match clip {
            Some(c) => t.maximum(-c)?.minimum(c),
            None => Ok(t),
        }
    };
    // Steps past a sequence's length hold its state and output zeros (forward only).
    let live: Option<Vec<Tensor>> = match &lens {
        None => None,
        Some(l) => {
            if ways.contains(&true) {
                return unsupported("sequence_lens with a reverse direction");
            }
            let l = l.cast(kiln_graph::DType::I64)?.reshape(&[batch as isize, 1])?;
            Some((0..seq).map(|t| l.gt(t as f64)).collect::<kiln_graph::Result<_>>()?)
        }
    };
    let dt = x.dtype();
    let (bi, hi) = (batch as isize, h as isize);
    let zeros = || Tensor::zeros(&[batch, h], dt);
    let (mut ys, mut last_h, mut last_c) = (Vec::new(), Vec::new(), Vec::new());
    for (d, &reverse) in ways.iter().enumerate() {
        let take = |t: &Tensor, rows: usize| -> kiln_graph::Result<Tensor> {
            t.narrow(0, d, 1)?.reshape(&[rows as isize, -1])
        };
        let (wd, rd) = (take(&w, g * h)?, take(&r, g * h)?);
        let (wb, rb) = match &b {
            Some(b) => {
                let bd = b.narrow(0, d, 1)?.reshape(&[2 * g as isize * hi])?;
                (Some(bd.narrow(0, 0, g * h)?), Some(bd.narrow(0, g * h, g * h)?))
            }
            None => (None, None),
        };
        // Every step's input products at once: [seq, batch, gates * h].
        let mut xw = x.matmul(&wd.transpose(0, 1)?)?;
        if let Some(wb) = &wb {
            xw = xw.add(wb)?;
        }
        let act = |k: usize, t: &Tensor| activate(&acts[d * per + k], t);
        let mut hs = match &h0 {
            Some(h0) => h0.narrow(0, d, 1)?.reshape(&[bi, hi])?,
            None => zeros()?,
        };
        let mut cs = match &c0 {
            Some(c0) => c0.narrow(0, d, 1)?.reshape(&[bi, hi])?,
            None => zeros()?,
        };
        let p = match &peep {
            Some(p) => Some(p.narrow(0, d, 1)?.reshape(&[3 * hi])?),
            None => None,
        };
        let mut out: Vec<Option<Tensor>> = vec![None; seq];
        let order: Vec<usize> = if reverse { (0..seq).rev().collect() } else { (0..seq).collect() };
        for t in order {
            let xt = xw.narrow(0, t, 1)?.reshape(&[bi, g as isize * hi])?;
            let recurrent = |state: &Tensor, k0: usize, n: usize| -> kiln_graph::Result<Tensor> {
                let rows = rd.narrow(0, k0 * h, n * h)?;
                let mut y = state.matmul(&rows.transpose(0, 1)?)?;
                if let Some(rb) = &rb {
                    y = y.add(&rb.narrow(0, k0 * h, n * h)?)?;
                }
                Ok(y)
            };
            let (h_new, c_new) = match kind {
                Kind::Rnn => (act(0, &clipped(xt.add(&recurrent(&hs, 0, 1)?)?)?)?, None),
                Kind::Gru => {
                    let zr = xt.narrow(1, 0, 2 * h)?.add(&recurrent(&hs, 0, 2)?)?;
                    let z = act(0, &clipped(gate(&zr, 0, h)?)?)?;
                    let rg = act(0, &clipped(gate(&zr, 1, h)?)?)?;
                    let hx = gate(&xt, 2, h)?;
                    let hr = match node.int("linear_before_reset", 0) {
                        0 => recurrent(&rg.mul(&hs)?, 2, 1)?,
                        _ => rg.mul(&recurrent(&hs, 2, 1)?)?,
                    };
                    let cand = act(1, &clipped(hx.add(&hr)?)?)?;
                    (z.neg()?.add(1.0)?.mul(&cand)?.add(&z.mul(&hs)?)?, None)
                }
                Kind::Lstm => {
                    let pre = xt.add(&recurrent(&hs, 0, 4)?)?;
                    let peephole = |k: usize, c: &Tensor| -> kiln_graph::Result<Option<Tensor>> {
                        p.as_ref().map(|p| p.narrow(0, k * h, h)?.mul(c)).transpose()
                    };
                    let with = |t: Tensor, extra: Option<Tensor>| match extra {
                        Some(e) => t.add(&e),
                        None => Ok(t),
                    };
                    // Gates i, o, f, c; peepholes i, o, f.
                    let i = act(0, &clipped(with(gate(&pre, 0, h)?, peephole(0, &cs)?)?)?)?;
                    let f = act(0, &clipped(with(gate(&pre, 2, h)?, peephole(2, &cs)?)?)?)?;
                    let cand = act(1, &clipped(gate(&pre, 3, h)?)?)?;
                    let c = f.mul(&cs)?.add(&i.mul(&cand)?)?;
                    let o = act(0, &clipped(with(gate(&pre, 1, h)?, peephole(1, &c)?)?)?)?;
                    (o.mul(&act(2, &c)?)?, Some(c))
                }
            };
            let (h_next, c_next, y) = match &live {
                Some(live) => {
                    let on = &live[t];
                    let c = match &c_new {
                        Some(c) => on.where_(c, &cs)?,
                        None => cs.clone(),
                    };
                    (on.where_(&h_new, &hs)?, c, on.where_(&h_new, 0.0)?)
                }
                None => (h_new.clone(), c_new.unwrap_or(cs), h_new),
            };
            hs = h_next;
            cs = c_next;
            out[t] = Some(y);
        }
        let steps: Vec<Tensor> = out
            .into_iter()
            .map(|y| y.expect("every step ran").reshape(&[1, 1, bi, hi]))
            .collect::<kiln_graph::Result<_>>()?;
        ys.push(Tensor::concat(&steps.iter().collect::<Vec<_>>(), 0)?);
        last_h.push(hs.reshape(&[1, bi, hi])?);
        last_c.push(cs.reshape(&[1, bi, hi])?);
    }
    let join = |v: &[Tensor], a: isize| Tensor::concat(&v.iter().collect::<Vec<_>>(), a);
    let (mut y, mut yh, mut yc) = (join(&ys, 1)?, join(&last_h, 0)?, join(&last_c, 0)?);
    if batchwise {
        y = y.permute(&[2, 0, 1, 3])?;
        yh = yh.transpose(0, 1)?;
        yc = yc.transpose(0, 1)?;
    }
    let mut outs = vec![Value::Tensor(y), Value::Tensor(yh)];
    if kind == Kind::Lstm {
        outs.push(Value::Tensor(yc));
    }
    Ok(outs)
}

#[cfg(test)]
mod tests {
    use super::super::testing::{run_one, string};
    use super::*;

    fn t(v: &[f32], dims: &[usize]) -> Option<Value> {
        Some(Value::Tensor(Tensor::from_slice(v, dims).unwrap()))
    }

    const X: [f32; 6] = [0.5, -1.0, 0.25, 2.0, -0.75, 0.1];
    const W: [f32; 4] = [0.3, -0.2, 0.1, 0.4];
    const R: [f32; 4] = [0.5, 0.1, -0.3, 0.2];

    /// `RNN` of X (`[3, 1, 2]`, or its steps reversed) one way: Y, Y_h.
    fn rnn(x: &[f32], direction: &str) -> (Vec<f32>, Vec<f32>) {
        let args = [t(x, &[3, 1, 2]), t(&W, &[1, 2, 2]), t(&R, &[1, 2, 2])];
        let out = run_one("RNN", vec![string("direction", direction)], &args).unwrap();
        (out[0].to_vec::<f32>().unwrap(), out[1].to_vec::<f32>().unwrap())
    }

    fn reversed_steps(v: &[f32], width: usize) -> Vec<f32> {
        v.chunks(width).rev().flatten().copied().collect()
    }

    /// The reverse direction is the forward one over the steps reversed; both ways at once stack them.
    #[test]
    fn reverse_and_bidirectional() {
        let (fy, fh) = rnn(&X, "forward");
        let (ry, rh) = rnn(&X, "reverse");
        let (flipped_y, flipped_h) = rnn(&reversed_steps(&X, 2), "forward");
        assert_eq!(ry, reversed_steps(&flipped_y, 2));
        assert_eq!(rh, flipped_h);
        let both = [W, W].concat();
        let args = [t(&X, &[3, 1, 2]), t(&both, &[2, 2, 2]), t(&[R, R].concat(), &[2, 2, 2])];
        let out = run_one("RNN", vec![string("direction", "bidirectional")], &args).unwrap();
        let y = out[0].to_vec::<f32>().unwrap();
        for s in 0..3 {
            assert_eq!(&y[s * 4..s * 4 + 2], &fy[s * 2..s * 2 + 2]);
            assert_eq!(&y[s * 4 + 2..s * 4 + 4], &ry[s * 2..s * 2 + 2]);
        }
        assert_eq!(out[1].to_vec::<f32>().unwrap(), [fh, rh].concat());
    }

    /// A sequence shorter than the input holds its state past its end and outputs zeros there.
    #[test]
    fn sequence_lengths_hold_the_state() {
        let x2: Vec<f32> = X.chunks(2).flat_map(|s| [s, s].concat()).collect();
        let lens = Some(Value::Tensor(Tensor::from_slice(&[3i32, 1], &[2]).unwrap()));
        let gates = |v: [f32; 4]| t(&[v, v, v].concat(), &[1, 6, 2]);
        let out = run_one("GRU", vec![], &[t(&x2, &[3, 2, 2]), gates(W), gates(R), None, lens.clone()]).unwrap();
        let (y, yh) = (out[0].to_vec::<f32>().unwrap(), out[1].to_vec::<f32>().unwrap());
        // Y is [seq, 1, batch, hidden]: batch 1 stops after its first step.
        assert_eq!(&y[6..8], &[0.0, 0.0]);
        assert_eq!(&y[10..12], &[0.0, 0.0]);
        assert_eq!(&yh[2..4], &y[2..4], "batch 1's last state is its first step's");
        assert_ne!(&yh[0..2], &y[0..2], "batch 0 ran on");
        let args = [t(&x2, &[3, 2, 2]), t(&W, &[1, 2, 2]), t(&R, &[1, 2, 2]), None, lens];
        let e = run_one("RNN", vec![string("direction", "reverse")], &args).unwrap_err();
        assert!(e.starts_with("unsupported") && e.contains("sequence_lens"), "{e}");
    }

    /// A sequence longer than the unrolling bound is a typed error, found before anything is traced.
    #[test]
    fn a_sequence_past_the_bound_is_an_error() {
        let steps = MAX_STEPS + 1;
        let args = [t(&vec![0.5; steps], &[steps, 1, 1]), t(&[1.0], &[1, 1, 1]), t(&[1.0], &[1, 1, 1])];
        let e = run_one("RNN", vec![], &args).unwrap_err();
        assert!(e.starts_with("unsupported") && e.contains("unrolled"), "{e}");
    }
}
