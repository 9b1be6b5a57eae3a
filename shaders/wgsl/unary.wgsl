// unary: out[i] = f(x[i]) for i in [params.start, params.start + params.count), where f is
// chosen by the override OP (the UnaryKind codes of ops/src/unary.rs: Relu, Sigmoid, Erf, Gelu,
// Clip...). MODE: 0 = f32 elements, 1 = i32 elements (Relu/Neg/Abs/Sign/Clip; i8 wraps when
// params.flags bit 2 is set), 2 = bool (Not). Clip with run-time bounds uses binary.wgsl.
// IsNaN/IsInf read f32 and write bool (u32 0/1). Elements are bound as u32 and bitcast.
// OP and MODE are overrides, not params, so each op compiles to its own pipeline: lavapipe ran
// every case of a run-time switch (Relu ~2x slower than with the op known).
// Bindings: 0 x (read), 1 out (read_write), 2 params. Overrides: WG (workgroup size), OP, MODE.

override WG: u32 = 64u;
override OP: u32;
override MODE: u32;

struct Params {
    start: u32,
    count: u32,
    alpha: f32,
    beta: f32,
    gamma: f32,
    flags: u32, // bit 0: IsInf detects -inf, bit 1: detects +inf, bit 2: wrap ints to i8
    imin: i32,
    imax: i32,
}

@group(0) @binding(0) var<storage, read> x: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@group(0) @binding(2) var<uniform> params: Params;

const FRAC_1_SQRT_2: f32 = 0.70710678;
const SQRT_2_OVER_PI: f32 = 0.7978846;

// clamp(v, lo, hi) that keeps NaN (WGSL leaves clamp/min/max of NaN to the implementation;
// NaN tests use float_bits.wgsl's is_nan).
fn clamp_nan(v: f32, lo: f32, hi: f32) -> f32 {
    return nan_through(clamp(v, lo, hi), v);
}

// Rational approximation of erf (same coefficients as erf_f32 in ops/src/unary.rs).
fn erf_approx(v: f32) -> f32 {
    let x = clamp_nan(v, -4.0, 4.0);
    let x2 = x * x;
    var p = -2.7261423e-10;
    p = p * x2 + 2.7706814e-8;
    p = p * x2 - 2.101024e-6;
    p = p * x2 - 5.6925064e-5;
    p = p * x2 - 7.3499063e-4;
    p = p * x2 - 2.9546002e-3;
    p = p * x2 - 1.6096033e-2;
    var q = -1.4566072e-5;
    q = q * x2 - 2.1337406e-4;
    q = q * x2 - 1.682827e-3;
    q = q * x2 - 7.3733293e-3;
    q = q * x2 - 1.426474e-2;
    return select(x * p / q, sign(x), abs(x) > 3.9 && !is_nan(x));
}

// tanh without overflow in exp-based implementations.
fn tanh_safe(v: f32) -> f32 {
    return tanh(clamp_nan(v, -15.0, 15.0));
}

fn float_op(v: f32) -> f32 {
    let a = params.alpha;
    let b = params.beta;
    switch OP {
        case 0u: { return nan_through(select(v, 0.0, v < 0.0), v); }      // Relu
        case 1u: { return select(v, a * v, v < 0.0); }                    // LeakyRelu
        case 2u: { return 1.0 / (1.0 + exp(-v)); }                        // Sigmoid
        case 3u: { return tanh_safe(v); }                                 // Tanh
        case 4u: { return erf_approx(v); }                                // Erf
        case 5u: { return 0.5 * v * (1.0 + erf_approx(v * FRAC_1_SQRT_2)); } // Gelu
        case 6u: {                                                        // Gelu (tanh)
            return 0.5 * v * (1.0 + tanh_safe(SQRT_2_OVER_PI * (v + 0.044715 * v * v * v)));
        }
        case 7u: { return clamp_nan(a * v + b, 0.0, 1.0); }               // HardSigmoid
        case 8u: { return v * clamp_nan(v / 6.0 + 0.5, 0.0, 1.0); }       // HardSwish
        case 9u: {                                                        // Clip (NaN stays)
            let y = select(v, a, v < a);
            return nan_through(select(y, b, y > b), v);
        }
        case 10u: { return sqrt(v); }
        case 11u: { return exp(v); }
        case 12u: { return log(v); }
        case 13u: { return neg_bits(v); }
        case 14u: { return 1.0 / v; }
        case 15u: { return floor(v); }
        case 16u: { return ceil(v); }
        case 17u: { return round(v); }                                    // ties to even
        case 18u: { return abs_bits(v); }
        case 19u: { return nan_through(sign(v), v); }
        case 20u: { return sin(v); }
        case 21u: { return cos(v); }
        case 22u: { return max(v, 0.0) + log(1.0 + exp(-abs(v))); }      // Softplus
        case 23u: { return v / (1.0 + abs(v)); }                          // Softsign
        case 24u: { return select(v, a * (exp(v) - 1.0), v < 0.0); }     // Elu
        case 25u: {                                                       // Selu
            return select(params.gamma * v, params.gamma * (a * exp(v) - a), v <= 0.0);
        }
        default: { return v; }
    }
}

fn int_op(v: i32) -> i32 {
    switch OP {
        case 0u: { return max(v, 0); }
        case 9u: { return min(max(v, params.imin), params.imax); }
        case 13u: { return -v; }
        case 18u: { return abs(v); }
        case 19u: { return sign(v); }
        default: { return v; }
    }
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * WG;
    if (i >= params.count) {
        return;
    }
    let j = params.start + i;
    let bits = x[j];
    if (MODE == 2u) {
        out[j] = select(1u, 0u, bits != 0u); // Not
        return;
    }
    if (MODE == 1u) {
        var r = int_op(bitcast<i32>(bits));
        if ((params.flags & 4u) != 0u) {
            r = (r << 24u) >> 24u;
        }
        out[j] = bitcast<u32>(r);
        return;
    }
    let mag = bits & 0x7fffffffu;
    if (OP == 27u) { // IsNaN
        out[j] = select(0u, 1u, mag > 0x7f800000u);
        return;
    }
    if (OP == 28u) { // IsInf
        let negative = (bits >> 31u) == 1u;
        let wanted = select((params.flags & 2u) != 0u, (params.flags & 1u) != 0u, negative);
        out[j] = select(0u, 1u, mag == 0x7f800000u && wanted);
        return;
    }
    out[j] = bitcast<u32>(float_op(bitcast<f32>(bits)));
}
