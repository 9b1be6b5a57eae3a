// conv: direct 2-D convolution (1-D runs as H = L, W = 1) with groups, strides, dilations and
// begin pads: out[n, oc, oh, ow] = bias[oc] + sum_{c < cg, kh, kw} x[n, g * cg + c, ih, iw] *
// w[oc, c, kh, kw], ih = oh * sh + kh * dh - pt, iw = ow * sw + kw * dw - pl (zero outside),
// g = oc / mg. Only output elements e with params.e_start <= e < params.e_end are written.
// Each invocation computes 4 consecutive pixels of one (n, oc) plane, so a weight is loaded once
// for 4 outputs; planes are numbered from params.plane0, blocks of 4 pixels per plane = bpp.
// Bindings: 0 x, 1 w, 2 bias (read; w bound again when has_bias = 0), 3 out (read_write),
// 4 params. Overrides: WG (workgroup size).

override WG: u32 = 64u;

struct Params {
    n: u32,
    c: u32,
    h: u32,
    w: u32,
    m: u32,
    oh: u32,
    ow: u32,
    kh: u32,
    kw: u32,
    sh: u32,
    sw: u32,
    dh: u32,
    dw: u32,
    pt: i32,
    pl: i32,
    cg: u32,
    mg: u32,
    has_bias: u32,
    plane0: u32,
    e_start: u32,
    e_end: u32,
    bpp: u32,
    threads: u32,
    _pad: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> w: array<f32>;
@group(0) @binding(2) var<storage, read> bias: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<uniform> params: Params;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * WG;
    if (i >= params.threads) {
        return;
    }
    let plane = params.plane0 + i / params.bpp;
    let npix = params.oh * params.ow;
    let p0 = (i % params.bpp) * 4u;
    let e0 = plane * npix + p0;
    // which of the 4 pixels exist and lie in the asked element range
    var live = vec4<bool>(false);
    var ohs = vec4<i32>(0);
    var ows = vec4<i32>(0);
    for (var j = 0u; j < 4u; j = j + 1u) {
        let p = p0 + j;
        live[j] = p < npix && e0 + j >= params.e_start && e0 + j < params.e_end;
        ohs[j] = i32(p / params.ow) * i32(params.sh) - params.pt;
        ows[j] = i32(p % params.ow) * i32(params.sw) - params.pl;
    }
    if (!any(live)) {
        return;
    }
    let n = plane / params.m;
    let oc = plane % params.m;
    let g = oc / params.mg;
    var acc = vec4<f32>(0.0);
    let hh = i32(params.h);
    let ww = i32(params.w);
    for (var c = 0u; c < params.cg; c = c + 1u) {
        let xplane = (n * params.c + g * params.cg + c) * params.h * params.w;
        let wbase = (oc * params.cg + c) * params.kh * params.kw;
        for (var ki = 0u; ki < params.kh; ki = ki + 1u) {
            let ihs = ohs + vec4<i32>(i32(ki * params.dh));
            for (var kj = 0u; kj < params.kw; kj = kj + 1u) {
                let wv = w[wbase + ki * params.kw + kj];
                let iws = ows + vec4<i32>(i32(kj * params.dw));
                var xv = vec4<f32>(0.0);
                for (var j = 0u; j < 4u; j = j + 1u) {
                    if (ihs[j] >= 0 && ihs[j] < hh && iws[j] >= 0 && iws[j] < ww) {
                        xv[j] = x[xplane + u32(ihs[j]) * params.w + u32(iws[j])];
                    }
                }
                acc = fma(vec4<f32>(wv), xv, acc);
            }
        }
    }
    if (params.has_bias != 0u) {
        acc = acc + vec4<f32>(bias[oc]);
    }
    for (var j = 0u; j < 4u; j = j + 1u) {
        if (live[j]) {
            out[e0 + j] = acc[j];
        }
    }
}
