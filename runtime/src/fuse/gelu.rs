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

use super::{const_of, is, is_op_of, rank_of, Uses};
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
    // The constant evaluated once: its one value, then its rank.
    let near = |v: ValueId| {
        let t = const_of(graph, uses, v, 4)?;
        let s = match t.as_f32()? {
            [s] => *s as f64,
            _ => return None,
        };
        ((s - want).abs() <= 1e-6 * want).then_some(t.shape.len())
    };
    if !ops.iter().any(|op| is(graph, n, op)) {
        return None;
    }
    let nd = &graph.nodes[n];
    match nd.inputs.as_slice() {
        [Some(a), Some(c)] if *a == cur => near(*c),
        [Some(c), Some(a)] if *a == cur && nd.op_type != "Div" => near(*c),
        _ => None,
    }
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
    is(graph, erf, "Erf").then_some(())?;
    let add = next(out(erf))?;
    let r1 = by_scalar(graph, uses, add, &["Add"], out(erf), 1.0)?;
    let times_x = next(out(add))?;
    is_op_of(graph, times_x, "Mul", x, out(add)).then_some(())?;
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
    is_op_of(graph, sq, "Mul", x, out(i)).then_some(())?;
    let cube = next(out(sq))?;
    is_op_of(graph, cube, "Mul", x, out(sq)).then_some(())?;
    let inner = next(out(cube))?;
    is_op_of(graph, inner, "Add", x, out(cube)).then_some(())?;
    let scaled = next(out(inner))?;
    let c = (2.0 / std::f64::consts::PI).sqrt();
    let r1 = by_scalar(graph, uses, scaled, &["Mul"], out(inner), c)?;
    let tanh = next(out(scaled))?;
    is(graph, tanh, "Tanh").then_some(())?;
    let plus_one = next(out(tanh))?;
    let r2 = by_scalar(graph, uses, plus_one, &["Add"], out(tanh), 1.0)?;
    let half = next(out(plus_one))?;
    let r3 = by_scalar(graph, uses, half, &["Mul"], out(plus_one), 0.5)?;
    let times_x = next(out(half))?;
    is_op_of(graph, times_x, "Mul", x, out(half)).then_some(())?;
    keeps_rank(graph, uses, x, &[r0, r1, r2, r3])?;
    Some(GeluChain {
        x,
        rest: vec![sq, cube, inner, scaled, tanh, plus_one, half, times_x],
        tanh: true,
    })
}
