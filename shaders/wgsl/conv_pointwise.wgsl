// conv_pointwise: conv.wgsl's result for 1x1 convs of stride 1 without pads, on adapters that
// run shaders on the CPU (lavapipe, SwiftShader), when a plane's pixels and a group's input
// channels are multiples of 4: x and w are read as vec4s, four pixels of an input plane and
// four input channels of a weight row a load, where conv.wgsl loads one float (a per-lane
// gather there) for each. out[n, oc, p] = bias[oc] + sum_{c < cg} w[oc, c] x[n, g * cg + c, p].
// Same Params, block numbering, epilogue and dispatch as conv.wgsl with PX = 8.
// Params, bindings 2-5, block numbering and the epilogue: the prelude conv_common.wgsl.
// Bindings: 0 x (vec4), 1 w (vec4). Overrides: WG, PX (8), OCB (8, 4 or 1), HAS_BIAS, ACT,
// POST, RESIDUAL.

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> w: array<vec4<f32>>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let b = block_at(gid, nwg);
    if (!b.live) {
        return;
    }
    let npix = params.oh * params.ow;
    let pq = npix / 4u;
    let cq = params.cg / 4u;
    // vec4 indices: pixels p0 .. p0 + 3 and p0 + 4 .. p0 + 7 (the first again past the plane:
    // computed, never written) of the group's first input plane
    let xa0 = ((b.n * params.c + b.g * params.cg) * npix + b.p0) / 4u;
    let xb0 = select(xa0, xa0 + 1u, b.p0 + 4u < npix);
    let row = weight_rows(b, cq);
    // acc[2 q]: channel oc0 + q at pixels p0 .. p0 + 3, acc[2 q + 1] at p0 + 4 .. p0 + 7
    var acc: array<vec4<f32>, 16>;
    for (var c = 0u; c < cq; c = c + 1u) {
        var wv: array<vec4<f32>, 8>;
        for (var q = 0u; q < OCB; q = q + 1u) {
            wv[q] = w[row[q] + c];
        }
        for (var j = 0u; j < 4u; j = j + 1u) {
            let plane = (4u * c + j) * pq;
            let xa = x[xa0 + plane];
            let xb = x[xb0 + plane];
            for (var q = 0u; q < OCB; q = q + 1u) {
                let wj = vec4<f32>(wv[q][j]);
                acc[2u * q] = fma(wj, xa, acc[2u * q]);
                acc[2u * q + 1u] = fma(wj, xb, acc[2u * q + 1u]);
            }
        }
    }
    finish_block(b, acc);
}
