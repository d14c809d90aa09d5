//! Op-by-op conformance: every op across dtypes and shapes (broadcasts, non-contiguous views, sizes that
//! are not multiples of a workgroup, empty and size-1 dims), and NaN/Inf propagation.

use kiln::graph::{compile, Backend, CpuReference, DType, Dynamic, Result, Tensor, TensorData};
use std::sync::Arc;

/// A deterministic tensor: `dims`, `dtype`, values from `gen(i)` (rounded to the dtype).
pub fn t(dims: &[usize], dtype: DType, gen: impl Fn(usize) -> f64) -> Tensor {
    let n: usize = dims.iter().product();
    Tensor::from_data(TensorData::from_f64((0..n).map(gen).collect(), dims, dtype).expect("sizes match"))
}

/// Values in about [-3, 3], distinct, with a sprinkle of exact zeros.
pub fn wave(i: usize) -> f64 {
    if i % 11 == 5 {
        0.0
    } else {
        ((i as f64) * 0.7371).sin() * 3.0
    }
}

/// Tolerance for a dtype: 1e-5 relative for f32 and integers, 1e-2 for half types, 1e-12 for f64; `scale`
/// widens it for reductions and composites, whose error grows with length.
pub fn tol(dtype: DType, scale: f64) -> f64 {
    match dtype {
        DType::F16 | DType::BF16 => 1e-2 * scale,
        DType::F64 => 1e-12 * scale,
        _ => 1e-5 * scale,
    }
}

fn close(got: &TensorData, want: &TensorData, tol: f64) -> std::result::Result<(), String> {
    if got.dims() != want.dims() || got.dtype() != want.dtype() {
        return Err(format!("got {} {:?}, want {} {:?}", got.dtype(), got.dims(), want.dtype(), want.dims()));
    }
    for (i, (g, w)) in got.values().iter().zip(want.values()).enumerate() {
        let ok = (g.is_nan() && w.is_nan()) || g == w || (g - w).abs() <= tol * (1.0 + w.abs());
        if !ok {
            return Err(format!("element {i}: got {g}, want {w}"));
        }
    }
    Ok(())
}

/// Runs `f` on `inputs` through `backend` and through the reference, and compares.
pub fn case(
    backend: &Arc<dyn Backend>,
    name: &str,
    inputs: &[Tensor],
    tol: f64,
    f: impl Fn(&[Tensor]) -> Result<Vec<Tensor>>,
) {
    case_with(backend, name, inputs, tol, Dynamic::Auto, &[], f)
}

/// [`case`], with the backend's compile making dims symbolic by `dynamic`.
pub fn case_with(
    backend: &Arc<dyn Backend>,
    name: &str,
    inputs: &[Tensor],
    tol: f64,
    dynamic: Dynamic,
    marks: &[(usize, usize)],
    f: impl Fn(&[Tensor]) -> Result<Vec<Tensor>>,
) {
    let want = compile(|x: Vec<Tensor>| f(&x)).backend(CpuReference).call(inputs.to_vec());
    let compiled = marks
        .iter()
        .fold(compile(|x: Vec<Tensor>| f(&x)).backend(backend.clone()).dynamic(dynamic), |c, &(arg, dim)| {
            c.mark_dynamic(arg, dim, 1..=usize::MAX)
        });
    let got = compiled.call_explained(inputs.to_vec());
    let want = want.unwrap_or_else(|e| panic!("{name}: the reference failed: {e}"));
    let (got, ex) = got.unwrap_or_else(|e| panic!("{name}: {} failed: {e}", backend.name()));
    assert_eq!(got.len(), want.len());
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        if let Err(msg) = close(&g.to_data().unwrap(), &w.to_data().unwrap(), tol) {
            panic!("{name}, output {k} on {}: {msg}\n{ex}", backend.name());
        }
    }
}

/// A unary op as a plain function.
type UnaryFn = fn(&Tensor) -> Result<Tensor>;

const FLOATS: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

/// Whether `b` computes f64 (a target without it refuses f64 graphs, tested in `tests/errors.rs`:
/// `f64_on_a_target_without_it_is_a_typed_error_naming_the_line`).
pub fn has_f64(b: &Arc<dyn Backend>) -> bool {
    b.target().is_none_or(|t| t.float64)
}

/// The float dtypes `b` computes: [`FLOATS`], and f64 where it has it.
fn floats(b: &Arc<dyn Backend>) -> Vec<DType> {
    FLOATS.into_iter().chain(has_f64(b).then_some(DType::F64)).collect()
}

