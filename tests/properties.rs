//! Property tests: broadcasting, reshape/permute round trips, reduction identities, f16/bf16 rounding.

mod common;
use common::*;
use half::{bf16, f16};
use kiln::{DType, Tensor};
use proptest::prelude::*;

/// A shape of rank 0..=4 with dims 1..=4, and values for it.
fn tensor_strategy() -> impl Strategy<Value = (Vec<usize>, Vec<f32>)> {
    prop::collection::vec(1usize..=4, 0..=4).prop_flat_map(|dims| {
        let n = dims.iter().product::<usize>();
        (Just(dims), prop::collection::vec(-100.0f32..100.0, n))
    })
}

fn strides(dims: &[usize]) -> Vec<usize> {
    let mut s = vec![1; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * dims[i + 1];
    }
    s
}

/// Flat offset into a tensor of `dims` for an index of the (right-aligned, broadcast) output.
fn broadcast_offset(dims: &[usize], out_idx: &[usize]) -> usize {
    let st = strides(dims);
    let pad = out_idx.len() - dims.len();
    dims.iter().enumerate().map(|(i, &d)| if d == 1 { 0 } else { out_idx[pad + i] * st[i] }).sum()
}

fn unravel(mut flat: usize, dims: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; dims.len()];
    for i in (0..dims.len()).rev() {
        idx[i] = flat % dims[i];
        flat /= dims[i];
    }
    idx
}

proptest! {
    #[test]
    fn broadcasting_matches_the_pytorch_rule(
        (da, va) in tensor_strategy(),
        mask in prop::collection::vec(any::<bool>(), 4),
        drop in 0usize..=2,
    ) {
        // b: a's trailing dims, some set to 1, some leading dims dropped — always broadcastable.
        let db: Vec<usize> = da.iter().skip(drop.min(da.len())).enumerate()
            .map(|(i, &d)| if mask[i % 4] { 1 } else { d }).collect();
        let nb: usize = db.iter().product();
        let vb: Vec<f32> = (0..nb).map(|i| i as f32 * 0.5 - 3.0).collect();
        let (a, b) = (f32s(&va, &da), f32s(&vb, &db));
        let (got, dims) = read(&a.add(&b));
        prop_assert_eq!(&dims, &da);
        let (got_rev, dims_rev) = read(&b.add(&a));
        prop_assert_eq!(&dims_rev, &da);
        for (flat, g) in got.iter().enumerate() {
            let idx = unravel(flat, &dims);
            let want = (va[broadcast_offset(&da, &idx)] + vb[broadcast_offset(&db, &idx)]) as f64;
            prop_assert_eq!(*g, want);
            prop_assert_eq!(got_rev[flat], want);
        }
    }

    #[test]
    fn reshape_and_permute_round_trip((dims, values) in tensor_strategy(), seed in any::<u64>()) {
        let x = f32s(&values, &dims);
        let flat = x.reshape(&[-1]).unwrap();
        let dims_i: Vec<isize> = dims.iter().map(|&d| d as isize).collect();
        let back = flat.reshape(&dims_i).unwrap();
        prop_assert_eq!(read(&Ok(back)), (values.iter().map(|&v| v as f64).collect::<Vec<_>>(), dims.clone()));

        // A pseudo-random permutation and its inverse.
        let mut perm: Vec<usize> = (0..dims.len()).collect();
        let mut s = seed;
        for i in (1..perm.len()).rev() {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            perm.swap(i, (s >> 33) as usize % (i + 1));
        }
        let mut inv = vec![0isize; perm.len()];
        for (i, &p) in perm.iter().enumerate() { inv[p] = i as isize; }
        let p: Vec<isize> = perm.iter().map(|&p| p as isize).collect();
        let permuted = x.permute(&p).unwrap();
        let (pv, pd) = read(&Ok(permuted.clone()));
        let want_dims: Vec<usize> = perm.iter().map(|&a| dims[a]).collect();
        prop_assert_eq!(&pd, &want_dims);
        // Element check: permuted[idx] == x[idx mapped back].
        let st = strides(&dims);
        for (flat, v) in pv.iter().enumerate() {
            let idx = unravel(flat, &pd);
            let src: usize = idx.iter().enumerate().map(|(i, &x)| x * st[perm[i]]).sum();
            prop_assert_eq!(*v, values[src] as f64);
        }
        let round = permuted.permute(&inv).unwrap();
        prop_assert_eq!(read(&Ok(round)), read(&Ok(x)));
    }

    #[test]
    fn reduction_identities((dims, values) in tensor_strategy(), axis_pick in any::<usize>()) {
        prop_assume!(!dims.is_empty());
        let x = f32s(&values, &dims);
        let axis = (axis_pick % dims.len()) as isize;
        let total = read(&x.sum(&[], false)).0[0];
        // Summing one axis then the rest gives the total (up to f32 rounding of the partial sums).
        let partial = x.sum(&[axis], false).unwrap();
        let two_step = read(&partial.sum(&[], false)).0[0];
        prop_assert!((two_step - total).abs() <= 1e-3 * (1.0 + total.abs()), "{} vs {}", two_step, total);
        // mean * count == sum.
        let count = dims[axis as usize] as f64;
        let (mean, _) = read(&x.mean(&[axis], false));
        let (sum, _) = read(&Ok(partial));
        for (m, s) in mean.iter().zip(&sum) {
            prop_assert!((m * count - s).abs() <= 1e-4 * (1.0 + s.abs()));
        }
        // max bounds every element and argmax points at it.
        let (mx, _) = read(&x.max(&[axis], true));
        let mxt = x.max(&[axis], true).unwrap();
        let (ge, _) = read(&x.ge(mxt.expand(&dims.iter().map(|&d| d as isize).collect::<Vec<_>>()).unwrap()));
        let (le, _) = read(&x.le(&mxt));
        prop_assert!(le.iter().all(|&b| b == 1.0));
        prop_assert!(ge.contains(&1.0));
        let arg = x.argmax(axis, true).unwrap();
        let (picked, _) = read(&x.gather(axis, &arg));
        prop_assert_eq!(picked, mx);
        // var(correction 0) == mean(x^2) - mean(x)^2.
        let (var, _) = read(&x.var(&[axis], 0, false));
        let (m2, _) = read(&x.mul(&x).unwrap().mean(&[axis], false));
        for ((v, m), q) in var.iter().zip(&mean).zip(&m2) {
            prop_assert!((v - (q - m * m)).abs() <= 1e-2 * (1.0 + q.abs()), "{} vs {}", v, q - m * m);
        }
    }

    #[test]
    fn f16_and_bf16_round_to_nearest_even(v in prop::collection::vec(any::<f32>(), 1..64)) {
        let x = Tensor::from_slice(&v, &[v.len()]).unwrap();
        let h: Vec<f16> = x.cast(DType::F16).unwrap().to_vec().unwrap();
        let b: Vec<bf16> = x.cast(DType::BF16).unwrap().to_vec().unwrap();
        for ((&f, hh), bb) in v.iter().zip(&h).zip(&b) {
            let (wh, wb) = (f16::from_f32(f), bf16::from_f32(f));
            prop_assert!(hh.to_bits() == wh.to_bits() || (hh.is_nan() && wh.is_nan()), "f16 of {}", f);
            prop_assert!(bb.to_bits() == wb.to_bits() || (bb.is_nan() && wb.is_nan()), "bf16 of {}", f);
        }
    }

    #[test]
    fn f16_arithmetic_rounds_each_result(a in -1000.0f32..1000.0, b in -1000.0f32..1000.0) {
        let (ha, hb) = (f16::from_f32(a), f16::from_f32(b));
        let x = Tensor::from_slice(&[ha], &[1]).unwrap();
        let y = Tensor::from_slice(&[hb], &[1]).unwrap();
        let got: Vec<f16> = x.mul(&y).unwrap().add(&x).unwrap().to_vec().unwrap();
        let prod = f16::from_f64(ha.to_f64() * hb.to_f64());
        let want = f16::from_f64(prod.to_f64() + ha.to_f64());
        prop_assert_eq!(got[0].to_bits(), want.to_bits());
    }
}

