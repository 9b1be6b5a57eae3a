// resize: Resize / Upsample for output elements [params.start, params.start + params.count).
// Per dimension d, output coordinate c maps to an input coordinate x (COORD_MODE: 0 half_pixel,
// 1 asymmetric, 2 align_corners, 3 pytorch_half_pixel, 4 tf_crop_and_resize, 5
// tf_half_pixel_for_nn, 6 half_pixel_symmetric) and to taps (index clamped to the input, weight):
// MODE 0 nearest (NEAREST_MODE 0 round_prefer_floor, 1 round_prefer_ceil, 2 floor, 3 ceil,
// 4 ceil when downsampling else floor) copies the raw word (any dtype); MODE 1 linear and MODE 2
// cubic (coefficient cubic_a, EXCLUDE_OUTSIDE 1 renormalises) sum f32 products over the
// separable taps. tf_crop_and_resize writes `extrapolation` when x falls outside [0, in - 1].
// Divisions go through float_bits.wgsl's div_rn, so a tap never moves with the adapter's `/`.
// RANK and the modes are overrides, not params: lavapipe runs both sides of a branch on a
// uniform value, so every output paid for every coordinate mode and the cubic taps.
// Bindings: 0 src (read), 1 out (read_write), 2 params. Overrides: WG (workgroup size), RANK,
// MODE, COORD_MODE, NEAREST_MODE, EXCLUDE_OUTSIDE.

override WG: u32 = 64u;
override RANK: u32;
override MODE: u32;
override COORD_MODE: u32;
override NEAREST_MODE: u32;
override EXCLUDE_OUTSIDE: u32;

struct Params {
    in_dims: array<vec4<u32>, 2>,
    out_dims: array<vec4<u32>, 2>,
    in_stride: array<vec4<u32>, 2>,
    scale: array<vec4<f32>, 2>,
    roi_start: array<vec4<f32>, 2>,
    roi_end: array<vec4<f32>, 2>,
    start: u32,
    count: u32,
    cubic_a: f32,
    extrapolation: f32,
}

@group(0) @binding(0) var<storage, read> src: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@group(0) @binding(2) var<uniform> params: Params;

fn original_coord(d: u32, c: u32) -> f32 {
    let x = f32(c);
    let scale = params.scale[d / 4u][d % 4u];
    let in_len = f32(params.in_dims[d / 4u][d % 4u]);
    let out_len = scale * in_len;
    switch COORD_MODE {
        case 1u: {
            return div_rn(x, scale);
        }
        case 2u: {
            if (out_len == 1.0) {
                return 0.0;
            }
            return div_rn(x * (in_len - 1.0), out_len - 1.0);
        }
        case 3u: {
            if (out_len == 1.0) {
                return -0.5;
            }
            return div_rn(x + 0.5, scale) - 0.5;
        }
        case 4u: {
            let r0 = params.roi_start[d / 4u][d % 4u];
            let r1 = params.roi_end[d / 4u][d % 4u];
            if (out_len == 1.0) {
                return (r1 - r0) * (in_len - 1.0) / 2.0 + r0 * (in_len - 1.0);
            }
            return div_rn(x * (r1 - r0) * (in_len - 1.0), out_len - 1.0) + r0 * (in_len - 1.0);
        }
        case 5u: {
            return div_rn(x + 0.5, scale);
        }
        case 6u: {
            let adjustment = div_rn(f32(params.out_dims[d / 4u][d % 4u]), out_len);
            let offset = in_len / 2.0 * (1.0 - adjustment);
            return offset + div_rn(x + 0.5, scale) - 0.5;
        }
        default: {
            return div_rn(x + 0.5, scale) - 0.5;
        }
    }
}

fn nearest_index(x: f32, scale: f32) -> i32 {
    let f = floor(x);
    let r = x - f;
    if (r == 0.0) {
        return i32(f);
    }
    switch NEAREST_MODE {
        case 1u: {
            return select(i32(f), i32(f) + 1, r >= 0.5);
        }
        case 2u: {
            return i32(f);
        }
        case 3u: {
            return i32(f) + 1;
        }
        case 4u: {
            return select(i32(f), i32(f) + 1, scale < 1.0);
        }
        default: {
            return select(i32(f), i32(f) + 1, r > 0.5);
        }
    }
}

fn cubic_coeff(t: f32) -> f32 {
    let a = params.cubic_a;
    let x = abs(t);
    if (x <= 1.0) {
        return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
    }
    if (x < 2.0) {
        return ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a;
    }
    return 0.0;
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * WG;
    if (i >= params.count) {
        return;
    }
    let v = params.start + i;
    var tap_idx: array<u32, 32>;
    var tap_w: array<f32, 32>;
    var ntaps: array<u32, 8>;
    var rem = v;
    var base = 0u;
    for (var k = 0u; k < RANK; k = k + 1u) {
        let d = RANK - 1u - k;
        let n = params.out_dims[d / 4u][d % 4u];
        let c = rem % n;
        rem = rem / n;
        let len = i32(params.in_dims[d / 4u][d % 4u]);
        let stride = params.in_stride[d / 4u][d % 4u];
        let x = original_coord(d, c);
        if (COORD_MODE == 4u && (x < 0.0 || x > f32(len - 1))) {
            out[v] = bitcast<u32>(params.extrapolation);
            return;
        }
        if (MODE == 0u) {
            let j = clamp(nearest_index(x, params.scale[d / 4u][d % 4u]), 0, len - 1);
            base = base + u32(j) * stride;
            ntaps[d] = 0u;
            continue;
        }
        let f = floor(x);
        let r = x - f;
        var cnt = 0u;
        if (MODE == 1u) {
            let taps = array<f32, 2>(1.0 - r, r);
            for (var j = 0; j < 2; j = j + 1) {
                if (taps[j] != 0.0) {
                    tap_idx[d * 4u + cnt] = u32(clamp(i32(f) + j, 0, len - 1)) * stride;
                    tap_w[d * 4u + cnt] = taps[j];
                    cnt = cnt + 1u;
                }
            }
        } else {
            var sum = 0.0;
            for (var j = -1; j < 3; j = j + 1) {
                let p = i32(f) + j;
                var w = cubic_coeff(f32(j) - r);
                if (EXCLUDE_OUTSIDE != 0u && (p < 0 || p >= len)) {
                    w = 0.0;
                }
                sum = sum + w;
                if (w != 0.0) {
                    tap_idx[d * 4u + cnt] = u32(clamp(p, 0, len - 1)) * stride;
                    tap_w[d * 4u + cnt] = w;
                    cnt = cnt + 1u;
                }
            }
            if (EXCLUDE_OUTSIDE != 0u && sum != 0.0) {
                for (var j = 0u; j < cnt; j = j + 1u) {
                    tap_w[d * 4u + j] = tap_w[d * 4u + j] / sum;
                }
            }
        }
        ntaps[d] = cnt;
    }
    if (MODE == 0u) {
        out[v] = src[base];
        return;
    }
    var total = 1u;
    for (var d = 0u; d < RANK; d = d + 1u) {
        total = total * ntaps[d];
    }
    var acc = 0.0;
    for (var t = 0u; t < total; t = t + 1u) {
        var rest = t;
        var s = base;
        var w = 1.0;
        for (var d = 0u; d < RANK; d = d + 1u) {
            let j = rest % ntaps[d];
            rest = rest / ntaps[d];
            s = s + tap_idx[d * 4u + j];
            w = w * tap_w[d * 4u + j];
        }
        acc = acc + w * bitcast<f32>(src[s]);
    }
    out[v] = bitcast<u32>(acc);
}
