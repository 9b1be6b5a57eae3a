// attention_rows_texture: attention_rows_vec4.wgsl with Kt and V read from textures: the runtime
// copies each into an rgba32uint texture TEXTURE_WIDTH texels wide, vec4 i at
// (i % TEXTURE_WIDTH, i / TEXTURE_WIDTH) (`GpuKernel::texture_inputs`). On llvmpipe a texel
// fetch at an index that differs between lanes is a gather, where a storage load loops over the
// lanes with a branch and a bounds check each. Q, loaded once an invocation, stays storage.
// Preconditions: attention_rows_vec4.wgsl's. Bindings: 0 q (vec4), 1 kt, 2 v (textures).

@group(0) @binding(0) var<storage, read> q: array<vec4<f32>>;
@group(0) @binding(1) var kt: texture_2d<u32>;
@group(0) @binding(2) var v: texture_2d<u32>;

// Texels a row of the textures (ops' TEXTURE_WIDTH).
const TEXTURE_WIDTH: u32 = 1024u;

fn q4(at: u32) -> vec4<f32> {
    return q[at / 4u];
}

fn kt4(at: u32) -> vec4<f32> {
    let i = at / 4u;
    return bitcast<vec4<f32>>(textureLoad(kt, vec2<u32>(i % TEXTURE_WIDTH, i / TEXTURE_WIDTH), 0));
}

fn v4(at: u32) -> vec4<f32> {
    let i = at / 4u;
    return bitcast<vec4<f32>>(textureLoad(v, vec2<u32>(i % TEXTURE_WIDTH, i / TEXTURE_WIDTH), 0));
}
