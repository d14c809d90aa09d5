// Helpers every kiln kernel may call. Index arithmetic follows kiln's symbolic rules: floor division and
// modulo with the divisor's sign.
fn kfloordiv(a: i32, b: i32) -> i32 {
    let q = a / b;
    return select(q, q - 1, (a % b != 0) && ((a < 0) != (b < 0)));
}

fn kmod(a: i32, b: i32) -> i32 {
    let r = a % b;
    return select(r, r + b, (r != 0) && ((r < 0) != (b < 0)));
}

// NaN and the infinities are made at run time: WGSL's constant evaluation rejects non-finite values, and
// browsers' compiler (Tint) refuses `bitcast<f32>(0x7fc00000u)` where naga lets it through. A call to a
// user function is never a constant expression.
fn kbits(bits: u32) -> f32 {
    return bitcast<f32>(bits);
}

fn knan() -> f32 {
    return kbits(0x7fc00000u);
}

fn kinf() -> f32 {
    return kbits(0x7f800000u);
}

fn kisnan(x: f32) -> bool {
    // Compare the bits: an optimiser may assume x == x.
    return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u;
}

fn kmaxf(a: f32, b: f32) -> f32 {
    return select(max(a, b), knan(), kisnan(a) || kisnan(b));
}

fn kminf(a: f32, b: f32) -> f32 {
    return select(min(a, b), knan(), kisnan(a) || kisnan(b));
}

fn krelu(x: f32) -> f32 {
    return select(max(x, 0.0), x, kisnan(x));
}

fn ktanh(x: f32) -> f32 {
    // The PTX renderer's tanh: an odd polynomial below |x| = 0.6, where 1 - 2/(e^2|x| + 1) would
    // cancel, that form above; both computed and one selected, so a subgroup never diverges. A driver's
    // own tanh may come from exp and overflow to NaN past |x| ~ 44; here e^2|x| stops at e^80 (WGSL
    // lets a driver assume no infinities), where the form is 1 in f32.
    let s = x * x;
    let small = fma(fma(fma(fma(fma(-5.70498872745e-3, s, 2.06390887954e-2), s, -5.37397155531e-2), s, 1.33314422036e-1), s, -3.33332819422e-1), s * x, x);
    let a = abs(x);
    let big = 1.0 - 2.0 / (exp(min(a + a, 80.0)) + 1.0);
    return select(select(sign(x) * big, x, kisnan(x)), small, a < 0.6);
}

fn ksigmoid(x: f32) -> f32 {
    return 1.0 / (1.0 + exp(-x));
}

fn kerf(x: f32) -> f32 {
    // The PTX renderer's erf: a Taylor series below |x| = 0.5, where 1 - erfc would cancel, the
    // Numerical Recipes erfc fit (fractional error < 1.2e-7) above; both computed and one selected, so a
    // subgroup never diverges (W1's inputs straddle 0.5).
    let a = abs(x);
    let z = x * x;
    let small = x * 1.1283791671 * (1.0 + z * (-0.3333333333 + z * (0.1 + z * (-0.0238095238 + z * (0.0046296296 + z * -0.0007575758)))));
    let t = 1.0 / (1.0 + 0.5 * a);
    let p = -a * a - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (-0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277))))))));
    let r = 1.0 - t * exp(p);
    let big = select(r, -r, x < 0.0);
    return select(select(big, small, a < 0.5), x, kisnan(x));
}

fn kpow(a: f32, b: f32) -> f32 {
    if (b == 0.0) {
        return 1.0;
    }
    if (a >= 0.0) {
        return pow(a, b);
    }
    if (b == round(b)) {
        let r = pow(-a, b);
        return select(r, -r, abs(b % 2.0) == 1.0);
    }
    return knan();
}

fn kf2i(x: f32) -> i32 {
    return select(i32(clamp(x, -2147483648.0, 2147483520.0)), 0, kisnan(x));
}

fn kround_f16(x: f32) -> f32 {
    return unpack2x16float(pack2x16float(vec2<f32>(x, 0.0))).x;
}

fn kround_bf16(x: f32) -> f32 {
    let u = bitcast<u32>(x);
    let rounded = (u + 0x7fffu + ((u >> 16u) & 1u)) & 0xffff0000u;
    return select(bitcast<f32>(rounded), x, kisnan(x));
}

fn kfloordiv_i(a: i32, b: i32) -> i32 {
    return select(kfloordiv(a, b), 0, b == 0);
}

fn kipow(a: i32, b: i32) -> i32 {
    return i32(kpow(f32(a), f32(b)));
}

// The high 32 bits of a 32 x 32-bit product (WGSL has no wide multiply): four 16-bit partial products.
fn kmulhi_u32(a: u32, b: u32) -> u32 {
    let a0 = a & 0xffffu;
    let a1 = a >> 16u;
    let b0 = b & 0xffffu;
    let b1 = b >> 16u;
    let p01 = a0 * b1;
    let p10 = a1 * b0;
    let mid = ((a0 * b0) >> 16u) + (p01 & 0xffffu) + (p10 & 0xffffu);
    return a1 * b1 + (p01 >> 16u) + (p10 >> 16u) + (mid >> 16u);
}
