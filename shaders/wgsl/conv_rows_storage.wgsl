// conv_rows_storage: conv_rows.wgsl (its prelude) reading W from a storage buffer, where a
// channel block's weights overflow a uniform window (conv_rows_uniform.wgsl).

@group(0) @binding(1) var<storage, read> w: array<f32>;

fn weight(k: u32) -> f32 {
    return w[k];
}
