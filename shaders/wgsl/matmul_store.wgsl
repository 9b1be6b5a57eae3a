// matmul_store: the output binding and the float store of matmul.wgsl (after matmul_common).
// Bindings: 3 out (read_write).

@group(0) @binding(3) var<storage, read_write> out: array<f32>;

// Writes alpha * sum + beta * C[mi, nj] at row mi, column nj of batch bi, when that output is
// inside the product and among the rows the dispatch writes.
fn store(bi: u32, mi: u32, nj: u32, sum: f32) {
    let r = bi * params.m + mi;
    if (mi >= params.m || nj >= params.n || r < params.row_start || r >= params.row_end) {
        return;
    }
    var v = params.alpha * sum;
    if (params.beta != 0.0) {
        v = v + params.beta * c[mi * params.c_rs + nj * params.c_cs];
    }
    out[r * params.n + nj] = v;
}
