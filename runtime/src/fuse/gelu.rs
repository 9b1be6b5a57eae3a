//! Gelu fusion: the chains exports spell Gelu as become one Gelu node, one pass over the
//! activations instead of five to nine kernels and their intermediates.
//!
//! - Exact Gelu of BERT-style exports: `Mul(Mul(x, Add(Erf(Div(x, sqrt 2)), 1)), 0.5)` (each
//!   Mul's operands in either order, or `Mul(x, 1 / sqrt 2)` for the Div); the kernel computes
//!   `0.5 * x * (1 + erf(x / sqrt 2))` (`x * FRAC_1_SQRT_2`, within an ulp of the Div).
//! - The tanh approximation as jax2tf exports it (magika, twice):
//!   `Mul(x, Mul(0.5, Add(1, Tanh(Mul(c, Add(x, Mul(x, Mul(x, Mul(0.044715, x)))))))))`,
//!   `c = sqrt(2 / pi)`, every operand order; it becomes Gelu with `approximate = "tanh"`.
//!
//! Sits inside the fusion pass (`fuse.rs`), which asks [`chain_from`] about each node. The
//! constants must be scalars (or one-element tensors) within 1e-6 of their values, and every
//! value between the chain's nodes read by the next node only.

use super::{const_of, default_domain, rank_of, scalar, Uses};
use crate::graph::{Graph, ValueId};

/// A Gelu chain found from its first node.
pub(super) struct GeluChain {
    pub x: ValueId,
    /// The chain's nodes after the first, in order; the last one's output is the result.
    pub rest: Vec<usize>,
    /// The tanh approximation (else exact Gelu).
    pub tanh: bool,
}

/// The Gelu chain that starts at node `i` (exact: the Div or Mul by sqrt 2's inverse; tanh:
/// the Mul by 0.044715), when every value between its nodes has the next node as its only
/// reader.
pub(super) fn chain_from(graph: &Graph, uses: &Uses, i: usize) -> Option<GeluChain> {
    exact_from(graph, uses, i).or_else(|| tanh_from(graph, uses, i))
}

/// Node `n` is one of `ops` (default domain, one output) of `cur` and a one-element constant
/// within 1e-6 of `want` (relative), in either order (the Div only as `cur / c`); returns the
/// constant's rank (a rank above the chain's input's would broadcast the result to it).
fn by_scalar(
    graph: &Graph,
    uses: &Uses,
    n: usize,
    ops: &[&str],
    cur: ValueId,
    want: f64,
) -> Option<usize> {
    let near = |v: ValueId| {
        let s = scalar(graph, uses, v)? as f64;
        ((s - want).abs() <= 1e-6 * want).then_some(const_of(graph, uses, v, 4)?.shape.len())
    };
    let nd = &graph.nodes[n];
    if !ops.contains(&nd.op_type.as_str()) || !default_domain(nd) || nd.outputs.len() != 1 {
        return None;
    }
    match nd.inputs.as_slice() {
        [Some(a), Some(c)] if *a == cur => near(*c),
        [Some(c), Some(a)] if *a == cur && nd.op_type != "Div" => near(*c),
        _ => None,
    }
}

/// Node `n` is `op(a, b)` or `op(b, a)` (default domain, one output).
fn reads_both(graph: &Graph, n: usize, op: &str, a: ValueId, b: ValueId) -> Option<()> {
    let nd = &graph.nodes[n];
    let pair = match nd.inputs.as_slice() {
        [Some(p), Some(q)] => (*p, *q),
        _ => return None,
    };
    (nd.op_type == op
        && default_domain(nd)
        && nd.outputs.len() == 1
        && (pair == (a, b) || pair == (b, a)))
        .then_some(())
}

/// The chain's constants broadcast nothing: each of rank 0, or at most `x`'s rank where the
/// pass knows it.
fn keeps_rank(graph: &Graph, uses: &Uses, x: ValueId, ranks: &[usize]) -> Option<()> {
    let most = ranks.iter().copied().max().unwrap_or(0);
    (most == 0 || rank_of(graph, uses, x, 8).is_some_and(|r| most <= r)).then_some(())
}

fn exact_from(graph: &Graph, uses: &Uses, i: usize) -> Option<GeluChain> {
    let first = &graph.nodes[i];
    let x = (*first.inputs.first()?)?;
    let sqrt2 = std::f64::consts::SQRT_2;
    let out = |n: usize| graph.nodes[n].outputs[0];
    let next = |v: ValueId| uses.sole_reader(v);
    let r0 = by_scalar(graph, uses, i, &["Div"], x, sqrt2)
        .or_else(|| by_scalar(graph, uses, i, &["Mul"], x, 1.0 / sqrt2))?;
    let erf = next(out(i))?;
    let erf_node = &graph.nodes[erf];
    if erf_node.op_type != "Erf" || !default_domain(erf_node) {
        return None;
    }
    let add = next(out(erf))?;
    let r1 = by_scalar(graph, uses, add, &["Add"], out(erf), 1.0)?;
    let times_x = next(out(add))?;
    reads_both(graph, times_x, "Mul", x, out(add))?;
    let half = next(out(times_x))?;
    let r2 = by_scalar(graph, uses, half, &["Mul"], out(times_x), 0.5)?;
    keeps_rank(graph, uses, x, &[r0, r1, r2])?;
    Some(GeluChain {
        x,
        rest: vec![erf, add, times_x, half],
        tanh: false,
    })
}

fn tanh_from(graph: &Graph, uses: &Uses, i: usize) -> Option<GeluChain> {
    let first = &graph.nodes[i];
    // x is whichever operand is not the 0.044715.
    let (x, r0) = first
        .inputs
        .iter()
        .flatten()
        .find_map(|&v| Some((v, by_scalar(graph, uses, i, &["Mul"], v, 0.044715)?)))?;
    let out = |n: usize| graph.nodes[n].outputs[0];
    let next = |v: ValueId| uses.sole_reader(v);
    // x * (x * (0.044715 x)), then x + that.
    let sq = next(out(i))?;
    reads_both(graph, sq, "Mul", x, out(i))?;
    let cube = next(out(sq))?;
    reads_both(graph, cube, "Mul", x, out(sq))?;
    let inner = next(out(cube))?;
    reads_both(graph, inner, "Add", x, out(cube))?;
    let scaled = next(out(inner))?;
    let c = (2.0 / std::f64::consts::PI).sqrt();
    let r1 = by_scalar(graph, uses, scaled, &["Mul"], out(inner), c)?;
    let tanh = next(out(scaled))?;
    let tn = &graph.nodes[tanh];
    if tn.op_type != "Tanh" || !default_domain(tn) {
        return None;
    }
    let plus_one = next(out(tanh))?;
    let r2 = by_scalar(graph, uses, plus_one, &["Add"], out(tanh), 1.0)?;
    let half = next(out(plus_one))?;
    let r3 = by_scalar(graph, uses, half, &["Mul"], out(plus_one), 0.5)?;
    let times_x = next(out(half))?;
    reads_both(graph, times_x, "Mul", x, out(half))?;
    keeps_rank(graph, uses, x, &[r0, r1, r2, r3])?;
    Some(GeluChain {
        x,
        rest: vec![sq, cube, inner, scaled, tanh, plus_one, half, times_x],
        tanh: true,
    })
}
