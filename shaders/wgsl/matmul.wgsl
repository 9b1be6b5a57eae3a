// matmul: out[b, m, n] = alpha * sum_k A[b, m, k] * B[b, k, n] + beta * C[m, n] for the logical
// output rows r = b * M + m with params.row_start <= r < params.row_end (other rows untouched).
// Serves MatMul (alpha 1, beta 0, C unused) and Gemm (transposes as strides, C broadcast to
// (M, N) through zero strides). A, B are read through row/column strides and per-batch strides
// (0 on broadcast batch dims); out is dense row-major [rows, N].
// Params, bindings 2 and 4: the prelude matmul_common.wgsl; out and the store: matmul_store.wgsl.
// Bindings: 0 a, 1 b, 2 c (read; MatMul binds b again there), 3 out (read_write), 4 params.
// Dispatch: (ceil(N / 64), ceil((M_hi - m_lo) / (WY * TM)), batches from params.b0); each
// invocation of the WS x WY workgroup keeps a TM x T register tile: rows
// m_lo + WY*TM*wg.y + ly + WY*i, columns 64*wg.x + lx + WS*j (strided so that neighbouring
// invocations read neighbouring columns). No shared memory (its barriers are slow on CPU
// Vulkan); GPUs take matmul_tiled.wgsl, which stages tiles there, for products of 32+ rows.
// Overrides: T (4 or 8) and WS = 64 / T; TM = T and WY = WS, or TM = WY = 1 when M is 1
// (one row a workgroup, not 64 of which 63 would repeat it).

@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;

// Rows and columns per invocation: 4, or 8 on adapters that run shaders on the CPU (every
// load a per-lane gather there: 16 loads for 64 FMAs instead of 8 for 16). WS = 64 / T.
override T: u32 = 4u;
override WS: u32 = 16u;
// Rows per invocation and invocations per workgroup column: T and WS, or 1 and 1.
override TM: u32 = 4u;
override WY: u32 = 16u;

@compute @workgroup_size(WS, WY)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let bi = params.b0 + wid.z;
    let offs = batch_offsets(bi);
    let a_off = offs.x;
    let b_off = offs.y;
    let m0 = params.m_lo + wid.y * WY * TM + lid.y;
    let n0 = wid.x * 64u + lid.x;
    var arow: array<u32, 8>;
    var bcol: array<u32, 8>;
    for (var i = 0u; i < TM; i = i + 1u) {
        let mi = m0 + WY * i;
        arow[i] = a_off + select(0u, mi, mi < params.m) * params.a_rs;
    }
    for (var j = 0u; j < T; j = j + 1u) {
        let nj = n0 + WS * j;
        bcol[j] = b_off + select(0u, nj, nj < params.n) * params.b_cs;
    }
    // acc[2 i + h]: row i, columns 4 h .. 4 h + 3 of the tile
    var acc: array<vec4<f32>, 16>;
    for (var p = 0u; p < params.k; p = p + 1u) {
        let pa = p * params.a_cs;
        let pb = p * params.b_rs;
        let bv0 = vec4<f32>(b[bcol[0] + pb], b[bcol[1] + pb], b[bcol[2] + pb], b[bcol[3] + pb]);
        var bv1 = vec4<f32>(0.0);
        if (T == 8u) {
            bv1 = vec4<f32>(b[bcol[4] + pb], b[bcol[5] + pb], b[bcol[6] + pb], b[bcol[7] + pb]);
        }
        for (var i = 0u; i < TM; i = i + 1u) {
            let av = vec4<f32>(a[arow[i] + pa]);
            acc[2u * i] = fma(av, bv0, acc[2u * i]);
            if (T == 8u) {
                acc[2u * i + 1u] = fma(av, bv1, acc[2u * i + 1u]);
            }
        }
    }
    for (var i = 0u; i < TM; i = i + 1u) {
        for (var j = 0u; j < T; j = j + 1u) {
            store(bi, m0 + WY * i, n0 + WS * j, acc[2u * i + j / 4u][j % 4u]);
        }
    }
}