/// f64 across its range: the transcendental functions `graph::f64_math` writes out, to f64 precision
/// against the reference's libm (exponents to both ends, subnormal logarithms, sines of 10^5), their
/// special values, and casts into narrower floats rounding once (just past a tie of each).
fn f64_range(b: &Arc<dyn Backend>) {
    let d = DType::F64;
    let span = |lo: f64, hi: f64| move |i: usize| lo + (hi - lo) * i as f64 / 40.0;
    let wide = t(&[41], d, span(-740.0, 708.0));
    let magnitudes = t(&[41], d, |i| 10f64.powf(span(-320.0, 307.0)(i)));
    let angles = t(&[41], d, span(-1e5, 1e5));
    let special = [0.0, -0.0, f64::INFINITY, f64::NEG_INFINITY, f64::NAN, 1.0, -1.0, 1e-310, -7.5, 30.0];
    let special = t(&[special.len()], d, |i| special[i]);
    let ties = [
        1.0 + 2f64.powi(-11) + 2f64.powi(-40),
        1.0 + 2f64.powi(-8) + 2f64.powi(-40),
        1.0 + 2f64.powi(-24) + 2f64.powi(-50),
    ];
    let ties = t(&[ties.len()], d, |i| ties[i]);
    let exponents = t(&[41], d, |i| span(-3.0, 3.0)(i).round() + if i % 3 == 0 { 0.37 } else { 0.0 });
    let inputs = [wide, magnitudes, angles, special, ties, exponents];
    case(b, "f64 across its range", &inputs, tol(d, 4.0), |v| {
        let (wide, mag, ang, sp) = (&v[0], &v[1], &v[2], &v[3]);
        let mut out = vec![
            wide.exp()?,
            mag.log()?,
            ang.sin()?,
            ang.cos()?,
            wide.div(40.0)?.tanh()?,
            wide.div(20.0)?.sigmoid()?,
            wide.div(100.0)?.erf()?,
            mag.sqrt()?,
            mag.rsqrt()?,
            wide.div(100.0)?.pow(&v[5])?,
            mag.sum(&[0], false)?,
        ];
        for f in [Tensor::exp, Tensor::log, Tensor::tanh, Tensor::erf, Tensor::sigmoid, Tensor::sin, Tensor::isnan] {
            out.push(f(sp)?);
        }
        out.extend([sp.maximum(&sp.neg()?)?, sp.max(&[0], false)?, sp.argmax(0, false)?]);
        for to in [DType::F32, DType::F16, DType::BF16, DType::F8E4M3] {
            out.push(v[4].cast(to)?);
        }
        Ok(out)
    });
}

