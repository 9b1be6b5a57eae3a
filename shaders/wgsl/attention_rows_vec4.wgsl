// attention_rows_vec4: attention_rows_body.wgsl (its prelude) reading Q, Kt and V as vec4s:
// one load for 4 elements, where lavapipe loops over the lanes for each storage load.
// Preconditions (the host checks them): Q rows, Kt columns and V rows contiguous along D and
// Dv (q_cs = k_rs = v_cs = 1), and every other stride and batch stride a multiple of 4.
// Bindings: 0 q, 1 kt, 2 v (vec4).

@group(0) @binding(0) var<storage, read> q: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> kt: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> v: array<vec4<f32>>;

fn q4(at: u32) -> vec4<f32> {
    return q[at / 4u];
}

fn kt4(at: u32) -> vec4<f32> {
    return kt[at / 4u];
}

fn v4(at: u32) -> vec4<f32> {
    return v[at / 4u];
}
