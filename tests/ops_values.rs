//! Every op against hand-computed values (eager mode on the CPU reference, and once more under compile).

mod common;
use common::*;
use kiln::{compile, DType, Tensor};

/// An f64 value as f32 would store it.
fn r32(x: f64) -> f64 {
    x as f32 as f64
}

fn check(t: kiln::Result<Tensor>, want: &[f64], dims: &[usize]) {
    let (v, d) = read(&t);
    assert_eq!(d, dims, "dims");
    assert_close(&v, want);
}

#[test]
fn unary_ops() {
    let x = f32s(&[-1.5, 0.0, 2.0, 0.25], &[4]);
    let e = std::f64::consts::E;
    check(x.neg(), &[1.5, 0.0, -2.0, -0.25], &[4]);
    check(x.abs(), &[1.5, 0.0, 2.0, 0.25], &[4]);
    check(x.relu(), &[0.0, 0.0, 2.0, 0.25], &[4]);
    check(x.exp(), &[(e.powf(-1.5) as f32) as f64, 1.0, (e * e) as f32 as f64, r32(0.25f64.exp())], &[4]);
    check(x.floor(), &[-2.0, 0.0, 2.0, 0.0], &[4]);
    check(x.ceil(), &[-1.0, 0.0, 2.0, 1.0], &[4]);
    check(f32s(&[0.5, 1.5, 2.5, -0.5], &[4]).round(), &[0.0, 2.0, 2.0, -0.0], &[4]);
    check(f32s(&[4.0, 0.25], &[2]).sqrt(), &[2.0, 0.5], &[2]);
    check(f32s(&[4.0, 0.25], &[2]).rsqrt(), &[0.5, 2.0], &[2]);
    check(f32s(&[4.0, -0.5], &[2]).reciprocal(), &[0.25, -2.0], &[2]);
    check(f32s(&[1.0, 0.0], &[2]).log(), &[0.0, f64::NEG_INFINITY], &[2]);
    check(f32s(&[0.0], &[1]).sin(), &[0.0], &[1]);
    check(f32s(&[0.0], &[1]).cos(), &[1.0], &[1]);
    check(f32s(&[0.0, 1.0], &[2]).tanh(), &[0.0, r32(0.7615941559557649)], &[2]);
    check(f32s(&[0.0], &[1]).sigmoid(), &[0.5], &[1]);
    check(f32s(&[0.0, 1.0], &[2]).erf(), &[0.0, r32(0.8427007929497149)], &[2]);
    check(bools(&[true, false], &[2]).logical_not(), &[0.0, 1.0], &[2]);
    let nan = f32s(&[f32::NAN, 1.0], &[2]);
    check(nan.isnan(), &[1.0, 0.0], &[2]);
    assert_eq!(nan.isnan().unwrap().dtype(), DType::Bool);
    check(f32s(&[-1.0], &[1]).sqrt(), &[f64::NAN], &[1]);
    check(nan.relu(), &[f64::NAN, 1.0], &[2]);
}