#[test]
fn half_precision_rounding_edges() {
    // 1 + 2^-11 is halfway between two f16 values: ties go to even (1.0); 1 + 3*2^-11 goes up.
    let x = f32s(&[1.0 + 2f32.powi(-11), 1.0 + 3.0 * 2f32.powi(-11), 65520.0, 1e-8], &[4]);
    let h: Vec<f32> = x.cast(DType::F16).unwrap().to_vec().unwrap();
    assert_eq!(h, vec![1.0, 1.0 + 2f32.powi(-9), f32::INFINITY, 0.0]);
    // bf16 keeps f32's range but 8 significand bits.
    let b: Vec<f32> = f32s(&[1.0 + 2f32.powi(-8), 3.0e38, 1.0 + 3.0 * 2f32.powi(-8)], &[3])
        .cast(DType::BF16)
        .unwrap()
        .to_vec()
        .unwrap();
    assert_eq!(b, vec![1.0, bf16::from_f32(3.0e38).to_f32(), 1.0 + 2f32.powi(-6)]);
    // Ops on f16 tensors give f16 results.
    let s = Tensor::from_slice(&[f16::from_f32(0.1); 3], &[3]).unwrap().sum(&[], false).unwrap();
    assert_eq!(s.dtype(), DType::F16);
    assert_eq!(s.to_vec::<f16>().unwrap()[0], f16::from_f64(3.0 * f16::from_f32(0.1).to_f64()));
}
