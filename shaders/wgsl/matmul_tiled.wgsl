// matmul_tiled: matmul.wgsl's product (same params, bindings, dispatch grid and store:
// matmul_common.wgsl, matmul_store.wgsl) through workgroup memory, for GPUs. A 16 x 16
// workgroup computes a 64 x 64 tile of the output (rows m_lo + 64 wid.y .., columns 64 wid.x
// ..), each invocation 4 rows x 4 consecutive columns (tile_staging.wgsl). Per step of 16 k
// the workgroup stages the tile's A (64 x 16) and B (16 x 64), each element loaded once from
// storage by one invocation (neighbouring invocations: neighbouring k of A, neighbouring
// columns of B), and each staged value then feeds 4 FMAs of 16 invocations; matmul.wgsl's
// invocations each load their own A and B values from storage, through the caches.
// Not for adapters that run shaders on the CPU (lavapipe runs a barrier as a join of the
// workgroup's lanes), nor for one-row products (matmul.wgsl's one-row workgroups).

@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;

@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32,
        @builtin(local_invocation_id) lid: vec3<u32>) {
    let bi = params.b0 + wid.z;
    let offs = batch_offsets(bi);
    let m_tile = params.m_lo + wid.y * TILE;
    let n_tile = wid.x * TILE;
    // The A elements this invocation stages: row m_tile + li / 4, k 4 (li % 4) .. + 3 of the
    // step (a row past M clamped to the last: its sums are never stored).
    let a_r = li / 4u;
    let a_k = (li % 4u) * 4u;
    let a_row = offs.x + min(m_tile + a_r, params.m - 1u) * params.a_rs;
    // The B elements: column n_tile + li % 64, step rows 4 (li / 64) .. + 3.
    let b_c = li % TILE;
    let b_k = (li / TILE) * 4u;
    let b_col = offs.y + min(n_tile + b_c, params.n - 1u) * params.b_cs;

    var acc = array<vec4<f32>, 4>(vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0));
    for (var k0 = 0u; k0 < params.k; k0 = k0 + KT) {
        for (var j = 0u; j < 4u; j = j + 1u) {
            let ka = k0 + a_k + j;
            let av = a[a_row + min(ka, params.k - 1u) * params.a_cs];
            stage_row(a_k + j, a_r, select(0.0, av, ka < params.k));
            let kb = k0 + b_k + j;
            let bv = b[b_col + min(kb, params.k - 1u) * params.b_rs];
            stage_col(b_k + j, b_c, select(0.0, bv, kb < params.k));
        }
        accumulate(&acc, lid);
    }
    for (var i = 0u; i < 4u; i = i + 1u) {
        for (var j = 0u; j < 4u; j = j + 1u) {
            store(bi, m_tile + 4u * lid.y + i, n_tile + 4u * lid.x + j, acc[i][j]);
        }
    }
}