/// Every op, over the dtypes it accepts.
pub fn every_op(b: &Arc<dyn Backend>) {
    use kiln::graph::ir::UnaryOp as U;
    let unary: [(U, UnaryFn); 17] = [
        (U::Neg, |x| x.neg()),
        (U::Abs, |x| x.abs()),
        (U::Exp, |x| x.exp()),
        (U::Log, |x| x.log()),
        (U::Sqrt, |x| x.sqrt()),
        (U::Rsqrt, |x| x.rsqrt()),
        (U::Sin, |x| x.sin()),
        (U::Cos, |x| x.cos()),
        (U::Tanh, |x| x.tanh()),
        (U::Sigmoid, |x| x.sigmoid()),
        (U::Erf, |x| x.erf()),
        (U::Relu, |x| x.relu()),
        (U::Reciprocal, |x| x.reciprocal()),
        (U::Floor, |x| x.floor()),
        (U::Ceil, |x| x.ceil()),
        (U::Round, |x| x.round()),
        (U::IsNan, |x| x.isnan()),
    ];
    for d in floats(b) {
        // 37 elements: not a multiple of any workgroup size; includes zeros and negatives.
        let x = t(&[37], d, wave);
        for (op, f) in unary {
            case(b, &format!("{} {d}", op.name()), std::slice::from_ref(&x), tol(d, 1.0), |v| Ok(vec![f(&v[0])?]));
        }
        // On a transposed (non-contiguous) view, with a broadcast operand.
        let m = t(&[5, 7], d, wave);
        let row = t(&[5], d, |i| i as f64 - 2.0);
        case(b, &format!("binary on views {d}"), &[m, row], tol(d, 1.0), |v| {
            let mt = v[0].transpose(0, 1)?;
            Ok(vec![
                mt.add(&v[1])?,
                mt.sub(&v[1])?,
                mt.mul(&v[1])?,
                mt.div(&v[1].add(10.0)?)?,
                mt.abs()?.pow(&v[1])?,
                mt.maximum(&v[1])?,
                mt.minimum(&v[1])?,
                mt.lt(&v[1])?,
                mt.ge(&v[1])?,
                mt.eq(&v[1])?,
                mt.gt(&v[1])?.where_(&mt, &v[1])?,
            ])
        });
    }
    for d in [DType::I32, DType::I64] {
        let x = t(&[3, 13], d, |i| (i as f64 * 7.0) % 23.0 - 11.0);
        let y = t(&[13], d, |i| (i % 5) as f64 + 1.0);
        case(b, &format!("integer ops {d}"), &[x, y], 0.0, |v| {
            // i32: 9 to 45, within the width and past it; i64: 64 to 68 (WGSL computes it in 32 bits, so a
            // shift within 64 would leave them).
            let past = if d == DType::I32 { v[1].mul(9)? } else { v[1].add(63)? };
            Ok(vec![
                v[0].neg()?,
                v[0].abs()?,
                v[0].relu()?,
                v[0].add(&v[1])?,
                v[0].mul(&v[1])?,
                v[0].div(&v[1])?,
                v[0].maximum(&v[1])?,
                v[0].le(&v[1])?,
                v[0].sum(&[1], false)?,
                v[0].max(&[0], true)?,
                v[0].argmin(1, false)?,
                // Negative operands: two's complement bits.
                v[0].bitwise_and(&v[1].neg()?)?,
                v[0].bitwise_or(&v[1])?,
                v[0].bitwise_xor(&v[1].mul(-3)?)?,
                // Shifts within the width, past it, and by negative amounts (read as unsigned: past it).
                v[0].bitwise_left_shift(&v[1])?,
                v[0].bitwise_right_shift(&v[1])?,
                v[0].bitwise_left_shift(&past)?,
                v[0].bitwise_right_shift(&past)?,
                v[0].bitwise_right_shift(&v[1].neg()?)?,
            ])
        });
    }
    for d in DType::ALL.into_iter().filter(|d| d.is_narrow_int()) {
        // Values across the whole range, 39 of them: threads share the packed words of WGSL's layout,
        // and the last word is part-filled. Sums and products leave the width: each op's result is
        // wrapped before the next reads it (a division or comparison after an overflow sees the
        // wrapped value, as the reference does).
        let (lo, hi) = (d.min_value(), d.max_value());
        let x = t(&[3, 13], d, |i| lo + ((i as f64 * 37.0) % 23.0) / 22.0 * (hi - lo));
        // Divisors from 1 up to 5, or the largest value of the 2-bit types (no zero after wrapping).
        let top = hi.min(5.0);
        let y = t(&[13], d, |i| (i as f64 % top) + 1.0);
        let f = t(&[13], DType::F32, |i| (i as f64 - 6.0) * hi * 0.37 + 0.75);
        case(b, &format!("narrow integer ops {d}"), &[x, y, f], 0.0, |v| {
            let (x, y) = (&v[0], &v[1]);
            let twice = x.add(x)?;
            Ok(vec![
                twice.clone(),
                x.sub(y)?,
                x.mul(y)?.mul(y)?,
                x.neg()?,
                x.abs()?,
                x.relu()?,
                twice.div(y)?,
                twice.lt(x)?,
                twice.maximum(x)?,
                x.sum(&[0], false)?,
                x.max(&[1], true)?,
                x.argmax(1, false)?,
                x.bitwise_and(&y.neg()?)?,
                x.bitwise_xor(y)?,
                x.bitwise_left_shift(y)?,
                x.bitwise_right_shift(&y.mul(2)?)?,
                x.cast(DType::F32)?.add(0.5)?,
                x.cast(DType::I32)?.mul(3)?,
                v[2].cast(d)?,
                v[2].mul(4.0)?.cast(d)?.add(y)?,
                x.eq(&twice)?.where_(x, &twice)?,
                x.transpose(0, 1)?.reshape(&[-1])?.narrow(0, 1, 17)?,
                x.reshape(&[1, 3, 13])?.max_pool(&[2], &kiln::graph::Window::uniform(1, 1, 1, 1))?,
            ])
        });
    }
    // u32 across its whole range: past 2^31 division, comparisons, maxima and conversions read the bits
    // as unsigned, and sums, differences and negations wrap modulo 2^32. u64 below 2^31, its results
    // too, and so are the sums (u64s): WGSL computes u64 in its low word, as i64 in i32 (a documented
    // limit).
    for d in [DType::U32, DType::U64] {
        let hi = if d == DType::U32 { d.max_value() } else { f64::from(i32::MAX) };
        let x = t(&[3, 13], d, |i| (((i as f64 * 37.0) % 23.0) / 22.0 * hi).floor());
        let y = t(&[13], d, |i| (i % 5) as f64 + 1.0);
        // Floats inside (−2^31, 2^32) (kiln's casts past an integer's range follow each device's cast);
        // for u64 non-negative (a negative one wraps past 2^32).
        let low = if d == DType::U32 { -6.0 } else { 0.0 };
        let f = t(&[13], DType::F32, |i| (i as f64 + low) * 2f64.powi(27) + 0.75);
        case(b, &format!("unsigned integer ops {d}"), &[x, y, f], 0.0, |v| {
            let (x, y) = (&v[0], &v[1]);
            let small = x.div(16)?;
            let mut out = vec![
                small.add(&small)?,
                small.mul(y)?,
                x.abs()?,
                x.relu()?,
                x.div(y)?,
                x.lt(&small.mul(8)?)?,
                x.maximum(&small.mul(9)?)?,
                x.minimum(y)?,
                small.sum(&[0], false)?,
                x.max(&[1], true)?,
                x.min(&[0], false)?,
                x.argmax(1, false)?,
                x.argmin(0, false)?,
                x.bitwise_or(y)?,
                x.bitwise_xor(y)?,
                x.bitwise_right_shift(y)?,
                x.bitwise_right_shift(&y.mul(7)?)?,
                small.bitwise_left_shift(y)?,
                x.cast(DType::F32)?,
                x.cast(DType::I32)?,
                x.cast(DType::U8)?,
                v[2].cast(d)?,
                x.eq(&small)?.where_(x, &small)?,
                x.transpose(0, 1)?.reshape(&[-1])?.narrow(0, 1, 17)?,
            ];
            if d == DType::U32 {
                // Past the width: wrapped.
                out.extend([x.add(x)?, x.sub(y)?, x.neg()?, x.mul(y)?.mul(y)?, x.bitwise_left_shift(&y.mul(7)?)?]);
                out.push(x.bitwise_and(&y.neg()?)?);
            }
            Ok(out)
        });
    }
    for d in DType::ALL.into_iter().filter(|d| d.minifloat().is_some()) {
        // Ties to even, the subnormal steps, saturation (infinities too), NaN, signed zero: 8- and 4-bit
        // floats are storage, written by a cast and read back through layout ops and another cast.
        let top = d.minifloat().map_or(448.0, |f| f.max);
        let special = [
            0.0,
            -0.0,
            1.0625,
            1.1875,
            -3.75,
            0.0009765625,
            0.00098,
            -1e9,
            f64::INFINITY,
            f64::NAN,
            top * 0.99,
            top * 1.01,
            -0.3,
            1e-3,
            100.0,
            top,
            0.15,
            7.0,
            -2.5e-5,
        ];
        let x = t(&[3, 19], DType::F32, |i| special[i % special.len()] * if i >= 19 { 1.7 } else { 1.0 });
        case(b, &format!("small float casts {d}"), &[x], 0.0, |v| {
            let q = v[0].cast(d)?;
            Ok(vec![
                q.clone(),
                q.cast(DType::F32)?,
                q.cast(DType::F16)?,
                q.transpose(0, 1)?.reshape(&[-1])?.narrow(0, 3, 40)?,
                Tensor::concat(&[&q, &v[0].mul(0.5)?.cast(d)?], 0)?.cast(DType::F32)?,
                q.cast(DType::F32)?.mul(3.0)?.cast(d)?,
                // The sign of a zero shows in its reciprocal (the FNUZ formats have only +0).
                // (rounded in a register: a cast of its own, not `q` read back from its buffer).
                {
                    let r = v[0].mul(1.0)?.cast(d)?.cast(DType::F32)?;
                    r.mul(0.0)?.add(1.0)?.div(&r)?
                },
            ])
        });
    }
    for d in DType::ALL.into_iter().filter(|d| d.minifloat().is_some()) {
        // Without saturation (ONNX's `saturate = 0`): past the overflow limit ±∞ (E5M2) or NaN; at the
        // limit itself by the tie's rule; from f32 and from f16.
        let f = d.minifloat().unwrap();
        let (limit, _) = f.overflow_limit();
        let special = [
            limit,
            -limit,
            limit * 1.001,
            limit * 0.999,
            -limit * 1.5,
            f.max,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
            -0.0,
            1.1875,
            1e9,
        ];
        let x = t(&[2, 12], DType::F32, |i| special[i % special.len()] * if i >= 12 { 0.5 } else { 1.0 });
        case(b, &format!("8-bit float casts without saturation {d}"), &[x], 0.0, |v| {
            let q = v[0].cast_unsaturated(d)?;
            Ok(vec![
                q.clone(),
                q.cast(DType::F32)?,
                v[0].cast(DType::F16)?.cast_unsaturated(d)?.cast(DType::F32)?,
                v[0].mul(2.0)?.cast_unsaturated(d)?,
            ])
        });
    }
    // E5M2 holds ±∞ as itself (0x7c, 0xfc): layout ops and casts out of it keep them (each element
    // decoded where read and encoded where written); a cast into it saturates them (±57,344).
    let held = [f64::INFINITY, f64::NEG_INFINITY, 1.0, 57344.0, -0.0, 2.0, -3.0, f64::NAN];
    let x = t(&[2, 4], DType::F8E5M2, |i| held[i % held.len()]);
    case(b, "E5M2 infinities", &[x], 0.0, |v| {
        Ok(vec![
            v[0].transpose(0, 1)?.reshape(&[-1])?,
            Tensor::concat(&[&v[0], &v[0]], 0)?.cast(DType::F32)?,
            v[0].cast(DType::F16)?,
            v[0].cast(DType::F32)?.cast(DType::F8E5M2)?,
            // Into E4M3FN, which has none: saturated, or NaN without saturation.
            v[0].cast(DType::F8E4M3)?,
            v[0].cast_unsaturated(DType::F8E4M3)?,
        ])
    });
    // `maximum` and `minimum` keep NaN (torch's rule) in the half types too, where a device computes
    // them in f16 (WGSL with `shader-f16`); reductions of halves, which accumulate in f32, likewise.
    for d in [DType::F16, DType::BF16] {
        let a = [f64::NAN, 1.0, -2.0, f64::NAN, 0.5, 3.0, -1.0, 2.0];
        let c = [0.0, f64::NAN, 1.0, f64::NAN, -0.5, 4.0, -2.0, 1.0];
        let (x, y) = (t(&[8], d, |i| a[i]), t(&[8], d, |i| c[i]));
        case(b, &format!("{d} maximum and minimum keep NaN"), &[x, y], 0.0, |v| {
            Ok(vec![
                v[0].maximum(&v[1])?,
                v[0].minimum(&v[1])?,
                v[1].clamp(Some(-1.0), Some(1.0))?,
                v[0].reshape(&[2, 4])?.max(&[1], false)?,
                v[1].reshape(&[4, 2])?.min(&[1], false)?,
            ])
        });
    }
    let p = t(&[6], DType::Bool, |i| (i % 2) as f64);
    let q = t(&[6], DType::Bool, |i| (i % 3 == 0) as u8 as f64);
    case(b, "bool ops", &[p, q], 0.0, |v| {
        Ok(vec![v[0].logical_not()?, v[0].logical_and(&v[1])?, v[0].logical_or(&v[1])?, v[0].sum(&[], false)?])
    });
    // Casts between every pair of dtypes; into u64, and from u32 and u64, of magnitudes: a negative
    // value wraps past 2^31, outside WGSL's i64 and u64 (computed in 32 bits). The unsigned ops case
    // above casts u32s past 2^31.
    let dtypes: Vec<DType> = kiln::DType::ALL.into_iter().filter(|&d| d != DType::F64 || has_f64(b)).collect();
    for &from in &dtypes {
        // (Within the dtype: a 2-bit integer's 2 would wrap to −2.)
        let magnitudes = t(&[9], from, |i| (wave(i) * 2.0).abs().min(from.max_value()));
        let wide_unsigned = matches!(from, DType::U32 | DType::U64);
        let x = if wide_unsigned { magnitudes.clone() } else { t(&[9], from, |i| wave(i) * 2.0) };
        case(b, &format!("casts from {from}"), &[x, magnitudes], tol(DType::BF16, 1.0), |v| {
            let into = |to: DType| if to == DType::U64 { v[1].cast(to) } else { v[0].cast(to) };
            dtypes.iter().map(|&d| into(d)).collect()
        });
    }
    if has_f64(b) {
        f64_range(b);
    }
    for d in floats(b) {
        let x = t(&[7, 33], d, wave);
        let s = if d == DType::F32 { 10.0 } else { 2.0 };
        case(b, &format!("reductions {d}"), std::slice::from_ref(&x), tol(d, s), |v| {
            let x = &v[0];
            Ok(vec![
                x.sum(&[1], false)?,
                x.sum(&[0], true)?,
                x.sum(&[], false)?,
                x.max(&[-1], false)?,
                x.min(&[0], false)?,
                x.mean(&[1], true)?,
                x.var(&[1], 1, false)?,
                x.argmax(1, false)?,
                x.argmin(0, true)?,
                x.transpose(0, 1)?.sum(&[1], false)?,
            ])
        });
        case(
            b,
            &format!("composites {d}"),
            &[x.clone(), t(&[33], d, |i| 1.0 + 0.01 * i as f64), t(&[33], d, |i| 0.1 * i as f64)],
            tol(d, s),
            |v| {
                let x = &v[0];
                let w = t(&[4, 33], d, |i| wave(i + 3) * 0.2);
                Ok(vec![
                    x.softmax(-1)?,
                    x.softmax(0)?,
                    x.log_softmax(1)?,
                    x.layer_norm(1, Some(&v[1]), Some(&v[2]), 1e-5)?,
                    x.gelu()?,
                    x.gelu_tanh()?,
                    x.silu()?,
                    x.linear(&w, Some(&t(&[4], d, |i| i as f64)))?,
                    x.narrow(1, 0, 7)?.causal_mask()?.softmax(-1)?,
                ])
            },
        );
    }
    for d in floats(b) {
        // Rows of 33–256 elements get a subgroup each, several to a workgroup, where the target has
        // subgroups (`Launch::packed`): 37 rows leave the last workgroup part-filled, and rows of 100
        // leave lanes past the row's end. Columns of 4,096 are summed in two passes, the last a
        // subgroup per column (`split_reduce`).
        let x = t(&[37, 100], d, wave);
        let tall = t(&[4096, 40], d, |i| wave(i % 997));
        let s = if d == DType::F32 { 10.0 } else { 2.0 };
        case(b, &format!("short rows and tall columns {d}"), &[x, tall], tol(d, s), |v| {
            let x = &v[0];
            Ok(vec![
                x.sum(&[1], false)?,
                x.max(&[1], true)?,
                x.min(&[-1], false)?,
                x.var(&[1], 1, false)?,
                x.softmax(-1)?,
                x.layer_norm(1, None, None, 1e-5)?,
                x.mul(x)?.sum(&[1], false)?.add(&x.sum(&[1], false)?)?,
                v[1].sum(&[0], false)?,
                v[1].mul(&v[1])?.sum(&[0], true)?,
                // Pointwise over a multiple of 8 elements: 16-byte vectors of eight 2-byte lanes on
                // CUDA; with an f32 output, four lanes.
                v[1].mul(&v[1])?.add(1.0)?,
                v[1].cast(DType::F32)?.mul(3.0)?.add(&v[1].cast(DType::F32)?)?,
            ])
        });
    }
    for d in floats(b) {
        convolutions(b, d);
    }
    let x = t(&[2, 3, 4], DType::F32, wave);
    let idx = t(&[5], DType::I64, |i| ((i * 2) % 3) as f64);
    let gidx = t(&[2, 3, 2], DType::I64, |i| (i % 4) as f64);
    case(b, "layout", &[x, idx, gidx], 0.0, |v| {
        let x = &v[0];
        Ok(vec![
            x.reshape(&[4, -1])?,
            x.permute(&[2, 0, 1])?,
            x.unsqueeze(1)?.expand(&[2, 3, 3, 4])?,
            x.slice(2, 1, None, 2)?,
            x.slice(1, -2, Some(3), 1)?,
            Tensor::concat(&[x, &x.mul(2.0)?, x], 1)?,
            x.pad(&[(1, 0), (0, 2), (2, 1)], -1.5)?,
            x.index_select(1, &v[1])?,
            x.gather(2, &v[2])?,
            x.transpose(0, 2)?.reshape(&[-1])?.add(1.0)?,
            Tensor::arange(0.0, 10.0, 1.5, DType::F32)?,
            Tensor::full(2.5, &[3, 2], DType::F32)?,
        ])
    });
    for d in [DType::F32, DType::F16, DType::I32] {
        let a = t(&[2, 1, 3, 5], d, |i| wave(i).round());
        let c = t(&[4, 5, 6], d, |i| wave(i + 1).round());
        case(b, &format!("matmul {d}"), &[a, c], tol(d, 10.0), |v| {
            let (a, c) = (&v[0], &v[1]);
            let vec5 = a.narrow(3, 0, 5)?.reshape(&[-1])?.narrow(0, 0, 5)?;
            Ok(vec![
                a.matmul(c)?,
                a.matmul(&vec5)?,
                vec5.matmul(c)?,
                vec5.matmul(&vec5)?,
                c.transpose(1, 2)?.matmul(c)?.relu()?,
            ])
        });
    }
    // Integer convolutions (ONNX's `ConvInteger`): exact products summed as integer matmuls do.
    let x = t(&[2, 4, 7, 6], DType::I32, |i| ((i * 37) % 511) as f64 - 255.0);
    let w = t(&[6, 2, 3, 3], DType::I32, |i| ((i * 11) % 255) as f64 - 127.0);
    let bias = t(&[6], DType::I32, |i| i as f64 * 1000.0 - 2500.0);
    case(b, "integer convolutions", &[x, w, bias], 0.0, |v| {
        use kiln::graph::Window;
        Ok(vec![
            v[0].conv(&v[1], Some(&v[2]), &Window::uniform(2, 2, 1, 1), 2)?,
            v[0].narrow(1, 0, 2)?.conv(&v[1], None, &Window::uniform(2, 1, 0, 2), 1)?,
        ])
    });
    large_matmuls(b);
    matmul_schedules(b);
    split_products(b);
}

