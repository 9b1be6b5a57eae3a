// conv_pointwise: conv.wgsl's result for 1x1 convs without pads, on adapters that run shaders on
// the CPU (lavapipe, SwiftShader), when a group's input channels are a multiple of 4: w is read
// as vec4s, four input channels of a weight row a load, where conv.wgsl loads one float (a
// per-lane gather there) for each. out[n, oc, p] = bias[oc] + sum_{c < cg} w[oc, c] x[n, g * cg
// + c, sh oy, sw ox]. Same Params, block numbering, epilogue and dispatch as conv.wgsl with
// PX = 8. Params, bindings 2-5, block numbering and the epilogue: the prelude conv_common.wgsl.
// This file follows one of the two declaring X (binding 0), `XAt` and `x_pixels`:
// conv_pointwise_x_vec4.wgsl (stride 1 on planes of whole vec4s: `conv_pointwise`) and
// conv_pointwise_x_pixels.wgsl (any stride, any plane: `conv_pointwise_strided`).
// Bindings: 0 x, 1 w (vec4). Overrides: WG, PX (8), OCB (8, 4 or 1), HAS_BIAS, ACT, POST,
// RESIDUAL.

@group(0) @binding(1) var<storage, read> w: array<vec4<f32>>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let b = block_at(gid, nwg);
    if (!b.live) {
        return;
    }
    let cq = params.cg / 4u;
    let at = x_at(b);
    let row = weight_rows(b, cq);
    // acc[2 q]: channel oc0 + q at pixels p0 .. p0 + 3, acc[2 q + 1] at p0 + 4 .. p0 + 7
    var acc: array<vec4<f32>, 16>;
    for (var c = 0u; c < cq; c = c + 1u) {
        var wv: array<vec4<f32>, 8>;
        for (var q = 0u; q < OCB; q = q + 1u) {
            wv[q] = w[row[q] + c];
        }
        for (var j = 0u; j < 4u; j = j + 1u) {
            let xs = x_pixels(at, 4u * c + j);
            for (var q = 0u; q < OCB; q = q + 1u) {
                let wj = vec4<f32>(wv[q][j]);
                acc[2u * q] = fma(wj, xs[0], acc[2u * q]);
                acc[2u * q + 1u] = fma(wj, xs[1], acc[2u * q + 1u]);
            }
        }
    }
    finish_block(b, acc);
}
