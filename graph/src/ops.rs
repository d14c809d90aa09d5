//! The user-facing ops on `Tensor`: argument checking, dtype rules, shape inference and broadcasting.
//! Each method checks its input, turns mistakes into typed errors naming the user's line, and hands one
//! node to `trace::record`. Broadcasting becomes explicit `Reshape`/`Expand` nodes here, so the IR's
//! pointwise ops always see equal shapes.

use crate::data::TensorData;
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::interp::reduce_dtype;
use crate::ir::{ArgReduceOp, BinaryOp, DTypeRule, GeluApprox, Op, ReduceOp, UnaryOp};
use crate::loc::SourceLoc;
use crate::shape::{broadcast_shapes, normalize_axis, reduced_shape, Dim, Shape};
use crate::sym::Expr;
use crate::trace::{record, Tensor};

/// A right-hand operand: another tensor or a Rust scalar. A scalar takes the dtype and shape of the
/// tensor it meets, so `x.mul(2.0)` records one constant node, not a broadcast.
pub trait Operand {
    /// The operand's value.
    fn operand(&self) -> OperandValue;
}

/// What an [`Operand`] holds.
#[derive(Clone, Debug)]
pub enum OperandValue {
    /// A tensor.
    Tensor(Tensor),
    /// A scalar, converted when it meets a tensor.
    Scalar(f64),
}

impl Operand for Tensor {
    fn operand(&self) -> OperandValue {
        OperandValue::Tensor(self.clone())
    }
}

impl Operand for &Tensor {
    fn operand(&self) -> OperandValue {
        OperandValue::Tensor((*self).clone())
    }
}

macro_rules! scalar_operand {
    ($($t:ty),*) => {$(
        impl Operand for $t {
            fn operand(&self) -> OperandValue {
                OperandValue::Scalar(*self as f64)
            }
        }
    )*};
}
scalar_operand!(f64, f32, i32, i64);

impl Operand for bool {
    fn operand(&self) -> OperandValue {
        OperandValue::Scalar(if *self { 1.0 } else { 0.0 })
    }
}

impl OperandValue {
    /// The tensor, or the scalar as a constant of `dtype` and `shape`.
    fn into_tensor(self, dtype: DType, shape: &Shape, loc: &SourceLoc) -> Result<Tensor> {
        match self {
            OperandValue::Tensor(t) => Ok(t),
            OperandValue::Scalar(v) => {
                record(Op::Full { value: dtype.round(v) }, &[], dtype, shape.clone(), loc.clone())
            }
        }
    }

    fn tensor(&self) -> Option<&Tensor> {
        match self {
            OperandValue::Tensor(t) => Some(t),
            OperandValue::Scalar(_) => None,
        }
    }
}

/// Every one of `others` has `x`'s dtype (weights and biases of a layer).
pub(crate) fn check_same_dtype(op: &str, x: DType, others: &[&Tensor], loc: &SourceLoc) -> Result<()> {
    match others.iter().find(|t| t.dtype() != x) {
        None => Ok(()),
        Some(t) => Err(Error::DType {
            op: op.into(),
            expected: format!("{x} like the input"),
            got: t.dtype(),
            loc: loc.clone(),
        }),
    }
}

pub(crate) fn check_dtype(op: &str, rule: DTypeRule, got: DType, loc: &SourceLoc) -> Result<()> {
    if rule.allows(got) {
        Ok(())
    } else {
        Err(Error::DType { op: op.into(), expected: rule.describe().into(), got, loc: loc.clone() })
    }
}

fn axis(op: &str, a: isize, rank: usize, loc: &SourceLoc) -> Result<usize> {
    normalize_axis(a, rank).ok_or_else(|| Error::Axis { op: op.into(), axis: a, rank, loc: loc.clone() })
}

/// Normalised, sorted, distinct axes; an empty list means every axis.
fn axes(op: &str, given: &[isize], rank: usize, loc: &SourceLoc) -> Result<Vec<usize>> {
    if given.is_empty() {
        return Ok((0..rank).collect());
    }
    let mut out = given.iter().map(|&a| axis(op, a, rank, loc)).collect::<Result<Vec<_>>>()?;
    out.sort_unstable();
    let n = out.len();
    out.dedup();
    if out.len() != n {
        return Err(Error::InvalidArgument {
            op: op.into(),
            msg: format!("axis listed twice in {given:?}"),
            loc: loc.clone(),
        });
    }
    Ok(out)
}

fn invalid(op: &str, msg: impl Into<String>, loc: &SourceLoc) -> Error {
    Error::InvalidArgument { op: op.into(), msg: msg.into(), loc: loc.clone() }
}

macro_rules! unary_methods {
    ($($name:ident => $op:ident),* $(,)?) => {
        impl Tensor {$(
            #[doc = concat!("Elementwise `", stringify!($name), "` (see docs/ops.md).")]
            #[track_caller]
            pub fn $name(&self) -> Result<Tensor> {
                self.unary(UnaryOp::$op, SourceLoc::caller())
            }
        )*}
    };
}

unary_methods!(
    neg => Neg, abs => Abs, exp => Exp, log => Log, sqrt => Sqrt, rsqrt => Rsqrt, sin => Sin,
    cos => Cos, tanh => Tanh, sigmoid => Sigmoid, erf => Erf, relu => Relu, reciprocal => Reciprocal,
    floor => Floor, ceil => Ceil, round => Round, logical_not => Not, isnan => IsNan,
);

