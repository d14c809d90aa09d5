// f64 helpers: appended to the prelude of a kernel that calls them (only devices with `shader-f64`
// compile f64 at all). Transcendental functions never reach a shader: `graph::f64_math` writes them out.

fn kisnand(x: f64) -> bool {
    return kisnan(f32(x));
}

// The NaN is made from bits (as `knan`): an optimiser may fold an arithmetic one, such as a + (-a), to 0.
fn kmaxd(a: f64, b: f64) -> f64 {
    return select(max(a, b), f64(knan()), kisnand(a) || kisnand(b));
}

fn kmind(a: f64, b: f64) -> f64 {
    return select(min(a, b), f64(knan()), kisnand(a) || kisnand(b));
}

fn krelud(x: f64) -> f64 {
    return select(max(x, 0.0lf), x, kisnand(x));
}

// Saturating, as `kf2i` (NaN is 0).
fn kd2i(x: f64) -> i32 {
    return select(i32(clamp(x, -2147483648.0lf, 2147483647.0lf)), 0, kisnand(x));
}

// A negative value wraps, as an integer cast does (through i32); a non-negative one saturates.
fn kd2u(x: f64) -> u32 {
    return select(bitcast<u32>(kd2i(x)), u32(clamp(x, 0.0lf, 4294967295.0lf)), x >= 0.0lf);
}

// x as an f32 rounded to odd (toward zero, the last bit set when anything was dropped): a second
// rounding from it, to f16, bf16 or an 8-bit float, is then the correct rounding of x.
fn kd2f_odd(x: f64) -> f32 {
    let t = f32(x);
    let b = bitcast<u32>(t);
    let z = select(b, b - 1u, abs(f64(t)) > abs(x));
    return select(t, bitcast<f32>(z | 1u), f64(t) != x && !kisnand(x));
}
