//! Elementwise ONNX ops: math, comparisons, activations, casts. Broadcasting is numpy's, which is
//! kiln's; integer shape arithmetic on folded sizes stays on the host.

use super::{invalid, one, unsupported, Node, OpResult};
use crate::tensor::dtype_of;
use crate::value::{Ints, Value};
use kiln_graph::sym::Expr;
use kiln_graph::{DType, Tensor};

type Unary = fn(&Tensor) -> kiln_graph::Result<Tensor>;

fn unary_fn(op: &str) -> Option<Unary> {
    Some(match op {
        "Abs" => Tensor::abs,
        "Neg" => Tensor::neg,
        "Exp" => Tensor::exp,
        "Log" => Tensor::log,
        "Sqrt" => Tensor::sqrt,
        "Reciprocal" => Tensor::reciprocal,
        "Sin" => Tensor::sin,
        "Cos" => Tensor::cos,
        "Tanh" => Tensor::tanh,
        "Sigmoid" => Tensor::sigmoid,
        "Erf" => Tensor::erf,
        "Relu" => Tensor::relu,
        "Floor" => Tensor::floor,
        "Ceil" => Tensor::ceil,
        "Round" => Tensor::round,
        "Not" => Tensor::logical_not,
        "IsNaN" => Tensor::isnan,
        _ => return None,
    })
}

type Binary = fn(&Tensor, &Tensor) -> kiln_graph::Result<Tensor>;

fn binary_fn(op: &str) -> Option<Binary> {
    Some(match op {
        "Add" | "Sum" => |a, b| a.add(b),
        "Sub" => |a, b| a.sub(b),
        "Mul" => |a, b| a.mul(b),
        "Div" => div,
        "Max" => |a, b| a.maximum(b),
        "Min" => |a, b| a.minimum(b),
        "Equal" => |a, b| a.eq(b),
        "Less" => |a, b| a.lt(b),
        "Greater" => |a, b| a.gt(b),
        "LessOrEqual" => |a, b| a.le(b),
        "GreaterOrEqual" => |a, b| a.ge(b),
        "And" => |a, b| a.logical_and(b),
        "Or" => |a, b| a.logical_or(b),
        "Xor" => |a, b| a.ne(b),
        "BitwiseAnd" => |a, b| a.bitwise_and(b),
        "BitwiseOr" => |a, b| a.bitwise_or(b),
        "BitwiseXor" => |a, b| a.bitwise_xor(b),
        _ => return None,
    })
}

/// ONNX's `Div`: kiln's integer division floors, ONNX's truncates toward zero (C's rule).
fn div(a: &Tensor, b: &Tensor) -> kiln_graph::Result<Tensor> {
    if !a.dtype().is_int() {
        return a.div(b);
    }
    let q = a.div(b)?;
    let r = a.sub(&q.mul(b)?)?;
    let signs_differ = a.lt(0.0)?.ne(&b.lt(0.0)?)?;
    let up = r.ne(0.0)?.logical_and(&signs_differ)?;
    q.add(&up.where_(1.0, 0.0)?.cast(q.dtype())?)
}

/// `a - trunc(a / b) * b` (`fmod = 1`: the sign of the dividend) or `a - floor(a / b) * b` (`fmod = 0`:
/// the sign of the divisor, integers only).
fn modulo(node: &Node) -> OpResult<Vec<Value>> {
    let (a, b) = (node.tensor(0)?, node.tensor(1)?);
    let fmod = node.int("fmod", 0) != 0;
    let q = match (a.dtype().is_int(), fmod) {
        (true, false) => a.div(&b)?,
        (true, true) => div(&a, &b)?,
        (false, true) => {
            // The rounded quotient can land on the wrong side of an integer (6.0 fmod 0.2): the remainder
            // is then brought back into (-|b|, |b|) with the dividend's sign.
            let x = a.div(&b)?;
            let t = x.lt(0.0)?.where_(x.ceil()?, x.floor()?)?;
            let r = a.sub(&t.mul(&b)?)?;
            let step = b.abs()?.mul(&a.lt(0.0)?.where_(-1.0, 1.0)?.cast(a.dtype())?)?;
            let wrong_sign = r.ne(0.0)?.logical_and(&r.lt(0.0)?.ne(&a.lt(0.0)?)?)?;
            let r = wrong_sign.where_(r.add(&step)?, &r)?;
            let too_big = r.abs()?.ge(&b.abs()?)?;
            return one(too_big.where_(r.sub(&step)?, &r)?);
        }
        (false, false) => return invalid("Mod of floats needs fmod = 1"),
    };
    one(a.sub(&q.mul(&b)?)?)
}

