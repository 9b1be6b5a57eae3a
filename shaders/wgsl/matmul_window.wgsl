// matmul_window: matmul_vec4.wgsl's product for adapters that run shaders on the CPU, with A's
// rows read from a uniform buffer: the runtime's 64 KiB window of A's rows row_start ..
// row_end (flat over batches, K floats each; the host cuts the product into dispatches whose
// rows fit). A workgroup's invocations share their rows and differ in columns, so an A index is
// uniform (workgroup and loop counters only): on llvmpipe that is one scalar load and a
// broadcast, where a storage load is a per-lane loop with a bounds check. B stays storage.
// Preconditions (the host checks them): A's rows contiguous across batches (a_rs = K, batch
// strides M * K), B one matrix for every batch, b_cs = 1, N and b_rs multiples of 4 (K any:
// K_UNALIGNED in matmul_window_body.wgsl).
// Params, bindings 2 and 4: the prelude matmul_common.wgsl (m_lo, b0 and the batch shapes and
// strides unused). Out is written four columns a store (0.75x the time of float stores here).
// Bindings: 0 a (uniform window), 1 b (vec4), 2 c (read; MatMul binds b again there), 3 out
// (read_write), 4 params. The product is matmul_window_body.wgsl; matmul_window_texture.wgsl
// reads B from a texture instead.
// Dispatch: (ceil(N / 64), ceil(rows / TM)) workgroups of 8 invocations, each keeping TM window
// rows x 8 contiguous columns. Overrides: TM (rows an invocation, 8 or the window's fewer),
// K_UNALIGNED, HAS_C, C_ROW.

@group(0) @binding(1) var<storage, read> b: array<vec4<f32>>;

// B's vec4 `i`.
fn b4(i: u32) -> vec4<f32> {
    return b[i];
}
