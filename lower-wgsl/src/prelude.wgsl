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

fn ksigmoid(x: f32) -> f32 {
    return 1.0 / (1.0 + exp(-x));
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

// A negative value wraps, as an integer cast does (through i32); a non-negative one saturates.
fn kf2u(x: f32) -> u32 {
    return select(bitcast<u32>(kf2i(x)), u32(clamp(x, 0.0, 4294967040.0)), x >= 0.0);
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
