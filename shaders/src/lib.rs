//! WGSL compute kernels of tandem, one file per kernel family, embedded as strings.
//!
//! Sits between the `.wgsl` sources in `wgsl/` and the operator crate (`tandem-ops`), which names
//! the shader each GPU kernel runs. This crate holds no logic: every shader follows the binding
//! convention below and is parsed and validated by naga in this crate's tests.
//!
//! Binding convention (group 0): the op's bound inputs first, then its outputs, then one `params`
//! uniform last. An input may be declared `var<uniform>` as `array<vec4<f32>, 4096>`: the runtime
//! binds a 64 KiB window of it there (`GpuKernel::uniform_window`), or `texture_2d<u32>`: the
//! runtime copies it into an rgba32uint texture there (`GpuKernel::texture_inputs`). Entry point `main`. Sizes
//! (`WG`, tiles) are `override` constants, and so is what selects the code path of a node inside
//! its per-element work (an op code, an element mode, a fused activation, a rank): a pipeline per
//! value, since lavapipe runs both sides of a branch on a uniform value, so a `switch` over
//! `params` costs every case there (unary, binary, cast, gather, conv, reduce, pool, resize, pad,
//! norm, softmax, attention, where and index_map do this; the other shaders branch on `params` only
//! outside their loops or in rarely hot ops). Data dependent values go in `params`, never into
//! shader text. Every element on the GPU is 4 bytes: `f32` for floats, `i32` for integers (int64 is
//! narrowed with a range check on upload), `u32` for bool. Flat invocation index over a 2-D grid
//! (to stay under 65535 workgroups per dimension):
//! `let i = gid.x + gid.y * nwg.x * WG;`

/// One compute shader: a stable name (used in pipeline cache keys and reports) and its source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Shader {
    pub name: &'static str,
    pub source: &'static str,
}

/// `shader!(CONST, "file")` embeds `wgsl/file.wgsl`; `shader!(CONST, "file", "prelude", ...)`
/// puts the prelude files' text in front of it: shared helper functions, or the params and
/// bindings of a family whose kernels share them (`attention_common`, `conv_common`).
macro_rules! shader {
    ($ident:ident, $file:literal $(, $prelude:literal)*) => {
        pub const $ident: Shader = Shader {
            name: $file,
            source: concat!(
                $(include_str!(concat!("../wgsl/", $prelude, ".wgsl")),)*
                include_str!(concat!("../wgsl/", $file, ".wgsl"))
            ),
        };
    };
}

/// `named_shader!(CONST, "name", "file", ...)`: the files' text in order under a name of its own,
/// for a kernel that is a combination of files (conv_rows' W and X bindings).
macro_rules! named_shader {
    ($ident:ident, $name:literal $(, $file:literal)+) => {
        pub const $ident: Shader = Shader {
            name: $name,
            source: concat!($(include_str!(concat!("../wgsl/", $file, ".wgsl")),)+),
        };
    };
}

