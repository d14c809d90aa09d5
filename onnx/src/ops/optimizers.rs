//! The optimizers of ONNX's `ai.onnx.preview.training` domain — `Adagrad`, `Momentum` (standard and
//! Nesterov) and `Adam` — over any number of tensors, as the pointwise updates their specification
//! writes: the compiler fuses each tensor's update into one kernel. The step count decides a branch of
//! each formula, so it is read while tracing (a graph break under `compile` when it is data). Attribute
//! defaults are the schema's (`epsilon` 1e-6; Adam's `alpha` 0.9, `beta` 0.999).

use super::{invalid, Node, OpResult};
use crate::value::Value;
use kiln_graph::Tensor;

/// The domain these ops live in.
pub(crate) const DOMAIN: &str = "ai.onnx.preview.training";

/// The op types this domain's family converts.
pub(crate) const OPS: &[&str] = &["Adagrad", "Adam", "Momentum"];

/// The family; `None` when `op` is not one of it.
pub(super) fn run(node: &Node, op: &str) -> Option<OpResult<Vec<Value>>> {
    Some(match op {
        "Adagrad" => adagrad(node),
        "Momentum" => momentum(node),
        "Adam" => adam(node),
        _ => return None,
    })
}

/// The rate `R` (a tensor, to broadcast), the step count `T`, and the `groups` lists of `n` tensors
/// that follow them (parameters, gradients, then each state).
fn operands(node: &Node, groups: usize) -> OpResult<(Tensor, f64, Vec<Vec<Tensor>>)> {
    let count = node.args.len().saturating_sub(2);
    if count == 0 || count % groups != 0 {
        return invalid(format!("{count} tensors after the rate and step, not {groups} lists of the same length"));
    }
    let n = count / groups;
    let rate = node.tensor(0)?;
    let step = match node.host_values(1)? {
        Some(v) if v.len() == 1 => v[0],
        _ => return invalid("the step count T must be one integer"),
    };
    let lists = (0..groups).map(|g| (0..n).map(|i| node.tensor(2 + g * n + i)).collect()).collect::<OpResult<_>>()?;
    Ok((rate, step, lists))
}

/// `norm_coefficient · X + G`.
fn regularized(node: &Node, x: &Tensor, g: &Tensor) -> OpResult<Tensor> {
    let c = node.float("norm_coefficient", 0.0);
    Ok(if c == 0.0 { g.clone() } else { x.mul(c)?.add(g)? })
}

/// `H' = H + G²`, `X' = X − R / (1 + T·decay) · G / (√H' + ε)`; outputs the `X'`s, then the `H'`s.
fn adagrad(node: &Node) -> OpResult<Vec<Value>> {
    let (rate, step, l) = operands(node, 3)?;
    let r = rate.div(1.0 + step * node.float("decay_factor", 0.0))?;
    let eps = node.float("epsilon", 1e-6);
    let (mut xs, mut hs) = (Vec::new(), Vec::new());
    for ((x, g), h) in l[0].iter().zip(&l[1]).zip(&l[2]) {
        let g = regularized(node, x, g)?;
        let h = h.add(&g.mul(&g)?)?;
        xs.push(Value::Tensor(x.sub(&r.mul(&g)?.div(&h.sqrt()?.add(eps)?)?)?));
        hs.push(Value::Tensor(h));
    }
    Ok([xs, hs].concat())
}

/// `V' = α·V + β·G` (β as 1 at step 0), `X' = X − R·V'` or, Nesterov, `X − R·(G + α·V')`; outputs the
/// `X'`s, then the `V'`s.
fn momentum(node: &Node) -> OpResult<Vec<Value>> {
    let (rate, step, l) = operands(node, 3)?;
    // Both coefficients are required: a default would be a guess.
    let required = |name: &str| -> OpResult<f64> {
        match node.proto.attribute.iter().any(|a| a.name() == name) {
            true => Ok(node.float(name, 0.0)),
            false => invalid(format!("Momentum needs its {name} attribute")),
        }
    };
    let (alpha, beta) = (required("alpha")?, required("beta")?);
    let nesterov = match node.string("mode").as_deref() {
        Some("standard") | None => false,
        Some("nesterov") => true,
        Some(other) => return invalid(format!("mode {other:?}")),
    };
    let beta = if step > 0.0 { beta } else { 1.0 };
    let (mut xs, mut vs) = (Vec::new(), Vec::new());
    for ((x, g), v) in l[0].iter().zip(&l[1]).zip(&l[2]) {
        let g = regularized(node, x, g)?;
        let v = v.mul(alpha)?.add(&g.mul(beta)?)?;
        let by = if nesterov { g.add(&v.mul(alpha)?)? } else { v.clone() };
        xs.push(Value::Tensor(x.sub(&rate.mul(&by)?)?));
        vs.push(Value::Tensor(v));
    }
    Ok([xs, vs].concat())
}

/// `V' = α·V + (1−α)·G`, `H' = β·H + (1−β)·G²`, `X' = (1 − c_post)·(X − R'·V' / (√H' + ε))` with
/// `R' = R·√(1−β^T) / (1−α^T)` past step 0; outputs the `X'`s, the `V'`s, then the `H'`s.
fn adam(node: &Node) -> OpResult<Vec<Value>> {
    let (rate, step, l) = operands(node, 4)?;
    let (alpha, beta) = (node.float("alpha", 0.9), node.float("beta", 0.999));
    let (eps, post) = (node.float("epsilon", 1e-6), node.float("norm_coefficient_post", 0.0));
    let r = if step > 0.0 { rate.mul((1.0 - beta.powf(step)).sqrt() / (1.0 - alpha.powf(step)))? } else { rate };
    let (mut xs, mut vs, mut hs) = (Vec::new(), Vec::new(), Vec::new());
    for (((x, g), v), h) in l[0].iter().zip(&l[1]).zip(&l[2]).zip(&l[3]) {
        let g = regularized(node, x, g)?;
        let v = v.mul(alpha)?.add(&g.mul(1.0 - alpha)?)?;
        let h = h.mul(beta)?.add(&g.mul(&g)?.mul(1.0 - beta)?)?;
        let x = x.sub(&r.mul(&v)?.div(&h.sqrt()?.add(eps)?)?)?.mul(1.0 - post)?;
        xs.push(Value::Tensor(x));
        vs.push(Value::Tensor(v));
        hs.push(Value::Tensor(h));
    }
    Ok([xs, vs, hs].concat())
}
