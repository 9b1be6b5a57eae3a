// Prelude (after float_bits.wgsl, shaders/src/lib.rs prepends both): pow with C99 / IEEE 754
// special cases (what onnxruntime's std::pow gives): NaN, infinities and signed zeros are decided here on the bits, never left to exp2/log2 (lavapipe's exp2 of
// NaN is 0).
fn pow_f(x: f32, y: f32) -> f32 {
    if (y == 0.0 || x == 1.0) {
        return 1.0; // even for a NaN x or y
    }
    if (is_nan(x) || is_nan(y)) {
        return nan_f32();
    }
    let odd = abs(y) < 16777216.0 && floor(y) == y && abs(y) % 2.0 == 1.0;
    if (is_inf(y)) {
        let ax = abs(x);
        if (ax == 1.0) {
            return 1.0;
        }
        return select(0.0, inf_f32(), (ax > 1.0) == (y > 0.0));
    }
    if (x == 0.0 || is_inf(x)) {
        // |x|^y is 0 or inf; the sign of x survives odd integer powers.
        let big = (x == 0.0) == (y < 0.0);
        let m = select(0.0, inf_f32(), big);
        return select(m, -m, odd && (bitcast<u32>(x) >> 31u) == 1u);
    }
    if (y == 1.0) {
        return x;
    }
    if (y == 2.0) {
        return x * x;
    }
    let m = exp2(y * log2(abs(x)));
    if (x < 0.0) {
        if (floor(y) != y) {
            return nan_f32(); // NaN
        }
        return select(m, -m, odd);
    }
    return m;
}

