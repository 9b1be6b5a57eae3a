//! Gelu fusion: the chain BERT-style exports spell exact Gelu as, `Mul(Mul(x, Add(Erf(Div(x,
//! sqrt 2)), 1)), 0.5)` (each Mul's operands in either order, or `Mul(x, 1 / sqrt 2)` for the
//! Div), becomes one Gelu node: one pass over the FFN's activations instead of five kernels
//! and four intermediates.
//!
//! Sits inside the fusion pass (`fuse.rs`), which asks [`chain_from`] about each node. The
//! constants must be scalars within 1e-6 of sqrt 2 (or its inverse), 1 and 0.5; the Gelu
//! kernel computes `0.5 * x * (1 + erf(x / sqrt 2))` (`x * FRAC_1_SQRT_2`, within an ulp of
//! the Div).

use super::{default_domain, scalar, Uses};
use crate::graph::{Graph, ValueId};

/// A Gelu chain found from its first node.
pub(super) struct GeluChain {
    pub x: ValueId,
    /// The chain's nodes after the first, in order; the last one's output is the result.
    pub rest: Vec<usize>,
}

/// The Gelu chain that starts at node `i` (the Div or Mul by sqrt 2's inverse), when every
/// value between its nodes has the next node as its only reader.
pub(super) fn chain_from(graph: &Graph, uses: &Uses, i: usize) -> Option<GeluChain> {
    let near = |v: ValueId, want: f64| {
        let s = scalar(graph, uses, v)? as f64;
        ((s - want).abs() <= 1e-6 * want).then_some(())
    };
    // `op(a, b)` where one operand is `cur` and the other a scalar near `want` (the Div only
    // as `cur / c`).
    let by_scalar = |n: usize, ops: &[&str], cur: ValueId, want: f64| {
        let nd = &graph.nodes[n];
        if !ops.contains(&nd.op_type.as_str()) || !default_domain(nd) || nd.outputs.len() != 1 {
            return None;
        }
        match nd.inputs.as_slice() {
            [Some(a), Some(c)] if *a == cur => near(*c, want),
            [Some(c), Some(a)] if *a == cur && nd.op_type != "Div" => near(*c, want),
            _ => None,
        }
    };
    let first = &graph.nodes[i];
    let x = (*first.inputs.first()?)?;
    let sqrt2 = std::f64::consts::SQRT_2;
    by_scalar(i, &["Div"], x, sqrt2).or_else(|| by_scalar(i, &["Mul"], x, 1.0 / sqrt2))?;
    let next = |v: ValueId| uses.sole_reader(v);
    let erf = next(first.outputs[0])?;
    let erf_node = &graph.nodes[erf];
    if erf_node.op_type != "Erf" || !default_domain(erf_node) {
        return None;
    }
    let add = next(erf_node.outputs[0])?;
    by_scalar(add, &["Add"], erf_node.outputs[0], 1.0)?;
    let gate = graph.nodes[add].outputs[0];
    let times_x = next(gate)?;
    let tx = &graph.nodes[times_x];
    let reads = |a: ValueId, b: ValueId| matches!(tx.inputs.as_slice(), [Some(p), Some(q)] if (*p, *q) == (a, b) || (*p, *q) == (b, a));
    if tx.op_type != "Mul" || !default_domain(tx) || !reads(x, gate) {
        return None;
    }
    let half = next(tx.outputs[0])?;
    by_scalar(half, &["Mul"], tx.outputs[0], 0.5)?;
    Some(GeluChain {
        x,
        rest: vec![erf, add, times_x, half],
    })
}
