//! tandem's operators: shared tensor types and one file per operator family, each with shape
//! inference, a work estimate, a rayon CPU kernel over any row range of its output, and the
//! description of its WGSL kernel.
//!
//! Sits between the shaders (`tandem-shaders`) and the runtime (`tandem`). No wgpu device code
//! and no ONNX protobuf here.

mod attrs;
pub mod concat_split;
pub mod expand_tile;
pub mod gather;
pub mod generate;
pub mod movement;
pub mod pad;
pub mod resize;
pub mod slice;
pub mod transpose;
pub mod view;
pub mod binary;
pub mod cast;
mod elementwise_common;
pub mod unary;
pub mod where_op;
pub mod conv;
pub mod conv_transpose;
pub mod cpu_gemm;
pub mod gemm_op;
pub mod matmul;
mod gpu_kernel;
pub mod norm;
pub mod norm_channel;
pub mod pool;
pub mod reduce;
pub mod softmax;
mod op;
pub mod registry;
pub mod shape;
mod tensor;

pub use attrs::{AttrValue, Attrs};
pub use gpu_kernel::GpuKernel;
pub use op::{Op, OpError, Result, Work};
pub use tensor::{DType, Data, Tensor, TensorMeta};
