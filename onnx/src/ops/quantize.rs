//! ONNX's linear quantization: `QuantizeLinear`, `DequantizeLinear` and `DynamicQuantizeLinear` (per
//! tensor, per axis and blocked), the integer products `MatMulInteger` and `ConvInteger`, their
//! requantizing forms `QLinearMatMul` and `QLinearConv`, and `BitShift`. Quantized values are kiln's
//! narrow integers (u8, i8, u16, i16, and the 4- and 2-bit ones) or its 8- and 4-bit floats (which take
//! the scaled value through their saturating cast); products take integers widened to i32, where they
//! accumulate exactly, and scales apply in f32, as ONNX's reference does.

use super::{axis, invalid, one, unsupported, Node, OpError, OpResult};
use crate::value::Value;
use kiln_graph::{DType, Tensor};

/// The op types this family converts.
pub(super) const OPS: &[&str] = &[
    "QuantizeLinear",
    "DequantizeLinear",
    "DynamicQuantizeLinear",
    "MatMulInteger",
    "ConvInteger",
    "QLinearMatMul",
    "QLinearConv",
    "BitShift",
];

/// The family; `None` when `op` is not one of it.
pub(super) fn run(node: &Node, op: &str) -> Option<OpResult<Vec<Value>>> {
    Some(match op {
        "QuantizeLinear" => quantize_linear(node),
        "DequantizeLinear" => dequantize_linear(node),
        "DynamicQuantizeLinear" => dynamic_quantize_linear(node),
        "MatMulInteger" => matmul_integer(node).and_then(one),
        "ConvInteger" => conv_integer(node).and_then(one),
        "QLinearMatMul" => qlinear_matmul(node).and_then(one),
        "QLinearConv" => qlinear_conv(node).and_then(one),
        "BitShift" => bit_shift(node).and_then(one),
        _ => return None,
    })
}

/// The dtype an `output_dtype` attribute names, if the node has one.
fn output_dtype(node: &Node) -> OpResult<Option<DType>> {
    match node.int("output_dtype", 0) {
        0 => Ok(None),
        t => crate::tensor::dtype_of(t as i32).map(Some).map_err(OpError::Unsupported),
    }
}

/// A quantized dtype kiln holds: the narrow integers (2 to 16 bits) and the small floats (8-bit, and
/// 4-bit E2M1).
fn quantized(d: DType) -> OpResult<DType> {
    if d.is_narrow_int() || d.minifloat().is_some() {
        Ok(d)
    } else {
        unsupported(format!(
            "quantized values of {d} (kiln quantizes to its 2- to 16-bit integers and its 8- and 4-bit floats)"
        ))
    }
}

/// `v`, a vector of `n` values, shaped to lie along axis `axis` (negative counts from the end) of a
/// rank-`rank` tensor.
fn vector_along(v: &Tensor, n: usize, rank: usize, axis: isize) -> OpResult<Tensor> {
    let a = if axis < 0 { axis + rank as isize } else { axis };
    if a < 0 || a >= rank as isize {
        return invalid(format!("a vector of {n} scales or zero points along axis {axis} of a rank-{rank} tensor"));
    }
    let mut shape = vec![1isize; rank];
    shape[a as usize] = n as isize;
    Ok(v.reshape(&shape)?)
}

/// A scale or zero point `v` of `x`, made to broadcast against it: one value for the whole tensor, one
/// per index of `axis` (a vector), or, with `block` > 0, one per `block` consecutive indices of `axis`
/// (shaped as the tensor but for that axis, which counts blocks). Only a blocked one needs `x`'s dims
/// constant (a dynamic batch quantizes per tensor or per channel).
fn along(v: &Tensor, x: &Tensor, axis_attr: i64, block: i64) -> OpResult<Tensor> {
    let vd = concrete(v, "a scale")?;
    let n: usize = vd.iter().product();
    if vd.is_empty() {
        return Ok(v.clone());
    }
    if n == 1 {
        return Ok(v.reshape(&[])?);
    }
    // The axis matters (and must exist) only for a scale of several values.
    let xs = x.shape();
    let axis = axis(axis_attr, xs.rank())?;
    if block <= 0 {
        if vd.len() != 1 || xs.dims()[axis].as_const() != Some(n as i64) {
            return invalid(format!("a per-axis scale of shape {vd:?} for axis {axis} of {xs}"));
        }
        return vector_along(v, n, xs.rank(), axis as isize);
    }
    let dims = concrete(x, "an input quantized in blocks")?;
    let block = block as usize;
    let fits = vd.len() == dims.len()
        && (0..dims.len()).all(|a| if a == axis { vd[a] == dims[a].div_ceil(block) } else { vd[a] == dims[a] });
    if !fits {
        return invalid(format!("a blocked scale of shape {vd:?} for blocks of {block} along axis {axis} of {dims:?}"));
    }
    // Each entry repeated `block` times along the axis, the last block cut to what remains.
    let mut wide: Vec<isize> = vd.iter().map(|&d| d as isize).collect();
    wide.insert(axis + 1, block as isize);
    let repeated = v.unsqueeze(axis as isize + 1)?.expand(&wide)?;
    let mut merged: Vec<isize> = vd.iter().map(|&d| d as isize).collect();
    merged[axis] *= block as isize;
    Ok(repeated.reshape(&merged)?.narrow(axis as isize, 0, dims[axis])?)
}

