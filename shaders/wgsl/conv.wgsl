// conv: direct 2-D convolution (1-D runs as H = L, W = 1) with groups, strides, dilations and
// begin pads: out[n, oc, oh, ow] = bias[oc] + sum_{c < cg, kh, kw} x[n, g * cg + c, ih, iw] *
// w[oc, c, kh, kw], ih = oh * sh + kh * dh - pt, iw = ow * sw + kw * dw - pl (zero outside),
// g = oc / mg. Only output elements e with params.e_start <= e < params.e_end are written.
// Register tile per invocation: PX (4 or 8) consecutive pixels of OCB (8, 4, or 1 for
// depthwise-like convs with mg < 4) consecutive output channels of one group, so each loaded
// input value feeds ocb FMAs and each weight PX. The runtime takes 4 x 4 on GPUs (for convs
// conv_tiled.wgsl does not take) and 8 x 8 on adapters that run shaders on the CPU
// (GpuKernel::on_cpu_adapter), where every load is a per-lane gather and few invocations
// suffice. Channel blocks: mgb = ceil(mg / OCB) per group,
// numbered over (n, group, block) from params.blk0; bpp blocks of PX pixels per plane.
// Params, bindings 2-5, block numbering and the epilogue: the prelude conv_common.wgsl.
// Bindings: 0 x, 1 w. Overrides: WG (workgroup size), PX (pixels per invocation), OCB,
// HAS_BIAS (0 or 1), ACT, POST (0 or 1), RESIDUAL.

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> w: array<f32>;

// x at (ih, iw) of the plane at `base` for 4 pixels, 0 outside (branchless: clamped index).
fn load_x(base: u32, ih: vec4<i32>, iw: vec4<i32>) -> vec4<f32> {
    let ok = (ih >= vec4<i32>(0)) & (ih < vec4<i32>(i32(params.h))) & (iw >= vec4<i32>(0))
        & (iw < vec4<i32>(i32(params.w)));
    let idx = select(vec4<u32>(base), vec4<u32>(base) + vec4<u32>(ih) * params.w + vec4<u32>(iw), ok);
    let v = vec4<f32>(x[idx.x], x[idx.y], x[idx.z], x[idx.w]);
    return select(vec4<f32>(0.0), v, ok);
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let b = block_at(gid, nwg);
    if (!b.live) {
        return;
    }
    let npix = params.oh * params.ow;
    var ohs = array<vec4<i32>, 2>(vec4<i32>(0), vec4<i32>(0));
    var ows = array<vec4<i32>, 2>(vec4<i32>(0), vec4<i32>(0));
    for (var j = 0u; j < PX; j = j + 1u) {
        let p = min(b.p0 + j, npix - 1u);
        ohs[j / 4u][j % 4u] = i32(p / params.ow) * i32(params.sh) - params.pt;
        ows[j / 4u][j % 4u] = i32(p % params.ow) * i32(params.sw) - params.pl;
    }
    let oh0 = ohs[0];
    let oh1 = ohs[1];
    let ow0 = ows[0];
    let ow1 = ows[1];
    let kk = params.kh * params.kw;
    let ws = params.cg * kk;
    let r = weight_rows(b, ws);
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
        let xplane = (b.n * params.c + b.g * params.cg + c) * params.h * params.w;
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
                let v0 = vec4<f32>(w[r[0] + k]);
                a0 = fma(v0, xa, a0);
                if (PX == 8u) {
                    b0 = fma(v0, xb, b0);
                }
                if (OCB >= 4u) {
                    let v1 = vec4<f32>(w[r[1] + k]);
                    let v2 = vec4<f32>(w[r[2] + k]);
                    let v3 = vec4<f32>(w[r[3] + k]);
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
                    let v4 = vec4<f32>(w[r[4] + k]);
                    let v5 = vec4<f32>(w[r[5] + k]);
                    let v6 = vec4<f32>(w[r[6] + k]);
                    let v7 = vec4<f32>(w[r[7] + k]);
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
    finish_block(b, array<vec4<f32>, 16>(a0, b0, a1, b1, a2, b2, a3, b3, a4, b4, a5, b5, a6, b6, a7, b7));
}
