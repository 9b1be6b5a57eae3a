// conv_rows_x_storage: conv_rows.wgsl's X (binding 0) as a storage buffer.

@group(0) @binding(0) var<storage, read> x: array<f32>;

// Window positions lo ..= hi: input columns col0 + lo .. col0 + hi of the row whose first
// element is `at` (0 outside the row, and everywhere when !row_ok).
fn x_window(at: u32, col0: i32, row_ok: bool, lo: u32, hi: u32) -> array<f32, 24> {
    var win: array<f32, 24>;
    for (var t = lo; t <= hi; t = t + 1u) {
        let col = col0 + i32(t);
        let ok = row_ok && col >= 0 && col < i32(params.w);
        win[t] = select(0.0, x[select(at, at + u32(col), ok)], ok);
    }
    return win;
}
