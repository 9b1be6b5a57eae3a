// where: out[i] = cond[ic] != 0 ? x[ix] : y[iy] with numpy broadcasting of all three (rank <= 8),
// for output elements i in [params.start, params.start + params.count). Elements are copied as
// 4-byte words, so every dtype works (f32, i32, bool as u32).
// RANK: the number of output dims after merging those every operand walks as one (>= 1),
// an override so the index loop's bounds are known when the pipeline compiles.
// Bindings: 0 cond (read), 1 x (read), 2 y (read), 3 out (read_write), 4 params. Overrides: WG,
// RANK.

override WG: u32 = 64u;
override RANK: u32;

struct Params {
    start: u32,
    count: u32,
    _pad0: u32,
    _pad1: u32,
    dims: array<vec4<u32>, 2>,
    c_strides: array<vec4<u32>, 2>,
    x_strides: array<vec4<u32>, 2>,
    y_strides: array<vec4<u32>, 2>,
}

@group(0) @binding(0) var<storage, read> cond: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<u32>;
@group(0) @binding(2) var<storage, read> y: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<u32>;
@group(0) @binding(4) var<uniform> params: Params;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * WG;
    if (i >= params.count) {
        return;
    }
    let j = params.start + i;
    // Coordinates over the (merged) output dims, innermost first; the outermost needs no
    // division: what is left of j is below its length.
    var rem = j;
    var ic = 0u;
    var ix = 0u;
    var iy = 0u;
    for (var k = RANK - 1u; k > 0u; k = k - 1u) {
        let len = params.dims[k / 4u][k % 4u];
        let c = rem % len;
        rem = rem / len;
        ic = ic + c * params.c_strides[k / 4u][k % 4u];
        ix = ix + c * params.x_strides[k / 4u][k % 4u];
        iy = iy + c * params.y_strides[k / 4u][k % 4u];
    }
    ic = ic + rem * params.c_strides[0].x;
    ix = ix + rem * params.x_strides[0].x;
    iy = iy + rem * params.y_strides[0].x;
    if (cond[ic] != 0u) {
        out[j] = x[ix];
    } else {
        out[j] = y[iy];
    }
}
