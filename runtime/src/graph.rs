//! tandem's own model graph: nodes with built operators, values with names and types.
//!
//! Sits between the importer (`import.rs`, the only code that knows ONNX) and the planner and
//! executor. Node and value names are the original ONNX names, for errors and reports.

use std::sync::Arc;
use tandem_ops::{DType, Op, Tensor};

/// Index of a value in [`Graph::values`].
pub type ValueId = usize;

/// One dimension of a declared shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dim {
    Fixed(usize),
    /// A named or unknown dimension (`dim_param`, or nothing declared).
    Symbolic(String),
}

/// A named value: a graph input, an initializer, or a node output.
#[derive(Debug, Clone)]
pub struct Value {
    pub name: String,
    /// Declared element type, if the model declares one.
    pub dtype: Option<DType>,
    /// Declared shape, if the model declares one.
    pub shape: Option<Vec<Dim>>,
    /// Contents, for initializers and `Constant` outputs.
    pub constant: Option<Arc<Tensor>>,
}

/// One operator application.
#[derive(Debug)]
pub struct Node {
    /// The ONNX node name (or `<op_type>_<index>` when the model gives none).
    pub name: String,
    pub op_type: String,
    pub domain: String,
    pub opset: i64,
    /// Input values in ONNX order; `None` for an omitted optional input (empty name).
    pub inputs: Vec<Option<ValueId>>,
    pub outputs: Vec<ValueId>,
    pub op: Box<dyn Op>,
    /// The ONNX attributes the operator was built from, each protobuf-encoded and
    /// length-prefixed, in name order: with the op type, domain and opset, what tells two
    /// nodes' operators apart (`fuse/repeated.rs`). `None` for nodes the runtime makes, which
    /// are then never merged.
    pub attributes: Option<Vec<u8>>,
}

/// A whole model, nodes in topological order.
#[derive(Debug, Default)]
pub struct Graph {
    pub values: Vec<Value>,
    pub nodes: Vec<Node>,
    /// Graph inputs that are not initializers: what `run` must be given.
    pub inputs: Vec<ValueId>,
    pub outputs: Vec<ValueId>,
}

impl Graph {
    /// The value named `name`.
    pub fn value_id(&self, name: &str) -> Option<ValueId> {
        self.values.iter().position(|v| v.name == name)
    }
}