/// The matmul template's schedules (`graph::matmul_tile`) where a template runs them: every dim symbolic
/// takes the large tile (8 × 8 sums a thread), here ragged every way (130 × 136 outputs, depth 37, two
/// batch entries) under a fused epilogue, and over a transposed operand; one symbolic extent beside a
/// 72-wide one takes the half tiles, beside a 40-wide one the narrow tiles; the static cases above take
/// the medium and small ones. Integers too: no GEMM library takes them.
pub fn matmul_schedules(b: &Arc<dyn Backend>) {
    for d in [DType::F32, DType::I32] {
        // Whole medium tiles every way (64 × 64 outputs over 48, static: `MatMul::whole_tiles`, no bound
        // checks rendered; under `gemm::LIBRARY_MIN_MACS`, so CUDA's template too), each operand read
        // along its depth and across it (the slots' walks, `Tile::slot_step`).
        let (a, c) = (t(&[64, 48], d, |i| wave(i + 6).round()), t(&[48, 64], d, |i| wave(i + 8).round()));
        case(b, &format!("matmul whole tiles {d}"), &[a, c], tol(d, 10.0), |v| {
            let (a, c) = (&v[0], &v[1]);
            Ok(vec![
                a.matmul(c)?.relu()?,
                a.matmul(&a.transpose(0, 1)?)?,
                c.transpose(0, 1)?.matmul(&a.transpose(0, 1)?)?,
            ])
        });
        let a = t(&[2, 130, 37], d, |i| wave(i).round());
        let c = t(&[37, 136], d, |i| wave(i + 3).round());
        let bias = t(&[136], d, |i| wave(i + 1).round());
        case_with(b, &format!("matmul schedules {d}"), &[a, c, bias], tol(d, 10.0), Dynamic::Always, &[], |v| {
            Ok(vec![v[0].matmul(&v[1])?.add(&v[2])?.relu()?, v[0].transpose(1, 2)?.matmul(&v[0])?])
        });
        // One extent symbolic, the other 72: half tiles (128 × 64 and 64 × 128); the other 40: narrow
        // ones (32 × 128 and 128 × 32); ragged every way.
        let x = t(&[130, 37], d, |i| wave(i + 5).round());
        let w = t(&[37, 72], d, |i| wave(i + 2).round());
        let narrow = t(&[40, 37], d, |i| wave(i + 4).round());
        let inputs = [x, w, narrow];
        case_with(
            b,
            &format!("matmul half and narrow schedules {d}"),
            &inputs,
            tol(d, 10.0),
            Dynamic::Auto,
            &[(0, 0)],
            |v| {
                let xt = v[0].transpose(0, 1)?;
                Ok(vec![
                    v[0].matmul(&v[1])?,
                    v[1].transpose(0, 1)?.matmul(&xt)?,
                    v[2].matmul(&xt)?,
                    v[0].matmul(&v[2].transpose(0, 1)?)?,
                ])
            },
        );
    }
}

