// matmul_window_texture: matmul_window.wgsl's product (matmul_window_body.wgsl) with B read
// from a texture (texel.wgsl, the prelude): B's loads, one per four FMAs an invocation, were
// most of the window kernel's time while they were storage loads.
// Bindings and dispatch: matmul_window.wgsl's, binding 1 the texture.

@group(0) @binding(1) var b: texture_2d<u32>;

// B's vec4 `i`.
fn b4(i: u32) -> vec4<f32> {
    return texel(b, i);
}
