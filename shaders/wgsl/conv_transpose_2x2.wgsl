// conv_transpose_2x2: conv_transpose.wgsl's result for the upsampling kind, a 2x2 kernel of
// stride 2 without pads or dilation whose output is exactly twice X's size (U-Net's and DBNet's
// up-convs), on adapters that run shaders on the CPU (lavapipe, SwiftShader). There each input
// pixel alone feeds its own 2 x 2 output pixels: out[n, oc, 2 ih + ki, 2 iw + kj] = bias[oc] +
// sum_{c < cg} x[n, g * cg + c, ih, iw] w[g * cg + c, oc % mg, ki, kj], a GEMM over channels.
// An invocation takes 4 input pixels of a row (X's width is a multiple of 4: one vec4 of X a
// channel) and OCB (4 or 1) output channels of a group, all four taps (one vec4 of W a channel
// and output channel), where conv_transpose.wgsl made every output element load each X and W
// float alone (a per-lane loop on llvmpipe) and test each tap.
// Invocation i < params.threads takes pixel block i % (h w / 4) of channel block blk0 + i /
// (h w / 4); channel blocks are numbered over (n, group, block of OCB channels in the group).
// Writes only output elements e_start .. e_start + count (whole planes: the rows asked for).
// Params, bindings 2-4 and WG: the prelude conv_transpose_common.wgsl.
// Bindings: 0 x (vec4), 1 w (vec4). Overrides: WG, OCB (4 or 1).

override OCB: u32;

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> w: array<vec4<f32>>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * WG;
    if (i >= params.threads) {
        return;
    }
    let hw4 = params.h * params.w / 4u;
    let blk = params.blk0 + i / hw4;
    let mgb = (params.mg + OCB - 1u) / OCB;
    let groups = params.m / params.mg;
    let n = blk / (groups * mgb);
    let g = (blk / mgb) % groups;
    let ocl0 = (blk % mgb) * OCB;
    let live = min(OCB, params.mg - ocl0);
    let p = (i % hw4) * 4u;
    let ih = p / params.w;
    let iw = p % params.w;
    // W's vec4 (the four taps) of input channel ci and output channel ocl0 + q of the group
    // (channel ocl0's again past the group's end: read, never written)
    var wrow: array<u32, 4>;
    for (var q = 0u; q < 4u; q = q + 1u) {
        wrow[q] = select(ocl0, ocl0 + q, q < live);
    }
    let c0 = n * params.c + g * params.cg;
    // acc[4 q + t]: output channel ocl0 + q, tap t = 2 ki + kj, at the 4 input pixels
    var acc: array<vec4<f32>, 16>;
    for (var c = 0u; c < params.cg; c = c + 1u) {
        let xv = x[(c0 + c) * hw4 + p / 4u];
        let ci = g * params.cg + c;
        for (var q = 0u; q < OCB; q = q + 1u) {
            let wv = w[ci * params.mg + wrow[q]];
            acc[4u * q] = fma(vec4<f32>(wv.x), xv, acc[4u * q]);
            acc[4u * q + 1u] = fma(vec4<f32>(wv.y), xv, acc[4u * q + 1u]);
            acc[4u * q + 2u] = fma(vec4<f32>(wv.z), xv, acc[4u * q + 2u]);
            acc[4u * q + 3u] = fma(vec4<f32>(wv.w), xv, acc[4u * q + 3u]);
        }
    }
    for (var q = 0u; q < live; q = q + 1u) {
        let oc = g * params.mg + ocl0 + q;
        var b = 0.0;
        if (params.has_bias != 0u) {
            b = bias[oc];
        }
        let plane = (n * params.m + oc) * params.oh * params.ow;
        for (var t = 0u; t < 4u; t = t + 1u) {
            let row = plane + (2u * ih + t / 2u) * params.ow + 2u * iw + t % 2u;
            let v = acc[4u * q + t] + vec4<f32>(b);
            for (var j = 0u; j < 4u; j = j + 1u) {
                let e = row + 2u * j;
                if (e >= params.e_start && e - params.e_start < params.count) {
                    out[e] = v[j];
                }
            }
        }
    }
}