/// The dims of a tensor the quantization ops need as constants.
fn concrete(x: &Tensor, what: &str) -> OpResult<Vec<usize>> {
    x.shape().as_concrete().ok_or_else(|| OpError::Unsupported(format!("{what} of symbolic shape")))
}

/// `x` rounded half to even and clamped to `d`'s range, in `d`.
fn saturate(x: &Tensor, d: DType) -> OpResult<Tensor> {
    Ok(x.round()?.clamp(Some(d.min_value()), Some(d.max_value()))?.cast(d)?)
}

/// `y = saturate(round(x / scale) + zero_point)`.
fn quantize_linear(node: &Node) -> OpResult<Vec<Value>> {
    let (x, scale, zp) = (node.tensor(0)?, node.tensor(1)?, node.opt_tensor(2)?);
    let out = match (&zp, output_dtype(node)?) {
        (Some(z), Some(o)) if z.dtype() != o => {
            return invalid(format!("output_dtype {o} but a zero point of {}", z.dtype()))
        }
        (Some(z), _) => z.dtype(),
        (None, o) => o.unwrap_or(DType::U8),
    };
    let out = quantized(out)?;
    let ax = node.int("axis", 1);
    let block = node.int("block_size", 0);
    // The quotient in the input's dtype when the scale shares it (numpy's), else in f32, or in the
    // `precision` the node asks for.
    let cd = match node.int("precision", 0) {
        0 if x.dtype() == scale.dtype() => x.dtype(),
        0 => DType::F32,
        p => crate::tensor::dtype_of(p as i32).map_err(OpError::Unsupported)?,
    };
    let q = x.cast(cd)?.div(&along(&scale.cast(cd)?, &x, ax, block)?)?;
    if out.minifloat().is_some() {
        // A small float takes the quotient itself, rounded and saturated by the cast (its zero point
        // is 0 by definition, as ONNX's reference ignores it).
        if node.int("saturate", 1) == 0 {
            return unsupported(format!("quantizing to {out} without saturation"));
        }
        return one(q.cast(out)?);
    }
    let q = q.round()?.cast(DType::F32)?;
    let q = match zp {
        Some(z) => q.add(&along(&z.cast(DType::F32)?, &x, ax, block)?)?,
        None => q,
    };
    one(saturate(&q, out)?)
}

/// `y = (x - zero_point) * scale`, in f32, then in the scale's dtype (or `output_dtype`).
fn dequantize_linear(node: &Node) -> OpResult<Vec<Value>> {
    let (x, scale, zp) = (node.tensor(0)?, node.tensor(1)?, node.opt_tensor(2)?);
    if let Some(z) = &zp {
        if z.dtype() != x.dtype() {
            return invalid(format!("a zero point of {} for values of {}", z.dtype(), x.dtype()));
        }
    }
    if !(x.dtype().is_narrow_int() || x.dtype() == DType::I32 || x.dtype().minifloat().is_some()) {
        return unsupported(format!("dequantizing {} values", x.dtype()));
    }
    // A small float's zero point is 0 by definition (ONNX's reference ignores it).
    let zp = zp.filter(|_| x.dtype().minifloat().is_none());
    let ax = node.int("axis", 1);
    let block = node.int("block_size", 0);
    let dx = x.cast(DType::F32)?;
    let dx = match zp {
        Some(z) => dx.sub(&along(&z.cast(DType::F32)?, &x, ax, block)?)?,
        None => dx,
    };
    let y = dx.mul(&along(&scale.cast(DType::F32)?, &x, ax, block)?)?;
    one(y.cast(output_dtype(node)?.unwrap_or(scale.dtype()))?)
}

