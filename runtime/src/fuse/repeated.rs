//! Repeated nodes merged (common-subexpression elimination): a node that does what an earlier
//! node does, to the same inputs, is dropped, and its readers read the earlier node's outputs.
//!
//! "What a node does" is its op type, domain, opset, ONNX attributes (as the importer encoded
//! them, [`Node::attributes`]) and output count. Inputs are the same when they are the same
//! value, or constants of at most [`SMALL_CONSTANT`] elements with equal type, shape and bits
//! (the shapes, axes and scalars that exporters repeat as separate initializers); larger
//! constants only by identity, so that load time never compares weights. Matches cascade in
//! node order: the light zoo's models make each weight with a `ConstantOfShape` of a small
//! shape initializer, so equal weights become one value, and then Convs of one input and equal
//! weights become one node, and the BatchNormalization after them too where its parameters are
//! equal. inception_v2's branches repeat 9 of its 69 Convs that way (onnxruntime merges them
//! as well, in its `CommonSubexpressionElimination`); densenet121 makes 770 of its weights
//! twice.
//!
//! Never merged: a node without inputs or attributes known to the importer (runtime-made
//! graphs), random generators (equal calls draw different numbers), and a node that writes a
//! graph output (its name must stay the caller's).
//!
//! Sits between the importer (which records the attributes) and the rest of `fuse.rs`, which
//! runs it first, so a merged Conv's chain fuses once.

use crate::graph::{Graph, Node, ValueId};
use std::collections::HashMap;
use tandem_ops::DType;

/// Constants of at most this many elements are compared by contents.
pub const SMALL_CONSTANT: usize = 64;

/// Ops whose equal calls give different results.
const RANDOM: [&str; 6] = [
    "RandomNormal",
    "RandomNormalLike",
    "RandomUniform",
    "RandomUniformLike",
    "Multinomial",
    "Bernoulli",
];

/// A node dropped for repeating an earlier one.
#[derive(Debug, Clone, PartialEq)]
pub struct Merged {
    pub op_type: String,
    /// The dropped node's name.
    pub dropped: String,
    /// The earlier node's name, whose outputs the dropped node's readers read.
    pub kept: String,
}

/// An input as [`merge`] compares it.
#[derive(Hash, PartialEq, Eq)]
enum Input {
    Omitted,
    Value(ValueId),
    Small(DType, Vec<usize>, Vec<u8>),
}

/// What makes two nodes the same computation.
#[derive(Hash, PartialEq, Eq)]
struct Key {
    op_type: String,
    domain: String,
    opset: i64,
    attributes: Vec<u8>,
    outputs: usize,
    inputs: Vec<Input>,
}

/// Drop every node that repeats an earlier one (module docs), in place; node order stays
/// topological. Returns the dropped nodes, in order.
pub fn merge(graph: &mut Graph) -> Vec<Merged> {
    let mut alias: Vec<ValueId> = (0..graph.values.len()).collect();
    let mut is_output = vec![false; graph.values.len()];
    graph.outputs.iter().for_each(|&v| is_output[v] = true);
    let mut first: HashMap<Key, usize> = HashMap::new();
    let (mut merged, mut dropped) = (Vec::new(), std::collections::HashSet::new());
    for i in 0..graph.nodes.len() {
        for v in graph.nodes[i].inputs.iter_mut().flatten() {
            *v = alias[*v];
        }
        let node = &graph.nodes[i];
        let Some(key) = key(graph, node, &is_output) else {
            continue;
        };
        let Some(&k) = first.get(&key) else {
            first.insert(key, i);
            continue;
        };
        for (&o, &earlier) in node.outputs.iter().zip(&graph.nodes[k].outputs) {
            alias[o] = earlier;
        }
        merged.push(Merged {
            op_type: node.op_type.clone(),
            dropped: node.name.clone(),
            kept: graph.nodes[k].name.clone(),
        });
        dropped.insert(i);
    }
    let mut at = 0..;
    graph
        .nodes
        .retain(|_| !dropped.contains(&at.next().unwrap_or(0)));
    merged
}

/// `node`'s key, or `None` for a node never merged (module docs).
fn key(graph: &Graph, node: &Node, is_output: &[bool]) -> Option<Key> {
    let attributes = node.attributes.as_ref()?;
    if node.inputs.is_empty()
        || RANDOM.contains(&node.op_type.as_str())
        || node.outputs.iter().any(|&o| is_output[o])
    {
        return None;
    }
    Some(Key {
        op_type: node.op_type.clone(),
        domain: node.domain.clone(),
        opset: node.opset,
        attributes: attributes.clone(),
        outputs: node.outputs.len(),
        inputs: node.inputs.iter().map(|v| input(graph, *v)).collect(),
    })
}

fn input(graph: &Graph, v: Option<ValueId>) -> Input {
    let Some(v) = v else {
        return Input::Omitted;
    };
    match graph.values[v].constant.as_deref() {
        Some(t) if t.numel() <= SMALL_CONSTANT => {
            Input::Small(t.dtype(), t.shape.clone(), t.data.to_le_bytes())
        }
        _ => Input::Value(v),
    }
}
