// texel: the layout of an input bound as a texture (`GpuKernel::texture_inputs`): the runtime
// copies the input's buffer into an rgba32uint texture TEXTURE_WIDTH texels wide, its vec4 i at
// texel (i % TEXTURE_WIDTH, i / TEXTURE_WIDTH). On llvmpipe a texel fetch at an index that
// differs between lanes is a gather, where a storage load is a loop over the lanes with a
// branch and a bounds check each.

// Texels a row of the texture (ops' TEXTURE_WIDTH).
const TEXTURE_WIDTH: u32 = 1024u;

// The input's vec4 `i`.
fn texel(t: texture_2d<u32>, i: u32) -> vec4<f32> {
    return bitcast<vec4<f32>>(textureLoad(t, vec2<u32>(i % TEXTURE_WIDTH, i / TEXTURE_WIDTH), 0));
}