#[test]
fn binary_ops_and_comparisons() {
    let a = f32s(&[1.0, 4.0, -3.0], &[3]);
    let b = f32s(&[2.0, 4.0, 2.0], &[3]);
    check(a.add(&b), &[3.0, 8.0, -1.0], &[3]);
    check(a.sub(&b), &[-1.0, 0.0, -5.0], &[3]);
    check(a.mul(&b), &[2.0, 16.0, -6.0], &[3]);
    check(a.div(&b), &[0.5, 1.0, -1.5], &[3]);
    check(a.pow(&b), &[1.0, 256.0, 9.0], &[3]);
    check(a.maximum(&b), &[2.0, 4.0, 2.0], &[3]);
    check(a.minimum(&b), &[1.0, 4.0, -3.0], &[3]);
    check(a.eq(&b), &[0.0, 1.0, 0.0], &[3]);
    check(a.ne(&b), &[1.0, 0.0, 1.0], &[3]);
    check(a.lt(&b), &[1.0, 0.0, 1.0], &[3]);
    check(a.le(&b), &[1.0, 1.0, 1.0], &[3]);
    check(a.gt(&b), &[0.0, 0.0, 0.0], &[3]);
    check(a.ge(&b), &[0.0, 1.0, 0.0], &[3]);
    let p = bools(&[true, true, false], &[3]);
    let q = bools(&[true, false, false], &[3]);
    check(p.logical_and(&q), &[1.0, 0.0, 0.0], &[3]);
    check(p.logical_or(&q), &[1.0, 1.0, 0.0], &[3]);
    // Bitwise ops of integers, two's complement; floats are a typed dtype error.
    let i = Tensor::from_slice(&[6i32, -8, i32::MIN], &[3]).unwrap();
    let j = Tensor::from_slice(&[3i32, -1, -1], &[3]).unwrap();
    check(i.bitwise_and(&j), &[2.0, -8.0, i32::MIN as f64], &[3]);
    check(i.bitwise_or(&j), &[7.0, -1.0, -1.0], &[3]);
    check(i.bitwise_xor(&j), &[5.0, 7.0, i32::MAX as f64], &[3]);
    let e = a.bitwise_and(&b).unwrap_err().to_string();
    assert!(e.contains("integer dtype"), "{e}");
    check(a.add(1.0), &[2.0, 5.0, -2.0], &[3]);
    check(a.mul(2.0).and_then(|t| t.sub(1)), &[1.0, 7.0, -7.0], &[3]);
    // NaN propagates through maximum/minimum, Inf through arithmetic.
    let n = f32s(&[f32::NAN, f32::INFINITY], &[2]);
    let one = f32s(&[1.0, 1.0], &[2]);
    check(n.maximum(&one), &[f64::NAN, f64::INFINITY], &[2]);
    check(n.minimum(&one), &[f64::NAN, 1.0], &[2]);
    check(n.sub(&n), &[f64::NAN, f64::NAN], &[2]);
    // Integer division floors; by zero is a typed error, not a panic.
    let i = i64s(&[7, -7], &[2]);
    check(i.div(2i64), &[3.0, -4.0], &[2]);
    assert!(matches!(i.div(0i64), Err(kiln::Error::Runtime { .. })));
}

#[test]
fn broadcasting_where_and_cast() {
    let col = f32s(&[1.0, 2.0], &[2, 1]);
    let row = f32s(&[10.0, 20.0, 30.0], &[3]);
    check(col.add(&row), &[11.0, 21.0, 31.0, 12.0, 22.0, 32.0], &[2, 3]);
    let c = bools(&[true, false, true], &[3]);
    check(c.where_(&row, r32(0.0)), &[10.0, 0.0, 30.0], &[3]);
    check(c.where_(col.mul(1.0).unwrap(), &row), &[1.0, 20.0, 1.0, 2.0, 20.0, 2.0], &[2, 3]);
    check(f32s(&[1.7, -1.7, f32::NAN], &[3]).cast(DType::I32), &[1.0, -1.0, 0.0], &[3]);
    check(f32s(&[0.0, 2.5], &[2]).cast(DType::Bool), &[0.0, 1.0], &[2]);
    check(f32s(&[1.0 + 1.0 / 1024.0], &[1]).cast(DType::BF16), &[1.0], &[1]);
    check(i64s(&[3], &[1]).cast(DType::F32), &[3.0], &[1]);
    // Into 8-bit floats, saturating and not: E4M3FN's tie at 464 stays at 448 (its mantissa 110 is
    // even), E4M3FNUZ's at 248 goes up (past 240), E5M2's at 61440 goes up to ∞.
    let (inf, nan) = (f64::INFINITY, f64::NAN);
    let x = f32s(&[464.0, 465.0, -1e6, f32::INFINITY, 248.0, 61440.0, 61439.0, f32::NAN], &[8]);
    let as_f32 = |d: DType, saturate: bool| {
        let q = if saturate { x.cast(d) } else { x.cast_unsaturated(d) };
        q.and_then(|q| q.cast(DType::F32))
    };
    let e4 = [448.0, 448.0, -448.0, 448.0, 256.0, 448.0, 448.0, nan];
    check(as_f32(DType::F8E4M3, true), &e4, &[8]);
    check(as_f32(DType::F8E4M3, false), &[448.0, nan, nan, nan, 256.0, nan, nan, nan], &[8]);
    check(as_f32(DType::F8E4M3FNUZ, false), &[nan, nan, nan, nan, nan, nan, nan, nan], &[8]);
    let e5 = [448.0, 448.0, -inf, inf, 256.0, inf, 57344.0, nan];
    check(as_f32(DType::F8E5M2, false), &e5, &[8]);
    let e5 = [448.0, 448.0, nan, nan, 256.0, nan, 57344.0, nan];
    check(as_f32(DType::F8E5M2FNUZ, false), &e5, &[8]);
    check(f32s(&[240.0, 247.0], &[2]).cast_unsaturated(DType::F8E4M3FNUZ), &[240.0, 240.0], &[2]);
    // From an 8-bit float (ONNX counts them floats): E5M2's ±∞ and 57344 overflow E4M3FN.
    let e5 =
        Tensor::from_data(kiln::TensorData::from_f64(vec![inf, -57344.0, 448.0, 2.5], &[4], DType::F8E5M2).unwrap());
    check(e5.cast_unsaturated(DType::F8E4M3), &[nan, nan, 448.0, 2.5], &[4]);
    check(e5.cast(DType::F8E4M3), &[448.0, -448.0, 448.0, 2.5], &[4]);
}