/// Folds integer arithmetic on known values (sizes): elementwise with a scalar or an equal-length side.
fn fold_ints(op: &str, a: &Ints, b: &Ints) -> Option<Ints> {
    type Fold = fn(&Expr, &Expr) -> Result<Expr, kiln_graph::sym::SymError>;
    let f: Fold = match op {
        "Add" => |x, y| x.checked_add(y),
        "Sub" => |x, y| x.checked_sub(y),
        "Mul" => |x, y| x.checked_mul(y),
        // ONNX truncates; sizes are never negative, where truncating is flooring.
        "Div" => |x, y| x.checked_floor_div(y),
        _ => return None,
    };
    let nonneg = |i: &Ints| i.values.iter().all(|v| v.as_const().is_none_or(|c| c >= 0));
    if op == "Div" && !(nonneg(a) && nonneg(b) && b.values.iter().all(|v| v.as_const().is_some_and(|c| c > 0))) {
        return None;
    }
    let (n, m) = (a.values.len(), b.values.len());
    let (dims, len) = if (n == m && a.dims == b.dims) || (m == 1 && b.dims.len() <= a.dims.len()) {
        (a.dims.clone(), n)
    } else if n == 1 && a.dims.len() <= b.dims.len() {
        (b.dims.clone(), m)
    } else {
        return None;
    };
    let at = |i: &Ints, k: usize| i.values[if i.values.len() == 1 { 0 } else { k }].clone();
    // An overflow leaves the arithmetic to tensors (which wrap as the dtype does).
    let values = (0..len).map(|k| f(&at(a, k), &at(b, k)).ok()).collect::<Option<Vec<_>>>()?;
    Some(Ints { dims, dtype: a.dtype, values })
}

fn variadic(node: &Node, f: Binary, op: &str) -> OpResult<Vec<Value>> {
    if node.args.is_empty() {
        return invalid("needs at least one input");
    }
    if let (Some(Value::Ints(a)), Some(Value::Ints(b)), 2) = (node.value(0), node.value(1), node.args.len()) {
        if let Some(r) = fold_ints(op, a, b) {
            return Ok(vec![Value::Ints(r)]);
        }
    }
    let mut acc = node.tensor(0)?;
    for i in 1..node.args.len() {
        let b = node.tensor(i)?;
        acc = f(&acc, &b)?;
    }
    if op == "Mean" {
        acc = acc.div(node.args.len() as f64)?;
    }
    one(acc)
}

/// `lo <= x <= hi` as `min(max(x, lo), hi)`.
fn clip(node: &Node) -> OpResult<Vec<Value>> {
    let x = node.tensor(0)?;
    if node.opset() < 11 {
        let lo = node.float("min", f64::NEG_INFINITY);
        let hi = node.float("max", f64::INFINITY);
        return one(x.maximum(lo)?.minimum(hi)?);
    }
    let mut y = x;
    if let Some(lo) = node.opt_tensor(1)? {
        y = y.maximum(&lo)?;
    }
    if let Some(hi) = node.opt_tensor(2)? {
        y = y.minimum(&hi)?;
    }
    one(y)
}

