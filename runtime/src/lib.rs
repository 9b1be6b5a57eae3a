//! tandem: run ONNX models on the CPU and the GPU together.

pub mod error;
pub mod gpu;
pub mod graph;
pub mod testing;

pub use error::{Error, Result};
pub use tandem_ops::{DType, Data, Tensor, TensorMeta};
