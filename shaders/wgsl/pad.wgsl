// pad: Pad for output elements [params.start, params.start + params.count), moving raw 4-byte
// words (any dtype). Output coordinate c_d reads input coordinate x_d = c_d - pad_begin_d; when
// x_d falls outside [0, in_dims_d): MODE 0 constant writes params.value (the fill value's GPU
// word), 1 reflect mirrors without repeating the edge, 2 edge clamps, 3 wrap is periodic.
// RANK and MODE are overrides, not params (lavapipe runs both sides of a branch on a uniform
// value).
// Bindings: 0 src (read), 1 out (read_write), 2 params. Overrides: WG (workgroup size), RANK,
// MODE.

override WG: u32 = 64u;
override RANK: u32;
override MODE: u32;

struct Params {
    out_dims: array<vec4<u32>, 2>,
    in_dims: array<vec4<u32>, 2>,
    in_stride: array<vec4<u32>, 2>,
    pad_begin: array<vec4<i32>, 2>,
    value: u32,
    start: u32,
    count: u32,
    _pad0: u32,
}

@group(0) @binding(0) var<storage, read> src: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@group(0) @binding(2) var<uniform> params: Params;

fn modulo(a: i32, n: i32) -> i32 {
    let r = a % n;
    return select(r, r + n, r < 0);
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * WG;
    if (i >= params.count) {
        return;
    }
    let v = params.start + i;
    var rem = v;
    var s = 0u;
    for (var k = 0u; k < RANK; k = k + 1u) {
        let d = RANK - 1u - k;
        let n = params.out_dims[d / 4u][d % 4u];
        let c = rem % n;
        rem = rem / n;
        let len = i32(params.in_dims[d / 4u][d % 4u]);
        var x = i32(c) - params.pad_begin[d / 4u][d % 4u];
        if (x < 0 || x >= len) {
            if (MODE == 0u) {
                out[v] = params.value;
                return;
            } else if (MODE == 1u) {
                if (len == 1) {
                    x = 0;
                } else {
                    let period = 2 * (len - 1);
                    x = modulo(x, period);
                    if (x >= len) {
                        x = period - x;
                    }
                }
            } else if (MODE == 2u) {
                x = clamp(x, 0, len - 1);
            } else {
                x = modulo(x, len);
            }
        }
        s = s + u32(x) * params.in_stride[d / 4u][d % 4u];
    }
    out[v] = src[s];
}
