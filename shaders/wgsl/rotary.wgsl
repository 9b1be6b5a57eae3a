// rotary: the rotate-half rotary embedding of ops/src/rotary.rs, out = x * cos + rot * sin with
// rot[j] = -x[j + half] for j < d - half, x[j - (d - half)] after, along the last axis, for
// output elements i in [params.start, params.start + params.count). The output's leading axes
// broadcast each input's rows (merged dims and row offsets in elements, as where.wgsl's
// broadcast); along the last axis x advances when d > 1, cos and sin when their steps are 1.
// RANK: the number of merged leading dims (>= 1), an override so the index loop's bounds are
// known when the pipeline compiles.
// Bindings: 0 x (read), 1 cos (read), 2 sin (read), 3 out (read_write), 4 params. Overrides: WG,
// RANK.

override WG: u32 = 64u;
override RANK: u32;

struct Params {
    start: u32,
    count: u32,
    row: u32,
    d: u32,
    half: u32,
    cos_step: u32,
    sin_step: u32,
    _pad: u32,
    dims: array<vec4<u32>, 2>,
    x_strides: array<vec4<u32>, 2>,
    cos_strides: array<vec4<u32>, 2>,
    sin_strides: array<vec4<u32>, 2>,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> cos_in: array<f32>;
@group(0) @binding(2) var<storage, read> sin_in: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<uniform> params: Params;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * WG;
    if (i >= params.count) {
        return;
    }
    let e = params.start + i;
    let j = e % params.row;
    // Row offsets over the merged leading dims, innermost first; the outermost needs no
    // division: what is left of the row index is below its length.
    var rem = e / params.row;
    var ix = 0u;
    var ic = 0u;
    var os = 0u;
    for (var k = RANK - 1u; k > 0u; k = k - 1u) {
        let len = params.dims[k / 4u][k % 4u];
        let c = rem % len;
        rem = rem / len;
        ix = ix + c * params.x_strides[k / 4u][k % 4u];
        ic = ic + c * params.cos_strides[k / 4u][k % 4u];
        os = os + c * params.sin_strides[k / 4u][k % 4u];
    }
    ix = ix + rem * params.x_strides[0].x;
    ic = ic + rem * params.cos_strides[0].x;
    os = os + rem * params.sin_strides[0].x;
    let xj = select(0u, j, params.d > 1u);
    let tail = params.d - params.half;
    var rot: f32;
    if (xj < tail) {
        rot = -x[ix + xj + params.half];
    } else {
        rot = x[ix + xj - tail];
    }
    out[e] = x[ix + xj] * cos_in[ic + j * params.cos_step] + rot * sin_in[os + j * params.sin_step];
}
