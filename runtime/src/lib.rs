//! tandem: run ONNX models on the CPU and the GPU together.

pub mod cost;
pub mod costs;
pub mod cpu_info;
pub mod error;
pub mod exec;
pub mod fuse;
pub mod fuzzgen;
pub mod gpu;
pub mod graph;
pub mod import;
pub mod layout;
pub mod limits;
pub mod npy;
mod onnx_proto;
pub mod plan;
pub mod recover;
pub mod report;
pub mod schedule;
pub mod session;
pub mod simulate;
pub mod testing;
pub mod trace;

pub use error::{Error, Result};
pub use plan::{Device, Placement, Selector};
pub use report::RunReport;
pub use session::{Session, SessionOptions};
pub use tandem_ops::{DType, Data, Tensor, TensorMeta};

/// The ONNX op types (default domain) tandem implements, sorted.
pub fn supported_ops() -> Vec<&'static str> {
    tandem_ops::registry::supported()
}