/// Products few outputs deep enough that a target running them on the matmul template cuts their depth
/// into partial products summed by a reduction (`graph::split_k`): 32 × 64 outputs over 1,152 with a
/// bias and ReLU after the sum, and 8 × 16 over 1,024 (f32, and bf16 with f32 partials), and a DenseNet layer's 3 × 3
/// convolution (128 channels in, 32 out, the batch norm's ReLU before it) whose sum is a part of a
/// concatenation assembled in place.
pub fn split_products(b: &Arc<dyn Backend>) {
    use kiln::graph::Window;
    for d in [DType::F32, DType::BF16] {
        let x = t(&[32, 1152], d, |i| wave(i) / 3.0);
        let w = t(&[1152, 64], d, |i| wave(i + 7) / 3.0);
        let bias = t(&[64], d, |i| wave(i + 3));
        // Under `gemm::LIBRARY_MIN_MACS`: the template's on every target, CUDA's too.
        let (x2, w2) = (t(&[8, 1024], d, |i| wave(i + 4) / 3.0), t(&[1024, 16], d, |i| wave(i + 6) / 3.0));
        case(b, &format!("split-K product {d}"), &[x, w, bias, x2, w2], tol(d, 10.0), |v| {
            Ok(vec![v[0].matmul(&v[1])?.add(&v[2])?.relu()?, v[3].matmul(&v[4])?.exp()?])
        });
    }
    // Halves and quarters: exact in TF32 (a CUDA target's convolutions) and summed exactly in f32.
    let x = t(&[1, 128, 8, 8], DType::F32, |i| (wave(i + 1) * 2.0).round() / 2.0);
    let w = t(&[32, 128, 3, 3], DType::F32, |i| wave(i + 2).round() / 4.0);
    case(b, "split-K convolution in a concatenation", &[x, w], tol(DType::F32, 10.0), |v| {
        let h = v[0].relu()?;
        let y = h.conv(&v[1], None, &Window::uniform(2, 1, 1, 1), 1)?;
        Ok(vec![Tensor::concat(&[&h, &y], 1)?.exp()?])
    });
}

