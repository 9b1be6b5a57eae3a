//! The runtime's error type: every failure a caller cannot foresee, with the node it concerns.
//!
//! Sits between every runtime module (which produce these) and the public API.

use tandem_ops::{DType, OpError};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The model file could not be read.
    #[error("cannot read model {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The bytes are not a valid ONNX model (bad protobuf, broken graph, bad initializer...).
    #[error("invalid model: {0}")]
    InvalidModel(String),
    /// A node failed: bad attributes, unsupported op or dtype, inconsistent shapes.
    #[error("node `{node}` ({op_type}, opset {opset}): {source}")]
    Node {
        node: String,
        op_type: String,
        opset: i64,
        #[source]
        source: OpError,
    },
    /// An input given to `run` does not match the model.
    #[error("input `{name}`: {reason}")]
    Input { name: String, reason: String },
    /// A model input was not given.
    #[error("missing input `{name}` ({dtype}, shape {shape})")]
    MissingInput {
        name: String,
        dtype: DType,
        shape: String,
    },
    /// No usable GPU adapter, or the GPU failed.
    #[error("gpu: {0}")]
    Gpu(String),
    /// Anything else a caller asked for that cannot be done (bad option, unknown node name...).
    #[error("{0}")]
    Usage(String),
    /// A run would need more of a resource than the session allows (checked before allocating).
    #[error("{resource} limit: the run needs {needed} bytes, the limit is {limit} ({detail})")]
    ResourceLimit {
        resource: &'static str,
        needed: u64,
        limit: u64,
        detail: String,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
