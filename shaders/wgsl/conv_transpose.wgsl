// conv_transpose: 2-D transposed convolution (1-D runs as H = L, W = 1) as a gather:
// out[n, oc, oh, ow] = bias[oc] + sum over c < cg, kh, kw with ih = (oh + pt - kh * dh) / sh and
// iw = (ow + pl - kw * dw) / sw exact and inside X of x[n, g * cg + c, ih, iw] *
// w[g * cg + c, oc % mg, kh, kw], g = oc / mg. One invocation per output element
// e = params.e_start + i, i < params.count (pads may be negative: output_shape larger than the
// natural size).
// Params, bindings 2-4 and WG: the prelude conv_transpose_common.wgsl.
// Bindings: 0 x, 1 w.

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> w: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * WG;
    if (i >= params.count) {
        return;
    }
    let e = params.e_start + i;
    let ow = e % params.ow;
    let oh = (e / params.ow) % params.oh;
    let plane = e / (params.ow * params.oh);
    let oc = plane % params.m;
    let n = plane / params.m;
    let g = oc / params.mg;
    let ocl = oc % params.mg;
    let sh = i32(params.sh);
    let sw = i32(params.sw);
    var acc = 0.0;
    for (var ki = 0u; ki < params.kh; ki = ki + 1u) {
        let th = i32(oh) + params.pt - i32(ki * params.dh);
        if (th < 0 || th % sh != 0 || th / sh >= i32(params.h)) {
            continue;
        }
        let ih = u32(th / sh);
        for (var kj = 0u; kj < params.kw; kj = kj + 1u) {
            let tw = i32(ow) + params.pl - i32(kj * params.dw);
            if (tw < 0 || tw % sw != 0 || tw / sw >= i32(params.w)) {
                continue;
            }
            let iw = u32(tw / sw);
            for (var c = 0u; c < params.cg; c = c + 1u) {
                let ci = g * params.cg + c;
                let xv = x[((n * params.c + ci) * params.h + ih) * params.w + iw];
                let wv = w[((ci * params.mg + ocl) * params.kh + ki) * params.kw + kj];
                acc = fma(xv, wv, acc);
            }
        }
    }
    if (params.has_bias != 0u) {
        acc = acc + bias[oc];
    }
    out[e] = acc;
}
