//! tandem's operators: shared tensor types and one file per operator family, each with shape
//! inference, a work estimate, a rayon CPU kernel over any row range of its output, and the
//! description of its WGSL kernel.
//!
//! Sits between the shaders (`tandem-shaders`) and the runtime (`tandem`). No wgpu device code
//! and no ONNX protobuf here.

pub mod arity;
pub mod attention;
mod attrs;
pub mod binary;
pub mod cast;
pub mod concat_split;
pub mod conv;
pub mod conv_transpose;
pub mod cpu_gemm;
pub mod cpu_gemm_packed;
mod elementwise_common;
mod exp_fma;
pub mod expand_tile;
pub mod gather;
pub mod gemm_op;
pub mod generate;
mod gpu_kernel;
mod kept;
#[cfg(target_arch = "x86_64")]
mod lanes;
pub mod matmul;
pub mod movement;
pub mod norm;
pub mod norm_channel;
mod op;
pub mod pad;
pub mod parallel;
mod phase_planes;
pub mod pool;
pub mod reduce;
pub mod registry;
pub mod resize;
pub mod rotary;
pub mod shape;
pub mod simd;
pub mod slice;
pub mod softmax;
mod tensor;
pub mod transpose;
pub mod unary;
pub mod view;
pub mod where_op;

pub use attrs::{AttrValue, Attrs};
pub use gpu_kernel::{
    GpuKernel, UniformWindow, TEXTURE_MAX_ROWS, TEXTURE_WIDTH, UNIFORM_WINDOW_BYTES,
};
pub use op::{Op, OpError, Result, Work};
pub use tensor::{DType, Data, Tensor, TensorMeta};
