//! The ONNX importer: model bytes to a validated, topologically sorted [`Graph`].
//!
//! Sits between `.onnx` files (read with the hand-written prost messages of `onnx_proto`; see
//! docs/importer.md for why not onnx-ir) and the rest of the runtime, which never sees ONNX.
//!
//! What it does, in order: decodes the protobuf; maps `opset_import` per domain (`""` and
//! `"ai.onnx"` are the default domain); converts initializers (raw, typed or external data);
//! takes graph inputs that are not initializers as [`Graph::inputs`] with their declared dtype
//! and shape; converts each node's attributes and builds its operator with
//! `tandem_ops::registry::build`; folds `Constant` nodes into constant values (they do not
//! appear in [`Graph::nodes`]); resolves node inputs by name (empty name: `None`; trailing
//! `None`s are dropped); sorts the nodes topologically (models may list them out of order).
//!
//! Errors: [`Error::InvalidModel`] for a malformed model (bad protobuf, dangling input, value
//! produced twice, cycle, data length not matching dims, graph output not produced...);
//! [`Error::Node`] for what one node cannot do: unsupported op (from the registry), domain,
//! attribute kind (subgraphs), or value type (dtype string, bfloat16..., sequences, sparse
//! initializers: reported on the first node that reads or writes the value). Never panics on
//! model input.

mod attrs;
mod tensor;

use crate::graph::{Dim, Graph, Node, Value, ValueId};
use crate::onnx_proto::{GraphProto, ModelProto, NodeProto, TensorProto, ValueInfoProto};
use crate::{Error, Result};
use prost::Message;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use tandem_ops::{OpError, Tensor};

/// The ONNX protobuf messages tandem reads, for tests and tools that build models by hand.
pub mod proto {
    pub use crate::onnx_proto::*;
}
pub use tensor::MAX_TENSOR_BYTES;

/// What is wrong with one piece of a model, before the importer knows which error to raise.
#[derive(Debug, Clone)]
pub(crate) enum Problem {
    /// The model is malformed.
    Invalid(String),
    /// Valid ONNX that tandem does not support.
    Unsupported(String),
}

impl Problem {
    fn context(self, what: &str) -> Problem {
        match self {
            Problem::Invalid(m) => Problem::Invalid(format!("{what}: {m}")),
            Problem::Unsupported(m) => Problem::Unsupported(format!("{what}: {m}")),
        }
    }

    fn op_error(self) -> OpError {
        match self {
            Problem::Invalid(m) => OpError::Invalid(m),
            Problem::Unsupported(m) => OpError::Unsupported(m),
        }
    }
}

/// Imports the model at `path`; external data files are looked up in the model's folder.
pub fn import_file(path: &Path) -> Result<Graph> {
    let bytes = std::fs::read(path).map_err(|source| Error::Io {
        path: path.display().to_string(),
        source,
    })?;
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    // Decoding from `Bytes` makes every `raw_data` a slice of this buffer: the weights are
    // copied once, into their tensors.
    import_model(
        ModelProto::decode(prost::bytes::Bytes::from(bytes)),
        Some(dir),
    )
}

/// Imports a model from its serialized bytes. `base_dir` is the folder external data paths
/// are relative to; with `None`, a model with external data is refused.
pub fn import_bytes(bytes: &[u8], base_dir: Option<&Path>) -> Result<Graph> {
    import_model(ModelProto::decode(bytes), base_dir)
}

fn import_model(
    decoded: Result<ModelProto, prost::DecodeError>,
    base_dir: Option<&Path>,
) -> Result<Graph> {
    let model =
        decoded.map_err(|e| Error::InvalidModel(format!("not an ONNX model (protobuf: {e})")))?;
    let graph = model
        .graph
        .as_ref()
        .ok_or_else(|| Error::InvalidModel("the model has no graph".into()))?;
    Builder::new(&model, base_dir).build(graph)
}

