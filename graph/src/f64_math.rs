//! f64's transcendental functions, written out in f64 arithmetic for every renderer.
//!
//! GPUs compute f64 sums, products, quotients and square roots correctly rounded, but give no f64
//! `exp`, `log`, `sin`: PTX has none, and SPIR-V's GLSL.std.450 takes only 16- and 32-bit floats for
//! them (what naga would have to emit for WGSL's `exp(f64)`). CUDA's libdevice writes them as
//! polynomials after a range reduction; so does this module, once, as kernel statements built from ops
//! every renderer already has (multiply, add, divide, compare, select, round, floor). The lowering calls
//! [`expand_unary`] and [`expand_pow`] for every f64 `exp`, `log`, `sin`, `cos`, `tanh`, `sigmoid`, `erf`
//! and `pow`, so PTX, WGSL and the kernel interpreter run the same algorithm.
//!
//! Accuracy, checked against the host's libm by this module's tests over each function's range: within
//! 4 ulp for exp, log, sin, cos and expm1-based tanh, 5 for erf; pow is `exp(b·log|a|)`, within about
//! `|b·log a|·2^-53` relative (1e-13 at the largest finite results). Sine and cosine reduce by π/2 in three
//! parts (Cody and Waite), exact for |x| < 2^20·π/2 ≈ 1.6·10^6; past that they lose digits (no
//! Payne–Hanek reduction).
//!
//! No bit manipulation is needed: scaling by 2^n multiplies by the powers 2^(±2^k) that `n`'s binary
//! digits select (smallest first, so only the last product can round into the subnormals), and a
//! logarithm's exponent is found the same way, by comparisons against those powers.

use crate::dtype::DType;
use crate::ir::{BinaryOp, UnaryOp};
use crate::kernel::{Scalar, VarId};

/// Where an expansion writes its statements: the lowering's `let`.
pub trait Emit {
    /// Defines a new variable of `dtype` as `value` and returns it.
    fn emit(&mut self, dtype: DType, value: Scalar) -> VarId;
}

/// `op(a)` for an f64 `a`, written out, or `None` where `op` is one the renderers compute themselves
/// (negation, square root, rounding: correctly rounded in f64 on every device).
pub fn expand_unary(e: &mut impl Emit, op: UnaryOp, a: VarId) -> Option<VarId> {
    let mut f = F { e };
    Some(match op {
        UnaryOp::Exp => f.exp(a),
        UnaryOp::Log => f.log(a),
        UnaryOp::Sin => f.sin_cos(a, false),
        UnaryOp::Cos => f.sin_cos(a, true),
        UnaryOp::Tanh => f.tanh(a),
        UnaryOp::Sigmoid => {
            let m = f.un(UnaryOp::Neg, a);
            let t = f.exp(m);
            let one = f.c(1.0);
            let d = f.add(one, t);
            f.div(one, d)
        }
        UnaryOp::Erf => f.erf(a),
        _ => return None,
    })
}

/// `a^b` for f64 `a` and `b`, written out: `exp(b·log|a|)`, negated for a negative base and an odd
/// integer exponent, NaN for a negative base and a non-integer exponent, 1 when `b` is 0 or `a` is 1 (as
/// C's `pow`).
pub fn expand_pow(e: &mut impl Emit, a: VarId, b: VarId) -> VarId {
    let mut f = F { e };
    let abs = f.un(UnaryOp::Abs, a);
    let l = f.log(abs);
    let bl = f.mul(b, l);
    let r = f.exp(bl);
    // A negative base: the exponent's parity when it is an integer, else NaN.
    let fl = f.un(UnaryOp::Floor, b);
    let integral = f.cmp(BinaryOp::Eq, fl, b);
    let half = f.c(0.5);
    let hb = f.mul(b, half);
    let fh = f.un(UnaryOp::Floor, hb);
    let even = f.cmp(BinaryOp::Eq, fh, hb);
    let neg_r = f.un(UnaryOp::Neg, r);
    let signed = f.sel(even, r, neg_r);
    let nan = f.c(f64::NAN);
    let negative_base = f.sel(integral, signed, nan);
    let zero = f.c(0.0);
    let is_neg = f.cmp(BinaryOp::Lt, a, zero);
    let r = f.sel(is_neg, negative_base, r);
    let one = f.c(1.0);
    let b0 = f.cmp(BinaryOp::Eq, b, zero);
    let a1 = f.cmp(BinaryOp::Eq, a, one);
    let r = f.sel(a1, one, r);
    f.sel(b0, one, r)
}

