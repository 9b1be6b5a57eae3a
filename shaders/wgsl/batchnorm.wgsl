// batchnorm: BatchNormalization in inference mode over a [N, channels, plane] tensor. One
// invocation per element e in [params.start, params.start + params.count), c = (e / plane) %
// channels: y = (x - mean[c]) / sqrt(var[c] + eps) * scale[c] + b[c], then max(y, 0) with a
// NaN kept where params.relu is 1 (a Relu the graph pass took in).
// Bindings: 0 x, 1 scale, 2 b, 3 mean, 4 var, 5 y, 6 params. Overrides: WG.

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
    relu: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> scale: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read> mean: array<f32>;
@group(0) @binding(4) var<storage, read> variance: array<f32>;
@group(0) @binding(5) var<storage, read_write> y: array<f32>;
@group(0) @binding(6) var<uniform> params: Params;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * WG;
    if (i >= params.count) {
        return;
    }
    let e = params.start + i;
    let c = (e / params.plane) % params.channels;
    let a = scale[c] / sqrt(variance[c] + params.eps);
    let v = (x[e] - mean[c]) * a + b[c];
    if (params.relu != 0u) {
        y[e] = nan_through(select(v, 0.0, v < 0.0), v);
    } else {
        y[e] = v;
    }
}