#[test]
fn reductions() {
    let x = f32s(&[1.0, 5.0, 3.0, 4.0, 2.0, 6.0], &[2, 3]);
    check(x.sum(&[], false), &[21.0], &[]);
    check(x.sum(&[1], false), &[9.0, 12.0], &[2]);
    check(x.sum(&[0], true), &[5.0, 7.0, 9.0], &[1, 3]);
    check(x.max(&[-1], false), &[5.0, 6.0], &[2]);
    check(x.min(&[0], false), &[1.0, 2.0, 3.0], &[3]);
    check(x.mean(&[1], false), &[3.0, 4.0], &[2]);
    check(x.var(&[1], 1, false), &[4.0, 4.0], &[2]);
    check(x.var(&[1], 0, true), &[8.0 / 3.0, 8.0 / 3.0], &[2, 1]);
    check(x.argmax(1, false), &[1.0, 2.0], &[2]);
    check(x.argmin(0, true), &[0.0, 1.0, 0.0], &[1, 3]);
    assert_eq!(x.argmax(1, false).unwrap().dtype(), DType::I64);
    check(f32s(&[1.0, 7.0, 7.0], &[3]).argmax(0, false), &[1.0], &[]);
    check(f32s(&[1.0, f32::NAN, 7.0], &[3]).max(&[], false), &[f64::NAN], &[]);
    check(f32s(&[1.0, f32::NAN, 7.0], &[3]).argmax(0, false), &[1.0], &[]);
    let b = bools(&[true, true, false], &[3]).sum(&[], false);
    assert_eq!(b.as_ref().unwrap().dtype(), DType::I64);
    check(b, &[2.0], &[]);
    check(f32s(&[], &[0, 2]).sum(&[0], false), &[0.0, 0.0], &[2]);
}