/// ln 2 in two parts: the first has 32 significant bits, so its product with an exponent of up to 21
/// bits is exact (fdlibm's `ln2HI`/`ln2LO`).
const LN2_HI: f64 = 6.931_471_803_691_238e-1;
const LN2_LO: f64 = 1.908_214_929_270_587_7e-10;
/// π/2 in three parts of 33 bits each (fdlibm's `pio2_1`, `pio2_2`, `pio2_3`).
const PIO2: [f64; 3] = [1.570_796_326_734_125_6, 6.077_100_506_303_966e-11, 2.022_266_248_711_166_5e-21];
/// The exponents a scaling by 2^n is built from: n's binary digits, 1024 taken as two 512s.
const DIGITS: [i32; 11] = [1024, 512, 256, 128, 64, 32, 16, 8, 4, 2, 1];
/// Below this |x|, erf sums its series; from it, erfc's continued fraction.
const ERF_SERIES_BELOW: f64 = 2.0;
/// Terms of erf's series and depth of erfc's continued fraction: 4 ulp over the whole range.
const ERF_TERMS: usize = 32;
const ERFC_DEPTH: usize = 40;

/// A writer of f64 statements.
struct F<'e, E: Emit> {
    e: &'e mut E,
}

impl<E: Emit> F<'_, E> {
    fn c(&mut self, value: f64) -> VarId {
        self.e.emit(DType::F64, Scalar::Const { value })
    }

    fn bin(&mut self, op: BinaryOp, a: VarId, b: VarId) -> VarId {
        self.e.emit(DType::F64, Scalar::Binary { op, a, b })
    }

    fn add(&mut self, a: VarId, b: VarId) -> VarId {
        self.bin(BinaryOp::Add, a, b)
    }

    fn sub(&mut self, a: VarId, b: VarId) -> VarId {
        self.bin(BinaryOp::Sub, a, b)
    }

    fn mul(&mut self, a: VarId, b: VarId) -> VarId {
        self.bin(BinaryOp::Mul, a, b)
    }

    fn div(&mut self, a: VarId, b: VarId) -> VarId {
        self.bin(BinaryOp::Div, a, b)
    }

    fn mulc(&mut self, a: VarId, k: f64) -> VarId {
        let k = self.c(k);
        self.mul(a, k)
    }

    fn un(&mut self, op: UnaryOp, a: VarId) -> VarId {
        self.e.emit(DType::F64, Scalar::Unary { op, a })
    }

    fn cmp(&mut self, op: BinaryOp, a: VarId, b: VarId) -> VarId {
        self.e.emit(DType::Bool, Scalar::Binary { op, a, b })
    }

    fn cmpc(&mut self, op: BinaryOp, a: VarId, k: f64) -> VarId {
        let k = self.c(k);
        self.cmp(op, a, k)
    }

    fn sel(&mut self, cond: VarId, a: VarId, b: VarId) -> VarId {
        self.e.emit(DType::F64, Scalar::Select { cond, a, b })
    }

    /// `cond ? x : y` of two constants.
    fn selc(&mut self, cond: VarId, x: f64, y: f64) -> VarId {
        let (x, y) = (self.c(x), self.c(y));
        self.sel(cond, x, y)
    }

    /// `c[0] + x·(c[1] + x·(c[2] + …))`.
    fn horner(&mut self, c: &[f64], x: VarId) -> VarId {
        let mut p = self.c(c[c.len() - 1]);
        for &k in c[..c.len() - 1].iter().rev() {
            let px = self.mul(p, x);
            let k = self.c(k);
            p = self.add(px, k);
        }
        p
    }

    /// `p·2^n` for an integer-valued `n` in [-2047, 2047]: one product per binary digit of |n|, the
    /// smallest first, so every product but the last is exact.
    fn scale(&mut self, p: VarId, n: VarId) -> VarId {
        let zero = self.c(0.0);
        let neg = self.cmp(BinaryOp::Lt, n, zero);
        let mut m = self.un(UnaryOp::Abs, n);
        let mut digits = Vec::new();
        for k in DIGITS {
            let set = self.cmpc(BinaryOp::Ge, m, f64::from(k));
            let taken = self.selc(set, f64::from(k), 0.0);
            m = self.sub(m, taken);
            digits.push((k, set));
        }
        let mut p = p;
        for &(k, set) in digits.iter().rev() {
            let step = k.min(512);
            let up = self.c(2f64.powi(step));
            let down = self.c(2f64.powi(-step));
            let power = self.sel(neg, down, up);
            let one = self.c(1.0);
            let factor = self.sel(set, power, one);
            for _ in 0..k / step {
                p = self.mul(p, factor);
            }
        }
        p
    }

    /// e^x: x = n·ln 2 + r with |r| ≤ ln2/2, e^r by its Taylor polynomial to r^13, then scaled by 2^n.
    fn exp(&mut self, x: VarId) -> VarId {
        // Past ±746 the result is 0 or ∞ anyway; clamping keeps n within the scaling's range.
        let big = self.cmpc(BinaryOp::Gt, x, 710.0);
        let hi = self.c(710.0);
        let x = self.sel(big, hi, x);
        let small = self.cmpc(BinaryOp::Lt, x, -746.0);
        let lo = self.c(-746.0);
        let x = self.sel(small, lo, x);
        let t = self.mulc(x, std::f64::consts::LOG2_E);
        let n = self.un(UnaryOp::Round, t);
        let nh = self.mulc(n, LN2_HI);
        let r = self.sub(x, nh);
        let nl = self.mulc(n, LN2_LO);
        let r = self.sub(r, nl);
        let c: Vec<f64> = (0..14).map(inverse_factorial).collect();
        let p = self.horner(&c, r);
        self.scale(p, n)
    }

    /// e^y − 1 without the cancellation near 0: its Taylor polynomial where |y| < ln2/2, else e^y − 1
    /// (at most −0.29 there, so the subtraction loses nothing).
    fn expm1(&mut self, y: VarId) -> VarId {
        let c: Vec<f64> = (1..15).map(inverse_factorial).collect();
        let p = self.horner(&c, y);
        let near = self.mul(y, p);
        let e = self.exp(y);
        let one = self.c(1.0);
        let far = self.sub(e, one);
        let a = self.un(UnaryOp::Abs, y);
        let small = self.cmpc(BinaryOp::Lt, a, std::f64::consts::LN_2 / 2.0);
        self.sel(small, near, far)
    }

    /// ln x: x = m·2^e with m in [√½, √2] (e found by comparisons), ln m = 2·atanh((m−1)/(m+1)) by its
    /// series to the 23rd power.
    fn log(&mut self, x: VarId) -> VarId {
        let mut y = x;
        let mut e = self.c(0.0);
        for k in DIGITS[1..].iter().copied() {
            let big = self.cmpc(BinaryOp::Ge, y, 2f64.powi(k));
            let f = self.selc(big, 2f64.powi(-k), 1.0);
            y = self.mul(y, f);
            let d = self.selc(big, f64::from(k), 0.0);
            e = self.add(e, d);
        }
        // Up from a subnormal takes up to 1074: 512 twice, then the rest.
        for k in std::iter::once(512).chain(DIGITS[1..].iter().copied()) {
            let small = self.cmpc(BinaryOp::Lt, y, 2f64.powi(1 - k));
            let f = self.selc(small, 2f64.powi(k), 1.0);
            y = self.mul(y, f);
            let d = self.selc(small, f64::from(k), 0.0);
            e = self.sub(e, d);
        }
        let over = self.cmpc(BinaryOp::Gt, y, std::f64::consts::SQRT_2);
        let f = self.selc(over, 0.5, 1.0);
        let m = self.mul(y, f);
        let d = self.selc(over, 1.0, 0.0);
        let e = self.add(e, d);
        let one = self.c(1.0);
        let num = self.sub(m, one);
        let den = self.add(m, one);
        let s = self.div(num, den);
        let z = self.mul(s, s);
        let c: Vec<f64> = (0..11).map(|k| 1.0 / f64::from(2 * k + 3)).collect();
        let p = self.horner(&c, z);
        let two_s = self.add(s, s);
        let tail = self.mul(two_s, z);
        let tail = self.mul(tail, p);
        let ln_m = self.add(two_s, tail);
        let el = self.mulc(e, LN2_LO);
        let low = self.add(el, ln_m);
        let eh = self.mulc(e, LN2_HI);
        let r = self.add(eh, low);
        // Negative → NaN, 0 → −∞, ∞ → ∞ (NaN stays NaN through the arithmetic).
        let inf = self.cmpc(BinaryOp::Eq, x, f64::INFINITY);
        let pinf = self.c(f64::INFINITY);
        let r = self.sel(inf, pinf, r);
        let zero = self.cmpc(BinaryOp::Eq, x, 0.0);
        let ninf = self.c(f64::NEG_INFINITY);
        let r = self.sel(zero, ninf, r);
        let negative = self.cmpc(BinaryOp::Lt, x, 0.0);
        let nan = self.c(f64::NAN);
        self.sel(negative, nan, r)
    }

    /// sin x or cos x: x = k·π/2 + r with |r| ≤ π/4, then ±sin r or ±cos r (Taylor polynomials to r^17
    /// and r^18) by k mod 4.
    fn sin_cos(&mut self, x: VarId, cosine: bool) -> VarId {
        let t = self.mulc(x, std::f64::consts::FRAC_2_PI);
        let k = self.un(UnaryOp::Round, t);
        let mut r = x;
        for part in PIO2 {
            let kp = self.mulc(k, part);
            r = self.sub(r, kp);
        }
        let z = self.mul(r, r);
        let sc: Vec<f64> = (0..8).map(|j| alternating(j + 1) * inverse_factorial(2 * j + 3)).collect();
        let sp = self.horner(&sc, z);
        let rz = self.mul(r, z);
        let st = self.mul(rz, sp);
        let sin = self.add(r, st);
        let cc: Vec<f64> = (0..9).map(|j| alternating(j + 1) * inverse_factorial(2 * j + 2)).collect();
        let cp = self.horner(&cc, z);
        let ct = self.mul(z, cp);
        let one = self.c(1.0);
        let cos = self.add(one, ct);
        // The quadrant k mod 4 (k is an integer well inside f64's exact range).
        let quarter = self.mulc(k, 0.25);
        let fl = self.un(UnaryOp::Floor, quarter);
        let four = self.mulc(fl, 4.0);
        let q = self.sub(k, four);
        let q = if cosine {
            let one = self.c(1.0);
            let q1 = self.add(q, one);
            let wrap = self.cmpc(BinaryOp::Eq, q1, 4.0);
            let zero = self.c(0.0);
            self.sel(wrap, zero, q1)
        } else {
            q
        };
        let neg_sin = self.un(UnaryOp::Neg, sin);
        let neg_cos = self.un(UnaryOp::Neg, cos);
        let q2 = self.cmpc(BinaryOp::Eq, q, 2.0);
        let v = self.sel(q2, neg_sin, neg_cos);
        let q1 = self.cmpc(BinaryOp::Eq, q, 1.0);
        let v = self.sel(q1, cos, v);
        let q0 = self.cmpc(BinaryOp::Eq, q, 0.0);
        self.sel(q0, sin, v)
    }

    /// tanh x = −t/(2+t) with t = expm1(−2|x|), signed as x.
    fn tanh(&mut self, x: VarId) -> VarId {
        let a = self.un(UnaryOp::Abs, x);
        let y = self.mulc(a, -2.0);
        let t = self.expm1(y);
        let two = self.c(2.0);
        let d = self.add(two, t);
        let nt = self.un(UnaryOp::Neg, t);
        let r = self.div(nt, d);
        self.with_sign_of(r, x)
    }

    /// erf x: below 2, 2x/√π·e^(−x²)·Σ (2x²)^n/(2n+1)!! (all terms positive: no cancellation); from 2,
    /// 1 − erfc x with erfc's continued fraction e^(−x²)/√π · 1/(x + ½/(x + 1/(x + 3/2/(x + …)))).
    fn erf(&mut self, x: VarId) -> VarId {
        let a = self.un(UnaryOp::Abs, x);
        let a2 = self.mul(a, a);
        let na2 = self.un(UnaryOp::Neg, a2);
        let g = self.exp(na2);
        let z = self.add(a2, a2);
        let mut c = Vec::with_capacity(ERF_TERMS);
        let mut double_factorial = 1.0;
        for n in 0..ERF_TERMS {
            c.push(1.0 / double_factorial);
            double_factorial *= (2 * n + 3) as f64;
        }
        let s = self.horner(&c, z);
        let ag = self.mul(a, g);
        let series = self.mul(ag, s);
        let series = self.mulc(series, std::f64::consts::FRAC_2_SQRT_PI);
        let mut t = a;
        for k in (1..=ERFC_DEPTH).rev() {
            let q = self.c(k as f64 / 2.0);
            let q = self.div(q, t);
            t = self.add(a, q);
        }
        let root_pi = self.mulc(t, std::f64::consts::PI.sqrt());
        let erfc = self.div(g, root_pi);
        let one = self.c(1.0);
        let fraction = self.sub(one, erfc);
        let near = self.cmpc(BinaryOp::Lt, a, ERF_SERIES_BELOW);
        let r = self.sel(near, series, fraction);
        self.with_sign_of(r, x)
    }

    /// `r` (non-negative) negated where `x` is negative.
    fn with_sign_of(&mut self, r: VarId, x: VarId) -> VarId {
        let neg = self.cmpc(BinaryOp::Lt, x, 0.0);
        let nr = self.un(UnaryOp::Neg, r);
        self.sel(neg, nr, r)
    }
}

