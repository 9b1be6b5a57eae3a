// conv_rows: conv.wgsl's result for convs of horizontal stride SW (1 or 2) and dilation 1 on
// adapters that run shaders on the CPU (lavapipe, SwiftShader). A block's 8 pixels lie in one
// output row (ROWS = 1: a row's last block may be short). For each input channel and kernel row
// an invocation loads the input columns its taps read, SW ox - PL .. SW (ox + 7) + KW - 1 - PL
// (ox the block's first column), once: 12 floats for a 3-wide kernel of stride 1, where
// conv.wgsl loads 8 (per-lane gathers there) for each of the 3 taps. KW (the kernel width), PL
// (the left pad) and SW are overrides, so the window's indices are constants and it stays in
// registers. Preconditions (the host checks them): dw = 1, KW <= 7, PL <= 4,
// KW - 1 - PL <= 3 + SW (the window: 24 columns from SW ox - 4).
// Same Params, block numbering (PX = 8, ROWS = 1), epilogue and dispatch as conv.wgsl.
// Params, bindings 2-5, block numbering and the epilogue: the prelude conv_common.wgsl. This
// file is itself the prelude of the four kernels, which declare W (binding 1) and `weight`:
// conv_rows_storage.wgsl (W a storage buffer) and conv_rows_uniform.wgsl (W's elements
// w_first .. w_first + 16384 a uniform buffer, the runtime's 64 KiB window), each after one of
// the two declaring X (binding 0) and `x_window`: conv_rows_x_storage.wgsl (a storage buffer)
// and conv_rows_x_texture.wgsl (a texture, where X's rows are whole vec4s).
// Bindings: 0 x, 1 w. Overrides: WG, PX (8), ROWS (1), OCB (8, 4 or 1), KW, PL, SW, HAS_BIAS,
// ACT, POST, RESIDUAL.

override KW: u32;
override PL: u32;
override SW: u32;

// One tap (weight column `tap` of the block's rows) over the 8 pixels at window positions
// s, s + SW, ..., s + 7 SW.
fn taps(acc: ptr<function, array<vec4<f32>, 16>>, win: array<f32, 24>, s: u32, row: array<u32, 8>, tap: u32) {
    var xs: array<vec4<f32>, 2>;
    for (var j = 0u; j < 8u; j = j + 1u) {
        xs[j / 4u][j % 4u] = win[s + SW * j];
    }
    for (var q = 0u; q < OCB; q = q + 1u) {
        let wv = vec4<f32>(weight(row[q] + tap));
        (*acc)[2u * q] = fma(wv, xs[0], (*acc)[2u * q]);
        (*acc)[2u * q + 1u] = fma(wv, xs[1], (*acc)[2u * q + 1u]);
    }
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let b = block_at(gid, nwg);
    if (!b.live) {
        return;
    }
    let oy = b.p0 / params.ow;
    let ox = b.p0 % params.ow;
    let ih0 = i32(oy * params.sh) - params.pt;
    // window position t holds input column SW ox - 4 + t; positions lo .. hi are read
    let lo = 4u - PL;
    let hi = 4u + 7u * SW + KW - 1u - PL;
    let col0 = i32(SW * ox) - 4;
    let kk = params.kh * KW;
    // indices from the binding's first element (w_first: 0 for a whole W)
    var row = weight_rows(b, params.cg * kk);
    for (var q = 0u; q < 8u; q = q + 1u) {
        row[q] = row[q] - params.w_first;
    }
    // acc[2 q]: channel oc0 + q at pixels p0 .. p0 + 3, acc[2 q + 1] at p0 + 4 .. p0 + 7
    var acc: array<vec4<f32>, 16>;
    for (var c = 0u; c < params.cg; c = c + 1u) {
        let plane = (b.n * params.c + b.g * params.cg + c) * params.h * params.w;
        for (var ki = 0u; ki < params.kh; ki = ki + 1u) {
            let ih = ih0 + i32(ki * params.dh);
            let row_ok = ih >= 0 && ih < i32(params.h);
            let at = plane + select(0u, u32(ih), row_ok) * params.w;
            let win = x_window(at, col0, row_ok, lo, hi);
            let tap0 = (c * params.kh + ki) * KW;
            // pixel j's tap kj reads input column SW (ox + j) + kj - PL: window position
            // 4 + SW j + kj - PL
            taps(&acc, win, 4u - PL, row, tap0);
            if (KW > 1u) {
                taps(&acc, win, 5u - PL, row, tap0 + 1u);
            }
            if (KW > 2u) {
                taps(&acc, win, 6u - PL, row, tap0 + 2u);
            }
            if (KW > 3u) {
                taps(&acc, win, 7u - PL, row, tap0 + 3u);
            }
            if (KW > 4u) {
                taps(&acc, win, 8u - PL, row, tap0 + 4u);
            }
            if (KW > 5u) {
                taps(&acc, win, 9u - PL, row, tap0 + 5u);
            }
            if (KW > 6u) {
                taps(&acc, win, 10u - PL, row, tap0 + 6u);
            }
        }
    }
    finish_block(b, acc);
}
