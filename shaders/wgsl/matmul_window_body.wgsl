// matmul_window_body: the product of matmul_window.wgsl and matmul_window_texture.wgsl, which
// differ only in where B is read from: each declares binding 1 and `fn b4(i: u32) -> vec4<f32>`,
// B's vec4 i (row-major, b_rs / 4 of them a row). See matmul_window.wgsl for the layout.

@group(0) @binding(0) var<uniform> a: array<vec4<f32>, 4096>;
@group(0) @binding(3) var<storage, read_write> out: array<vec4<f32>>;

// HAS_C: 0 where beta is 0 (lavapipe would read C for every output behind a branch on params).
override HAS_C: u32 = 1u;
// C_ROW: 1 where C is one row for every output row (c_rs 0: a bias), read once an invocation;
// its reads per output row cost about as much as the product's B loads at K 384.
override C_ROW: u32 = 0u;
override TM: u32 = 8u;
// K_UNALIGNED: 1 where K is not a multiple of 4 (magika's 257): A's rows do not start at vec4s,
// so A is read a float at a time, and the last group of four k is cut at K (A's and B's rows
// past it read as 0).
override K_UNALIGNED: u32 = 0u;

// A's elements k = 4 p .. 4 p + 3 of window row `row`.
fn a4(row: u32, p: u32) -> vec4<f32> {
    if (K_UNALIGNED == 0u) {
        return a[row * (params.k / 4u) + p];
    }
    var v = vec4<f32>(0.0);
    for (var j = 0u; j < 4u; j = j + 1u) {
        let e = min(row * params.k + 4u * p + j, 16383u);
        v[j] = select(0.0, a[e / 4u][e % 4u], 4u * p + j < params.k);
    }
    return v;
}

// B's row k, columns from vec4 `col` (brs vec4s a row; 0 for k past K).
fn b_row4(col: u32, k: u32, brs: u32) -> vec4<f32> {
    if (K_UNALIGNED == 0u) {
        return b4(col + k * brs);
    }
    return select(vec4<f32>(0.0), b4(col + min(k, params.k - 1u) * brs), k < params.k);
}

// C's four columns from element `at` on.
fn c4(at: u32) -> vec4<f32> {
    let cs = params.c_cs;
    return vec4<f32>(c[at], c[at + cs], c[at + 2u * cs], c[at + 3u * cs]);
}

// C[0, nj .. nj + 3] (column 0 for columns past N: never written).
fn c_row4(nj: u32) -> vec4<f32> {
    return c4(select(0u, nj, nj < params.n) * params.c_cs);
}

// Writes alpha * sum + beta * C[mi, nj .. nj + 3] at row mi, columns nj .. nj + 3 of batch bi,
// when they are inside the product and among the rows the dispatch writes (`crow`: that C
// where C_ROW).
fn store4(bi: u32, mi: u32, nj: u32, sum: vec4<f32>, crow: vec4<f32>) {
    let r = bi * params.m + mi;
    if (mi >= params.m || nj >= params.n || r < params.row_start || r >= params.row_end) {
        return;
    }
    var v = params.alpha * sum;
    if (HAS_C != 0u && C_ROW != 0u) {
        v = v + params.beta * crow;
    } else if (HAS_C != 0u) {
        v = v + params.beta * c4(mi * params.c_rs + nj * params.c_cs);
    }
    out[(r * params.n + nj) / 4u] = v;
}

@compute @workgroup_size(8)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let rows = params.row_end - params.row_start;
    let r0 = wid.y * TM;
    let n0 = (wid.x * 8u + lid.x) * 8u;
    // B's columns n0 .. n0 + 3 and n0 + 4 .. n0 + 7 at k = 0 (column 0 past N: computed,
    // never written)
    let bc0 = select(0u, n0, n0 < params.n) / 4u;
    let bc1 = select(0u, n0 + 4u, n0 + 4u < params.n) / 4u;
    let brs = params.b_rs / 4u;
    let kq = (params.k + 3u) / 4u;
    // acc[2 i + h]: window row r0 + i, columns n0 + 4 h .. n0 + 4 h + 3
    var acc: array<vec4<f32>, 16>;
    for (var p = 0u; p < kq; p = p + 1u) {
        let k = 4u * p;
        let b00 = b_row4(bc0, k, brs);
        let b01 = b_row4(bc1, k, brs);
        let b10 = b_row4(bc0, k + 1u, brs);
        let b11 = b_row4(bc1, k + 1u, brs);
        let b20 = b_row4(bc0, k + 2u, brs);
        let b21 = b_row4(bc1, k + 2u, brs);
        let b30 = b_row4(bc0, k + 3u, brs);
        let b31 = b_row4(bc1, k + 3u, brs);
        for (var i = 0u; i < TM; i = i + 1u) {
            let av = a4(min(r0 + i, rows - 1u), p);
            var s0 = acc[2u * i];
            var s1 = acc[2u * i + 1u];
            s0 = fma(vec4<f32>(av.x), b00, s0);
            s1 = fma(vec4<f32>(av.x), b01, s1);
            s0 = fma(vec4<f32>(av.y), b10, s0);
            s1 = fma(vec4<f32>(av.y), b11, s1);
            s0 = fma(vec4<f32>(av.z), b20, s0);
            s1 = fma(vec4<f32>(av.z), b21, s1);
            s0 = fma(vec4<f32>(av.w), b30, s0);
            s1 = fma(vec4<f32>(av.w), b31, s1);
            acc[2u * i] = s0;
            acc[2u * i + 1u] = s1;
        }
    }
    var c0 = vec4<f32>(0.0);
    var c1 = vec4<f32>(0.0);
    if (HAS_C != 0u && C_ROW != 0u) {
        c0 = c_row4(n0);
        c1 = c_row4(n0 + 4u);
    }
    for (var i = 0u; i < TM; i = i + 1u) {
        let r = params.row_start + r0 + i;
        store4(r / params.m, r % params.m, n0, acc[2u * i], c0);
        store4(r / params.m, r % params.m, n0 + 4u, acc[2u * i + 1u], c1);
    }
}
