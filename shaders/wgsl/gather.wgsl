// gather: Gather (OP 0) and GatherElements (OP 1) for output elements
// [params.start, params.start + params.count), moving raw 4-byte words (any dtype).
// Gather: the output is viewed as [outer, nidx, inner]; out[(o, k, e)] =
//   data[(o * axis_dim + idx) * inner + e] with idx = indices[k] (+ axis_dim when negative).
// GatherElements: the output has the indices' shape `out_dims` (rank <= 8); out[c] =
//   data[sum c_d * data_stride_d] with c_axis replaced by indices[c] (+ axis_dim when negative).
// An index outside [0, axis_dim) writes 0 (the CPU kernel reports it as an error).
// OP is an override (lavapipe runs both sides of a branch on a uniform value).
// Bindings: 0 data (read), 1 indices (read, i32), 2 out (read_write), 3 params. Overrides: WG,
// OP.

override WG: u32 = 64u;
override OP: u32;

struct Params {
    out_dims: array<vec4<u32>, 2>,
    data_stride: array<vec4<u32>, 2>,
    _pad: u32,
    rank: u32,
    axis: u32,
    axis_dim: u32,
    nidx: u32,
    inner: u32,
    start: u32,
    count: u32,
}

@group(0) @binding(0) var<storage, read> data: array<u32>;
@group(0) @binding(1) var<storage, read> indices: array<i32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;
@group(0) @binding(3) var<uniform> params: Params;

fn fix_index(raw: i32) -> i32 {
    var idx = raw;
    if (idx < 0) {
        idx = idx + i32(params.axis_dim);
    }
    if (idx < 0 || idx >= i32(params.axis_dim)) {
        return -1;
    }
    return idx;
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * WG;
    if (i >= params.count) {
        return;
    }
    let v = params.start + i;
    if (OP == 0u) {
        let e = v % params.inner;
        let k = (v / params.inner) % params.nidx;
        let o = v / (params.inner * params.nidx);
        let idx = fix_index(indices[k]);
        if (idx < 0) {
            out[v] = 0u;
            return;
        }
        out[v] = data[(o * params.axis_dim + u32(idx)) * params.inner + e];
        return;
    }
    let idx = fix_index(indices[v]);
    if (idx < 0) {
        out[v] = 0u;
        return;
    }
    var rem = v;
    var s = 0u;
    for (var k = 0u; k < params.rank; k = k + 1u) {
        let d = params.rank - 1u - k;
        let n = params.out_dims[d / 4u][d % 4u];
        var c = rem % n;
        rem = rem / n;
        if (d == params.axis) {
            c = u32(idx);
        }
        s = s + c * params.data_stride[d / 4u][d % 4u];
    }
    out[v] = data[s];
}
