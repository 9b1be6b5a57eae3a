// attention: out[b, i, :] = softmax(mask(scale(Q[b, i, :] . Kt[b, :, j])) over j) @ V[b]
// for the output rows r = b * sq + i with params.row_start <= r < row_start + rows (the fused
// MatMul, Div or Mul, Add or Where, Softmax, MatMul chain; ops/src/attention.rs). Q, Kt, V and
// the mask are read through row/column strides and per-batch strides (0 where broadcast).
// scale_mode 0: none, 1: x * scale, 2: x / scale. masked 0: none, 1: x + mask (f32 bits),
// 2: (mask != 0) == keep ? x : fill (bool as u32). One invocation per row, two passes over the
// keys: the maximum, then exp(x - max) summed and accumulated against V (at most 128 value
// elements). A row whose maximum is infinite gives NaN, as the Softmax kernels do.
// Params and bindings 3-5: attention_common.wgsl.
// Bindings: 0 q, 1 kt, 2 v.
// Overrides: WG.

@group(0) @binding(0) var<storage, read> q: array<f32>;
@group(0) @binding(1) var<storage, read> kt: array<f32>;
@group(0) @binding(2) var<storage, read> v: array<f32>;

override WG: u32 = 64u;

// scaled and masked score of key j for the query row at q_at (mask row at m_at)
fn score(q_at: u32, k_off: u32, m_at: u32, j: u32) -> f32 {
    var s = 0.0;
    let k_at = k_off + j * params.k_cs;
    for (var c = 0u; c < params.d; c = c + 1u) {
        s = s + q[q_at + c * params.q_cs] * kt[k_at + c * params.k_rs];
    }
    return scale_mask(s, m_at, j);
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = gid.x + gid.y * nwg.x * WG;
    if (t >= params.rows) {
        return;
    }
    let r = params.row_start + t;
    let i = r % params.sq;
    let off = batch_offsets(r / params.sq);
    let q_off = off.x;
    let k_off = off.y;
    let v_off = off.z;
    let m_off = off.w;
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
