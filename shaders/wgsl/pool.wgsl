// pool: MaxPool / AveragePool over up to 3 spatial dims (padded to 3 in front). One invocation
// per output element e in [params.start, params.start + params.count), e flat over
// [N*C, O0, O1, O2]. Window element k along dim a reads input index o*stride - pad_begin +
// k*dilation; only the taps inside the input are visited (their range is computed). MODE:
// 0 max, 1 average over the input elements in the window, 2 average over the window
// positions inside the input or its padding (count_include_pad; a ceil-mode overhang past
// the end padding does not count). DILATED: 0 when every dilation is 1 (the tap range then
// needs no division).
// MODE and DILATED are overrides, not params: lavapipe runs both sides of a branch on a
// uniform value.
// Bindings: 0 x (f32, read), 1 y (f32, read_write), 2 params. Overrides: WG, MODE, DILATED.

override WG: u32 = 64u;
override MODE: u32;
override DILATED: u32;

struct Params {
    in_dims: vec4<u32>,   // xyz: D0 D1 D2, w: N*C
    out_dims: vec4<u32>,  // xyz: O0 O1 O2
    kernel: vec4<u32>,
    strides: vec4<u32>,
    dilations: vec4<u32>,
    pads: vec4<u32>,      // xyz: begin pads
    pads_end: vec4<u32>,  // xyz: end pads
    start: u32,
    count: u32,
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
    let od = params.out_dims;
    let id = vec3<i32>(params.in_dims.xyz);
    let o2 = e % od.z;
    let o1 = (e / od.z) % od.y;
    let o0 = (e / (od.z * od.y)) % od.x;
    let nc = e / (od.z * od.y * od.x);
    let plane = nc * params.in_dims.x * params.in_dims.y * params.in_dims.z;
    let s = vec3<i32>(vec3<u32>(o0, o1, o2) * params.strides.xyz) - vec3<i32>(params.pads.xyz);
    let k = vec3<i32>(params.kernel.xyz);
    let dil = vec3<i32>(params.dilations.xyz);

    // The taps of each dim are computed, not searched: a kernel may be 2^30 wide.
    let lo = first_tap(s, dil);
    let hi = end_tap(s, dil, k, id);

    // -FLT_MAX exactly (Chrome rejects a literal past it, as -3.4028235e38 is)
    var best = -3.4028234663852886e38;
    var found = false;
    var sum = 0.0;
    var count = 0u;
    for (var k0 = lo.x; k0 < hi.x; k0 = k0 + 1) {
        let i0 = s.x + k0 * dil.x;
        for (var k1 = lo.y; k1 < hi.y; k1 = k1 + 1) {
            let i1 = s.y + k1 * dil.y;
            let row = plane + u32((i0 * id.y + i1) * id.z);
            for (var k2 = lo.z; k2 < hi.z; k2 = k2 + 1) {
                let v = x[row + u32(s.z + k2 * dil.z)];
                if (MODE == 0u) {
                    if (!found || ((v > best || is_nan(v)) && !is_nan(best))) { // NaN propagates
                        best = v;
                        found = true;
                    }
                } else {
                    sum = sum + v;
                    count = count + 1u;
                }
            }
        }
    }
    if (MODE == 0u) {
        y[e] = best;
    } else if (MODE == 1u) {
        y[e] = sum / f32(count);
    } else {
        // Window positions before the end of the end padding, per dim.
        let inside = vec3<u32>(end_tap(s, dil, k, id + vec3<i32>(params.pads_end.xyz)));
        y[e] = sum / f32(inside.x * inside.y * inside.z);
    }
}

// The first tap k with s + k * d >= 0, per dim.
fn first_tap(s: vec3<i32>, d: vec3<i32>) -> vec3<i32> {
    if (DILATED == 0u) {
        return max(-s, vec3<i32>(0));
    }
    return select((-s + d - 1) / d, vec3<i32>(0), s >= vec3<i32>(0));
}

// One past the last tap k < kernel with s + k * d < end, per dim (at most the first tap when
// none; the host keeps end - s + d - 1 within i32 and passes d = 1 for a kernel of 1).
fn end_tap(s: vec3<i32>, d: vec3<i32>, kernel: vec3<i32>, end: vec3<i32>) -> vec3<i32> {
    if (DILATED == 0u) {
        return select(min(kernel, end - s), vec3<i32>(0), end <= s);
    }
    return select(min(kernel, (end - s + d - 1) / d), vec3<i32>(0), end <= s);
}