shader!(COPY, "copy");
shader!(COPY_VEC4, "copy_vec4");
shader!(UNARY, "unary", "float_bits");
shader!(BINARY, "binary", "float_bits", "pow_c99");
shader!(WHERE, "where");
shader!(ROTARY, "rotary");
shader!(CAST, "cast");
shader!(SOFTMAX, "softmax", "float_bits");
shader!(REDUCE, "reduce", "float_bits", "reduce_common");
shader!(REDUCE_WIDE, "reduce_wide", "float_bits", "reduce_common");
shader!(POOL, "pool", "float_bits");
shader!(NORM, "norm");
shader!(NORM_STATS, "norm_stats");
shader!(BATCHNORM, "batchnorm", "float_bits");
shader!(LRN, "lrn", "float_bits", "pow_c99");
shader!(INDEX_MAP, "index_map");
shader!(GATHER, "gather");
shader!(PAD, "pad");
shader!(RESIZE, "resize", "float_bits");
shader!(GENERATE, "generate");
shader!(MATMUL, "matmul", "matmul_common", "matmul_store");
shader!(MATMUL_VEC4, "matmul_vec4", "matmul_common", "matmul_store");
shader!(
    MATMUL_TILED,
    "matmul_tiled",
    "matmul_common",
    "matmul_store",
    "tile_staging"
);
shader!(
    MATMUL_WINDOW,
    "matmul_window",
    "matmul_common",
    "matmul_window_body"
);
shader!(
    MATMUL_WINDOW_TEXTURE,
    "matmul_window_texture",
    "texel",
    "matmul_common",
    "matmul_window_body"
);
shader!(CONV, "conv", "float_bits", "conv_common");
shader!(
    CONV_TILED,
    "conv_tiled",
    "float_bits",
    "conv_common",
    "tile_staging"
);
shader!(
    CONV_POINTWISE,
    "conv_pointwise",
    "float_bits",
    "conv_common",
    "conv_pointwise_x_vec4"
);
named_shader!(
    CONV_POINTWISE_STRIDED,
    "conv_pointwise_strided",
    "float_bits",
    "conv_common",
    "conv_pointwise_x_pixels",
    "conv_pointwise"
);
shader!(
    CONV_ROWS,
    "conv_rows_storage",
    "float_bits",
    "conv_common",
    "conv_rows",
    "conv_rows_x_storage"
);
shader!(
    CONV_ROWS_UNIFORM,
    "conv_rows_uniform",
    "float_bits",
    "conv_common",
    "conv_rows",
    "conv_rows_x_storage"
);
named_shader!(
    CONV_ROWS_TEXTURE,
    "conv_rows_texture",
    "texel",
    "float_bits",
    "conv_common",
    "conv_rows",
    "conv_rows_x_texture",
    "conv_rows_storage"
);
named_shader!(
    CONV_ROWS_UNIFORM_TEXTURE,
    "conv_rows_uniform_texture",
    "texel",
    "float_bits",
    "conv_common",
    "conv_rows",
    "conv_rows_x_texture",
    "conv_rows_uniform"
);
shader!(CONV_TRANSPOSE, "conv_transpose", "conv_transpose_common");
shader!(
    CONV_TRANSPOSE_2X2,
    "conv_transpose_2x2",
    "conv_transpose_common"
);
shader!(ATTENTION, "attention", "attention_common");
shader!(
    ATTENTION_ROWS,
    "attention_rows",
    "attention_common",
    "attention_rows_body"
);
shader!(
    ATTENTION_ROWS_VEC4,
    "attention_rows_vec4",
    "attention_common",
    "attention_rows_body"
);
shader!(
    ATTENTION_ROWS_TEXTURE,
    "attention_rows_texture",
    "texel",
    "attention_common",
    "attention_rows_body"
);

/// Every shader of the crate, for validation and contract tests.
pub const ALL: &[Shader] = &[
    COPY,
    COPY_VEC4,
    UNARY,
    BINARY,
    WHERE,
    ROTARY,
    CAST,
    SOFTMAX,
    REDUCE,
    REDUCE_WIDE,
    POOL,
    NORM,
    NORM_STATS,
    BATCHNORM,
    LRN,
    INDEX_MAP,
    GATHER,
    PAD,
    RESIZE,
    GENERATE,
    MATMUL,
    MATMUL_VEC4,
    MATMUL_TILED,
    MATMUL_WINDOW,
    MATMUL_WINDOW_TEXTURE,
    CONV,
    CONV_TILED,
    CONV_POINTWISE,
    CONV_POINTWISE_STRIDED,
    CONV_ROWS,
    CONV_ROWS_UNIFORM,
    CONV_ROWS_TEXTURE,
    CONV_ROWS_UNIFORM_TEXTURE,
    CONV_TRANSPOSE,
    CONV_TRANSPOSE_2X2,
    ATTENTION,
    ATTENTION_ROWS,
    ATTENTION_ROWS_VEC4,
    ATTENTION_ROWS_TEXTURE,
];