fn activation(node: &Node, op: &str, x: &Tensor) -> OpResult<Tensor> {
    Ok(match op {
        "LeakyRelu" => x.leaky_relu(node.float("alpha", 0.01))?,
        "Elu" => x.elu(node.float("alpha", 1.0))?,
        "Selu" => {
            let alpha = node.float("alpha", 1.673_263_192_176_818_8);
            let gamma = node.float("gamma", 1.050_701_022_148_132_3);
            x.le(0.0)?.where_(x.exp()?.sub(1.0)?.mul(alpha)?, x)?.mul(gamma)?
        }
        "Celu" => {
            let alpha = node.float("alpha", 1.0);
            let e = x.div(alpha)?.exp()?.sub(1.0)?.mul(alpha)?;
            x.relu()?.add(&e.minimum(0.0)?)?
        }
        "HardSigmoid" => {
            let (alpha, beta) = (node.float("alpha", 0.2), node.float("beta", 0.5));
            x.mul(alpha)?.add(beta)?.minimum(1.0)?.maximum(0.0)?
        }
        "HardSwish" => x.hardswish()?,
        "Softplus" => x.exp()?.add(1.0)?.log()?,
        "Softsign" => x.div(&x.abs()?.add(1.0)?)?,
        "ThresholdedRelu" => x.gt(node.float("alpha", 1.0))?.where_(x, 0.0)?,
        "Mish" => x.mul(&x.exp()?.add(1.0)?.log()?.tanh()?)?,
        "Tan" => x.sin()?.div(&x.cos()?)?,
        "Sinh" => x.exp()?.sub(&x.neg()?.exp()?)?.mul(0.5)?,
        "Cosh" => x.exp()?.add(&x.neg()?.exp()?)?.mul(0.5)?,
        // asinh is odd: computed on |x| and signed back, so large negative x does not cancel.
        "Asinh" => {
            let a = x.abs()?;
            let m = a.add(&a.mul(&a)?.add(1.0)?.sqrt()?)?.log()?;
            x.lt(0.0)?.where_(m.neg()?, &m)?
        }
        "Acosh" => x.add(&x.mul(x)?.sub(1.0)?.sqrt()?)?.log()?,
        "Atanh" => x.add(1.0)?.div(&x.neg()?.add(1.0)?)?.log()?.mul(0.5)?,
        "Atan" => atan(x)?,
        // asin(x) = atan(x / sqrt(1 - x²)): ±1 divides to ±inf, whose atan is ±π/2; past ±1, NaN.
        "Asin" => atan(&x.div(&x.mul(x)?.neg()?.add(1.0)?.sqrt()?)?)?,
        "Acos" => atan(&x.div(&x.mul(x)?.neg()?.add(1.0)?.sqrt()?)?)?.neg()?.add(std::f64::consts::FRAC_PI_2)?,
        "Shrink" => {
            let (bias, lambd) = (node.float("bias", 0.0), node.float("lambd", 0.5));
            let high = x.gt(lambd)?.where_(x.sub(bias)?, 0.0)?;
            x.lt(-lambd)?.where_(x.add(bias)?, &high)?
        }
        "Swish" => x.mul(&x.mul(node.float("alpha", 1.0))?.sigmoid()?)?,
        "Sign" => x.gt(0.0)?.where_(1.0, &x.lt(0.0)?.where_(-1.0, 0.0)?)?,
        "IsInf" => {
            let (pos, negative) = (node.int("detect_positive", 1) != 0, node.int("detect_negative", 1) != 0);
            match (pos, negative) {
                (true, true) => x.abs()?.eq(f64::INFINITY)?,
                (true, false) => x.eq(f64::INFINITY)?,
                (false, true) => x.eq(f64::NEG_INFINITY)?,
                (false, false) => x.ne(x)?.logical_and(&x.eq(x)?)?,
            }
        }
        "Gelu" => match node.string("approximate").as_deref() {
            None | Some("none") => x.gelu()?,
            Some("tanh") => x.gelu_tanh()?,
            Some(other) => return invalid(format!("approximate = {other:?}")),
        },
        _ => return unsupported(format!("op {op}")),
    })
}

