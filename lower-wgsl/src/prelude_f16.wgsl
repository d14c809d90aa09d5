// f16 `maximum`/`minimum` with NaN kept (torch's rule; WGSL's max and min may return either operand):
// in kernels that compute in f16 and call them. NaN is read from the widened value's bits (`kisnan`),
// which no compiler folds (naga has no bitcast of f16).

fn kisnanh(x: f16) -> bool {
    return kisnan(f32(x));
}

fn kmaxh(a: f16, b: f16) -> f16 {
    return select(max(a, b), select(b, a, kisnanh(a)), kisnanh(a) || kisnanh(b));
}

fn kminh(a: f16, b: f16) -> f16 {
    return select(min(a, b), select(b, a, kisnanh(a)), kisnanh(a) || kisnanh(b));
}
