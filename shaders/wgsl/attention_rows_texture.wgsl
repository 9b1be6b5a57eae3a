// attention_rows_texture: attention_rows_vec4.wgsl with Kt and V read from textures (texel.wgsl,
// the prelude). Q, loaded once an invocation, stays storage.
// Preconditions: attention_rows_vec4.wgsl's. Bindings: 0 q (vec4), 1 kt, 2 v (textures).

@group(0) @binding(0) var<storage, read> q: array<vec4<f32>>;
@group(0) @binding(1) var kt: texture_2d<u32>;
@group(0) @binding(2) var v: texture_2d<u32>;

fn q4(at: u32) -> vec4<f32> {
    return q[at / 4u];
}

fn kt4(at: u32) -> vec4<f32> {
    return texel(kt, at / 4u);
}

fn v4(at: u32) -> vec4<f32> {
    return texel(v, at / 4u);
}
