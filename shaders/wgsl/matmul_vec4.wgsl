// matmul_vec4: matmul.wgsl's product for adapters that run shaders on the CPU (lavapipe,
// SwiftShader), when A's rows and B's rows are contiguous and 16-byte aligned: A and B are read
// as vec4s, four k of an A row and four columns of a B row a load, where matmul.wgsl loads one
// float (a per-lane gather there) for each. Same Params, dispatch and results as matmul.wgsl;
// an invocation keeps TM rows x 8 contiguous columns (lanes 8 columns apart), WS = 8.
// Preconditions (the host checks them): a_cs = b_cs = 1, K, N, a_rs, b_rs and every batch
// offset multiples of 4.
// Params, bindings 2 and 4: the prelude matmul_common.wgsl; out and the store: matmul_store.wgsl
// (a vec4 store there took 1.6x the time on lavapipe).
// Bindings: 0 a (vec4), 1 b (vec4), 2 c (read; MatMul binds b again there), 3 out (read_write),
// 4 params. Overrides: TM and WY (8 and 8, or 1 and 1 when M is 1).

@group(0) @binding(0) var<storage, read> a: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> b: array<vec4<f32>>;

override TM: u32 = 8u;
override WY: u32 = 8u;

@compute @workgroup_size(8, WY)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let bi = params.b0 + wid.z;
    let offs = batch_offsets(bi);
    let a_off = offs.x;
    let b_off = offs.y;
    let m0 = params.m_lo + wid.y * WY * TM + lid.y;
    let n0 = wid.x * 64u + lid.x * 8u;
    // vec4 indices: A row i at k = 0, B's columns n0 .. n0 + 3 and n0 + 4 .. n0 + 7 at k = 0
    // (clamped to column 0 past N: computed, never written).
    var arow: array<u32, 8>;
    for (var i = 0u; i < TM; i = i + 1u) {
        let mi = m0 + WY * i;
        arow[i] = (a_off + select(0u, mi, mi < params.m) * params.a_rs) / 4u;
    }
    let bc0 = (b_off + select(0u, n0, n0 < params.n)) / 4u;
    let bc1 = (b_off + select(0u, n0 + 4u, n0 + 4u < params.n)) / 4u;
    let brs = params.b_rs / 4u;
    // acc[2 i + h]: row i, columns n0 + 4 h .. n0 + 4 h + 3
    var acc: array<vec4<f32>, 16>;
    for (var p = 0u; p < params.k; p = p + 4u) {
        let pb = p * brs;
        let b00 = b[bc0 + pb];
        let b01 = b[bc1 + pb];
        let b10 = b[bc0 + pb + brs];
        let b11 = b[bc1 + pb + brs];
        let b20 = b[bc0 + pb + 2u * brs];
        let b21 = b[bc1 + pb + 2u * brs];
        let b30 = b[bc0 + pb + 3u * brs];
        let b31 = b[bc1 + pb + 3u * brs];
        for (var i = 0u; i < TM; i = i + 1u) {
            let av = a[arow[i] + p / 4u];
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
    for (var i = 0u; i < TM; i = i + 1u) {
        for (var j = 0u; j < 8u; j = j + 1u) {
            store(bi, m0 + WY * i, n0 + j, acc[2u * i + j / 4u][j % 4u]);
        }
    }
}
