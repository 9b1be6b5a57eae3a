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

fn is_nan4(v: vec4<f32>) -> vec4<bool> {
    return (bitcast<vec4<u32>>(v) & vec4<u32>(0x7fffffffu)) > vec4<u32>(0x7f800000u);
}

// A NaN input passes through `r` unchanged. NVIDIA's compiler turns `select(v, 0, v < 0)` and
// the like into min/max instructions, which return the other operand for a NaN.
fn nan_through(r: f32, v: f32) -> f32 {
    return select(r, v, is_nan(v));
}

fn nan_through4(r: vec4<f32>, v: vec4<f32>) -> vec4<f32> {
    return select(r, v, is_nan4(v));
}

// |v| and -v on the sign bit: exact for NaN payloads too (NVIDIA's abs and negation return its
// canonical NaN 0x7fffffff, whatever the input's sign and payload).
fn abs_bits(v: f32) -> f32 {
    return bitcast<f32>(bitcast<u32>(v) & 0x7fffffffu);
}

fn neg_bits(v: f32) -> f32 {
    return bitcast<f32>(bitcast<u32>(v) ^ 0x80000000u);
}

// a / b rounded as IEEE division rounds it. WGSL lets `/` be 2.5 ulp off, and NVIDIA's is (3.5 /
// 3.5 gave 1.0000001, which moved a nearest Resize tap): one correction with the exact residual
// that fma gives. Infinite or NaN quotients are returned as they are.
fn div_rn(a: f32, b: f32) -> f32 {
    let q = a / b;
    if ((bitcast<u32>(q) & 0x7f800000u) == 0x7f800000u) {
        return q;
    }
    let r = fma(-q, b, a);
    return fma(r, 1.0 / b, q);
}

fn is_inf(v: f32) -> bool {
    return (bitcast<u32>(v) & 0x7fffffffu) == 0x7f800000u;
}

