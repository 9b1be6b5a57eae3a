// conv_pointwise_strided: conv.wgsl's result for 1x1 convs without pads of any stride, on
// adapters that run shaders on the CPU (lavapipe, SwiftShader), where a group's input channels
// are a multiple of 4 but the output pixels do not map onto whole vec4s of an input plane
// (a stride above 1, or a plane of 7 x 7): conv_pointwise.wgsl with X read one float a pixel,
// at input pixel (oy sh, ox sw), and W still as vec4s. Where conv_rows.wgsl would take these,
// each invocation loaded its W floats one at a time and checked every X column against the
// row's bounds. out[n, oc, p] = bias[oc] + sum_{c < cg} w[oc, c] x[n, g * cg + c, sh oy, sw ox].
// Same Params, block numbering (PX = 8, ROWS = 0), epilogue and dispatch as conv.wgsl.
// Params, bindings 2-5, block numbering and the epilogue: the prelude conv_common.wgsl.
// Bindings: 0 x, 1 w (vec4). Overrides: WG, PX (8), OCB (8, 4 or 1), HAS_BIAS, ACT, POST,
// RESIDUAL.

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> w: array<vec4<f32>>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let b = block_at(gid, nwg);
    if (!b.live) {
        return;
    }
    let hw = params.h * params.w;
    let cq = params.cg / 4u;
    // each pixel's offset in an input plane; the block's first pixel again past its end
    // (computed, never written)
    var at: array<u32, 8>;
    for (var j = 0u; j < 8u; j = j + 1u) {
        let p = b.p0 + select(0u, j, j < b.left);
        at[j] = (p / params.ow) * params.sh * params.w + (p % params.ow) * params.sw;
    }
    let x0 = (b.n * params.c + b.g * params.cg) * hw;
    let row = weight_rows(b, cq);
    // acc[2 q]: channel oc0 + q at pixels p0 .. p0 + 3, acc[2 q + 1] at p0 + 4 .. p0 + 7
    var acc: array<vec4<f32>, 16>;
    for (var c = 0u; c < cq; c = c + 1u) {
        var wv: array<vec4<f32>, 8>;
        for (var q = 0u; q < OCB; q = q + 1u) {
            wv[q] = w[row[q] + c];
        }
        for (var j = 0u; j < 4u; j = j + 1u) {
            let plane = x0 + (4u * c + j) * hw;
            let xa = vec4<f32>(x[plane + at[0]], x[plane + at[1]], x[plane + at[2]], x[plane + at[3]]);
            let xb = vec4<f32>(x[plane + at[4]], x[plane + at[5]], x[plane + at[6]], x[plane + at[7]]);
            for (var q = 0u; q < OCB; q = q + 1u) {
                let wj = vec4<f32>(wv[q][j]);
                acc[2u * q] = fma(wj, xa, acc[2u * q]);
                acc[2u * q + 1u] = fma(wj, xb, acc[2u * q + 1u]);
            }
        }
    }
    finish_block(b, acc);
}