/// u8 quantization of `x` with the scale and zero point its range (widened to hold 0) gives:
/// `(y, y_scale, y_zero_point)`.
fn dynamic_quantize_linear(node: &Node) -> OpResult<Vec<Value>> {
    let given = node.tensor(0)?;
    let x = given.cast(DType::F32)?;
    let (hi, lo) = (x.max(&[], false)?.maximum(0.0)?, x.min(&[], false)?.minimum(0.0)?);
    let range = hi.sub(&lo)?;
    let scale = hi.eq(&lo)?.where_(1.0, &range)?.div(255.0)?;
    let zp = lo.div(&scale)?.neg()?.clamp(Some(0.0), Some(255.0))?.round()?;
    let y = x.div(&scale)?.round()?.add(&zp)?.clamp(Some(0.0), Some(255.0))?.cast(DType::U8)?;
    let scale = scale.cast(given.dtype())?;
    Ok(vec![Value::Tensor(y), Value::Tensor(scale), Value::Tensor(zp.cast(DType::U8)?)])
}

/// `x - zero_point` in i32, the zero point per tensor or per entry of `axis` of `x` (the rows of a
/// matrix product's left operand, the columns of its right, a weight's output channels), or shaped to
/// broadcast as given.
fn centered(x: &Tensor, zp: Option<Tensor>, axis_of_vector: isize) -> OpResult<Tensor> {
    let xi = x.cast(DType::I32)?;
    let Some(z) = zp else { return Ok(xi) };
    if z.dtype() != x.dtype() {
        return invalid(format!("a zero point of {} for values of {}", z.dtype(), x.dtype()));
    }
    let zd = concrete(&z, "a zero point")?;
    let z = z.cast(DType::I32)?;
    let n: usize = zd.iter().product();
    let z = if n == 1 {
        z.reshape(&[])?
    } else if zd.len() == 1 {
        vector_along(&z, n, x.rank(), axis_of_vector)?
    } else {
        z
    };
    Ok(xi.sub(&z)?)
}

/// `(A - a_zero_point) @ (B - b_zero_point)` in i32.
fn matmul_integer(node: &Node) -> OpResult<Tensor> {
    let (a, b) = (node.tensor(0)?, node.tensor(1)?);
    let a = centered(&a, node.opt_tensor(2)?, -2)?;
    let b = centered(&b, node.opt_tensor(3)?, -1)?;
    Ok(a.matmul(&b)?)
}

/// The convolution of `x - x_zero_point` with `w - w_zero_point` (per output channel) in i32.
fn conv_integer(node: &Node) -> OpResult<Tensor> {
    let (x, w) = (node.tensor(0)?, node.tensor(1)?);
    let x = centered(&x, node.opt_tensor(2)?, 1)?;
    let w = centered(&w, node.opt_tensor(3)?, 0)?;
    super::nn::conv_of(node, &x, &w, None)
}

/// An i32 accumulator rescaled by `a_scale · b_scale / y_scale` (each a scalar or a vector along
/// `axis` of the result), shifted by `y_zero_point` and saturated to its dtype.
fn requantize(acc: &Tensor, scales: [(Tensor, isize); 3], y_zp: Option<Tensor>, fallback: DType) -> OpResult<Tensor> {
    let out = quantized(y_zp.as_ref().map_or(fallback, Tensor::dtype))?;
    let mut m = acc.cast(DType::F32)?;
    for (i, (s, axis_of_vector)) in scales.into_iter().enumerate() {
        let s = s.cast(DType::F32)?;
        let sd = concrete(&s, "a scale")?;
        let s = if sd.iter().product::<usize>() == 1 {
            s.reshape(&[])?
        } else if sd.len() == 1 {
            vector_along(&s, sd[0], acc.rank(), axis_of_vector)?
        } else {
            return invalid(format!("a scale of shape {sd:?} (a scalar or a vector)"));
        };
        m = if i == 2 { m.div(&s)? } else { m.mul(&s)? };
    }
    let m = match y_zp {
        Some(z) => m.add(&z.cast(DType::F32)?.reshape(&[])?)?,
        None => m,
    };
    saturate(&m, out)
}