/// Matmuls big enough (over `gemm::LIBRARY_MIN_MACS`) that targets with a GEMM library hand them to
/// it: transposed weights broadcast over a batch, column-major operands, attention's two-level batch of
/// permuted views, and a view no library can read in place (the template takes it).
pub fn large_matmuls(b: &Arc<dyn Backend>) {
    for d in [DType::F32, DType::BF16] {
        let x = t(&[2, 48, 96], d, |i| wave(i) / 3.0);
        let w = t(&[80, 96], d, |i| wave(i + 7) / 3.0);
        let bias = t(&[80], d, |i| wave(i + 3));
        let qkv = t(&[2, 64, 192], d, |i| wave(i + 1) / 3.0);
        let z = t(&[8, 6, 64], d, |i| wave(i + 2) / 3.0);
        let xt = t(&[2, 96, 48], d, |i| wave(i + 5) / 3.0);
        case(b, &format!("large matmuls {d}"), &[x, w, bias, qkv, z, xt], tol(d, 10.0), |v| {
            let (x, w, bias, qkv, z, xt) = (&v[0], &v[1], &v[2], &v[3], &v[4], &v[5]);
            let heads = |i: usize| qkv.narrow(2, i * 64, 64)?.reshape(&[2, 64, 4, 16])?.permute(&[0, 2, 1, 3]);
            let (q, k, vv) = (heads(0)?, heads(1)?, heads(2)?);
            let att = q.matmul(&k.transpose(-1, -2)?)?.mul(0.25)?.softmax(-1)?.matmul(&vv)?;
            let zt = z.permute(&[1, 0, 2])?.reshape(&[48, 64])?;
            Ok(vec![
                x.linear(w, Some(bias))?.gelu()?,
                xt.transpose(1, 2)?.matmul(&w.transpose(0, 1)?)?,
                att.permute(&[0, 2, 1, 3])?.reshape(&[2, 64, 64])?,
                zt.matmul(&w.narrow(1, 0, 64)?.transpose(0, 1)?)?,
            ])
        });
    }
}