macro_rules! binary_methods {
    ($($name:ident => $op:ident),* $(,)?) => {
        impl Tensor {$(
            #[doc = concat!("Elementwise `", stringify!($name), "` with PyTorch broadcasting (see docs/ops.md).")]
            #[track_caller]
            pub fn $name(&self, rhs: impl Operand) -> Result<Tensor> {
                let loc = SourceLoc::caller();
                let rhs = rhs.operand();
                let other = rhs.tensor().cloned();
                let like: Vec<&Tensor> = std::iter::once(self).chain(other.as_ref()).collect();
                // Eagerly, the constant, the broadcast and the op are one kernel.
                crate::trace::eager_group(&like, || {
                    let rhs = rhs.into_tensor(self.dtype(), &self.shape(), &loc)?;
                    self.binary(BinaryOp::$op, &rhs, loc)
                })
            }
        )*}
    };
}

binary_methods!(
    add => Add, sub => Sub, mul => Mul, div => Div, pow => Pow, maximum => Max, minimum => Min,
    eq => Eq, ne => Ne, lt => Lt, le => Le, gt => Gt, ge => Ge, logical_and => And, logical_or => Or,
    bitwise_and => BitAnd, bitwise_or => BitOr, bitwise_xor => BitXor,
    bitwise_left_shift => Shl, bitwise_right_shift => Shr,
);

/// Two dims that must be equal: the same expression, or — under a trace — dims that are equal at this
/// call's sizes (a dynamic `s0` that is 10 meeting a weight's 10), which the trace then assumes and
/// guards, keeping the constant one (torch specialises the same way).
fn unify_dims(a: &Dim, b: &Dim) -> Option<Dim> {
    if a == b {
        return Some(a.clone());
    }
    let diff = a.checked_sub(b).ok()?;
    (crate::trace::assume_zero(&diff) == Some(true)).then(|| if b.as_const().is_some() { b.clone() } else { a.clone() })
}

impl Tensor {
    /// This tensor with each dim that broadcasting or a weight unified with a constant (see
    /// [`unify_dims`]) replaced by that constant: a free reshape under the trace's guard, so every node
    /// downstream sees one consistent shape. Dims of size 1 (broadcast) stay as they are.
    fn specialized(&self, dims: &[Dim], loc: &SourceLoc) -> Result<Tensor> {
        let s = self.shape();
        let one = Expr::from(1usize);
        let out: Vec<Dim> =
            s.dims().iter().zip(dims).map(|(d, t)| if *d == one || d == t { d.clone() } else { t.clone() }).collect();
        if out.len() != s.rank() || out == s.dims() {
            return Ok(self.clone());
        }
        record(Op::Reshape, &[self], self.dtype(), Shape(out), loc.clone())
    }
}

/// PyTorch broadcasting of two shapes (dims aligned from the right; a 1 stretches), with symbolic dims
/// unified as [`unify_dims`] does. The error shows the sizes the user passed.
fn broadcast(a: &Shape, b: &Shape, op: &str, loc: &SourceLoc) -> Result<Shape> {
    if let Ok(s) = broadcast_shapes(a, b) {
        return Ok(s);
    }
    let rank = a.rank().max(b.rank());
    let one = Expr::from(1usize);
    let at = |s: &Shape, i: usize| (i + s.rank()).checked_sub(rank).map_or(one.clone(), |j| s.dims()[j].clone());
    let mut out = Vec::with_capacity(rank);
    for i in 0..rank {
        let (da, db) = (at(a, i), at(b, i));
        let d = if db == one {
            Some(da)
        } else if da == one {
            Some(db)
        } else {
            unify_dims(&da, &db)
        };
        out.push(d.ok_or_else(|| Error::Broadcast {
            op: op.into(),
            lhs: crate::trace::shape_for_humans(a),
            rhs: crate::trace::shape_for_humans(b),
            loc: loc.clone(),
        })?);
    }
    Ok(Shape(out))
}

impl Tensor {
    /// A concrete tensor from host elements; `dims` must multiply to `values.len()`.
    #[track_caller]
    pub fn from_slice<T: Element>(values: &[T], dims: &[usize]) -> Result<Tensor> {
        Ok(Tensor::from_data(TensorData::new(values, dims)?))
    }

    /// A rank-0 tensor holding `value` rounded to `dtype`.
    #[track_caller]
    pub fn scalar(value: f64, dtype: DType) -> Result<Tensor> {
        Tensor::full(value, &[], dtype)
    }

    /// Every element `value` (rounded to `dtype`).
    #[track_caller]
    pub fn full(value: f64, dims: &[usize], dtype: DType) -> Result<Tensor> {
        Tensor::full_at("full", value, dims, dtype, SourceLoc::caller())
    }

    fn full_at(op: &str, value: f64, dims: &[usize], dtype: DType, loc: SourceLoc) -> Result<Tensor> {
        if dims.iter().any(|&d| i64::try_from(d).is_err()) {
            return Err(Error::TooLarge { op: op.into(), msg: format!("size {dims:?} exceeds i64"), loc });
        }
        record(Op::Full { value: dtype.round(value) }, &[], dtype, Shape::from_dims(dims), loc)
    }

    /// A tensor of `dims` filled with `value`, of this tensor's dtype and where it lives (torch's
    /// `new_full`): eagerly it is made on this tensor's device, with nothing uploaded; traced, it is a
    /// constant of the graph.
    #[track_caller]
    pub fn new_full(&self, dims: &[usize], value: f64) -> Result<Tensor> {
        let (dtype, loc) = (self.dtype(), SourceLoc::caller());
        crate::trace::eager_group(&[self], || Tensor::full_at("new_full", value, dims, dtype, loc))
    }

