// conv: direct 2-D convolution (1-D runs as H = L, W = 1) with groups, strides, dilations and
// begin pads: out[n, oc, oh, ow] = bias[oc] + sum_{c < cg, kh, kw} x[n, g * cg + c, ih, iw] *
// w[oc, c, kh, kw], ih = oh * sh + kh * dh - pt, iw = ow * sw + kw * dw - pl (zero outside),
// g = oc / mg. Only output elements e with params.e_start <= e < params.e_end are written.
// Register tile per invocation: PX (4 or 8) consecutive pixels of OCB (8, 4, or 1 for
// depthwise-like convs with mg < 4) consecutive output channels of one group, so each loaded
// input value feeds ocb FMAs and each weight PX. The runtime takes 4 x 4 on GPUs and 8 x 8 on
// adapters that run shaders on the CPU (GpuKernel::on_cpu_adapter), where every load is a
// per-lane gather and few invocations suffice. Channel blocks: mgb = ceil(mg / OCB) per group,
// numbered over (n, group, block) from params.blk0; bpp blocks of PX pixels per plane.
// Fused activation after the bias (ACT; the runtime's fusion pass sets it): 0 none,
// 1 Relu, 2 LeakyRelu (alpha act_a), 3 Clip [act_a, act_b], 4 Sigmoid, 5 SiLU x * sigmoid(x),
// 6 HardSigmoid clamp(act_a * x + act_b, 0, 1), 7 HardSwish x * clamp(act_a * x + act_b, 0, 1);
// the same formulas as unary.wgsl, NaN staying NaN for 1-3, 6, 7. Then, when POST = 1,
// v * post_scale + post_shift (scalar Mul and Add nodes after the activation). A fused residual
// z (an Add after the Conv; z has the output's shape) is added at the same index: RESIDUAL
// 1 before the activation, 2 after the affine, 0 none.
// OCB, HAS_BIAS, ACT, POST and RESIDUAL are overrides, not params: lavapipe runs both sides of
// a branch on a uniform value, so a depthwise conv (OCB 1) paid for 8 channels' FMAs and every
// output for each activation's formulas.
// Bindings: 0 x, 1 w, 2 bias, 3 z (read; w bound again when HAS_BIAS = 0 or RESIDUAL = 0),
// 4 out (read_write), 5 params. Overrides: WG (workgroup size), PX (pixels per invocation),
// OCB, HAS_BIAS (0 or 1), ACT, POST (0 or 1), RESIDUAL.

override WG: u32 = 64u;
// Pixels per invocation: 4 or 8.
override PX: u32 = 8u;
override OCB: u32;
override HAS_BIAS: u32;
override ACT: u32;
override POST: u32;
override RESIDUAL: u32;

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
    blk0: u32,
    e_start: u32,
    e_end: u32,
    bpp: u32,
    threads: u32,
    mgb: u32,
    act_a: f32,
    act_b: f32,
    post_scale: f32,
    post_shift: f32,
    _pad: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> w: array<f32>;
@group(0) @binding(2) var<storage, read> bias: array<f32>;
@group(0) @binding(3) var<storage, read> z: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
@group(0) @binding(5) var<uniform> params: Params;

// z at e0 .. e0 + 4, 0 past the plane's last `left` pixels (no read there).
fn residual4(e0: u32, left: u32) -> vec4<f32> {
    var r = vec4<f32>(0.0);
    for (var j = 0u; j < 4u; j = j + 1u) {
        if (j < left) {
            r[j] = z[e0 + j];
        }
    }
    return r;
}

// x at (ih, iw) of the plane at `base` for 4 pixels, 0 outside (branchless: clamped index).
fn load_x(base: u32, ih: vec4<i32>, iw: vec4<i32>) -> vec4<f32> {
    let ok = (ih >= vec4<i32>(0)) & (ih < vec4<i32>(i32(params.h))) & (iw >= vec4<i32>(0))
        & (iw < vec4<i32>(i32(params.w)));
    let idx = select(vec4<u32>(base), vec4<u32>(base) + vec4<u32>(ih) * params.w + vec4<u32>(iw), ok);
    let v = vec4<f32>(x[idx.x], x[idx.y], x[idx.z], x[idx.w]);
    return select(vec4<f32>(0.0), v, ok);
}

