//! RMSNorm fusion: the chain exported Llama-style models spell RMSNorm as,
//! `Div(x, Sqrt(Add(ReduceMean(Pow(x, 2)), eps))) * scale` (ONNX's own RMSNormalization
//! expansion, with `Mul(x, x)` in place of the Pow), becomes one RMSNormalization node: one pass
//! over each row instead of six kernels and five intermediates.
//!
//! Sits inside the fusion pass (`fuse.rs`), which asks [`chain_from`] about each node. Only the
//! last-axis form folds (ReduceMean `axes = [-1]`, keepdims), with a scalar f32 epsilon and a
//! 1-D f32 constant scale: whatever the input's rank, that is RMSNormalization over the last
//! axis with the same broadcasting.

use super::{const_of, is, scalar, Uses};
use crate::graph::{Graph, ValueId};

/// An RMSNorm chain found from its first node.
pub(super) struct RmsChain {
    /// The normalised input and the scale.
    pub x: ValueId,
    pub scale: ValueId,
    pub eps: f32,
    /// The chain's nodes after the first, in order; the last one's output is the result.
    pub rest: Vec<usize>,
}

/// The RMSNorm chain that starts at node `i` (`Pow(x, 2)` or `Mul(x, x)`), when every value
/// between its nodes has the next node as its only reader.
pub(super) fn chain_from(graph: &Graph, uses: &Uses, i: usize) -> Option<RmsChain> {
    let node = |n: usize, op: &str| is(graph, n, op).then_some(&graph.nodes[n]);
    let first = &graph.nodes[i];
    let x = match (first.op_type.as_str(), first.inputs.as_slice()) {
        ("Pow", [Some(x), Some(e)]) if scalar(graph, uses, *e) == Some(2.0) => *x,
        ("Mul", [Some(x), Some(y)]) if x == y => *x,
        _ => return None,
    };
    node(i, &first.op_type)?;
    let next = |v: ValueId, op: &str| {
        let r = uses.sole_reader(v)?;
        Some((r, node(r, op)?))
    };
    let (mean, mean_node) = next(first.outputs[0], "ReduceMean")?;
    let axes = match mean_node.inputs.get(1).copied().flatten() {
        Some(a) => Some(const_of(graph, uses, a, 4)?),
        None => None,
    };
    if !tandem_ops::reduce::is_mean_over_last_axis(mean_node.op.as_ref(), axes.as_deref()) {
        return None;
    }
    let (add, add_node) = next(mean_node.outputs[0], "Add")?;
    let eps = match add_node.inputs.as_slice() {
        [Some(a), Some(b)] if *a == mean_node.outputs[0] => scalar(graph, uses, *b)?,
        [Some(a), Some(b)] if *b == mean_node.outputs[0] => scalar(graph, uses, *a)?,
        _ => return None,
    };
    let (sqrt, sqrt_node) = next(add_node.outputs[0], "Sqrt")?;
    let (div, div_node) = next(sqrt_node.outputs[0], "Div")?;
    if div_node.inputs.as_slice() != [Some(x), Some(sqrt_node.outputs[0])] {
        return None;
    }
    let (mul, mul_node) = next(div_node.outputs[0], "Mul")?;
    let scale = match mul_node.inputs.as_slice() {
        [Some(a), Some(s)] | [Some(s), Some(a)] if *a == div_node.outputs[0] => *s,
        _ => return None,
    };
    let scale_t = const_of(graph, uses, scale, 4)?;
    (scale_t.shape.len() == 1 && scale_t.as_f32().is_some()).then_some(RmsChain {
        x,
        scale,
        eps,
        rest: vec![mean, add, sqrt, div, mul],
    })
}
