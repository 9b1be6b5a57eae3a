// lrn: local response normalisation across channels of a [N, channels, plane] tensor. One
// invocation per element e in [params.start, params.start + params.count) at (n, c, s):
// sq = sum of x[n, cc, s]^2 for cc in [c - before, c + after] within [0, channels);
// y = x / (bias + alpha_over_size * sq)^beta, the power with C99 special cases (as std::pow).
// Bindings: 0 x, 1 y, 2 params. Overrides: WG.

override WG: u32 = 64u;

struct Params {
    start: u32,
    count: u32,
    channels: u32,
    plane: u32,
    eps: f32,
    alpha_over_size: f32,
    beta: f32,
    bias: f32,
    before: u32,
    after: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@group(0) @binding(2) var<uniform> params: Params;

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

fn is_nan(v: f32) -> bool {
    return (bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u;
}

fn is_inf(v: f32) -> bool {
    return (bitcast<u32>(v) & 0x7fffffffu) == 0x7f800000u;
}

// pow with C99 / IEEE 754 special cases (what onnxruntime's std::pow gives): NaN, infinities
// and signed zeros are decided here on the bits, never left to exp2/log2 (lavapipe's exp2 of
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

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * WG;
    if (i >= params.count) {
        return;
    }
    let e = params.start + i;
    let plane = params.plane;
    let s = e % plane;
    let c = (e / plane) % params.channels;
    let n = e / (plane * params.channels);
    let lo = select(0u, c - params.before, c >= params.before);
    let hi = min(c + params.after + 1u, params.channels);
    var sq = 0.0;
    for (var cc = lo; cc < hi; cc = cc + 1u) {
        let v = x[(n * params.channels + cc) * plane + s];
        sq = sq + v * v;
    }
    // pow_f, not pow: a NaN or negative base must give NaN as on the CPU (lavapipe's pow of NaN
    // is 0, which turned x / NaN into inf).
    y[e] = x[e] / pow_f(params.bias + params.alpha_over_size * sq, params.beta);
}
