// Prelude (shaders/src/lib.rs prepends it): NaN/Inf constants and tests on the bits, shared
// by the shaders that must keep IEEE special values.

// NaN and +Inf built at run time: Chrome's WGSL compiler (Tint) rejects a const-expression
// whose value is not finite, so the bits go through a `let` first.
fn nan_f32() -> f32 {
    let bits = 0x7fc00000u;
    return bitcast<f32>(bits);
}

fn inf_f32() -> f32 {
    let bits = 0x7f800000u;
    return bitcast<f32>(bits);
}

// NaN on the bits: lavapipe's LLVM folds `v != v` to false (see README.md, "Numerics").
fn is_nan(v: f32) -> bool {
    return (bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u;
}

fn is_inf(v: f32) -> bool {
    return (bitcast<u32>(v) & 0x7fffffffu) == 0x7f800000u;
}