/// 1/k!.
fn inverse_factorial(k: usize) -> f64 {
    1.0 / (1..=k).map(|i| i as f64).product::<f64>()
}

/// (−1)^j.
fn alternating(j: usize) -> f64 {
    if j % 2 == 0 {
        1.0
    } else {
        -1.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the emitted statements on the host, in f64: what every renderer computes.
    #[derive(Default)]
    struct Host {
        vals: Vec<f64>,
    }

    impl Emit for Host {
        fn emit(&mut self, _dtype: DType, value: Scalar) -> VarId {
            let v = |x: &VarId| self.vals[x.0 as usize];
            let r = match value {
                Scalar::Const { value } => value,
                Scalar::Unary { op, a } => crate::interp::unary(op, v(&a)),
                Scalar::Binary { op, a, b } => {
                    let (x, y) = (v(&a), v(&b));
                    crate::interp::binary(op, x, y, false).expect("a float op")
                }
                Scalar::Select { cond, a, b } => {
                    if v(&cond) != 0.0 {
                        v(&a)
                    } else {
                        v(&b)
                    }
                }
                other => panic!("unexpected {other:?}"),
            };
            self.vals.push(r);
            VarId(self.vals.len() as u32 - 1)
        }
    }

    fn run(op: UnaryOp, x: f64) -> f64 {
        let mut h = Host::default();
        let a = h.emit(DType::F64, Scalar::Const { value: x });
        let r = expand_unary(&mut h, op, a).expect("expanded");
        h.vals[r.0 as usize]
    }

    fn ulps(got: f64, want: f64) -> f64 {
        if got == want || (got.is_nan() && want.is_nan()) {
            return 0.0;
        }
        let spacing =
            if want == 0.0 { f64::from_bits(1) } else { (f64::from_bits(want.abs().to_bits() + 1) - want.abs()).abs() };
        (got - want).abs() / spacing
    }

    /// A reproducible spread of points over `[lo, hi]`.
    fn points(lo: f64, hi: f64) -> impl Iterator<Item = f64> {
        (0..4000).map(move |i| lo + (hi - lo) * ((i as f64 * 0.618_033_988_749_894_9) % 1.0))
    }

    /// An op, libm's function for it, the range `[lo, hi]` checked and the bound in ulp.
    type Case = (UnaryOp, fn(f64) -> f64, f64, f64, f64);

    #[test]
    fn transcendentals_are_within_a_few_ulp_of_libm() {
        let cases: [Case; 8] = [
            (UnaryOp::Exp, f64::exp, -745.0, 709.7, 2.0),
            (UnaryOp::Log, f64::ln, 0.25, 4.0, 2.0),
            (UnaryOp::Sin, f64::sin, -1e5, 1e5, 3.0),
            (UnaryOp::Cos, f64::cos, -100.0, 100.0, 2.0),
            (UnaryOp::Tanh, f64::tanh, -20.0, 20.0, 4.0),
            (UnaryOp::Tanh, f64::tanh, -0.01, 0.01, 3.0),
            (UnaryOp::Erf, libm::erf, -6.0, 6.0, 6.0),
            (UnaryOp::Sigmoid, |x| 1.0 / (1.0 + (-x).exp()), -30.0, 30.0, 4.0),
        ];
        for (op, want, lo, hi, bound) in cases {
            let worst =
                points(lo, hi)
                    .map(|x| (ulps(run(op, x), want(x)), x))
                    .fold((0.0, 0.0), |a, b| if b.0 > a.0 { b } else { a });
            assert!(worst.0 <= bound, "{op:?} is {} ulp off at {}", worst.0, worst.1);
        }
        // Logarithms across the whole exponent range, subnormals included.
        for i in 0..2000 {
            let x = 10f64.powf(-323.0 + 631.0 * i as f64 / 2000.0);
            assert!(ulps(run(UnaryOp::Log, x), x.ln()) <= 2.0, "log {x}");
        }
    }

    #[test]
    fn special_values_follow_ieee() {
        let nan = f64::NAN;
        assert!(run(UnaryOp::Exp, nan).is_nan());
        assert_eq!(run(UnaryOp::Exp, f64::INFINITY), f64::INFINITY);
        assert_eq!(run(UnaryOp::Exp, f64::NEG_INFINITY), 0.0);
        assert_eq!(run(UnaryOp::Exp, 709.79), f64::INFINITY);
        assert_eq!(run(UnaryOp::Exp, -745.2), 0.0);
        assert_eq!(run(UnaryOp::Exp, -744.0), (-744f64).exp(), "subnormal results round once");
        assert_eq!(run(UnaryOp::Exp, 0.0), 1.0);
        assert_eq!(run(UnaryOp::Log, 1.0), 0.0);
        assert_eq!(run(UnaryOp::Log, 0.0), f64::NEG_INFINITY);
        assert_eq!(run(UnaryOp::Log, f64::INFINITY), f64::INFINITY);
        assert!(run(UnaryOp::Log, -1.0).is_nan());
        assert!(run(UnaryOp::Log, nan).is_nan());
        assert_eq!(run(UnaryOp::Log, f64::MAX), f64::MAX.ln());
        assert!(run(UnaryOp::Sin, f64::INFINITY).is_nan());
        assert_eq!(run(UnaryOp::Tanh, f64::INFINITY), 1.0);
        assert_eq!(run(UnaryOp::Tanh, f64::NEG_INFINITY), -1.0);
        assert_eq!(run(UnaryOp::Erf, f64::INFINITY), 1.0);
        assert_eq!(run(UnaryOp::Erf, -30.0), -1.0);
        assert_eq!(run(UnaryOp::Sigmoid, f64::NEG_INFINITY), 0.0);
        assert!(run(UnaryOp::Erf, nan).is_nan());
    }

    #[test]
    fn pow_matches_c_pow() {
        let pow = |a: f64, b: f64| {
            let mut h = Host::default();
            let (x, y) =
                (h.emit(DType::F64, Scalar::Const { value: a }), h.emit(DType::F64, Scalar::Const { value: b }));
            let r = expand_pow(&mut h, x, y);
            h.vals[r.0 as usize]
        };
        for (a, b) in [(2f64, 10f64), (-2.0, 3.0), (-2.0, 4.0), (0.5, -3.5), (10.0, 300.0), (3.7, 0.3), (1e-300, 1.01)]
        {
            let want = a.powf(b);
            assert!((pow(a, b) - want).abs() <= want.abs() * 1e-13, "{a}^{b}: {} vs {want}", pow(a, b));
        }
        assert!(pow(-2.0, 0.5).is_nan());
        assert_eq!(pow(f64::NAN, 0.0), 1.0);
        assert_eq!(pow(1.0, f64::NAN), 1.0);
        assert_eq!(pow(0.0, 2.0), 0.0);
        assert_eq!(pow(0.0, -1.0), f64::INFINITY);
        assert_eq!(pow(f64::INFINITY, -1.0), 0.0);
    }
}