/// Empty and size-1 dims, NaN and Inf, and (when `big`) grids past 65535 workgroups. `ieee_nan`: the
/// backend promises IEEE NaN/Inf through plain arithmetic (WGSL does not: its spec lets drivers assume
/// NaN and Inf never occur, so there only kiln's NaN-aware ops are checked).
pub fn edge_cases(b: &Arc<dyn Backend>, big: bool, ieee_nan: bool) {
    let empty = t(&[0, 5], DType::F32, wave);
    case(b, "empty tensors", &[empty], 0.0, |v| {
        Ok(vec![v[0].add(1.0)?, v[0].sum(&[0], false)?, v[0].exp()?.transpose(0, 1)?])
    });
    let ones = t(&[1, 1, 3], DType::F32, wave);
    case(b, "size-1 dims", &[ones], 1e-5, |v| {
        Ok(vec![
            v[0].sum(&[0, 1], false)?,
            v[0].softmax(0)?,
            v[0].expand(&[2, 4, 3])?.mul(&v[0])?,
            v[0].squeeze(0)?.matmul(&v[0].reshape(&[3, 1])?)?,
        ])
    });
    let special = [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 0.0, -0.0, 1.0, -1.0, 3e38];
    let s = t(&[8], DType::F32, |i| special[i]);
    case(b, "NaN-aware ops", std::slice::from_ref(&s), 1e-5, |v| {
        let x = &v[0];
        Ok(vec![
            x.maximum(1.0)?,
            x.minimum(1.0)?,
            x.relu()?,
            x.tanh()?,
            x.erf()?,
            x.isnan()?,
            x.max(&[], false)?,
            x.min(&[], false)?,
            x.argmax(0, false)?,
            x.narrow(0, 1, 7)?.exp()?,
            x.narrow(0, 1, 7)?.mul(10.0)?,
        ])
    });
    // Counter-based random numbers are integer arithmetic: every backend draws the reference's numbers
    // exactly (multiples of 2^-24), under two keys (one with the sign bits set), and dropout keeps and
    // scales the same elements; an odd size covers partial vectors and groups; other streams of one key.
    let keys = t(&[2, 2], DType::I32, |i| [7.0, 3.0, -1.0, -2_147_483_647.0][i]);
    let x = t(&[3, 257], DType::F32, wave);
    case(b, "random numbers and dropout", &[keys, x], 0.0, |v| {
        let (k0, k1) = (v[0].narrow(0, 0, 1)?.reshape(&[2])?, v[0].narrow(0, 1, 1)?.reshape(&[2])?);
        Ok(vec![
            Tensor::rand(&[3, 257], &k0)?,
            v[1].rand_like(&k1)?,
            v[1].dropout(0.25, &k0)?,
            // Streams: the counter's third word (a large one has its sign bit set as an i32).
            Tensor::rand_in(&[3, 257], &k0, 7)?,
            v[1].dropout_in(0.5, &k1, 0xFFFF_FFF0)?,
        ])
    });
    // Inside a row kernel (its persistent row and its passes) and a reduction.
    let keys = t(&[2], DType::I32, |i| [12.0, 34.0][i]);
    let x = t(&[5, 300], DType::F32, wave);
    case(b, "dropout inside rows", &[keys, x], 1e-5, |v| {
        let y = v[1].dropout(0.5, &v[0])?;
        Ok(vec![y.softmax(-1)?, y.sum(&[1], false)?])
    });
    if ieee_nan {
        case(b, "NaN and Inf through arithmetic", &[s], 1e-5, |v| {
            let x = &v[0];
            Ok(vec![x.exp()?, x.sub(x)?, x.mul(0.0)?, x.sigmoid()?, x.sum(&[], false)?, x.narrow(0, 1, 7)?.softmax(0)?])
        });
        // A division by a loop-invariant divisor is computed from its reciprocal, yet rounded as a
        // division: 41·k / 41 is exactly k (a product with the rounded 1/41 is 1 ulp low for k = 1, so
        // the floor would be k − 1), in a pointwise kernel (a constant divisor) and in a row (a sum).
        // IEEE backends only: WGSL's division may be 2.5 ulp off by its spec.
        let k = t(&[4, 8], DType::F32, |i| 41.0 * (i + 1) as f64);
        case(b, "quotients round as divisions", &[k], 0.0, |v| {
            let x = &v[0];
            let sums = x.div(41.0)?.floor()?.sum(&[1], true)?;
            Ok(vec![x.div(41.0)?.floor()?, x.div(&sums)?.mul(&sums)?.div(41.0)?.round()?.sub(&x.div(41.0)?)?])
        });
        // A division by ±2^k is a multiplication by ±2^-k (exact: one rounding of the same number), at the
        // ends of the range too: 2^126 (its reciprocal the smallest normal), 2^127 (a reciprocal that is
        // not normal: divided), results that are subnormal or overflow.
        let p = t(&[6], DType::F32, |i| [41.0, -3.0, 3e38, 1.5e-38, 0.0, 1e-45][i]);
        case(b, "division by powers of two", &[p], 0.0, |v| {
            let x = &v[0];
            let two = |k: i32| 2f64.powi(k);
            Ok(vec![x.div(4096.0)?, x.div(-0.25)?, x.div(two(126))?, x.div(two(127))?, x.div(0.5)?, x.div(4.0)?])
        });
        // tanh near 0 to its own size (the ratio tanh(x)/x ≈ 1): a form `(1 − e)/(1 + e)` cancels there,
        // ~1e-2 off at 1e-5, inside the absolute tolerance of tanh itself.
        let tiny = t(&[5], DType::F32, |i| [1e-5, -3e-4, 1e-3, 0.3, -0.59][i]);
        case(b, "tanh keeps its digits near zero", &[tiny], 2e-6, |v| Ok(vec![v[0].tanh()?.div(&v[0])?]));
        // Every half-precision value is rounded to its dtype, intermediates too: exp(12) overflows f16
        // even when the result is cast back to f32 (found by the random CUDA graphs).
        let y = t(&[4], DType::F32, |i| [2.0, 10.0, 12.0, 20.0][i]);
        case(b, "half intermediates round and overflow", &[y], 1e-2, |v| {
            let h = v[0].cast(DType::F16)?;
            Ok(vec![h.exp()?.cast(DType::F32)?, h.mul(&h)?.mul(&h)?.cast(DType::F32)?])
        });
    }
    if big {
        // 70,000 rows of a row kernel: one workgroup per row, more than one grid dimension holds.
        let x = t(&[70_000, 64], DType::F32, wave);
        case(b, "grid past 65535 workgroups", &[x], 1e-5, |v| Ok(vec![v[0].softmax(-1)?]));
    }
}

