// conv_common: the params, bindings 2-5, block numbering and epilogue that conv.wgsl,
// conv_pointwise.wgsl and conv_rows.wgsl share, and conv_tiled.wgsl all but the block numbering
// (each declares its own x and w bindings 0 and 1).
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
// Bindings: 2 bias, 3 z (read; w bound again when HAS_BIAS = 0 or RESIDUAL = 0), 4 out
// (read_write), 5 params.

override WG: u32 = 64u;
// Pixels per invocation: 4 or 8.
override PX: u32 = 8u;
// Output channels per invocation: 8, 4 or 1.
override OCB: u32;
// 1: pixel blocks within output rows (block_at).
override ROWS: u32 = 0u;
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
    // conv_rows: the first W element of its uniform window of weights (0 for the others).
    w_first: u32,
    // conv_tiled: its first pixel tile and channel tile (0 for the others).
    tile_x0: u32,
    tile_y0: u32,
}

@group(0) @binding(2) var<storage, read> bias: array<f32>;
@group(0) @binding(3) var<storage, read> z: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
@group(0) @binding(5) var<uniform> params: Params;

// z at e0 .. e0 + 4, its first `left` (0 after them; no read there).
fn residual4(e0: u32, left: u32) -> vec4<f32> {
    var r = vec4<f32>(0.0);
    for (var j = 0u; j < 4u; j = j + 1u) {
        if (j < left) {
            r[j] = z[e0 + j];
        }
    }
    return r;
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

// The epilogue of output channel oc at pixels p0 .. p0 + 4 of image n, sums `acc`, of which
// the first `left` are the block's: bias, residual, activation, affine, written where
// e_start <= e < e_end.
fn finish4(acc: vec4<f32>, n: u32, oc: u32, p0: u32, left: u32) {
    var v = acc;
    if (HAS_BIAS != 0u) {
        v = v + vec4<f32>(bias[oc]);
    }
    let e0 = (n * params.m + oc) * params.oh * params.ow + p0;
    if (RESIDUAL == 1u) {
        v = v + residual4(e0, left);
    }
    v = activate(v);
    if (POST != 0u) {
        v = v * params.post_scale + params.post_shift;
    }
    if (RESIDUAL == 2u) {
        v = v + residual4(e0, left);
    }
    for (var j = 0u; j < 4u; j = j + 1u) {
        let e = e0 + j;
        if (j < left && e >= params.e_start && e < params.e_end) {
            out[e] = v[j];
        }
    }
}

// An invocation's block: image n, group g, output channels oc0 .. oc_end, pixels p0 .. p0 +
// left (left <= PX); live when one of its outputs lies in e_start .. e_end.
struct Block {
    n: u32,
    g: u32,
    oc0: u32,
    oc_end: u32,
    p0: u32,
    left: u32,
    live: bool,
}

// The block of the invocation at `gid` (a flat index i over the 2-D grid), not live past
// params.threads. Channel blocks are numbered over (n, group, block) from params.blk0, bpp
// blocks of PX pixels per plane; invocation i takes the (i % bpp)-th pixel block of block
// blk0 + i / bpp. Pixel blocks run over the flattened plane, or, when ROWS = 1, over each output
// row (ceil(ow / PX) a row, the last one short), so a block's pixels share a row.
fn block_at(gid: vec3<u32>, nwg: vec3<u32>) -> Block {
    var b: Block;
    let i = gid.x + gid.y * nwg.x * WG;
    if (i >= params.threads) {
        b.live = false;
        return b;
    }
    let blk = params.blk0 + i / params.bpp;
    let per_img = params.mgb * (params.m / params.mg);
    b.n = blk / per_img;
    b.g = (blk % per_img) / params.mgb;
    b.oc0 = b.g * params.mg + (blk % params.mgb) * OCB;
    b.oc_end = min(b.oc0 + OCB, (b.g + 1u) * params.mg);
    let npix = params.oh * params.ow;
    let pb = i % params.bpp;
    if (ROWS != 0u) {
        let per_row = (params.ow + PX - 1u) / PX;
        let ox = (pb % per_row) * PX;
        b.p0 = (pb / per_row) * params.ow + ox;
        b.left = min(PX, params.ow - ox);
    } else {
        b.p0 = pb * PX;
        b.left = min(PX, select(0u, npix - b.p0, b.p0 < npix));
    }
    b.live = false;
    for (var j = 0u; j < PX; j = j + 1u) {
        for (var oc = b.oc0; oc < b.oc_end; oc = oc + 1u) {
            let e = (b.n * params.m + oc) * npix + b.p0 + j;
            b.live = b.live || (j < b.left && e >= params.e_start && e < params.e_end);
        }
    }
    return b;
}

// The weight row index (rows of `per_channel` elements) of each output channel oc0 + q of the
// block, q < 8; channel oc0's past the group's end: read in bounds, never written.
fn weight_rows(b: Block, per_channel: u32) -> array<u32, 8> {
    var r: array<u32, 8>;
    for (var q = 0u; q < 8u; q = q + 1u) {
        r[q] = select(b.oc0, b.oc0 + q, b.oc0 + q < b.oc_end) * per_channel;
    }
    return r;
}

// The epilogue of the block's accumulators: acc[2 q] pixels p0 .. p0 + 3 and acc[2 q + 1]
// pixels p0 + 4 .. p0 + 7 (PX = 8) of output channel oc0 + q.
fn finish_block(b: Block, acc: array<vec4<f32>, 16>) {
    for (var q = 0u; q < b.oc_end - b.oc0; q = q + 1u) {
        finish4(acc[2u * q], b.n, b.oc0 + q, b.p0, b.left);
        if (PX == 8u) {
            finish4(acc[2u * q + 1u], b.n, b.oc0 + q, b.p0 + 4u, select(0u, b.left - 4u, b.left > 4u));
        }
    }
}
