// norm_stats: the optional Mean and InvStdDev outputs of LayerNormalization. One invocation per
// row r in [params.first_row, params.first_row + params.rows): two-pass mean and variance of
// x[r * n ..][..n]; mean[r] = mean, inv_std[r] = 1 / sqrt(var + eps).
// Bindings: 0 x, 1 mean, 2 inv_std, 3 params. Overrides: WG.

override WG: u32 = 64u;

struct Params {
    n: u32,
    first_row: u32,
    rows: u32,
    eps: f32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> mean_out: array<f32>;
@group(0) @binding(2) var<storage, read_write> inv_std: array<f32>;
@group(0) @binding(3) var<uniform> params: Params;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * WG;
    if (i >= params.rows) {
        return;
    }
    let r = params.first_row + i;
    let n = params.n;
    let base = r * n;
    // Shifted by the first element so a large common offset does not swamp the sum.
    let k = x[base];
    var s = 0.0;
    for (var j = 0u; j < n; j = j + 1u) {
        s = s + (x[base + j] - k);
    }
    let mean = k + s / f32(n);
    var v = 0.0;
    for (var j = 0u; j < n; j = j + 1u) {
        let d = x[base + j] - mean;
        v = v + d * d;
    }
    mean_out[r] = mean;
    inv_std[r] = 1.0 / sqrt(v / f32(n) + params.eps);
}
