// index_map: a generic strided gather, out[g(v)] = src[f(v)] for virtual elements v in
// [params.start, params.start + params.count) of a virtual shape `dims` (rank <= 8). With the
// row-major coordinates c_d of v: x_d = (offset_d + c_d * step_d) mod modulo_d (modulo 0: none),
// f(v) = in_base + sum x_d * in_stride_d, g(v) = out_base + sum c_d * out_stride_d.
// Serves Transpose, Slice, Expand, Tile (contiguous output), Concat (one dispatch per input) and
// Split (one dispatch per output). Elements are moved as raw 4-byte words (any dtype).
// Bindings: 0 src (read), 1 out (read_write), 2 params. Overrides: WG (workgroup size).

override WG: u32 = 64u;

struct Params {
    dims: array<vec4<u32>, 2>,
    in_stride: array<vec4<u32>, 2>,
    out_stride: array<vec4<u32>, 2>,
    offset: array<vec4<i32>, 2>,
    step: array<vec4<i32>, 2>,
    modulo: array<vec4<u32>, 2>,
    rank: u32,
    start: u32,
    count: u32,
    in_base: u32,
    out_base: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<storage, read> src: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@group(0) @binding(2) var<uniform> params: Params;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * WG;
    if (i >= params.count) {
        return;
    }
    var rem = params.start + i;
    var s = params.in_base;
    var o = params.out_base;
    for (var k = 0u; k < params.rank; k = k + 1u) {
        let d = params.rank - 1u - k;
        let n = params.dims[d / 4u][d % 4u];
        let c = rem % n;
        rem = rem / n;
        var x = params.offset[d / 4u][d % 4u] + i32(c) * params.step[d / 4u][d % 4u];
        let m = params.modulo[d / 4u][d % 4u];
        if (m != 0u) {
            x = x % i32(m);
            if (x < 0) {
                x = x + i32(m);
            }
        }
        s = s + u32(x) * params.in_stride[d / 4u][d % 4u];
        o = o + c * params.out_stride[d / 4u][d % 4u];
    }
    out[o] = src[s];
}