#[test]
fn layout_ops() {
    let x = f32s(&[0.0, 1.0, 2.0, 3.0, 4.0, 5.0], &[2, 3]);
    check(x.reshape(&[3, -1]), &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0], &[3, 2]);
    check(x.permute(&[1, 0]), &[0.0, 3.0, 1.0, 4.0, 2.0, 5.0], &[3, 2]);
    check(x.transpose(0, -1), &[0.0, 3.0, 1.0, 4.0, 2.0, 5.0], &[3, 2]);
    check(f32s(&[1.0, 2.0], &[2, 1]).expand(&[2, 3]), &[1.0, 1.0, 1.0, 2.0, 2.0, 2.0], &[2, 3]);
    check(f32s(&[1.0, 2.0], &[2]).expand(&[2, -1]), &[1.0, 2.0, 1.0, 2.0], &[2, 2]);
    check(x.unsqueeze(0), &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0], &[1, 2, 3]);
    check(x.unsqueeze(0).unwrap().squeeze(0), &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0], &[2, 3]);
    check(x.slice(1, 0, None, 2), &[0.0, 2.0, 3.0, 5.0], &[2, 2]);
    check(x.slice(1, -2, None, 1), &[1.0, 2.0, 4.0, 5.0], &[2, 2]);
    check(x.slice(0, 5, Some(9), 1), &[], &[0, 3]);
    check(x.narrow(1, 1, 1), &[1.0, 4.0], &[2, 1]);
    let y = f32s(&[9.0, 9.0], &[2, 1]);
    check(Tensor::concat(&[&x, &y], 1), &[0.0, 1.0, 2.0, 9.0, 3.0, 4.0, 5.0, 9.0], &[2, 4]);
    check(Tensor::concat(&[&x, &x], 0), &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0], &[4, 3]);
    check(f32s(&[1.0, 2.0], &[1, 2]).pad(&[(1, 0), (0, 1)], -1.0), &[-1.0, -1.0, -1.0, 1.0, 2.0, -1.0], &[2, 3]);
    check(x.index_select(1, &i64s(&[2, 0, 2], &[3])), &[2.0, 0.0, 2.0, 5.0, 3.0, 5.0], &[2, 3]);
    check(x.gather(1, &i64s(&[1, 1, 0, 2], &[2, 2])), &[1.0, 1.0, 3.0, 5.0], &[2, 2]);
    assert!(matches!(x.index_select(0, &i64s(&[2], &[1])), Err(kiln::Error::Runtime { .. })));
}

#[test]
fn sources() {
    check(Tensor::full(2.5, &[2], DType::F32), &[2.5, 2.5], &[2]);
    check(Tensor::zeros(&[1, 2], DType::I32), &[0.0, 0.0], &[1, 2]);
    check(Tensor::ones(&[2], DType::Bool), &[1.0, 1.0], &[2]);
    check(Tensor::scalar(3.0, DType::I64), &[3.0], &[]);
    check(Tensor::arange(0.0, 4.0, 1.0, DType::I64), &[0.0, 1.0, 2.0, 3.0], &[4]);
    check(Tensor::arange(1.0, 2.0, 0.25, DType::F32), &[1.0, 1.25, 1.5, 1.75], &[4]);
    check(Tensor::arange(5.0, 0.0, -2.0, DType::I32), &[5.0, 3.0, 1.0], &[3]);
}

