// attention_rows_body: attention.wgsl's output (the same bindings and params; one pass over the
// keys with a running max where attention.wgsl makes two) with R query rows of one batch an
// invocation, for adapters that run shaders on the CPU
// (ops/src/attention.rs). There each storage load is a per-lane gather: the rows' Q stay in
// registers (D = 4 * D4 elements) and each key's Kt column and V row, loaded once, serve R
// rows. Invocation t takes the rows i0 .. i0 + R of batch b for block b * ceil(sq / R) + i0 / R
// = (block of row_start) + t, writing those inside row_start .. row_start + rows.
// Only for sk > 0 (the op keeps attention.wgsl when there are no keys: zero rows).
// This file is the prelude of the two kernels, which declare Q, Kt and V (bindings 0-2) and
// q4, kt4 and v4 (the 4 elements of a Q row, a Kt column, a V row from an element on):
// attention_rows.wgsl (floats through strides) and attention_rows_vec4.wgsl (vec4 loads).
// Params and bindings 3-5: attention_common.wgsl.
// Overrides: WG, R (1 to 4), D4 = d / 4 and DV4 = dv / 4 (each 1 to 16).

override WG: u32 = 64u;
override R: u32 = 4u;
override D4: u32 = 8u;
override DV4: u32 = 8u;

// Q . Kt[:, j] of the R rows in qr (row rr at qr[16 rr ..]); Kt's column j starts at k_at
fn dots(qr: ptr<function, array<vec4<f32>, 64>>, k_at: u32) -> vec4<f32> {
    var s = vec4<f32>(0.0);
    for (var c4 = 0u; c4 < D4; c4 = c4 + 1u) {
        let c = 4u * c4;
        let kv = kt4(k_at + c * params.k_rs);
        for (var rr = 0u; rr < R; rr = rr + 1u) {
            s[rr] = s[rr] + dot((*qr)[16u * rr + c4], kv);
        }
    }
    return s;
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = gid.x + gid.y * nwg.x * WG;
    let sq = params.sq;
    let nb = (sq + R - 1u) / R;
    let first = params.row_start;
    let last = params.row_start + params.rows - 1u;
    let blk = (first / sq) * nb + (first % sq) / R + t;
    if (params.rows == 0u || blk > (last / sq) * nb + (last % sq) / R) {
        return;
    }
    let bi = blk / nb;
    let i0 = (blk % nb) * R;
    let off = batch_offsets(bi);
    let q_off = off.x;
    let k_off = off.y;
    let v_off = off.z;
    let m_off = off.w;
    // rows past sq read row sq - 1 and are not written
    var qr: array<vec4<f32>, 64>;
    var m_at = vec4<u32>(0u);
    for (var rr = 0u; rr < R; rr = rr + 1u) {
        let i = min(i0 + rr, sq - 1u);
        let q_at = q_off + i * params.q_rs;
        m_at[rr] = m_off + i * params.m_rs;
        for (var c4 = 0u; c4 < D4; c4 = c4 + 1u) {
            let c = 4u * c4;
            qr[16u * rr + c4] = q4(q_at + c * params.q_cs);
        }
    }
    // One pass over the keys with a running max (online softmax): each row's sum and output
    // are rescaled by exp(old max - new max) when the max grows, so every key's Kt column and
    // mask value are loaded once, not once for the max and again for the sum. A max still at
    // -inf (keys masked so far) scales nothing and adds nothing.
    var mx = vec4<f32>(0.0);
    var acc: array<vec4<f32>, 64>;
    var total = vec4<f32>(0.0);
    for (var j = 0u; j < params.sk; j = j + 1u) {
        let s = dots(&qr, k_off + j * params.k_cs);
        var e = vec4<f32>(0.0);
        var corr = vec4<f32>(1.0);
        for (var rr = 0u; rr < R; rr = rr + 1u) {
            let x = scale_mask(s[rr], m_at[rr], j);
            let old = select(mx[rr], x, j == 0u);
            let m = max(old, x);
            // below -FLT_MAX (3.4028234663852886e38: Chrome rejects a literal above it)
            let none = m < -3.4028234663852886e38;
            corr[rr] = select(exp(old - m), 1.0, old == m);
            e[rr] = select(exp(x - m), 0.0, none);
            mx[rr] = m;
        }
        total = total * corr + e;
        let v_at = v_off + j * params.v_rs;
        for (var c4 = 0u; c4 < DV4; c4 = c4 + 1u) {
            let c = 4u * c4;
            let vv = v4(v_at + c * params.v_cs);
            for (var rr = 0u; rr < R; rr = rr + 1u) {
                let a = acc[16u * rr + c4] * corr[rr];
                acc[16u * rr + c4] = fma(vec4<f32>(e[rr]), vv, a);
            }
        }
    }
    for (var rr = 0u; rr < R; rr = rr + 1u) {
        let i = i0 + rr;
        let r = bi * sq + i;
        if (i >= sq || r < first || r > last) {
            continue;
        }
        let inv = 1.0 / total[rr];
        let dv = 4u * DV4;
        for (var c4 = 0u; c4 < DV4; c4 = c4 + 1u) {
            let o = acc[16u * rr + c4] * inv;
            for (var k = 0u; k < 4u; k = k + 1u) {
                out[r * dv + 4u * c4 + k] = o[k];
            }
        }
    }
}