/// The op types this family converts.
pub(super) const OPS: &[&str] = &[
    "Abs",
    "Neg",
    "Exp",
    "Log",
    "Sqrt",
    "Reciprocal",
    "Sin",
    "Cos",
    "Tan",
    "Tanh",
    "Sigmoid",
    "Erf",
    "Relu",
    "Floor",
    "Ceil",
    "Round",
    "Not",
    "IsNaN",
    "IsInf",
    "Sign",
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Pow",
    "Max",
    "Min",
    "Sum",
    "Mean",
    "Equal",
    "Less",
    "Greater",
    "LessOrEqual",
    "GreaterOrEqual",
    "And",
    "Or",
    "Xor",
    "Where",
    "Cast",
    "CastLike",
    "Clip",
    "Mod",
    "LeakyRelu",
    "Elu",
    "Selu",
    "Celu",
    "HardSigmoid",
    "HardSwish",
    "PRelu",
    "Softplus",
    "Softsign",
    "ThresholdedRelu",
    "Mish",
    "Gelu",
    "Identity",
    "Dropout",
    "BitwiseNot",
    "BitwiseAnd",
    "BitwiseOr",
    "BitwiseXor",
    "Sinh",
    "Cosh",
    "Asinh",
    "Acosh",
    "Atanh",
    "Atan",
    "Asin",
    "Acos",
    "Shrink",
    "Swish",
];

/// The elementwise family; `None` when `op` is not one of it.
pub(super) fn run(node: &Node, op: &str) -> Option<OpResult<Vec<Value>>> {
    if let Some(f) = unary_fn(op) {
        return Some(node.tensor(0).and_then(|x| one(f(&x)?)));
    }
    if let Some(f) = binary_fn(op) {
        return Some(variadic(node, f, op));
    }
    Some(match op {
        "Mean" => variadic(node, |a, b| a.add(b), op),
        "Pow" => (|| {
            let (x, y) = (node.tensor(0)?, node.tensor(1)?);
            if !x.dtype().is_float() && y.dtype().is_float() {
                // An integer base to a float power: computed in the exponent's type, truncated to the
                // base's (numpy's `power(x, y).astype(x.dtype)`, which ONNX's reference takes).
                return one(x.cast(y.dtype())?.pow(&y)?.cast(x.dtype())?);
            }
            let y = if y.dtype() == x.dtype() { y } else { y.cast(x.dtype())? };
            one(x.pow(&y)?)
        })(),
        "Where" => (|| one(node.tensor(0)?.where_(node.tensor(1)?, node.tensor(2)?)?))(),
        "Cast" | "CastLike" => (|| {
            let to = if op == "Cast" {
                dtype_of(node.int("to", 0) as i32).or_else(|m| unsupported(format!("a cast to {m}")))?
            } else {
                node.value(1).map(Value::dtype).ok_or_else(|| super::OpError::Invalid("input 1 is required".into()))?
            };
            if let (Some(Value::Ints(i)), true) = (node.value(0), to.is_int()) {
                return Ok(vec![Value::Ints(Ints { dtype: to, ..i.clone() })]);
            }
            // `saturate` speaks of 8-bit float targets only; every other cast ignores it.
            match node.int("saturate", 1) {
                0 => one(node.tensor(0)?.cast_unsaturated(to)?),
                _ => one(node.tensor(0)?.cast(to)?),
            }
        })(),
        "Clip" => clip(node),
        "Mod" => modulo(node),
        // Two's complement: !x = -x - 1, exact for every integer (an unsigned one wrapped to its width).
        "BitwiseNot" => (|| {
            let x = node.tensor(0)?;
            if !x.dtype().is_int() {
                return invalid(format!("BitwiseNot of {}", x.dtype()));
            }
            one(x.neg()?.sub(1.0)?)
        })(),
        "Identity" => match node.value(0) {
            Some(v) => Ok(vec![v.clone()]),
            None => invalid("input 0 is required"),
        },
        "Dropout" => dropout(node),
        "PRelu" => prelu(node),
        op if activation_name(op) => (|| one(activation(node, op, &node.tensor(0)?)?))(),
        _ => return None,
    })
}

