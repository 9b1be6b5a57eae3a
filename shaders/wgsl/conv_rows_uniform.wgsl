// conv_rows_uniform: conv_rows.wgsl (its prelude) reading W from a uniform buffer, the
// runtime's 64 KiB window of W's elements w_first .. w_first + 16384 (the host cuts a conv into
// dispatches whose channels' weights fit). On llvmpipe a uniform load is a vector load (a
// scalar and a broadcast where its index is uniform) and a storage load a per-lane loop with a
// bounds check: a 3x3 32 -> 32 conv on 80 x 80 ran in 0.61x the time.

@group(0) @binding(1) var<uniform> w: array<vec4<f32>, 4096>;

fn weight(k: u32) -> f32 {
    return w[k / 4u][k % 4u];
}
