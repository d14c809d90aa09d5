//! The polynomial approximations the renderers print for functions a GPU has no instruction for (erf,
//! tanh), kept here so the PTX and WGSL versions are one design with one set of coefficients and one
//! stated error, checked in CI against libm by evaluating them exactly as the renderers do
//! (`erf`, `tanh_small` below).
//!
//! Coefficients are listed constant term first; renderers evaluate them by Horner's rule with fused
//! multiply-adds, from the last. Each is an f32 value written out exactly, so printing it in either
//! language gives the same bits.

/// erf: below this |x| the odd polynomial [`ERF_SMALL`] (no cancellation near 0); at or above it
/// `1 - 2^q(|x|)`, q from [`ERF_LARGE_LOG2`]. Both forms are computed and one selected, so a warp or
/// subgroup whose inputs straddle the split never diverges.
pub const ERF_SPLIT: f64 = 0.921875;

/// erf(x) = x + x·p(x²) below [`ERF_SPLIT`]: p's coefficients in s = x², a minimax fit of
/// erf(x)/x − 1 (`scripts/fit_erf.py`).
pub const ERF_SMALL: [f64; 6] = [
    0.12837915122509003,
    -0.3761250674724579,
    0.11281926929950714,
    -0.026770230382680893,
    0.004997998010367155,
    -0.000601337815169245,
];

/// erf(t) = 1 − 2^q(t) for t = min(|x|, [`ERF_CLAMP`]) at or above [`ERF_SPLIT`]: q's coefficients in t,
/// a fit of log2(erfc(t)) weighted by erfc(t) (the error it makes in erf) (`scripts/fit_erf.py`).
pub const ERF_LARGE_LOG2: [f64; 7] = [
    -0.0003028242790605873,
    -1.626805305480957,
    -0.919408917427063,
    -0.14980795979499817,
    0.032001033425331116,
    -0.0043736849911510944,
    0.0002809434081427753,
];

/// Where erf's second form stops moving: erfc(4) ≈ 1.5e-8 is below half an f32 ulp of 1, so erf is 1
/// there and beyond; clamping keeps the polynomial inside the range it was fitted on.
pub const ERF_CLAMP: f64 = 4.0;

/// The error budget [`erf`] is tested to, in units in the last place of the correctly rounded f32
/// result, with an exact `2^q`; the hardware's `ex2.approx` adds at most ~0.2 ulp more (its error, at
/// most 2 ulp of 2^q ≤ erfc(0.92) ≈ 0.19, scaled into erf's ulp).
pub const ERF_MAX_ULP: f64 = 1.5;

/// tanh: below this |x| the odd polynomial [`TANH_SMALL`], where `1 − 2/(e^{2|x|} + 1)` would cancel.
pub const TANH_SPLIT: f64 = 0.6;

/// tanh(x) = x + x³·p(x²) below [`TANH_SPLIT`]: p's coefficients in s = x² (libdevice's).
pub const TANH_SMALL: [f64; 5] =
    [-3.33332819422e-1, 1.33314422036e-1, -5.37397155531e-2, 2.06390887954e-2, -5.70498872745e-3];

/// `c[0] + s·(c[1] + s·(…))` by fused multiply-adds from the last coefficient, in f32 — the renderers'
/// order of operations.
pub fn horner(c: &[f64], s: f32) -> f32 {
    let mut acc = c[c.len() - 1] as f32;
    for &k in c[..c.len() - 1].iter().rev() {
        acc = acc.mul_add(s, k as f32);
    }
    acc
}

/// erf in f32 exactly as the renderers compute it (with an exact `2^q`).
pub fn erf(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    let a = x.abs();
    let small = horner(&ERF_SMALL, x * x).mul_add(x, x);
    let q = horner(&ERF_LARGE_LOG2, a.min(ERF_CLAMP as f32));
    let big = (1.0 - q.exp2()).copysign(x);
    if a < ERF_SPLIT as f32 {
        small
    } else {
        big
    }
}

/// tanh's first form in f32 as the renderers compute it (valid below [`TANH_SPLIT`]).
pub fn tanh_small(x: f32) -> f32 {
    let s = x * x;
    horner(&TANH_SMALL, s).mul_add(s * x, x)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Distance from the correctly rounded f32 result in its units in the last place.
    fn ulps(got: f32, exact: f64) -> f64 {
        let rounded = exact as f32;
        let ulp = if rounded == 0.0 {
            f32::from_bits(1) as f64
        } else {
            let next = f32::from_bits(rounded.abs().to_bits() + 1);
            (next - rounded.abs()) as f64
        };
        (got as f64 - exact).abs() / ulp
    }

    #[test]
    fn every_coefficient_is_an_f32_value() {
        for c in ERF_SMALL.iter().chain(&ERF_LARGE_LOG2).chain([&ERF_SPLIT, &ERF_CLAMP]) {
            assert_eq!(*c as f32 as f64, *c, "{c} is not exactly an f32");
        }
    }

    #[test]
    fn erf_within_its_budget_everywhere() {
        let mut worst = (0.0, 0.0f32);
        // Every 64th f32 in [-6, 6] (both signs, the split and the clamp crossed), plus tiny values.
        let top = 6.0f32.to_bits();
        for bits in (0..=top).step_by(64).chain([1, 2, 0x0080_0000, 0x3f6c_0000, 0x3f6c_0001, 0x3f6b_ffff]) {
            for x in [f32::from_bits(bits), -f32::from_bits(bits)] {
                let e = ulps(erf(x), libm::erf(x as f64));
                if e > worst.0 {
                    worst = (e, x);
                }
            }
        }
        assert!(worst.0 <= ERF_MAX_ULP, "erf is {} ulp off at {}", worst.0, worst.1);
    }

    #[test]
    fn erf_at_its_ends() {
        assert!(erf(f32::NAN).is_nan());
        assert_eq!(erf(f32::INFINITY), 1.0);
        assert_eq!(erf(f32::NEG_INFINITY), -1.0);
        assert_eq!(erf(0.0).to_bits(), 0.0f32.to_bits());
        assert_eq!(erf(-0.0).to_bits(), (-0.0f32).to_bits());
        assert_eq!(erf(100.0), 1.0);
        // Odd: the same magnitude either side.
        for x in [0.3f32, 0.921875, 1.7, 3.9] {
            assert_eq!(erf(-x), -erf(x));
        }
    }

    #[test]
    fn tanh_first_form_within_two_ulp_below_its_split() {
        let mut x = -(TANH_SPLIT as f32);
        while x < TANH_SPLIT as f32 {
            let e = ulps(tanh_small(x), (x as f64).tanh());
            assert!(e <= 2.0, "tanh is {e} ulp off at {x}");
            x += 1.0e-4;
        }
    }
}
