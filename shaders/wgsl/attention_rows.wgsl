// attention_rows: attention_rows_body.wgsl (its prelude) reading Q, Kt and V as floats through
// their strides along D and Dv.
// Bindings: 0 q, 1 kt, 2 v.

@group(0) @binding(0) var<storage, read> q: array<f32>;
@group(0) @binding(1) var<storage, read> kt: array<f32>;
@group(0) @binding(2) var<storage, read> v: array<f32>;

fn q4(at: u32) -> vec4<f32> {
    let s = params.q_cs;
    return vec4<f32>(q[at], q[at + s], q[at + 2u * s], q[at + 3u * s]);
}

fn kt4(at: u32) -> vec4<f32> {
    let s = params.k_rs;
    return vec4<f32>(kt[at], kt[at + s], kt[at + 2u * s], kt[at + 3u * s]);
}

fn v4(at: u32) -> vec4<f32> {
    let s = params.v_cs;
    return vec4<f32>(v[at], v[at + s], v[at + 2u * s], v[at + 3u * s]);
}