/// `QLinearMatMul`: the integer product of the centred operands, requantized.
fn qlinear_matmul(node: &Node) -> OpResult<Tensor> {
    let (a, b) = (node.tensor(0)?, node.tensor(3)?);
    let acc = centered(&a, node.opt_tensor(2)?, -2)?.matmul(&centered(&b, node.opt_tensor(5)?, -1)?)?;
    let scales = [(node.tensor(1)?, -2), (node.tensor(4)?, -1), (node.tensor(6)?, -1)];
    requantize(&acc, scales, node.opt_tensor(7)?, a.dtype())
}

/// `QLinearConv`: the integer convolution of the centred input and weight plus the i32 bias,
/// requantized (the weight's scale per output channel).
fn qlinear_conv(node: &Node) -> OpResult<Tensor> {
    let (x, w) = (node.tensor(0)?, node.tensor(3)?);
    let xc = centered(&x, node.opt_tensor(2)?, 1)?;
    let wc = centered(&w, node.opt_tensor(5)?, 0)?;
    let bias = node.opt_tensor(8)?.map(|b| b.cast(DType::I32)).transpose()?;
    let acc = super::nn::conv_of(node, &xc, &wc, bias.as_ref())?;
    let scales = [(node.tensor(1)?, 1), (node.tensor(4)?, 1), (node.tensor(6)?, 1)];
    requantize(&acc, scales, node.opt_tensor(7)?, x.dtype())
}

/// `x << y` or `x >> y` on unsigned integers: a product with, or a quotient by, `2^min(y, width)`
/// (read from a table), wrapped to the width.
fn bit_shift(node: &Node) -> OpResult<Tensor> {
    let (x, y) = (node.tensor(0)?, node.tensor(1)?);
    if !x.dtype().is_unsigned() {
        return unsupported(format!("BitShift of {} (ONNX shifts unsigned integers)", x.dtype()));
    }
    if y.dtype() != x.dtype() {
        return invalid(format!("shifting {} by {}", x.dtype(), y.dtype()));
    }
    Ok(match node.string("direction").as_deref() {
        Some("LEFT") => x.bitwise_left_shift(&y)?,
        Some("RIGHT") => x.bitwise_right_shift(&y)?,
        other => return invalid(format!("direction {other:?}")),
    })
}

#[cfg(test)]
mod tests {
    use super::super::testing::{int, run_one, string};
    use crate::value::Value;
    use kiln_graph::Tensor;

    fn arg<T: kiln_graph::dtype::Element>(v: &[T], dims: &[usize]) -> Option<Value> {
        Some(Value::Tensor(Tensor::from_slice(v, dims).unwrap()))
    }

    /// Blocks of 2 along axis 1 of a 2 × 5 input: the last block is cut to one column; values round half
    /// to even and saturate at u8's ends.
    #[test]
    fn blocked_quantization_repeats_each_scale_over_its_block() {
        let x = arg(&[1.0f32, 3.0, 5.0, 7.0, 9.0, -2.0, 2.5, 600.0, 0.5, 1.5], &[2, 5]);
        let scale = arg(&[1.0f32, 2.0, 0.5, 1.0, 1.0, 4.0], &[2, 3]);
        let zp = arg(&[0u8, 0, 10, 1, 1, 1], &[2, 3]);
        let got = run_one("QuantizeLinear", vec![int("axis", 1), int("block_size", 2)], &[x, scale, zp]).unwrap();
        // Row 0: 1/1, 3/1, 5/2 = 2.5 → 2, 7/2 = 3.5 → 4, 9/0.5 + 10 = 28. Row 1: -2 + 1 → 0 (saturated
        // from -1), 2.5 → 2 + 1, 600 + 1 → 255, 0.5 + 1 → 1, 1.5/4 = 0.375 → 0 + 1.
        assert_eq!(got[0].to_vec::<u8>().unwrap(), [1, 3, 2, 4, 28, 0, 3, 255, 1, 1]);
    }

    /// Per-axis dequantization of i8 with a zero point a channel, back to the scale's dtype.
    #[test]
    fn dequantization_is_per_channel_along_its_axis() {
        let x = arg(&[-128i8, 0, 127, 5, -5, 1], &[3, 2]);
        let scale = arg(&[0.5f32, 2.0, 1.0], &[3]);
        let zp = arg(&[0i8, 1, -1], &[3]);
        let got = run_one("DequantizeLinear", vec![int("axis", 0)], &[x, scale, zp]).unwrap();
        assert_eq!(got[0].to_vec::<f32>().unwrap(), [-64.0, 0.0, 252.0, 8.0, -4.0, 2.0]);
    }

