// matmul_window_texture: matmul_window.wgsl's product (matmul_window_body.wgsl) with B read
// from a texture: the runtime copies B's buffer into an rgba32uint texture TEXTURE_WIDTH texels
// wide, vec4 i at (i % TEXTURE_WIDTH, i / TEXTURE_WIDTH) (`GpuKernel::texture_inputs`). On
// llvmpipe a texel fetch at an index that differs between lanes is a gather, where a storage
// load is a loop over the lanes with a branch and a bounds check each: B's loads, one per
// four FMAs an invocation, were most of the window kernel's time.
// Bindings and dispatch: matmul_window.wgsl's, binding 1 the texture.

@group(0) @binding(1) var b: texture_2d<u32>;

// Texels a row of the texture (ops' TEXTURE_WIDTH).
const TEXTURE_WIDTH: u32 = 1024u;

// B's vec4 `i`.
fn b4(i: u32) -> vec4<f32> {
    return bitcast<vec4<f32>>(textureLoad(b, vec2<u32>(i % TEXTURE_WIDTH, i / TEXTURE_WIDTH), 0));
}
