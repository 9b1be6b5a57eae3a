// attention: out[b, i, :] = softmax(mask(scale(Q[b, i, :] . Kt[b, :, j])) over j) @ V[b]
// for the output rows r = b * sq + i with params.row_start <= r < row_start + rows (the fused
// MatMul, Div or Mul, Add or Where, Softmax, MatMul chain; ops/src/attention.rs). Q, Kt, V and
// the mask are read through row/column strides and per-batch strides (0 where broadcast).
// scale_mode 0: none, 1: x * scale, 2: x / scale. masked 0: none, 1: x + mask (f32 bits),
// 2: (mask != 0) == keep ? x : fill (bool as u32). One invocation per row, two passes over the
// keys: the maximum, then exp(x - max) summed and accumulated against V (at most 128 value
// elements). A row whose maximum is infinite gives NaN, as the Softmax kernels do.
// Bindings: 0 q, 1 kt, 2 v, 3 mask (q again when there is none), 4 out (read_write), 5 params.
// Overrides: WG.

override WG: u32 = 64u;

struct Params {
    sq: u32,
    sk: u32,
    d: u32,
    dv: u32,
    row_start: u32,
    rows: u32,
    nbd: u32,
    scale_mode: u32,
    scale: f32,
    masked: u32,
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
    // output batch dims (nbd of them), then each operand's element stride per batch dim
    bshape: array<vec4<u32>, 2>,
    q_bs: array<vec4<u32>, 2>,
    k_bs: array<vec4<u32>, 2>,
    v_bs: array<vec4<u32>, 2>,
    m_bs: array<vec4<u32>, 2>,
}

@group(0) @binding(0) var<storage, read> q: array<f32>;
@group(0) @binding(1) var<storage, read> kt: array<f32>;
@group(0) @binding(2) var<storage, read> v: array<f32>;
@group(0) @binding(3) var<storage, read> mask: array<u32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
@group(0) @binding(5) var<uniform> params: Params;

// scaled and masked score of key j for the query row at q_at (mask row at m_at)
fn score(q_at: u32, k_off: u32, m_at: u32, j: u32) -> f32 {
    var s = 0.0;
    let k_at = k_off + j * params.k_cs;
    for (var c = 0u; c < params.d; c = c + 1u) {
        s = s + q[q_at + c * params.q_cs] * kt[k_at + c * params.k_rs];
    }
    if (params.scale_mode == 1u) {
        s = s * params.scale;
    } else if (params.scale_mode == 2u) {
        s = s / params.scale;
    }
    if (params.masked == 1u) {
        s = s + bitcast<f32>(mask[m_at + j * params.m_cs]);
    } else if (params.masked == 2u && (mask[m_at + j * params.m_cs] != 0u) != (params.keep != 0u)) {
        s = params.fill;
    }
    return s;
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = gid.x + gid.y * nwg.x * WG;
    if (t >= params.rows) {
        return;
    }
    let r = params.row_start + t;
    let i = r % params.sq;
    var rem = r / params.sq;
    var q_off = 0u;
    var k_off = 0u;
    var v_off = 0u;
    var m_off = 0u;
    for (var dd = i32(params.nbd) - 1; dd >= 0; dd = dd - 1) {
        let du = u32(dd);
        let dim = params.bshape[du / 4u][du % 4u];
        let idx = rem % dim;
        rem = rem / dim;
        q_off = q_off + idx * params.q_bs[du / 4u][du % 4u];
        k_off = k_off + idx * params.k_bs[du / 4u][du % 4u];
        v_off = v_off + idx * params.v_bs[du / 4u][du % 4u];
        m_off = m_off + idx * params.m_bs[du / 4u][du % 4u];
    }
    if (params.sk == 0u) {
        for (var c = 0u; c < params.dv; c = c + 1u) {
            out[r * params.dv + c] = 0.0;
        }
        return;
    }
    let q_at = q_off + i * params.q_rs;
    let m_at = m_off + i * params.m_rs;
    var m = score(q_at, k_off, m_at, 0u);
    for (var j = 1u; j < params.sk; j = j + 1u) {
        let s = score(q_at, k_off, m_at, j);
        if (s > m) {
            m = s;
        }
    }
    var acc: array<f32, 128>;
    for (var c = 0u; c < params.dv; c = c + 1u) {
        acc[c] = 0.0;
    }
    var total = 0.0;
    for (var j = 0u; j < params.sk; j = j + 1u) {
        let e = exp(score(q_at, k_off, m_at, j) - m);
        total = total + e;
        let v_at = v_off + j * params.v_rs;
        for (var c = 0u; c < params.dv; c = c + 1u) {
            acc[c] = acc[c] + e * v[v_at + c * params.v_cs];
        }
    }
    let inv = 1.0 / total;
    for (var c = 0u; c < params.dv; c = c + 1u) {
        out[r * params.dv + c] = acc[c] * inv;
    }
}