    /// All zeros.
    #[track_caller]
    pub fn zeros(dims: &[usize], dtype: DType) -> Result<Tensor> {
        Tensor::full(0.0, dims, dtype)
    }

    /// All ones.
    #[track_caller]
    pub fn ones(dims: &[usize], dtype: DType) -> Result<Tensor> {
        Tensor::full(1.0, dims, dtype)
    }

    /// `start, start+step, ...` below `end`, like `torch.arange` (an `iota` scaled and shifted).
    #[track_caller]
    pub fn arange(start: f64, end: f64, step: f64, dtype: DType) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        if step == 0.0 || !step.is_finite() || !start.is_finite() || !end.is_finite() {
            return Err(invalid(
                "arange",
                format!("start {start}, end {end} and step {step} must be finite, step nonzero"),
                &loc,
            ));
        }
        let n = ((end - start) / step).ceil().max(0.0) as usize;
        let iota = record(Op::Iota { axis: 0 }, &[], dtype, Shape::from_dims(&[n]), loc.clone())?;
        if step == 1.0 && start == 0.0 {
            return Ok(iota);
        }
        let shape = iota.shape();
        let step = OperandValue::Scalar(step).into_tensor(dtype, &shape, &loc)?;
        let start = OperandValue::Scalar(start).into_tensor(dtype, &shape, &loc)?;
        iota.binary(BinaryOp::Mul, &step, loc.clone())?.binary(BinaryOp::Add, &start, loc)
    }

    pub(crate) fn unary(&self, op: UnaryOp, loc: SourceLoc) -> Result<Tensor> {
        check_dtype(op.name(), op.accepts(), self.dtype(), &loc)?;
        let dtype = if op == UnaryOp::IsNan { DType::Bool } else { self.dtype() };
        record(Op::Unary { op }, &[self], dtype, self.shape(), loc)
    }

    pub(crate) fn binary(&self, op: BinaryOp, rhs: &Tensor, loc: SourceLoc) -> Result<Tensor> {
        let name = op.name();
        check_dtype(name, op.accepts(), self.dtype(), &loc)?;
        if rhs.dtype() != self.dtype() {
            return Err(Error::DType {
                op: name.into(),
                expected: format!("both operands of one dtype ({}; cast explicitly)", self.dtype()),
                got: rhs.dtype(),
                loc,
            });
        }
        let shape = self.broadcast_with(rhs, name, &loc)?;
        let a = self.expand_to(&shape, &loc)?;
        let b = rhs.expand_to(&shape, &loc)?;
        let dtype = if op.is_comparison() { DType::Bool } else { self.dtype() };
        record(Op::Binary { op }, &[&a, &b], dtype, shape, loc)
    }

    fn broadcast_with(&self, other: &Tensor, op: &str, loc: &SourceLoc) -> Result<Shape> {
        broadcast(&self.shape(), &other.shape(), op, loc)
    }

    /// Explicit broadcast: leading size-1 dims by reshape, then an expand; a no-op when shapes match.
    fn expand_to(&self, target: &Shape, loc: &SourceLoc) -> Result<Tensor> {
        let s = self.shape();
        if &s == target {
            return Ok(self.clone());
        }
        let pad = target.rank() - s.rank();
        let mut t = self.specialized(&target.dims()[pad..], loc)?;
        let s = t.shape();
        if pad > 0 {
            let mut dims = vec![Expr::from(1usize); pad];
            dims.extend(s.dims().iter().cloned());
            t = record(Op::Reshape, &[&t], t.dtype(), Shape(dims), loc.clone())?;
        }
        if &t.shape() == target {
            return Ok(t);
        }
        record(Op::Expand, &[&t], t.dtype(), target.clone(), loc.clone())
    }

    /// `cond ? a : b` elementwise with broadcasting; `self` is the bool condition. A scalar branch takes
    /// the other branch's dtype (f32 when both are scalars).
    #[track_caller]
    pub fn where_(&self, a: impl Operand, b: impl Operand) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        check_dtype("where", DTypeRule::Bool, self.dtype(), &loc)?;
        let (a, b) = (a.operand(), b.operand());
        let dtype = a.tensor().or(b.tensor()).map_or(DType::F32, |t| t.dtype());
        let mut shape = self.shape();
        for t in [a.tensor(), b.tensor()].into_iter().flatten() {
            shape = broadcast(&shape, &t.shape(), "where", &loc)?;
        }
        let (a, b) = (a.into_tensor(dtype, &shape, &loc)?, b.into_tensor(dtype, &shape, &loc)?);
        if a.dtype() != b.dtype() {
            return Err(Error::DType {
                op: "where".into(),
                expected: format!("both branches of one dtype ({})", a.dtype()),
                got: b.dtype(),
                loc,
            });
        }
        let (c, a, b) = (self.expand_to(&shape, &loc)?, a.expand_to(&shape, &loc)?, b.expand_to(&shape, &loc)?);
        record(Op::Where, &[&c, &a, &b], dtype, shape, loc)
    }

    /// Conversion to `dtype` (floats to integers truncate toward zero and wrap to the width; NaN becomes
    /// 0). Into an 8- or 4-bit float it rounds to nearest even and saturates past the largest finite
    /// value, infinities too (ONNX's default): E5M2, which holds ±∞ as values, gets its infinities
    /// clamped first; E2M1, which has no NaN, takes NaN to −0.
    #[track_caller]
    pub fn cast(&self, dtype: DType) -> Result<Tensor> {
        if dtype == self.dtype() {
            return Ok(self.clone());
        }
        let loc = SourceLoc::caller();
        if let Some(f) = dtype.minifloat().filter(|f| f.infinities && self.dtype().is_float()) {
            // Clamped in f32 (a half widens exactly), where every backend's min and max keep NaN.
            let clamped =
                SourceLoc::attributed(loc.clone(), || self.cast(DType::F32)?.clamp(Some(-f.max), Some(f.max)))?;
            return record(Op::Cast, &[&clamped], dtype, self.shape(), loc);
        }
        record(Op::Cast, &[self], dtype, self.shape(), loc)
    }

    /// Conversion to `dtype` as [`Tensor::cast`], except into an 8-bit float from a float (an 8-bit one
    /// too): a value
    /// that rounds past the largest finite value (an infinity too) becomes ±∞ where the format holds
    /// infinities (E5M2) and NaN where it does not (ONNX's `saturate = 0`). Decided in f32 (a half widens
    /// exactly) against [`crate::dtype::Minifloat::overflow_limit`]; the cast itself is the saturating one,
    /// which leaves ±∞ and NaN as they are. A format with neither (E2M1) saturates: it has nothing else
    /// to hold an overflow as.
    #[track_caller]
    pub fn cast_unsaturated(&self, dtype: DType) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        let from_float = self.dtype().is_float() || self.dtype().minifloat().is_some();
        let Some(f) = dtype.minifloat().filter(|f| f.nan && from_float && dtype != self.dtype()) else {
            return SourceLoc::attributed(loc, || self.cast(dtype));
        };
        let past = SourceLoc::attributed(loc.clone(), || {
            let wide = self.cast(DType::F32)?;
            let (limit, tie_overflows) = f.overflow_limit();
            let size = wide.abs()?;
            let over = if tie_overflows { size.ge(limit)? } else { size.gt(limit)? };
            if f.infinities {
                over.where_(&wide.lt(0.0)?.where_(f64::NEG_INFINITY, f64::INFINITY)?, &wide)
            } else {
                over.where_(f64::NAN, &wide)
            }
        })?;
        record(Op::Cast, &[&past], dtype, self.shape(), loc)
    }

    fn reduce(&self, op: ReduceOp, given: &[isize], keepdim: bool, loc: SourceLoc) -> Result<Tensor> {
        let name = op.name();
        check_dtype(name, if op == ReduceOp::Sum { DTypeRule::Any } else { DTypeRule::Numeric }, self.dtype(), &loc)?;
        let ax = axes(name, given, self.rank(), &loc)?;
        let s = self.shape();
        if op != ReduceOp::Sum && ax.iter().any(|&a| s.dims()[a].as_const() == Some(0)) {
            return Err(Error::Shape {
                op: name.into(),
                msg: format!("cannot reduce an empty axis of {s} (no identity)"),
                loc,
            });
        }
        let out = reduced_shape(&s, &ax, keepdim);
        record(Op::Reduce { op, axes: ax, keepdim }, &[self], reduce_dtype(op, self.dtype()), out, loc)
    }

    /// Sum over `axes` (empty = all). Integer and bool sums are i64 (u32 and u64 sums u64, as numpy).
    #[track_caller]
    pub fn sum(&self, axes: &[isize], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Sum, axes, keepdim, SourceLoc::caller())
    }

    /// Maximum over `axes` (empty = all), NaN-propagating.
    #[track_caller]
    pub fn max(&self, axes: &[isize], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Max, axes, keepdim, SourceLoc::caller())
    }

    /// Minimum over `axes` (empty = all), NaN-propagating.
    #[track_caller]
    pub fn min(&self, axes: &[isize], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Min, axes, keepdim, SourceLoc::caller())
    }

    /// Mean over `axes` (empty = all); floats only.
    #[track_caller]
    pub fn mean(&self, given: &[isize], keepdim: bool) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        check_dtype("mean", DTypeRule::Float, self.dtype(), &loc)?;
        let ax = axes("mean", given, self.rank(), &loc)?;
        let out = reduced_shape(&self.shape(), &ax, keepdim);
        record(Op::Mean { axes: ax, keepdim }, &[self], self.dtype(), out, loc)
    }

    /// Variance over `axes` (empty = all) with `correction` subtracted from the count (1 = unbiased).
    #[track_caller]
    pub fn var(&self, given: &[isize], correction: usize, keepdim: bool) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        check_dtype("var", DTypeRule::Float, self.dtype(), &loc)?;
        let ax = axes("var", given, self.rank(), &loc)?;
        let out = reduced_shape(&self.shape(), &ax, keepdim);
        record(Op::Var { axes: ax, correction, keepdim }, &[self], self.dtype(), out, loc)
    }

    fn arg_reduce(&self, op: ArgReduceOp, a: isize, keepdim: bool, loc: SourceLoc) -> Result<Tensor> {
        let name = if op == ArgReduceOp::ArgMax { "argmax" } else { "argmin" };
        check_dtype(name, DTypeRule::Numeric, self.dtype(), &loc)?;
        let ax = axis(name, a, self.rank(), &loc)?;
        let s = self.shape();
        if s.dims()[ax].as_const() == Some(0) {
            return Err(Error::Shape {
                op: name.into(),
                msg: format!("cannot take {name} of an empty axis of {s}"),
                loc,
            });
        }
        let out = reduced_shape(&s, &[ax], keepdim);
        record(Op::ArgReduce { op, axis: ax, keepdim }, &[self], DType::I64, out, loc)
    }

    /// Index of the first maximum along `axis` (i64).
    #[track_caller]
    pub fn argmax(&self, axis: isize, keepdim: bool) -> Result<Tensor> {
        self.arg_reduce(ArgReduceOp::ArgMax, axis, keepdim, SourceLoc::caller())
    }

    /// Index of the first minimum along `axis` (i64).
    #[track_caller]
    pub fn argmin(&self, axis: isize, keepdim: bool) -> Result<Tensor> {
        self.arg_reduce(ArgReduceOp::ArgMin, axis, keepdim, SourceLoc::caller())
    }

    /// Same elements, new shape; one dim may be `-1` and is inferred.
    #[track_caller]
    pub fn reshape(&self, dims: &[isize]) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        let s = self.shape();
        let numel = s.numel();
        let shown = format!("{dims:?}");
        let reshape_err = |to_numel: String| Error::Reshape {
            from: crate::trace::shape_for_humans(&s),
            from_numel: crate::trace::concrete_value(&numel).map_or_else(|| numel.to_string(), |v| v.to_string()),
            to: shown.clone(),
            to_numel,
            loc: loc.clone(),
        };
        if dims.iter().filter(|&&d| d == -1).count() > 1 || dims.iter().any(|&d| d < -1) {
            return Err(invalid("reshape", format!("{shown}: at most one -1 and no other negative size"), &loc));
        }
        let too_large = || Error::TooLarge {
            op: "reshape".into(),
            msg: format!("{shown} has more elements than kiln can address"),
            loc: loc.clone(),
        };
        let mut known = Expr::from(1usize);
        for &d in dims.iter().filter(|&&d| d >= 0) {
            let d = i64::try_from(d).map_err(|_| too_large())?;
            known = known.checked_mul(&Expr::from(d)).map_err(|_| too_large())?;
        }
        let out: Vec<Dim> = if dims.contains(&-1) {
            if known.as_const() == Some(0) {
                return Err(reshape_err("? (a -1 next to a zero size)".into()));
            }
            let inferred = numel.checked_floor_div(&known).map_err(|_| reshape_err("?".into()))?;
            // `[2, s0]` to `[-1, 4]` needs 4 to divide 2*s0: true for this call's sizes, it becomes a
            // guard of the compiled entry (as torch does), false it is the user's error.
            if inferred.clone() * known.clone() != numel {
                let rem = numel.checked_modulo(&known).map_err(|_| reshape_err("?".into()))?;
                if crate::trace::assume_zero(&rem) != Some(true) {
                    return Err(reshape_err(format!("a multiple of {known}")));
                }
            }
            dims.iter().map(|&d| if d == -1 { inferred.clone() } else { Expr::from(d as usize) }).collect()
        } else {
            if known != numel {
                let diff = numel.checked_sub(&known).map_err(|_| too_large())?;
                if crate::trace::assume_zero(&diff) != Some(true) {
                    return Err(reshape_err(known.to_string()));
                }
            }
            dims.iter().map(|&d| Expr::from(d as usize)).collect()
        };
        let out = Shape(out);
        if out == s {
            return Ok(self.clone());
        }
        record(Op::Reshape, &[self], self.dtype(), out, loc)
    }

    /// Reorders axes: output axis `i` is input axis `perm[i]`.
    #[track_caller]
    pub fn permute(&self, perm: &[isize]) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        let r = self.rank();
        if perm.len() != r {
            return Err(invalid(
                "permute",
                format!("{perm:?} has {} entries for a tensor of rank {r}", perm.len()),
                &loc,
            ));
        }
        let p = perm.iter().map(|&a| axis("permute", a, r, &loc)).collect::<Result<Vec<_>>>()?;
        let mut seen = vec![false; r];
        for &a in &p {
            if std::mem::replace(&mut seen[a], true) {
                return Err(invalid("permute", format!("{perm:?} is not a permutation"), &loc));
            }
        }
        if p.iter().enumerate().all(|(i, &a)| i == a) {
            return Ok(self.clone());
        }
        let s = self.shape();
        let out = Shape(p.iter().map(|&a| s.dims()[a].clone()).collect());
        record(Op::Permute { perm: p }, &[self], self.dtype(), out, loc)
    }

    /// Swaps two axes.
    #[track_caller]
    pub fn transpose(&self, a: isize, b: isize) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        let r = self.rank();
        let (a, b) = (axis("transpose", a, r, &loc)?, axis("transpose", b, r, &loc)?);
        let mut perm: Vec<isize> = (0..r as isize).collect();
        perm.swap(a, b);
        self.permute(&perm)
    }

    /// Broadcasts to `dims` under PyTorch's rules (`-1` keeps a dim).
    #[track_caller]
    pub fn expand(&self, dims: &[isize]) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        let s = self.shape();
        if dims.len() < s.rank() {
            return Err(invalid("expand", format!("cannot expand {s} to fewer dims {dims:?}"), &loc));
        }
        let pad = dims.len() - s.rank();
        let mut target = Vec::with_capacity(dims.len());
        for (i, &d) in dims.iter().enumerate() {
            target.push(match (d, i.checked_sub(pad)) {
                (-1, Some(j)) => s.dims()[j].clone(),
                (d, _) if d >= 0 => Expr::from(d as usize),
                _ => return Err(invalid("expand", format!("bad size {d} in {dims:?}"), &loc)),
            });
        }
        let target = Shape(target);
        if target.checked_numel().is_err() {
            return Err(Error::TooLarge {
                op: "expand".into(),
                msg: format!("{dims:?} has more elements than kiln can address"),
                loc,
            });
        }
        let ok = broadcast(&s, &target, "expand", &loc).is_ok_and(|b| b == target);
        if !ok {
            return Err(Error::Broadcast {
                op: "expand".into(),
                lhs: crate::trace::shape_for_humans(&s),
                rhs: crate::trace::shape_for_humans(&target),
                loc,
            });
        }
        self.expand_to(&target, &loc)
    }

    /// Inserts a size-1 axis at `axis` (in `-rank-1..=rank`).
    #[track_caller]
    pub fn unsqueeze(&self, a: isize) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        let s = self.shape();
        let at = axis("unsqueeze", a, s.rank() + 1, &loc)?;
        let mut dims = s.dims().to_vec();
        dims.insert(at, Expr::from(1usize));
        record(Op::Reshape, &[self], self.dtype(), Shape(dims), loc)
    }

    /// Removes a size-1 axis.
    #[track_caller]
    pub fn squeeze(&self, a: isize) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        let s = self.shape();
        let at = axis("squeeze", a, s.rank(), &loc)?;
        if s.dims()[at].as_const() != Some(1) {
            return Err(Error::Shape { op: "squeeze".into(), msg: format!("axis {a} of {s} is not of size 1"), loc });
        }
        let mut dims = s.dims().to_vec();
        dims.remove(at);
        record(Op::Reshape, &[self], self.dtype(), Shape(dims), loc)
    }

    /// Elements `start, start+step, ...` below `end` along `axis`, Python-style: negative indices count
    /// from the end, out-of-range bounds clamp, `end = None` means the end.
    #[track_caller]
    pub fn slice(&self, a: isize, start: isize, end: Option<isize>, step: usize) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        let s = self.shape();
        let ax = axis("slice", a, s.rank(), &loc)?;
        if step == 0 {
            return Err(invalid("slice", "step must be positive", &loc));
        }
        let len = s.dims()[ax].as_const().ok_or_else(|| Error::Unsupported {
            what: format!("slicing symbolic axis {ax} of {s}"),
            loc: loc.clone(),
        })?;
        let clamp = |i: isize| -> i64 {
            let i = i as i64;
            (if i < 0 { i + len } else { i }).clamp(0, len)
        };
        let (b, e) = (clamp(start), end.map_or(len, clamp));
        let n = if e > b { (e - b + step as i64 - 1) / step as i64 } else { 0 };
        let mut dims = s.dims().to_vec();
        dims[ax] = Expr::from(n);
        let op = Op::Slice { axis: ax, start: Expr::from(b), end: Expr::from(e.max(b)), step };
        record(op, &[self], self.dtype(), Shape(dims), loc)
    }

    /// `length` elements from `start` along `axis`.
    #[track_caller]
    pub fn narrow(&self, axis: isize, start: usize, length: usize) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        let s = self.shape();
        let ax = crate::ops::axis("narrow", axis, s.rank(), &loc)?;
        match s.dims()[ax].as_const() {
            Some(len) if (start + length) as i64 <= len => {}
            _ => {
                return Err(invalid(
                    "narrow",
                    format!("[{start}, {}) is outside axis {axis} of {s}", start + length),
                    &loc,
                ))
            }
        }
        self.slice(axis, start as isize, Some((start + length) as isize), 1)
    }

    /// Joins tensors along `axis`; all other dims and the dtype must agree.
    #[track_caller]
    pub fn concat(tensors: &[&Tensor], a: isize) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        let first = tensors.first().ok_or_else(|| invalid("concat", "needs at least one tensor", &loc))?;
        let s0 = first.shape();
        let ax = axis("concat", a, s0.rank(), &loc)?;
        let mut total = Expr::from(0usize);
        for t in tensors {
            let s = t.shape();
            if t.dtype() != first.dtype() {
                return Err(Error::DType {
                    op: "concat".into(),
                    expected: format!("{} like the first", first.dtype()),
                    got: t.dtype(),
                    loc,
                });
            }
            let fits = s.rank() == s0.rank() && (0..s.rank()).all(|i| i == ax || s.dims()[i] == s0.dims()[i]);
            if !fits {
                return Err(Error::Shape {
                    op: "concat".into(),
                    msg: format!("{s} does not match {s0} outside axis {ax}"),
                    loc,
                });
            }
            total = total + s.dims()[ax].clone();
        }
        if tensors.len() == 1 {
            return Ok((*first).clone());
        }
        let mut dims = s0.dims().to_vec();
        dims[ax] = total;
        record(Op::Concat { axis: ax }, tensors, first.dtype(), Shape(dims), loc)
    }

    /// Constant padding; `pads[i] = (before, after)` for axis `i`, from the first axis (unlike
    /// `torch.nn.functional.pad`, which starts from the last). Fewer entries than the rank pad the leading
    /// axes only.
    #[track_caller]
    pub fn pad(&self, pads: &[(usize, usize)], value: f64) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        let s = self.shape();
        if pads.len() > s.rank() {
            return Err(invalid("pad", format!("{} pad pairs for a tensor of rank {}", pads.len(), s.rank()), &loc));
        }
        let mut full = pads.to_vec();
        full.resize(s.rank(), (0, 0));
        let dims = s.dims().iter().zip(&full).map(|(d, &(b, a))| d.clone() + Expr::from(b + a)).collect();
        record(Op::Pad { pads: full, value: self.dtype().round(value) }, &[self], self.dtype(), Shape(dims), loc)
    }

    /// Picks entries along `axis` by a 1-D integer `index`.
    #[track_caller]
    pub fn index_select(&self, a: isize, index: &Tensor) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        let s = self.shape();
        let ax = axis("index_select", a, s.rank(), &loc)?;
        check_dtype("index_select", DTypeRule::Numeric, index.dtype(), &loc)?;
        if !index.dtype().is_int() || index.rank() != 1 {
            return Err(invalid(
                "index_select",
                format!("index must be a 1-D integer tensor, got {} {}", index.dtype(), index.shape()),
                &loc,
            ));
        }
        let mut dims = s.dims().to_vec();
        dims[ax] = index.shape().dims()[0].clone();
        record(Op::IndexSelect { axis: ax }, &[self, index], self.dtype(), Shape(dims), loc)
    }

    /// PyTorch's `gather`: `out[i][j] = self[index[i][j]][j]` for axis 0; `index` is an integer tensor of
    /// the same rank, no larger than `self` outside `axis`.
    #[track_caller]
    pub fn gather(&self, a: isize, index: &Tensor) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        let (s, is) = (self.shape(), index.shape());
        let ax = axis("gather", a, s.rank(), &loc)?;
        if !index.dtype().is_int() || is.rank() != s.rank() {
            return Err(invalid(
                "gather",
                format!("index must be an integer tensor of rank {}, got {} {}", s.rank(), index.dtype(), is),
                &loc,
            ));
        }
        for i in 0..s.rank() {
            let fits = i == ax
                || matches!((is.dims()[i].as_const(), s.dims()[i].as_const()), (Some(a), Some(b)) if a <= b)
                || is.dims()[i] == s.dims()[i];
            if !fits {
                return Err(Error::Shape {
                    op: "gather".into(),
                    msg: format!("index {is} is larger than input {s} at axis {i}"),
                    loc,
                });
            }
        }
        record(Op::Gather { axis: ax }, &[self, index], self.dtype(), is, loc)
    }

    /// Matrix product with PyTorch's `matmul` rules: 1-D operands are promoted and the added axis removed,
    /// batch dims broadcast.
    #[track_caller]
    pub fn matmul(&self, rhs: &Tensor) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        check_dtype("matmul", DTypeRule::Wide, self.dtype(), &loc)?;
        if rhs.dtype() != self.dtype() {
            return Err(Error::DType {
                op: "matmul".into(),
                expected: format!("both operands {}", self.dtype()),
                got: rhs.dtype(),
                loc,
            });
        }
        let (sa, sb) = (self.shape(), rhs.shape());
        if sa.rank() == 0 || sb.rank() == 0 {
            return Err(Error::Shape {
                op: "matmul".into(),
                msg: format!("needs operands of rank >= 1, got {sa} and {sb}"),
                loc,
            });
        }
        let one = Expr::from(1usize);
        let a = if sa.rank() == 1 {
            record(Op::Reshape, &[self], self.dtype(), Shape(vec![one.clone(), sa.dims()[0].clone()]), loc.clone())?
        } else {
            self.clone()
        };
        let b = if sb.rank() == 1 {
            record(Op::Reshape, &[rhs], rhs.dtype(), Shape(vec![sb.dims()[0].clone(), one.clone()]), loc.clone())?
        } else {
            rhs.clone()
        };
        let (da, db) = (a.shape(), b.shape());
        let (ra, rb) = (da.rank(), db.rank());
        let (m, k) = (&da.dims()[ra - 2], &da.dims()[ra - 1]);
        let (k2, n) = (&db.dims()[rb - 2], &db.dims()[rb - 1]);
        let Some(k) = unify_dims(k, k2) else {
            let (ha, hb) = (crate::trace::shape_for_humans(&da), crate::trace::shape_for_humans(&db));
            return Err(Error::Shape { op: "matmul".into(), msg: format!("inner dims differ: {ha} @ {hb}"), loc });
        };
        let k = &k;
        let batch =
            broadcast(&Shape(da.dims()[..ra - 2].to_vec()), &Shape(db.dims()[..rb - 2].to_vec()), "matmul", &loc)
                .map_err(|_| Error::Broadcast {
                    op: "matmul".into(),
                    lhs: crate::trace::shape_for_humans(&da),
                    rhs: crate::trace::shape_for_humans(&db),
                    loc: loc.clone(),
                })?;
        let with = |x: &Dim, y: &Dim| {
            let mut d = batch.dims().to_vec();
            d.push(x.clone());
            d.push(y.clone());
            Shape(d)
        };
        let a = a.expand_to(&with(m, k), &loc)?;
        let b = b.expand_to(&with(k, n), &loc)?;
        let out = record(Op::MatMul, &[&a, &b], self.dtype(), with(m, n), loc.clone())?;
        let mut dims = out.shape().dims().to_vec();
        let r = dims.len();
        match (sa.rank(), sb.rank()) {
            (1, 1) => {
                dims.truncate(r - 2);
            }
            (1, _) => {
                dims.remove(r - 2);
            }
            (_, 1) => {
                dims.pop();
            }
            _ => return Ok(out),
        }
        record(Op::Reshape, &[&out], out.dtype(), Shape(dims), loc)
    }

    fn float_composite(&self, op: Op, loc: SourceLoc) -> Result<Tensor> {
        check_dtype(op.name(), DTypeRule::Float, self.dtype(), &loc)?;
        record(op, &[self], self.dtype(), self.shape(), loc)
    }

    /// Softmax along `axis`.
    #[track_caller]
    pub fn softmax(&self, a: isize) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        let ax = axis("softmax", a, self.rank(), &loc)?;
        self.float_composite(Op::Softmax { axis: ax }, loc)
    }

    /// Log-softmax along `axis`.
    #[track_caller]
    pub fn log_softmax(&self, a: isize) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        let ax = axis("log_softmax", a, self.rank(), &loc)?;
        self.float_composite(Op::LogSoftmax { axis: ax }, loc)
    }

    /// GELU, erf form (PyTorch's default).
    #[track_caller]
    pub fn gelu(&self) -> Result<Tensor> {
        self.float_composite(Op::Gelu { approx: GeluApprox::Erf }, SourceLoc::caller())
    }

    /// GELU, tanh approximation.
    #[track_caller]
    pub fn gelu_tanh(&self) -> Result<Tensor> {
        self.float_composite(Op::Gelu { approx: GeluApprox::Tanh }, SourceLoc::caller())
    }

    /// SiLU (swish): `x * sigmoid(x)`.
    #[track_caller]
    pub fn silu(&self) -> Result<Tensor> {
        self.float_composite(Op::Silu, SourceLoc::caller())
    }

    /// This tensor combined element by element across the processes of the data-parallel world this
    /// process joined ([`Op::AllReduce`]): inside a compiled step it is one more op of the step — the
    /// compiler buckets such reductions and queues each as soon as its inputs are made, beside the
    /// rest of the step. A process that joined no world is a world of one: the tensor itself.
    #[track_caller]
    pub fn all_reduce(&self, op: crate::ir::CollectiveOp) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        let rule = match op {
            crate::ir::CollectiveOp::Sum => DTypeRule::Wide,
            crate::ir::CollectiveOp::Mean => DTypeRule::Float,
        };
        check_dtype(Op::AllReduce { op }.name(), rule, self.dtype(), &loc)?;
        record(Op::AllReduce { op }, &[self], self.dtype(), self.shape(), loc)
    }

    /// Keeps elements on and below the diagonal of the last two axes, `-inf` above (causal attention).
    #[track_caller]
    pub fn causal_mask(&self) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        if self.rank() < 2 {
            return Err(Error::Shape {
                op: "causal_mask".into(),
                msg: format!("needs rank >= 2, got {}", self.shape()),
                loc,
            });
        }
        self.float_composite(Op::CausalMask, loc)
    }

    /// Layer norm over the last `dims` axes, optionally affine (`weight` and `bias` shaped like those axes).
    #[track_caller]
    pub fn layer_norm(&self, dims: usize, weight: Option<&Tensor>, bias: Option<&Tensor>, eps: f64) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        check_dtype("layer_norm", DTypeRule::Float, self.dtype(), &loc)?;
        let s = self.shape();
        if dims == 0 || dims > s.rank() {
            return Err(invalid("layer_norm", format!("cannot normalise the last {dims} axes of {s}"), &loc));
        }
        let norm = Shape(s.dims()[s.rank() - dims..].to_vec());
        let mut inputs = vec![self];
        match (weight, bias) {
            (None, None) => {}
            (Some(w), Some(b)) => {
                for t in [w, b] {
                    if t.shape() != norm || t.dtype() != self.dtype() {
                        return Err(Error::Shape {
                            op: "layer_norm".into(),
                            msg: format!(
                                "weight and bias must be {} {norm}, got {} {}",
                                self.dtype(),
                                t.dtype(),
                                t.shape()
                            ),
                            loc,
                        });
                    }
                }
                inputs.extend([w, b]);
            }
            _ => return Err(invalid("layer_norm", "give both weight and bias, or neither", &loc)),
        }
        let op = Op::LayerNorm { dims, eps, affine: inputs.len() == 3 };
        record(op, &inputs, self.dtype(), s, loc)
    }

    /// `self @ weight^T + bias`, with `weight` shaped `[out, in]` as in `torch.nn.Linear`.
    #[track_caller]
    pub fn linear(&self, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        check_dtype("linear", DTypeRule::Float, self.dtype(), &loc)?;
        let (s, w) = (self.shape(), weight.shape());
        let unified = (s.rank() >= 1 && w.rank() == 2).then(|| unify_dims(&s.dims()[s.rank() - 1], &w.dims()[1]));
        if unified.as_ref().is_none_or(Option::is_none) {
            let (hs, hw) = (crate::trace::shape_for_humans(&s), crate::trace::shape_for_humans(&w));
            return Err(Error::Shape {
                op: "linear".into(),
                msg: format!("input {hs} does not fit weight {hw} ([out, in])"),
                loc,
            });
        }
        // A dynamic feature dim unified with the weight's: the input is viewed with the constant.
        let mut spec = s.dims().to_vec();
        if let (Some(u), Some(last)) = (unified.flatten(), spec.last_mut()) {
            *last = u;
        }
        let x = self.specialized(&spec, &loc)?;
        let out_f = w.dims()[0].clone();
        let mut inputs = vec![&x, weight];
        if let Some(b) = bias {
            if b.shape() != Shape(vec![out_f.clone()]) {
                return Err(Error::Shape {
                    op: "linear".into(),
                    msg: format!("bias {} must be [{out_f}]", b.shape()),
                    loc,
                });
            }
            inputs.push(b);
        }
        check_same_dtype("linear", self.dtype(), &inputs[1..], &loc)?;
        let mut dims = s.dims().to_vec();
        let last = dims.len() - 1;
        dims[last] = out_f;
        record(Op::Linear { bias: bias.is_some() }, &inputs, self.dtype(), Shape(dims), loc)
    }
}
