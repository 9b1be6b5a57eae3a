// conv_tiled: conv.wgsl's convolution (same params, bindings and epilogue, conv_common.wgsl) as
// an implicit GEMM through workgroup memory, for GPUs: out[oc, p] = sum_k W[oc, k] * X'[k, p]
// per group, k = (c, kh, kw) and X' the input under each output pixel p (zero outside). A
// 16 x 16 workgroup computes a tile of 64 output channels of one group x 64 pixels of one
// image; each invocation 4 channels x 4 consecutive pixels (tile_staging.wgsl). Per step of 16
// k the workgroup stages the tile's W (64 x 16) and X' (16 x 64), each element loaded once
// from storage by one invocation (neighbouring invocations: neighbouring k of W, neighbouring
// pixels of X'), and each staged value then feeds 4 FMAs of 16 invocations. conv.wgsl's
// register tile has each invocation load its own W and X values from storage (through the
// caches: a lent H200 ran resnet50's convs at about 0.45 TFLOP/s with it).
// Grid: x pixel tiles from params.tile_x0, y channel tiles of all groups from params.tile_y0
// (group g's tile t is g * ceil(mg / 64) + t), z images from params.blk0: the tiles output
// elements e_start .. e_end touch (ops/src/conv.rs, TileGrid). A workgroup with no output
// there returns before its first barrier (its condition is uniform: workgroup id and params).
// Not for adapters that run shaders on the CPU: lavapipe runs each barrier as a join of the
// workgroup's lanes (conv.wgsl, matmul.wgsl say why they keep none).

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> w: array<f32>;

@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32,
        @builtin(local_invocation_id) lid: vec3<u32>) {
    let npix = params.oh * params.ow;
    let tiles_per_group = (params.mg + TILE - 1u) / TILE;
    let n = params.blk0 + wid.z;
    let y = params.tile_y0 + wid.y;
    let g = y / tiles_per_group;
    let oc_tile = g * params.mg + (y % tiles_per_group) * TILE;
    let oc_group_end = (g + 1u) * params.mg;
    let p_tile = (params.tile_x0 + wid.x) * TILE;
    // the tile's first and last output elements (e grows with oc, then pixel)
    let oc_last = min(oc_tile + TILE, oc_group_end) - 1u;
    let p_last = min(p_tile + TILE, npix) - 1u;
    let e_lo = (n * params.m + oc_tile) * npix + p_tile;
    let e_hi = (n * params.m + oc_last) * npix + p_last;
    if (e_hi < params.e_start || e_lo >= params.e_end) {
        return;
    }
    let kk = params.kh * params.kw;
    let ks = params.cg * kk;

    // The W element this invocation stages: channel oc_tile + li / 4, k 4 (li % 4) .. + 3 of
    // the step; clamped to a channel of the group (its values never reach an output).
    let w_oc = li / 4u;
    let w_k = (li % 4u) * 4u;
    let w_row = min(oc_tile + w_oc, oc_group_end - 1u) * ks;
    // The X' elements: pixel p_tile + li % 64, step rows 4 (li / 64) .. + 3.
    let x_p = li % TILE;
    let x_k = (li / TILE) * 4u;
    let p = min(p_tile + x_p, npix - 1u);
    let ih0 = i32(p / params.ow) * i32(params.sh) - params.pt;
    let iw0 = i32(p % params.ow) * i32(params.sw) - params.pl;
    let x_img = (n * params.c + g * params.cg) * params.h * params.w;

    var acc = array<vec4<f32>, 4>(vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0));
    for (var k0 = 0u; k0 < ks; k0 = k0 + KT) {
        for (var j = 0u; j < 4u; j = j + 1u) {
            let kt = k0 + w_k + j;
            stage_row(w_k + j, w_oc, select(0.0, w[w_row + min(kt, ks - 1u)], kt < ks));
            let kx = k0 + x_k + j;
            let c = kx / kk;
            let r = kx % kk;
            let ih = ih0 + i32((r / params.kw) * params.dh);
            let iw = iw0 + i32((r % params.kw) * params.dw);
            let ok = kx < ks && ih >= 0 && ih < i32(params.h) && iw >= 0 && iw < i32(params.w);
            let idx = select(0u, x_img + (c * params.h + u32(ih)) * params.w + u32(iw), ok);
            stage_col(x_k + j, x_p, select(0.0, x[idx], ok));
        }
        accumulate(&acc, lid);
    }
    let p0 = p_tile + 4u * lid.x;
    let left = select(0u, min(4u, npix - p0), p0 < npix);
    for (var i = 0u; i < 4u; i = i + 1u) {
        let oc = oc_tile + 4u * lid.y + i;
        if (oc < oc_group_end) {
            finish4(acc[i], n, oc, p0, left);
        }
    }
}