    /// Scales that fit no mode, zero points of another dtype, shifts of signed values and an unknown
    /// direction are typed errors, not panics.
    #[test]
    fn malformed_quantization_nodes_are_typed_errors() {
        let x = || arg(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2]);
        let bad_axis_scale = run_one("QuantizeLinear", vec![int("axis", 1)], &[x(), arg(&[1.0f32; 3], &[3]), None]);
        assert!(bad_axis_scale.unwrap_err().starts_with("invalid: a per-axis scale"));
        let bad_block = run_one(
            "QuantizeLinear",
            vec![int("axis", 1), int("block_size", 3)],
            &[x(), arg(&[1.0f32; 4], &[2, 2]), None],
        );
        assert!(bad_block.unwrap_err().starts_with("invalid: a blocked scale"));
        let float_zp = run_one("QuantizeLinear", vec![], &[x(), arg(&[1.0f32], &[]), arg(&[0.0f32], &[])]);
        assert!(float_zp.unwrap_err().starts_with("unsupported: quantized values of f32"));
        let mixed = run_one("DequantizeLinear", vec![], &[arg(&[1u8], &[1]), arg(&[1.0f32], &[]), arg(&[0i8], &[])]);
        assert!(mixed.unwrap_err().starts_with("invalid: a zero point of i8"));
        let signed = run_one("BitShift", vec![string("direction", "LEFT")], &[arg(&[1i8], &[1]), arg(&[1i8], &[1])]);
        assert!(signed.unwrap_err().starts_with("unsupported: BitShift of i8"));
        let up = run_one("BitShift", vec![string("direction", "UP")], &[arg(&[1u8], &[1]), arg(&[1u8], &[1])]);
        assert!(up.unwrap_err().starts_with("invalid: direction"));
    }

    /// Shifts by the width or more give 0, as numpy's do; left shifts wrap to the width.
    #[test]
    fn bit_shifts_wrap_and_saturate_the_shift() {
        let x = || arg(&[0x81u16, 3, 0xffff, 1], &[4]);
        let y = || arg(&[1u16, 15, 16, 40], &[4]);
        let left = run_one("BitShift", vec![string("direction", "LEFT")], &[x(), y()]).unwrap();
        assert_eq!(left[0].to_vec::<u16>().unwrap(), [0x102, 0x8000, 0, 0]);
        let right = run_one("BitShift", vec![string("direction", "RIGHT")], &[x(), y()]).unwrap();
        assert_eq!(right[0].to_vec::<u16>().unwrap(), [0x40, 0, 0, 0]);
        // u32 and u64 shift in their own dtype: the top bit survives, a shift by the width clears.
        let x = || arg(&[0x8000_0001u32, 3, 0xffff_ffff, 7], &[4]);
        let y = || arg(&[0u32, 31, 32, 1], &[4]);
        let left = run_one("BitShift", vec![string("direction", "LEFT")], &[x(), y()]).unwrap();
        assert_eq!(left[0].to_vec::<u32>().unwrap(), [0x8000_0001, 0x8000_0000, 0, 14]);
        let right = run_one("BitShift", vec![string("direction", "RIGHT")], &[x(), y()]).unwrap();
        assert_eq!(right[0].to_vec::<u32>().unwrap(), [0x8000_0001, 0, 0, 3]);
        let x = arg(&[1u64 << 40, 5], &[2]);
        let left = run_one("BitShift", vec![string("direction", "LEFT")], &[x, arg(&[12u64, 64], &[2])]).unwrap();
        assert_eq!(left[0].to_vec::<u64>().unwrap(), [1 << 52, 0]);
    }

    /// A vector of zero points along an axis the operand lacks is a typed error, not an index past the
    /// shape (a 1-D left operand has no rows).
    #[test]
    fn a_zero_point_vector_along_a_missing_axis_is_invalid() {
        let a = arg(&[1u8, 2, 3], &[3]);
        let b = arg(&[1u8, 2, 3, 4, 5, 6], &[3, 2]);
        let got = run_one("MatMulInteger", vec![], &[a, b, arg(&[1u8, 2], &[2]), None]);
        assert!(got.unwrap_err().starts_with("invalid: a vector of 2"));
    }
}
