// attention_common: the Params and bindings the attention kernels share (mirrored by
// AttentionParams in ops/src/attention.rs), and their helpers. Each kernel declares q, kt and v
// (floats, or vec4s in attention_rows_vec4.wgsl).
// Bindings: 0 q, 1 kt, 2 v, 3 mask (q again when there is none), 4 out (read_write), 5 params.
// Overrides: SCALE_MODE (0 none, 1 multiply by params.scale, 2 divide) and MASKED (0 no mask,
// 1 added, 2 selecting: params.fill where the mask differs from params.keep), so each score
// compiles without the others' code (lavapipe runs both sides of a branch on a uniform value).

override SCALE_MODE: u32;
override MASKED: u32;

struct Params {
    sq: u32,
    sk: u32,
    d: u32,
    dv: u32,
    row_start: u32,
    rows: u32,
    nbd: u32,
    scale: f32,
    q_rs: u32,
    q_cs: u32,
    k_rs: u32,
    k_cs: u32,
    v_rs: u32,
    v_cs: u32,
    m_rs: u32,
    m_cs: u32,
    fill: f32,
    keep: u32,
    _pad0: u32,
    _pad1: u32,
    // output batch dims (nbd of them), then each operand's element stride per batch dim
    bshape: array<vec4<u32>, 2>,
    q_bs: array<vec4<u32>, 2>,
    k_bs: array<vec4<u32>, 2>,
    v_bs: array<vec4<u32>, 2>,
    m_bs: array<vec4<u32>, 2>,
}

@group(0) @binding(3) var<storage, read> mask: array<u32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
@group(0) @binding(5) var<uniform> params: Params;

// The element offsets of Q, Kt, V and the mask for output batch `batch` (row / sq).
fn batch_offsets(batch: u32) -> vec4<u32> {
    var rem = batch;
    var off = vec4<u32>(0u);
    for (var dd = i32(params.nbd) - 1; dd >= 0; dd = dd - 1) {
        let du = u32(dd);
        let dim = params.bshape[du / 4u][du % 4u];
        let idx = rem % dim;
        rem = rem / dim;
        off = off + idx * vec4<u32>(
            params.q_bs[du / 4u][du % 4u],
            params.k_bs[du / 4u][du % 4u],
            params.v_bs[du / 4u][du % 4u],
            params.m_bs[du / 4u][du % 4u],
        );
    }
    return off;
}

// The score s0 (Q . Kt column j) scaled and masked, the mask row starting at m_at.
fn scale_mask(s0: f32, m_at: u32, j: u32) -> f32 {
    var s = s0;
    if (SCALE_MODE == 1u) {
        s = s * params.scale;
    } else if (SCALE_MODE == 2u) {
        s = s / params.scale;
    }
    if (MASKED == 1u) {
        s = s + bitcast<f32>(mask[m_at + j * params.m_cs]);
    } else if (MASKED == 2u && (mask[m_at + j * params.m_cs] != 0u) != (params.keep != 0u)) {
        s = params.fill;
    }
    return s;
}
