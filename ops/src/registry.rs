//! The table from ONNX op type to operator constructor: one line per operator.
//!
//! Sits between the runtime's importer (which looks op types up here) and the operator files.

use crate::{Attrs, Op, OpError, Result};

/// Builds an operator from its attributes (validating them).
pub type Constructor = fn(&Attrs) -> Result<Box<dyn Op>>;

/// Every supported op type of the default ONNX domain, with its constructor.
pub const OPS: &[(&str, Constructor)] = &[
    ("MatMul", crate::matmul::matmul),
    ("Gemm", crate::gemm_op::gemm),
];

/// Build the operator for `op_type` of the default domain.
pub fn build(op_type: &str, attrs: &Attrs) -> Result<Box<dyn Op>> {
    match OPS.iter().find(|(name, _)| *name == op_type) {
        Some((_, make)) => make(attrs),
        None => Err(OpError::Unsupported(format!(
            "op type `{op_type}` is not implemented; supported: {}",
            supported().join(", ")
        ))),
    }
}

/// Names of the supported op types, sorted.
pub fn supported() -> Vec<&'static str> {
    let mut v: Vec<_> = OPS.iter().map(|(n, _)| *n).collect();
    v.sort();
    v
}