/// `Dropout`: the identity in inference; in training mode (opset 12's third input) each element kept
/// with probability `1 − ratio` and scaled by `1/(1 − ratio)`, the mask drawn by kiln's counter-based
/// generator under the node's `seed` (`random::draw`; the same on every backend; not numpy's numbers,
/// which the ONNX reference draws). The optional second output is the mask.
fn dropout(node: &Node) -> OpResult<Vec<Value>> {
    let x = node.tensor(0)?;
    let training = node.opset() >= 12 && node.host_values(2)?.is_some_and(|t| t.first().is_some_and(|&t| t != 0.0));
    let ratio = match (node.opset(), node.host_values(1)?) {
        (o, Some(r)) if o >= 12 => match r.as_slice() {
            [r] => *r,
            _ => return invalid(format!("ratio has {} values, a scalar was expected", r.len())),
        },
        (o, None) if o >= 12 => 0.5,
        _ => node.float("ratio", 0.5),
    };
    let want_mask = node.proto.output.get(1).is_some_and(|o| !o.is_empty());
    let dims = || x.shape().as_concrete().ok_or(super::OpError::Unsupported("a dropout mask of symbolic shape".into()));
    if !training || ratio == 0.0 {
        let mut outs = vec![Value::Tensor(x.clone())];
        if want_mask {
            outs.push(Value::Tensor(Tensor::full(1.0, &dims()?, DType::Bool)?));
        }
        return Ok(outs);
    }
    let (key, stream) = super::random::draw(node);
    let (y, keep) = x.dropout_with_mask(ratio, &key, stream)?;
    let mut outs = vec![Value::Tensor(y)];
    if want_mask {
        outs.push(Value::Tensor(keep));
    }
    Ok(outs)
}

/// Arctangent, which kiln has no op for: Cephes' `atanf` — |x| reduced to [0, tan(π/8)] by
/// atan(x) = π/2 + atan(-1/x) past tan(3π/8) and π/4 + atan((x - 1)/(x + 1)) past tan(π/8), then an odd
/// polynomial (relative error ~1e-7), the sign put back.
fn atan(x: &Tensor) -> kiln_graph::Result<Tensor> {
    use std::f64::consts::{FRAC_PI_2, FRAC_PI_4};
    let a = x.abs()?;
    let (far, mid) = (a.gt(2.414_213_562_373_095)?, a.gt(0.414_213_562_373_095)?);
    let reduced = far.where_(&a.reciprocal()?.neg()?, &mid.where_(&a.sub(1.0)?.div(&a.add(1.0)?)?, &a)?)?;
    let base = far.where_(FRAC_PI_2, &mid.where_(FRAC_PI_4, 0.0)?)?;
    let z = reduced.mul(&reduced)?;
    let p = z.mul(8.053_744_495_38e-2)?.sub(1.387_768_560_32e-1)?.mul(&z)?.add(1.997_771_064_78e-1)?.mul(&z)?;
    let y = p.sub(3.333_294_915_39e-1)?.mul(&z)?.mul(&reduced)?.add(&reduced)?.add(&base)?;
    x.lt(0.0)?.where_(&y.neg()?, &y)
}

fn activation_name(op: &str) -> bool {
    matches!(
        op,
        "LeakyRelu"
            | "Elu"
            | "Selu"
            | "Celu"
            | "HardSigmoid"
            | "HardSwish"
            | "Softplus"
            | "Softsign"
            | "ThresholdedRelu"
            | "Mish"
            | "Tan"
            | "Sign"
            | "IsInf"
            | "Gelu"
            | "Sinh"
            | "Cosh"
            | "Asinh"
            | "Acosh"
            | "Atanh"
            | "Atan"
            | "Asin"
            | "Acos"
            | "Shrink"
            | "Swish"
    )
}

/// PRelu: `x` where positive, `slope * x` elsewhere (slope broadcast to `x`).
fn prelu(node: &Node) -> OpResult<Vec<Value>> {
    let (x, slope) = (node.tensor(0)?, node.tensor(1)?);
    one(x.lt(0.0)?.where_(x.mul(&slope)?, &x)?)
}

#[cfg(test)]
mod tests {
    use super::super::testing::run_one;
    use super::*;

