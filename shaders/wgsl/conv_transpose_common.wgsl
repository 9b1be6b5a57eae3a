// conv_transpose_common: the params and bindings 2-4 that conv_transpose.wgsl and
// conv_transpose_2x2.wgsl share (each declares its own x and w, bindings 0 and 1).
// Bindings: 2 bias (read; w bound again when has_bias = 0), 3 out (read_write), 4 params.
// Overrides: WG (workgroup size).

override WG: u32 = 64u;

struct Params {
    n: u32,
    c: u32,
    h: u32,
    w: u32,
    m: u32,
    oh: u32,
    ow: u32,
    kh: u32,
    kw: u32,
    sh: u32,
    sw: u32,
    dh: u32,
    dw: u32,
    pt: i32,
    pl: i32,
    cg: u32,
    mg: u32,
    has_bias: u32,
    e_start: u32,
    count: u32,
    // conv_transpose_2x2.wgsl's first channel block and invocations (0 for conv_transpose)
    blk0: u32,
    threads: u32,
}

@group(0) @binding(2) var<storage, read> bias: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<uniform> params: Params;