#[test]
fn matmul_rules() {
    let a = f32s(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    let b = f32s(&[1.0, 0.0, 0.0, 1.0, 1.0, 1.0], &[3, 2]);
    check(a.matmul(&b), &[4.0, 5.0, 10.0, 11.0], &[2, 2]);
    let v = f32s(&[1.0, 1.0, 1.0], &[3]);
    check(a.matmul(&v), &[6.0, 15.0], &[2]);
    check(v.matmul(&b), &[2.0, 2.0], &[2]);
    check(v.matmul(&v), &[3.0], &[]);
    // Batch dims broadcast: [2, 1, 2, 3] @ [3, 3, 2] -> [2, 3, 2, 2].
    let batched = a.reshape(&[1, 1, 2, 3]).unwrap().expand(&[2, 1, 2, 3]).unwrap();
    let bs = b.unsqueeze(0).unwrap().expand(&[3, 3, 2]).unwrap();
    let (vals, dims) = read(&batched.matmul(&bs));
    assert_eq!(dims, vec![2, 3, 2, 2]);
    assert_close(&vals, &[4.0, 5.0, 10.0, 11.0].repeat(6));
}

#[test]
fn composites() {
    let x = f32s(&[1.0, 2.0, 3.0, 1.0, 1.0, 1.0], &[2, 3]);
    let e = |v: f64| v.exp();
    let s = e(1.0) + e(2.0) + e(3.0);
    let sm = [e(1.0) / s, e(2.0) / s, e(3.0) / s, 1.0 / 3.0, 1.0 / 3.0, 1.0 / 3.0];
    check(x.softmax(-1), &sm.map(|v| v as f32 as f64), &[2, 3]);
    check(x.log_softmax(1), &sm.map(|v| v.ln() as f32 as f64), &[2, 3]);
    // Softmax of huge values stays finite (max-subtracted).
    check(f32s(&[1000.0, 1000.0], &[2]).softmax(0), &[0.5, 0.5], &[2]);
    let ln = x.layer_norm(1, None, None, 0.0);
    let r = (2.0f64 / 3.0).sqrt();
    check(ln, &[-1.0 / r, 0.0, 1.0 / r, f64::NAN, f64::NAN, f64::NAN].map(|v| v as f32 as f64), &[2, 3]);
    let w = f32s(&[2.0, 2.0, 2.0], &[3]);
    let b = f32s(&[1.0, 1.0, 1.0], &[3]);
    let ln = x.layer_norm(1, Some(&w), Some(&b), 1e-5).unwrap();
    let (v, _) = read(&Ok(ln));
    assert_close(&v[3..], &[1.0, 1.0, 1.0]);
    assert!((v[0] - (1.0 - 2.0 / (2.0 / 3.0 + 1e-5f64).sqrt())).abs() < 1e-6);
    let g = f32s(&[0.0, 1.0, -1.0], &[3]);
    check(g.gelu(), &[0.0, r32(0.8413447460685429), r32(-0.15865525393145707)], &[3]);
    check(g.gelu_tanh(), &[0.0, r32(0.8411919906082768), r32(-0.15880800939172324)], &[3]);
    check(g.silu(), &[0.0, r32(0.7310585786300049), r32(-0.2689414213699951)], &[3]);
    let wl = f32s(&[1.0, 0.0, 0.0, 0.0, 1.0, 1.0], &[2, 3]);
    check(x.linear(&wl, Some(&f32s(&[0.5, -0.5], &[2]))), &[1.5, 4.5, 1.5, 1.5], &[2, 2]);
    check(x.linear(&wl, None), &[1.0, 5.0, 1.0, 2.0], &[2, 2]);
    let sq = f32s(&[1.0, 2.0, 3.0, 4.0], &[2, 2]);
    check(sq.causal_mask(), &[1.0, f64::NEG_INFINITY, 3.0, 4.0], &[2, 2]);
}

#[test]
fn compiled_matches_eager_on_a_mixed_function() {
    let f = |(x, w): (&Tensor, &Tensor)| -> kiln::Result<Tensor> {
        let h = x.linear(w, None)?.relu()?;
        let h = h.add(&h.mean(&[-1], true)?)?;
        h.softmax(-1)?.sum(&[0], false)
    };
    let x = f32s(&[0.1, -0.2, 0.3, 0.4, 0.5, -0.6], &[2, 3]);
    let w = f32s(&[1.0, 2.0, 3.0, -1.0, 0.5, 0.25, 0.0, 1.0, -1.0], &[3, 3]);
    let eager = read(&f((&x, &w)));
    // The compiled side runs the whole pipeline on the kernel interpreter: independent of the eager
    // reference it is compared with.
    let compiled = compile(f).backend(kiln::Backend::Kernels);
    let (out, explanation) = compiled.call_explained((&x, &w)).unwrap();
    assert_eq!(explanation.graph_count(), 1);
    assert_eq!(explanation.break_count(), 0);
    assert_eq!(explanation.backend, "cpu-kernels");
    let got = read(&Ok(out));
    assert_eq!(got.1, eager.1);
    assert_close(&got.0, &eager.0);
}