/// The convolution family in the shapes CNNs use: a strided, padded 3x3 with bias, a grouped and dilated
/// one, depthwise, a 1x1 projection, 1-D, a strided transposed one (zeros inserted between its inputs,
/// an output padding), and the pools (NaN-free inputs, odd sizes).
fn convolutions(b: &Arc<dyn Backend>, d: DType) {
    use kiln::graph::Window;
    let x = t(&[2, 4, 9, 7], d, wave);
    let x1 = t(&[2, 3, 11], d, wave);
    let k = |dims: &[usize], seed: usize| t(dims, d, move |i| wave(i * 3 + seed) * 0.3);
    let (w3, bias) = (k(&[6, 4, 3, 3], 1), k(&[6], 2));
    let (wg, wdw, w1, wc1) = (k(&[4, 2, 3, 3], 3), k(&[4, 1, 3, 3], 4), k(&[8, 4, 1, 1], 5), k(&[5, 3, 4], 6));
    let wt = k(&[4, 3, 3, 3], 7);
    // Accumulations over up to 36 taps: tolerance scales like a reduction's.
    case(b, &format!("convolutions {d}"), &[x, x1], tol(d, 6.0), |v| {
        let (x, x1) = (&v[0], &v[1]);
        Ok(vec![
            x.conv(&w3, Some(&bias), &Window::uniform(2, 2, 1, 1), 1)?,
            x.conv(&wg, None, &Window { padding: vec![(2, 1), (0, 2)], dilation: vec![2, 1], ..Window::default() }, 2)?,
            x.conv(&wdw, None, &Window::uniform(2, 1, 1, 1), 4)?.relu()?,
            x.conv(&w1, None, &Window::default(), 1)?,
            x1.conv(&wc1, None, &Window { stride: vec![3], padding: vec![(1, 2)], ..Window::default() }, 1)?,
            x.conv_transpose(&wt, None, &Window::uniform(2, 2, 1, 1), &[1, 0], 1)?,
            x.max_pool(&[3, 3], &Window::uniform(2, 2, 1, 1))?,
            x.avg_pool(&[2, 2], &Window::uniform(2, 2, 0, 1), true)?,
            x.avg_pool(&[3, 3], &Window::uniform(2, 1, 1, 1), false)?,
            x1.max_pool(&[2], &Window::default())?,
        ])
    });
}
