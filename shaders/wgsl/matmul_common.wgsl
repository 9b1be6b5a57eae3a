// matmul_common: the Params, the C and params bindings and the batch offsets the MatMul kernels
// share (Params mirrored by MatmulParams in ops/src/matmul.rs). Each kernel declares its own
// A (binding 0) and B (binding 1); out (binding 3) and the store come from matmul_store.wgsl
// (floats; matmul.wgsl and matmul_vec4.wgsl) or the kernel (vec4s; matmul_window.wgsl).
// Bindings: 2 c (read; MatMul binds b again there), 4 params.

struct Params {
    m: u32,
    n: u32,
    k: u32,
    row_start: u32,
    row_end: u32,
    m_lo: u32,
    b0: u32,
    nbd: u32,
    a_rs: u32,
    a_cs: u32,
    b_rs: u32,
    b_cs: u32,
    c_rs: u32,
    c_cs: u32,
    alpha: f32,
    beta: f32,
    // output batch dims (nbd of them), then A's and B's element strides per batch dim
    bshape: array<vec4<u32>, 2>,
    a_bs: array<vec4<u32>, 2>,
    b_bs: array<vec4<u32>, 2>,
}

@group(0) @binding(2) var<storage, read> c: array<f32>;
@group(0) @binding(4) var<uniform> params: Params;

// The element offsets of batch `bi` in A and B.
fn batch_offsets(bi: u32) -> vec2<u32> {
    var rem = bi;
    var off = vec2<u32>(0u);
    for (var d = i32(params.nbd) - 1; d >= 0; d = d - 1) {
        let du = u32(d);
        let dim = params.bshape[du / 4u][du % 4u];
        let idx = rem % dim;
        rem = rem / dim;
        off = off + idx * vec2<u32>(params.a_bs[du / 4u][du % 4u], params.b_bs[du / 4u][du % 4u]);
    }
    return off;
}