// clamp(v, 0, 1) with NaN kept.
fn unit_clamp(v: vec4<f32>) -> vec4<f32> {
    let y = select(v, vec4<f32>(0.0), v < vec4<f32>(0.0));
    return nan_through4(select(y, vec4<f32>(1.0), y > vec4<f32>(1.0)), v);
}

fn activate(v: vec4<f32>) -> vec4<f32> {
    switch ACT {
        case 1u: { return nan_through4(select(v, vec4<f32>(0.0), v < vec4<f32>(0.0)), v); }
        case 2u: { return select(v, params.act_a * v, v < vec4<f32>(0.0)); }
        case 3u: {
            let y = select(v, vec4<f32>(params.act_a), v < vec4<f32>(params.act_a));
            return nan_through4(select(y, vec4<f32>(params.act_b), y > vec4<f32>(params.act_b)), v);
        }
        case 4u: { return 1.0 / (1.0 + exp(-v)); }
        case 5u: { return v * (1.0 / (1.0 + exp(-v))); }
        case 6u: { return unit_clamp(params.act_a * v + params.act_b); }
        case 7u: { return v * unit_clamp(params.act_a * v + params.act_b); }
        default: { return v; }
    }
}

// The epilogue of output channel oc at pixels p0 .. p0 + 4 of image n, sums `acc`: bias,
// residual, activation, affine, written where inside the plane and e_start <= e < e_end.
fn finish4(acc: vec4<f32>, n: u32, oc: u32, p0: u32, npix: u32) {
    var v = acc;
    if (HAS_BIAS != 0u) {
        v = v + vec4<f32>(bias[oc]);
    }
    let e0 = (n * params.m + oc) * npix + p0;
    if (RESIDUAL == 1u) {
        v = v + residual4(e0, npix - p0);
    }
    v = activate(v);
    if (POST != 0u) {
        v = v * params.post_scale + params.post_shift;
    }
    if (RESIDUAL == 2u) {
        v = v + residual4(e0, npix - p0);
    }
    for (var j = 0u; j < 4u; j = j + 1u) {
        let e = e0 + j;
        if (p0 + j < npix && e >= params.e_start && e < params.e_end) {
            out[e] = v[j];
        }
    }
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * WG;
    if (i >= params.threads) {
        return;
    }
    let blk = params.blk0 + i / params.bpp;
    let per_img = params.mgb * (params.m / params.mg);
    let n = blk / per_img;
    let g = (blk % per_img) / params.mgb;
    let oc0 = g * params.mg + (blk % params.mgb) * OCB;
    let oc_end = min(oc0 + OCB, (g + 1u) * params.mg);
    let npix = params.oh * params.ow;
    let p0 = (i % params.bpp) * PX;
    var ohs = array<vec4<i32>, 2>(vec4<i32>(0), vec4<i32>(0));
    var ows = array<vec4<i32>, 2>(vec4<i32>(0), vec4<i32>(0));
    var any_live = false;
    for (var j = 0u; j < PX; j = j + 1u) {
        let p = min(p0 + j, npix - 1u);
        ohs[j / 4u][j % 4u] = i32(p / params.ow) * i32(params.sh) - params.pt;
        ows[j / 4u][j % 4u] = i32(p % params.ow) * i32(params.sw) - params.pl;
        for (var oc = oc0; oc < oc_end; oc = oc + 1u) {
            let e = (n * params.m + oc) * npix + p0 + j;
            any_live = any_live || (p0 + j < npix && e >= params.e_start && e < params.e_end);
        }
    }
    if (!any_live) {
        return;
    }
    let oh0 = ohs[0];
    let oh1 = ohs[1];
    let ow0 = ows[0];
    let ow1 = ows[1];
    let kk = params.kh * params.kw;
    let ws = params.cg * kk;
    // weights of channels past the group end are read from oc0 (in bounds) and never written
    let r0 = oc0 * ws;
    let r1 = select(oc0, oc0 + 1u, oc0 + 1u < oc_end) * ws;
    let r2 = select(oc0, oc0 + 2u, oc0 + 2u < oc_end) * ws;
    let r3 = select(oc0, oc0 + 3u, oc0 + 3u < oc_end) * ws;
    let r4 = select(oc0, oc0 + 4u, oc0 + 4u < oc_end) * ws;
    let r5 = select(oc0, oc0 + 5u, oc0 + 5u < oc_end) * ws;
    let r6 = select(oc0, oc0 + 6u, oc0 + 6u < oc_end) * ws;
    let r7 = select(oc0, oc0 + 7u, oc0 + 7u < oc_end) * ws;
    // a: pixels 0-3, b: pixels 4-7, one of each per output channel of the block
    var a0 = vec4<f32>(0.0);
    var a1 = vec4<f32>(0.0);
    var a2 = vec4<f32>(0.0);
    var a3 = vec4<f32>(0.0);
    var a4 = vec4<f32>(0.0);
    var a5 = vec4<f32>(0.0);
    var a6 = vec4<f32>(0.0);
    var a7 = vec4<f32>(0.0);
    var b0 = vec4<f32>(0.0);
    var b1 = vec4<f32>(0.0);
    var b2 = vec4<f32>(0.0);
    var b3 = vec4<f32>(0.0);
    var b4 = vec4<f32>(0.0);
    var b5 = vec4<f32>(0.0);
    var b6 = vec4<f32>(0.0);
    var b7 = vec4<f32>(0.0);
    for (var c = 0u; c < params.cg; c = c + 1u) {
        let xplane = (n * params.c + g * params.cg + c) * params.h * params.w;
        for (var ki = 0u; ki < params.kh; ki = ki + 1u) {
            let dh = vec4<i32>(i32(ki * params.dh));
            for (var kj = 0u; kj < params.kw; kj = kj + 1u) {
                let dw = vec4<i32>(i32(kj * params.dw));
                let xa = load_x(xplane, oh0 + dh, ow0 + dw);
                var xb = vec4<f32>(0.0);
                if (PX == 8u) {
                    xb = load_x(xplane, oh1 + dh, ow1 + dw);
                }
                let k = c * kk + ki * params.kw + kj;
                let v0 = vec4<f32>(w[r0 + k]);
                a0 = fma(v0, xa, a0);
                if (PX == 8u) {
                    b0 = fma(v0, xb, b0);
                }
                if (OCB >= 4u) {
                    let v1 = vec4<f32>(w[r1 + k]);
                    let v2 = vec4<f32>(w[r2 + k]);
                    let v3 = vec4<f32>(w[r3 + k]);
                    a1 = fma(v1, xa, a1);
                    a2 = fma(v2, xa, a2);
                    a3 = fma(v3, xa, a3);
                    if (PX == 8u) {
                        b1 = fma(v1, xb, b1);
                        b2 = fma(v2, xb, b2);
                        b3 = fma(v3, xb, b3);
                    }
                }
                // 8 channels only with 8 pixels: a 4-pixel pipeline keeps a4..a7 constant
                if (PX == 8u && OCB == 8u) {
                    let v4 = vec4<f32>(w[r4 + k]);
                    let v5 = vec4<f32>(w[r5 + k]);
                    let v6 = vec4<f32>(w[r6 + k]);
                    let v7 = vec4<f32>(w[r7 + k]);
                    a4 = fma(v4, xa, a4);
                    a5 = fma(v5, xa, a5);
                    a6 = fma(v6, xa, a6);
                    a7 = fma(v7, xa, a7);
                    if (PX == 8u) {
                        b4 = fma(v4, xb, b4);
                        b5 = fma(v5, xb, b5);
                        b6 = fma(v6, xb, b6);
                        b7 = fma(v7, xb, b7);
                    }
                }
            }
        }
    }
    let accs = array<vec4<f32>, 16>(a0, b0, a1, b1, a2, b2, a3, b3, a4, b4, a5, b5, a6, b6, a7, b7);
    for (var q = 0u; q < oc_end - oc0; q = q + 1u) {
        finish4(accs[2u * q], n, oc0 + q, p0, npix);
        if (PX == 8u) {
            finish4(accs[2u * q + 1u], n, oc0 + q, p0 + 4u, npix);
        }
    }
}
