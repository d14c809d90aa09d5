// 8- and 4-bit floats (`Storage::Minifloat`): rounding, encoding and decoding, in kernels that call
// them. `uz` marks the FNUZ formats: one zero (no -0) and one NaN, at the negative zero's code 0x80; `w`
// is the bits of a code (8, or 4 for E2M1, whose sign is bit 3); `nan` whether the format has a NaN
// (E2M1 has none: NaN casts to -0).

// The value of an 8-bit float with `m` mantissa bits, smallest normal exponent `emin` and largest
// finite value `top` nearest `x`, ties to even; past `top` saturated (an infinity too, unless the format
// has infinities, `inf`: E5M2's are values of it, which a cast clamps before); NaN kept; a zero unsigned
// where the format has one zero, or -0 where it has no NaN. The scalings are by powers of two, exact.
fn kf8_round(x: f32, m: i32, emin: i32, top: f32, inf: bool, uz: bool, nan: bool) -> f32 {
    let b = bitcast<u32>(x);
    let ab = min(b & 0x7fffffffu, bitcast<u32>(top));
    let e = max(i32(ab >> 23u) - 127, emin);
    let step = kbits(u32(e - m + 127) << 23u);
    let inverse = kbits(u32(m - e + 127) << 23u);
    let r = round(kbits(ab) * inverse) * step;
    let sign = select(b & 0x80000000u, 0u, uz && r == 0.0);
    let kept = select(kbits(bitcast<u32>(r) | sign), x, kisnan(x) || (inf && (b & 0x7fffffffu) == 0x7f800000u));
    return select(kept, -0.0, kisnan(x) && !nan);
}

// The bits of `r`, a value of a format of `m` mantissa bits and exponent bias `bias` (`kf8_round`'s, or
// one loaded from such a buffer): sign, exponent, mantissa; below the smallest normal a multiple of the
// smallest step; ±inf as the all-ones exponent where the format has infinities (`inf`, E5M2); NaN as
// `nanc` (0x7f; 0x80 where `uz`).
fn kf8_bits(r: f32, m: u32, bias: i32, inf: bool, uz: bool, w: u32, nanc: u32) -> u32 {
    let b = bitcast<u32>(r);
    let ab = b & 0x7fffffffu;
    let e = i32(ab >> 23u) - 127;
    let emin = 1 - bias;
    let sub = u32(kbits(ab) * kbits(u32(i32(m) - emin + 127) << 23u));
    let normal = (u32(e + bias) << m) | ((ab >> (23u - m)) & ((1u << m) - 1u));
    let signbit = 1u << (w - 1u);
    let sign = select((b >> (32u - w)) & signbit, 0u, uz && ab == 0u);
    let v = sign | select(normal, sub, e < emin);
    let infinite = ((b >> (32u - w)) & signbit) | (((1u << (w - 1u - m)) - 1u) << m);
    let coded = select(v, infinite, inf && ab == 0x7f800000u);
    return select(coded, nanc, ab > 0x7f800000u);
}

// The value of small float bits `c` (`kf8_bits`' inverse): E4M3FN (`inf` false) has no infinities and
// one NaN code; E5M2 IEEE's specials in its top exponent; the FNUZ formats (`uz`) every code finite but
// 0x80, their NaN; E2M1 (`nan` false) every code finite.
fn kf8_value(c: u32, m: u32, bias: i32, inf: bool, uz: bool, w: u32, nan: bool) -> f32 {
    let signbit = 1u << (w - 1u);
    let f = c & ((1u << m) - 1u);
    let top = (1u << (w - 1u - m)) - 1u;
    let e = (c >> m) & top;
    let sub = f32(f) * kbits(u32(1 - bias - i32(m) + 127) << 23u);
    let normal = kbits((u32(i32(e) - bias + 127) << 23u) | (f << (23u - m)));
    var v = select(normal, sub, e == 0u);
    if (inf && e == top) {
        v = select(knan(), kinf(), f == 0u);
    }
    if (nan && !inf && !uz && (c & (signbit - 1u)) == signbit - 1u) {
        v = knan();
    }
    if (uz && c == signbit) {
        return knan();
    }
    return kbits(bitcast<u32>(v) | ((c & signbit) << (32u - w)));
}