/// Reads a serialized `TensorProto` (the `test_data_set_N/*.pb` files of ONNX tests): its
/// name and contents. Unsupported dtypes give [`Error::Input`]; malformed data
/// [`Error::InvalidModel`].
pub fn read_tensor_pb(bytes: &[u8]) -> Result<(String, Tensor)> {
    let t = TensorProto::decode(bytes)
        .map_err(|e| Error::InvalidModel(format!("not a TensorProto (protobuf: {e})")))?;
    match tensor::tensor_from_proto(&t, None) {
        Ok(tensor) => Ok((t.name, tensor)),
        Err(Problem::Unsupported(reason)) => Err(Error::Input {
            name: t.name,
            reason,
        }),
        Err(Problem::Invalid(m)) => Err(Error::InvalidModel(format!("tensor `{}`: {m}", t.name))),
    }
}

/// A node whose inputs are not resolved yet (models may list nodes out of order).
struct PendingNode {
    node: Node,
    input_names: Vec<String>,
}

struct Builder<'m> {
    base_dir: Option<&'m Path>,
    /// Opset version per domain (default domain as `""`).
    opsets: HashMap<String, i64>,
    /// Names of model-local functions, as `domain:name`.
    functions: HashSet<String>,
    values: Vec<Value>,
    ids: HashMap<String, ValueId>,
    /// Values tandem cannot represent, reported on the first node that touches them.
    unsupported: HashMap<String, String>,
    /// Declared types of intermediate and output values.
    declared: HashMap<&'m str, &'m ValueInfoProto>,
}

fn invalid(m: String) -> Error {
    Error::InvalidModel(m)
}

