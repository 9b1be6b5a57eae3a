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
