// index_map: a generic strided gather, out[g(v)] = src[f(v)] for virtual elements v in
// [params.start, params.start + params.count) of a virtual shape `dims` (rank <= 8). With the
// row-major coordinates c_d of v: x_d = (offset_d + c_d * step_d) mod modulo_d (modulo 0: none),
// f(v) = in_base + sum x_d * in_stride_d, g(v) = out_base + sum c_d * out_stride_d.
// Serves Transpose, Slice, Expand, Tile (contiguous output), Concat (one dispatch per input) and
// Split (one dispatch per output). Elements are moved as raw 4-byte words (any dtype).
// Overrides: RANK, the rank of `dims` (>= 1), and MODULO, bit d set when dim d has a modulo, so
// the index loop compiles without the dims it does not have and without the modulo where there
// is none (lavapipe runs both sides of a branch on a uniform value; integer division is its
// costliest step).
// Bindings: 0 src (read), 1 out (read_write), 2 params. Overrides: WG (workgroup size), RANK,
// MODULO.

override WG: u32 = 64u;
override RANK: u32;
override MODULO: u32;

struct Params {
    dims: array<vec4<u32>, 2>,
    in_stride: array<vec4<u32>, 2>,
    out_stride: array<vec4<u32>, 2>,
    offset: array<vec4<i32>, 2>,
    step: array<vec4<i32>, 2>,
    modulo: array<vec4<u32>, 2>,
    start: u32,
    count: u32,
    in_base: u32,
    out_base: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
    _pad3: u32,
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
    // Innermost dim first; the outermost (d = 0) needs no division: what is left of the index
    // is below its length.
    for (var d = RANK - 1u; d > 0u; d = d - 1u) {
        let n = params.dims[d / 4u][d % 4u];
        let c = rem % n;
        rem = rem / n;
        s = s + in_offset(d, c);
        o = o + c * params.out_stride[d / 4u][d % 4u];
    }
    s = s + in_offset(0u, rem);
    o = o + rem * params.out_stride[0].x;
    out[o] = src[s];
}

// The input offset of coordinate c of dim d.
fn in_offset(d: u32, c: u32) -> u32 {
    var x = params.offset[d / 4u][d % 4u] + i32(c) * params.step[d / 4u][d % 4u];
    if (((MODULO >> d) & 1u) != 0u) {
        let m = i32(params.modulo[d / 4u][d % 4u]);
        x = x % m;
        if (x < 0) {
            x = x + m;
        }
    }
    return u32(x) * params.in_stride[d / 4u][d % 4u];
}
