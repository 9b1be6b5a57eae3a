// conv_rows_x_texture: conv_rows.wgsl's X (binding 0) as a texture (texel.wgsl), read a vec4 at
// a time: 3 to 6 fetches for a window where the storage buffer's kernel loads 10 to 22 floats,
// each a loop over the lanes on llvmpipe. Precondition (the host checks it): the input width
// params.w is a multiple of 4, so a row starts at a vec4 and each vec4 lies inside or outside it
// whole (the window's first column col0 is SW ox - 4, ox a multiple of 8).

@group(0) @binding(0) var x: texture_2d<u32>;

// Window positions lo ..= hi (and the rest of their vec4s): input columns col0 + lo ..
// col0 + hi of the row whose first element is `at` (0 outside the row, and everywhere when
// !row_ok).
fn x_window(at: u32, col0: i32, row_ok: bool, lo: u32, hi: u32) -> array<f32, 24> {
    var win: array<f32, 24>;
    for (var q = lo / 4u; q <= hi / 4u; q = q + 1u) {
        let col = col0 + i32(4u * q);
        let ok = row_ok && col >= 0 && col < i32(params.w);
        let v = select(vec4<f32>(0.0), texel(x, select(0u, (at + u32(col)) / 4u, ok)), ok);
        win[4u * q] = v.x;
        win[4u * q + 1u] = v.y;
        win[4u * q + 2u] = v.z;
        win[4u * q + 3u] = v.w;
    }
    return win;
}
