// norm: row normalisation for LayerNormalization, RMSNormalization and InstanceNormalization.
// One invocation per row r in [params.first_row, params.first_row + params.rows): over
// x[r * n ..][..n], a two-pass (shifted) mean and variance (RMSNormalization, RMS = 1: mean 0 and
// the mean of x^2 as the variance), then y = (x - mean) / sqrt(var + eps) * scale[si] + (HAS_BIAS ? b[bi] : 0)
// with si = (r % channels) * s_row + j * s_el and bi = (r % channels) * b_row + j * b_el
// (LayerNorm: channels 1, s_el 1 or 0; InstanceNorm: s_row 1, s_el 0).
// RMS and HAS_BIAS are overrides (lavapipe runs both sides of a branch on a uniform value).
// Bindings: 0 x, 1 scale, 2 b (scale again when absent), 3 y, 4 params. Overrides: WG, RMS,
// HAS_BIAS.

override WG: u32 = 64u;
override RMS: u32;
override HAS_BIAS: u32;

struct Params {
    n: u32,
    first_row: u32,
    rows: u32,
    channels: u32,
    s_row: u32,
    s_el: u32,
    b_row: u32,
    b_el: u32,
    eps: f32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> scale: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<uniform> params: Params;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * WG;
    if (i >= params.rows) {
        return;
    }
    let r = params.first_row + i;
    let n = params.n;
    let base = r * n;
    // Sums in four lanes (elements j, j + 1, j + 2, j + 3 of each step) then a tail: lavapipe
    // ran the one-element loops at ~0.7 ms a row of 128.
    let n4 = n / 4u * 4u;
    // Shifted by the first element so a large common offset does not swamp the sum.
    var mean = 0.0;
    if (RMS == 0u) {
        let k = x[base];
        var s4 = vec4<f32>(0.0);
        for (var j = 0u; j < n4; j = j + 4u) {
            s4 = s4 + (vec4<f32>(x[base + j], x[base + j + 1u], x[base + j + 2u], x[base + j + 3u]) - k);
        }
        var s = (s4.x + s4.y) + (s4.z + s4.w);
        for (var j = n4; j < n; j = j + 1u) {
            s = s + (x[base + j] - k);
        }
        mean = k + s / f32(n);
    }
    var v4 = vec4<f32>(0.0);
    for (var j = 0u; j < n4; j = j + 4u) {
        let d = vec4<f32>(x[base + j], x[base + j + 1u], x[base + j + 2u], x[base + j + 3u]) - mean;
        v4 = fma(d, d, v4);
    }
    var v = (v4.x + v4.y) + (v4.z + v4.w);
    for (var j = n4; j < n; j = j + 1u) {
        let d = x[base + j] - mean;
        v = v + d * d;
    }
    let inv = 1.0 / sqrt(v / f32(n) + params.eps);
    let c = r % params.channels;
    for (var j = 0u; j < n; j = j + 1u) {
        var out = (x[base + j] - mean) * inv * scale[c * params.s_row + j * params.s_el];
        if (HAS_BIAS != 0u) {
            out = out + b[c * params.b_row + j * params.b_el];
        }
        y[base + j] = out;
    }
}