    /// Atan, Asin and Acos against the host's f64 functions, across the reduction's three ranges, at
    /// their boundaries, at ±1 and ±inf, and with NaN.
    #[test]
    fn inverse_trigonometry_within_f32_rounding() {
        let mut xs: Vec<f32> = (-400..=400).map(|i| i as f32 / 40.0).collect();
        xs.extend([0.414_213_56, 2.414_213_5, 1e-30, -1e30, f32::INFINITY, f32::NEG_INFINITY, f32::NAN]);
        for (op, f) in [("Atan", f64::atan as fn(f64) -> f64), ("Asin", f64::asin), ("Acos", f64::acos)] {
            let x = Tensor::from_slice(&xs, &[xs.len()]).unwrap();
            let got = run_one(op, vec![], &[Some(Value::Tensor(x))]).unwrap()[0].to_vec::<f32>().unwrap();
            for (&x, &y) in xs.iter().zip(&got) {
                let want = f(x as f64);
                if want.is_nan() {
                    assert!(y.is_nan(), "{op}({x}) = {y}, want NaN");
                } else {
                    assert!(
                        (y as f64 - want).abs() <= 4e-7 * want.abs().max(1e-30) + 1e-7,
                        "{op}({x}) = {y}, want {want}"
                    );
                }
            }
        }
    }

    /// BitwiseNot of signed integers is `-x - 1`, exactly, at the type's ends too; floats are refused.
    #[test]
    fn bitwise_not_flips_every_bit_of_a_signed_integer() {
        let xs = [0i32, 1, -1, 7, -8, i32::MAX, i32::MIN];
        let x = Some(Value::Tensor(Tensor::from_slice(&xs, &[xs.len()]).unwrap()));
        let got = run_one("BitwiseNot", vec![], &[x]).unwrap()[0].to_vec::<i32>().unwrap();
        assert_eq!(got, xs.iter().map(|v| !v).collect::<Vec<_>>());
        let f = Some(Value::Tensor(Tensor::from_slice(&[1.0f32], &[1]).unwrap()));
        assert!(run_one("BitwiseNot", vec![], &[f]).unwrap_err().starts_with("invalid"));
    }

    /// BitwiseAnd/Or/Xor of signed integers bit for bit (negative values and the type's ends, a
    /// broadcast row, i64 too); floats are refused with a typed error.
    #[test]
    fn bitwise_and_or_xor_combine_every_bit() {
        let xs = [0i32, 1, -1, 6, -8, i32::MAX, i32::MIN, 0x5555_5555];
        let ys = [3i32, -2, 12, i32::MIN];
        let x = Some(Value::Tensor(Tensor::from_slice(&xs, &[2, 4]).unwrap()));
        let y = Some(Value::Tensor(Tensor::from_slice(&ys, &[4]).unwrap()));
        for (op, f) in [
            ("BitwiseAnd", (|a, b| a & b) as fn(i32, i32) -> i32),
            ("BitwiseOr", |a, b| a | b),
            ("BitwiseXor", |a, b| a ^ b),
        ] {
            let got = run_one(op, vec![], &[x.clone(), y.clone()]).unwrap()[0].to_vec::<i32>().unwrap();
            let want: Vec<i32> = xs.iter().enumerate().map(|(i, &a)| f(a, ys[i % 4])).collect();
            assert_eq!(got, want, "{op}");
        }
        let big = [1i64 << 40 | 5, -3];
        let b = Some(Value::Tensor(Tensor::from_slice(&big, &[2]).unwrap()));
        let got = run_one("BitwiseXor", vec![], &[b.clone(), b]).unwrap()[0].to_vec::<i64>().unwrap();
        assert_eq!(got, vec![0, 0]);
        let f = Some(Value::Tensor(Tensor::from_slice(&[1.0f32], &[1]).unwrap()));
        let e = run_one("BitwiseAnd", vec![], &[f.clone(), f]).unwrap_err();
        assert!(e.starts_with("failed"), "{e:?}"); // kiln's typed dtype error
    }
}