impl<'m> Builder<'m> {
    fn new(model: &'m ModelProto, base_dir: Option<&'m Path>) -> Builder<'m> {
        let mut opsets = HashMap::new();
        for o in &model.opset_import {
            let d = normalize_domain(&o.domain).to_string();
            let v = opsets.entry(d).or_insert(o.version);
            *v = (*v).max(o.version);
        }
        // IR versions before 3 had no opset_import: opset 1 of the default domain is implied.
        if model.ir_version < 3 && !opsets.contains_key("") {
            opsets.insert(String::new(), 1);
        }
        Builder {
            base_dir,
            opsets,
            functions: model
                .functions
                .iter()
                .map(|f| format!("{}:{}", normalize_domain(&f.domain), f.name))
                .collect(),
            values: Vec::new(),
            ids: HashMap::new(),
            unsupported: HashMap::new(),
            declared: HashMap::new(),
        }
    }

    /// Adds a value named `name`, refusing a second definition of the same name.
    fn define(&mut self, value: Value, what: &str) -> Result<ValueId> {
        if value.name.is_empty() {
            return Err(invalid(format!("{what} has an empty name")));
        }
        if self.ids.contains_key(&value.name) {
            return Err(invalid(format!(
                "value `{}` is produced twice (again as {what})",
                value.name
            )));
        }
        let id = self.values.len();
        self.ids.insert(value.name.clone(), id);
        self.values.push(value);
        Ok(id)
    }

    fn build(mut self, g: &'m GraphProto) -> Result<Graph> {
        // Names read by some node or graph output: unused unsupported initializers are dropped.
        let mut used: HashSet<&str> = g.output.iter().map(|o| o.name.as_str()).collect();
        for n in &g.node {
            used.extend(n.input.iter().map(|s| s.as_str()));
        }
        for vi in g.value_info.iter().chain(&g.output) {
            self.declared.insert(vi.name.as_str(), vi);
        }

        let mut initializer_names = HashSet::new();
        for s in &g.sparse_initializer {
            let name = s
                .values
                .as_ref()
                .map(|v| v.name.clone())
                .unwrap_or_default();
            initializer_names.insert(name.clone());
            if used.contains(name.as_str()) {
                self.unsupported.insert(
                    name.clone(),
                    format!("`{name}` is a sparse initializer: sparse tensors are not supported"),
                );
                self.define(placeholder(&name), "a sparse initializer")?;
            }
        }
        for t in &g.initializer {
            initializer_names.insert(t.name.clone());
            self.initializer(t, used.contains(t.name.as_str()))?;
        }

        let mut inputs = Vec::new();
        for vi in &g.input {
            if initializer_names.contains(&vi.name) {
                continue;
            }
            let value = match tensor::declared_type(vi) {
                Ok((dtype, shape)) => Value {
                    dtype,
                    shape,
                    ..placeholder(&vi.name)
                },
                Err(Problem::Invalid(m)) => {
                    return Err(invalid(format!("graph input `{}`: {m}", vi.name)))
                }
                Err(Problem::Unsupported(m)) => {
                    if !used.contains(vi.name.as_str()) {
                        return Err(value_error(&vi.name, "graph input", m));
                    }
                    self.unsupported
                        .insert(vi.name.clone(), format!("input `{}`: {m}", vi.name));
                    placeholder(&vi.name)
                }
            };
            inputs.push(self.define(value, "a graph input")?);
        }

        let mut pending = Vec::with_capacity(g.node.len());
        for (index, n) in g.node.iter().enumerate() {
            if let Some(p) = self.node(index, n)? {
                pending.push(p);
            }
        }
        let nodes = self.resolve_and_sort(pending)?;

        if g.output.is_empty() {
            return Err(invalid("the graph declares no outputs".into()));
        }
        let mut outputs = Vec::with_capacity(g.output.len());
        for o in &g.output {
            let id = *self.ids.get(&o.name).ok_or_else(|| {
                invalid(format!(
                    "graph output `{}` is not produced by any node, initializer or input",
                    o.name
                ))
            })?;
            if let Some(m) = self.unsupported.get(&o.name) {
                return Err(value_error(&o.name, "graph output", m.clone()));
            }
            outputs.push(id);
        }
        Ok(Graph {
            values: self.values,
            nodes,
            inputs,
            outputs,
        })
    }

    fn initializer(&mut self, t: &TensorProto, used: bool) -> Result<()> {
        let value = match tensor::tensor_from_proto(t, self.base_dir) {
            Ok(tensor) => Value {
                dtype: Some(tensor.dtype()),
                shape: Some(tensor.shape.iter().map(|&d| Dim::Fixed(d)).collect()),
                constant: Some(Arc::new(tensor)),
                ..placeholder(&t.name)
            },
            Err(Problem::Invalid(m)) => {
                return Err(invalid(format!("initializer `{}`: {m}", t.name)))
            }
            Err(Problem::Unsupported(m)) if used => {
                let m = format!("initializer `{}`: {m}", t.name);
                self.unsupported.insert(t.name.clone(), m);
                placeholder(&t.name)
            }
            Err(Problem::Unsupported(_)) => return Ok(()),
        };
        self.define(value, "an initializer")?;
        Ok(())
    }

    /// Converts one node: its op (or, for `Constant`, its value) and its output values.
    fn node(&mut self, index: usize, n: &'m NodeProto) -> Result<Option<PendingNode>> {
        if n.op_type.is_empty() {
            return Err(invalid(format!("node {index} has no op_type")));
        }
        let name = if n.name.is_empty() {
            format!("{}_{index}", n.op_type)
        } else {
            n.name.clone()
        };
        let domain = normalize_domain(&n.domain).to_string();
        let opset = self.opsets.get(&domain).copied();
        let fail = |p: Problem| Error::Node {
            node: name.clone(),
            op_type: n.op_type.clone(),
            opset: opset.unwrap_or(0),
            source: p.op_error(),
        };
        if !domain.is_empty() {
            let what = if self.functions.contains(&format!("{domain}:{}", n.op_type)) {
                "model-local functions are not supported".to_string()
            } else {
                "only the default ONNX domain is supported".to_string()
            };
            return Err(fail(Problem::Unsupported(format!(
                "domain `{domain}`: {what}"
            ))));
        }
        let opset = opset.ok_or_else(|| {
            invalid(format!(
                "node `{name}` ({}) uses the default domain, which opset_import does not list",
                n.op_type
            ))
        })?;
        if opset < 1 {
            return Err(invalid(format!(
                "node `{name}` ({}): opset_import gives the default domain version {opset}; \
                 opset versions start at 1",
                n.op_type
            )));
        }
        let mut attrs = attrs::convert_attrs(n, opset, self.base_dir).map_err(fail)?;
        for input in n.input.iter().filter(|s| !s.is_empty()) {
            if let Some(m) = self.unsupported.get(input) {
                return Err(fail(Problem::Unsupported(m.clone())));
            }
        }

        if n.op_type == "Constant" {
            let t = attrs::constant_value(&attrs).map_err(fail)?;
            if n.output.len() != 1 || !n.input.is_empty() {
                return Err(fail(Problem::Invalid(
                    "Constant takes no inputs and has exactly one output".into(),
                )));
            }
            let value = Value {
                dtype: Some(t.dtype()),
                shape: Some(t.shape.iter().map(|&d| Dim::Fixed(d)).collect()),
                constant: Some(Arc::new(t)),
                ..placeholder(&n.output[0])
            };
            self.define(value, &format!("the output of node `{name}`"))?;
            return Ok(None);
        }

        if let Some((min, max)) = tandem_ops::arity::input_count(&n.op_type, opset) {
            let given = n.input.len();
            if given < min || given > max {
                let want = match (min, max) {
                    (a, b) if a == b => format!("{a}"),
                    (a, b) if b >= 1 << 16 => format!("at least {a}"),
                    (a, b) => format!("{a} to {b}"),
                };
                return Err(fail(Problem::Invalid(format!(
                    "{} (opset {opset}) takes {want} inputs, the node has {given}",
                    n.op_type
                ))));
            }
            if let Some(i) = n.input[..min].iter().position(|s| s.is_empty()) {
                return Err(fail(Problem::Invalid(format!(
                    "input {i} of {} is required but the node leaves it empty",
                    n.op_type
                ))));
            }
        }

        // Split with neither `split` sizes nor `num_outputs` splits into as many equal parts as
        // the node has outputs: only the graph knows that count, so pass it on.
        let split_sizes_given = attrs.has("split") || n.input.get(1).is_some_and(|s| !s.is_empty());
        if n.op_type == "Split" && !split_sizes_given && !attrs.has("num_outputs") {
            attrs.values.insert(
                "num_outputs".into(),
                tandem_ops::AttrValue::Int(n.output.len() as i64),
            );
        }
        let op = tandem_ops::registry::build(&n.op_type, &attrs).map_err(|source| Error::Node {
            node: name.clone(),
            op_type: n.op_type.clone(),
            opset,
            source,
        })?;
        // Omitted trailing outputs are dropped; omitted middle ones get a private name.
        let kept = n
            .output
            .iter()
            .rposition(|o| !o.is_empty())
            .map_or(0, |i| i + 1);
        let mut outputs = Vec::with_capacity(kept);
        for (i, out) in n.output[..kept].iter().enumerate() {
            let value = if out.is_empty() {
                let mut private = format!("{name}:unused_output_{i}");
                while self.ids.contains_key(&private) {
                    private.push('_');
                }
                placeholder(&private)
            } else {
                let (dtype, shape) = match self.declared.get(out.as_str()) {
                    Some(vi) => tensor::declared_type(vi)
                        .map_err(|p| fail(p.context(&format!("output `{out}`"))))?,
                    None => (None, None),
                };
                Value {
                    dtype,
                    shape,
                    ..placeholder(out)
                }
            };
            outputs.push(self.define(value, &format!("an output of node `{name}`"))?);
        }
        let node = Node {
            name,
            op_type: n.op_type.clone(),
            domain,
            opset,
            inputs: Vec::new(),
            outputs,
            op,
            attributes: Some(attribute_bytes(n)),
        };
        Ok(Some(PendingNode {
            node,
            input_names: n.input.clone(),
        }))
    }

    /// Resolves node inputs by name and orders the nodes so that producers come first
    /// (stable: among ready nodes, the one listed first in the model goes first).
    fn resolve_and_sort(&self, pending: Vec<PendingNode>) -> Result<Vec<Node>> {
        let mut producer: HashMap<ValueId, usize> = HashMap::new();
        for (i, p) in pending.iter().enumerate() {
            for &o in &p.node.outputs {
                producer.insert(o, i);
            }
        }
        let mut nodes = Vec::with_capacity(pending.len());
        let mut preds: Vec<Vec<usize>> = Vec::with_capacity(pending.len());
        for p in pending {
            let mut node = p.node;
            let mut deps = Vec::new();
            for name in &p.input_names {
                if name.is_empty() {
                    node.inputs.push(None);
                    continue;
                }
                let id = *self.ids.get(name).ok_or_else(|| {
                    invalid(format!(
                        "node `{}` ({}) reads `{name}`, which is not a graph input, initializer \
                         or node output",
                        node.name, node.op_type
                    ))
                })?;
                if let Some(&src) = producer.get(&id) {
                    deps.push(src);
                }
                node.inputs.push(Some(id));
            }
            while node.inputs.last() == Some(&None) {
                node.inputs.pop();
            }
            deps.sort_unstable();
            deps.dedup();
            preds.push(deps);
            nodes.push(node);
        }

        let n = nodes.len();
        let mut succs: Vec<Vec<usize>> = vec![Vec::new(); n];
        let mut indegree = vec![0usize; n];
        for (i, deps) in preds.iter().enumerate() {
            indegree[i] = deps.len();
            for &d in deps {
                succs[d].push(i);
            }
        }
        let mut ready: BinaryHeap<Reverse<usize>> =
            (0..n).filter(|&i| indegree[i] == 0).map(Reverse).collect();
        let mut order = Vec::with_capacity(n);
        while let Some(Reverse(i)) = ready.pop() {
            order.push(i);
            for &s in &succs[i] {
                indegree[s] -= 1;
                if indegree[s] == 0 {
                    ready.push(Reverse(s));
                }
            }
        }
        if order.len() < n {
            // Every node left has an unsorted predecessor; walking back n steps from any of
            // them must end inside a cycle.
            let mut cur = (0..n).find(|&i| indegree[i] > 0).expect("a node is left");
            for _ in 0..n {
                cur = *preds[cur]
                    .iter()
                    .find(|&&p| indegree[p] > 0)
                    .expect("a left node has a left predecessor");
            }
            return Err(invalid(format!(
                "the graph has a cycle through node `{}` ({})",
                nodes[cur].name, nodes[cur].op_type
            )));
        }
        let mut slots: Vec<Option<Node>> = nodes.into_iter().map(Some).collect();
        Ok(order
            .into_iter()
            .map(|i| slots[i].take().expect("each node is placed once"))
            .collect())
    }
}

/// `n`'s attributes, each protobuf-encoded and length-prefixed, in name order
/// ([`Node::attributes`]).
fn attribute_bytes(n: &NodeProto) -> Vec<u8> {
    let mut each: Vec<_> = n.attribute.iter().map(|a| (&a.name, a)).collect();
    each.sort_by_key(|(name, _)| *name);
    each.iter()
        .flat_map(|(_, a)| a.encode_length_delimited_to_vec())
        .collect()
}

/// A value with a name only.
fn placeholder(name: &str) -> Value {
    Value {
        name: name.to_string(),
        dtype: None,
        shape: None,
        constant: None,
    }
}

/// An unsupported value that no node touches (a graph input passed straight to the output,
/// or unused): reported as a node error whose "node" is the value itself.
fn value_error(name: &str, role: &str, m: String) -> Error {
    Error::Node {
        node: name.to_string(),
        op_type: format!("({role})"),
        opset: 0,
        source: OpError::Unsupported(m),
    }
}

/// `"ai.onnx"` and `""` both name the default domain.
fn normalize_domain(d: &str) -> &str {
    if d == "ai.onnx" {
        ""
    } else {
        d
    }
}
