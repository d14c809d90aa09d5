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

// The value of an 8-bit float with `m` mantissa bits, smallest normal exponent `emin` and largest
// finite value `top` nearest `x`, ties to even; past `top` (infinities too) saturated, as ONNX's cast;
// NaN kept. The scalings are by powers of two, exact.
fn kround_f8(x: f32, m: i32, emin: i32, top: f32) -> f32 {
    let b = bitcast<u32>(x);
    let ab = min(b & 0x7fffffffu, bitcast<u32>(top));
    let e = max(i32(ab >> 23u) - 127, emin);
    let step = kbits(u32(e - m + 127) << 23u);
    let inverse = kbits(u32(m - e + 127) << 23u);
    let r = round(kbits(ab) * inverse) * step;
    return select(kbits(bitcast<u32>(r) | (b & 0x80000000u)), x, kisnan(x));
}

// The bits of `r`, a value `kround_f8` made for a format of `m` mantissa bits and exponent bias `bias`:
// sign, exponent, mantissa; below the smallest normal a multiple of the smallest step; NaN as 0x7f.
fn kf8_bits(r: f32, m: u32, bias: i32) -> u32 {
    let b = bitcast<u32>(r);
    let ab = b & 0x7fffffffu;
    let e = i32(ab >> 23u) - 127;
    let emin = 1 - bias;
    let sub = u32(kbits(ab) * kbits(u32(i32(m) - emin + 127) << 23u));
    let normal = (u32(e + bias) << m) | ((ab >> (23u - m)) & ((1u << m) - 1u));
    let v = ((b >> 24u) & 0x80u) | select(normal, sub, e < emin);
    return select(v, 0x7fu, ab > 0x7f800000u);
}

// The value of 8-bit float bits `c` (`kf8_bits`' inverse): E4M3FN (`inf` false) has no infinities and
// one NaN code; E5M2 IEEE's specials in its top exponent.
fn kf8_value(c: u32, m: u32, bias: i32, inf: bool) -> f32 {
    let f = c & ((1u << m) - 1u);
    let top = (1u << (7u - m)) - 1u;
    let e = (c >> m) & top;
    let sub = f32(f) * kbits(u32(1 - bias - i32(m) + 127) << 23u);
    let normal = kbits((u32(i32(e) - bias + 127) << 23u) | (f << (23u - m)));
    var v = select(normal, sub, e == 0u);
    if (inf && e == top) {
        v = select(knan(), kinf(), f == 0u);
    }
    if (!inf && (c & 0x7fu) == 0x7fu) {
        v = knan();
    }
    return kbits(bitcast<u32>(v) | ((c & 0x80u) << 24u));
}
