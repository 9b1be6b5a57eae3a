//! Rotary fusion: the rotate-half rotary embedding as Llama-style exports spell it,
//! `Add(Mul(x, cos), Mul(Concat(Neg(Slice(x, h, e)), Slice(x, 0, h)), sin))` (each Mul's and
//! the Add's operands in either order), becomes one Rotary node
//! ([`tandem_ops::rotary::Rotary`]): one pass over the output instead of seven kernels.
//!
//! Sits inside the fusion pass (`fuse.rs`), which asks [`chain_from`] about each Add. Both
//! Slices and the Concat must be on the last axis (`-1`, or `rank - 1` where `x`'s rank is
//! known), the Slices' bounds constant and non-negative with the second starting where the
//! first ends, their steps absent or 1, and every value between the chain's nodes read by the
//! next node only. `cos` and `sin` are any values (decode gathers them by position). A
//! Transpose that makes `x` for the chain alone, keeping the last axis last (the head split
//! `[0, 2, 1, 3]` before it in tiny Llama), folds in too ([`Rotary::perm`]).

use super::{const_of, is, rank_of, Uses};
use crate::graph::{Graph, Node, ValueId};
use tandem_ops::concat_split::Concat;
use tandem_ops::rotary::Rotary;
use tandem_ops::transpose::Transpose;
use tandem_ops::Data;

/// A rotary chain found from its Add.
pub(super) struct RotaryChain {
    pub op: Rotary,
    /// x, cos and sin: the fused node's inputs.
    pub inputs: [ValueId; 3],
    /// The chain's nodes but the Add (which becomes the fused node: every input is made
    /// before it).
    pub absorbed: Vec<usize>,
    /// The Slices' bounds, no longer read by the fused node.
    pub dropped: Vec<ValueId>,
}

/// The rotary chain that ends at Add node `i`, if any (see the module doc).
pub(super) fn chain_from(graph: &Graph, uses: &Uses, i: usize) -> Option<RotaryChain> {
    let add = node(graph, i, "Add")?;
    let [Some(p), Some(q)] = add.inputs[..] else {
        return None;
    };
    // the value `v` made by a `op` node whose only reader is `reader`
    let made_by = |v: ValueId, op: &str, reader: usize| {
        let n = uses.producer[v]?;
        (uses.sole_reader(v) == Some(reader)).then_some(())?;
        Some((n, node(graph, n, op)?))
    };
    let two = |nd: &Node| match nd.inputs[..] {
        [Some(a), Some(b)] => Some((a, b)),
        _ => None,
    };
    // the rotated Mul reads a Concat; try both of the Add's operands as that one
    let (m_rot, m_plain) = [(q, p), (p, q)].into_iter().find_map(|(r, s)| {
        let (mr, mr_node) = made_by(r, "Mul", i)?;
        let (a, b) = two(mr_node)?;
        let concat = [a, b]
            .into_iter()
            .find(|&v| made_by(v, "Concat", mr).is_some())?;
        let sin = if concat == a { b } else { a };
        let (ms, _) = made_by(s, "Mul", i)?;
        Some(((mr, concat, sin), ms))
    })?;
    let (mr, concat, sin) = m_rot;
    let (c, c_node) = made_by(concat, "Concat", mr)?;
    let (neg_out, low) = two(c_node)?;
    let (ng, ng_node) = made_by(neg_out, "Neg", c)?;
    let high = ng_node.inputs.first().copied().flatten()?;
    let (s_hi, s_hi_node) = made_by(high, "Slice", ng)?;
    let (s_lo, s_lo_node) = made_by(low, "Slice", c)?;
    let x = s_hi_node.inputs.first().copied().flatten()?;
    let last =
        |axis: i64| axis == -1 || rank_of(graph, uses, x, 8).map(|r| r as i64 - 1) == Some(axis);
    let cat = c_node.op.as_any()?.downcast_ref::<Concat>()?;
    if !last(cat.given_axis()) {
        return None;
    }
    let (lo, lo_bounds) = slice_bounds(graph, uses, s_lo_node, x, &last)?;
    let (hi, hi_bounds) = slice_bounds(graph, uses, s_hi_node, x, &last)?;
    if lo.0 != 0 || hi.0 != lo.1 || hi.1 < hi.0 {
        return None;
    }
    let (a, b) = two(&graph.nodes[m_plain])?;
    let cos = match (a == x, b == x) {
        (true, _) => b,
        (_, true) => a,
        _ => return None,
    };
    let mut dropped = lo_bounds;
    dropped.extend(hi_bounds);
    let mut absorbed = vec![m_plain, mr, c, ng, s_hi, s_lo];
    // a head split's Transpose read by the chain alone, which keeps the last axis last
    let (x, perm) = match transposed(graph, uses, x, &absorbed[..]) {
        Some((t, perm, stored)) => {
            absorbed.push(t);
            (stored, Some(perm))
        }
        None => (x, None),
    };
    Some(RotaryChain {
        op: Rotary {
            half: lo.1,
            end: hi.1,
            perm,
        },
        inputs: [x, cos, sin],
        absorbed,
        dropped,
    })
}

/// The Transpose node that makes `x`, its perm and its input, when `readers` are all that
/// read `x` and the perm keeps the last axis last.
fn transposed(
    graph: &Graph,
    uses: &Uses,
    x: ValueId,
    readers: &[usize],
) -> Option<(usize, Vec<usize>, ValueId)> {
    let t = uses.producer[x]?;
    let tnode = node(graph, t, "Transpose")?;
    let perm = (tnode.op.as_any()?.downcast_ref::<Transpose>())?.explicit_perm()?;
    let only_chain = !uses.output[x] && uses.readers[x].iter().all(|r| readers.contains(r));
    match tnode.inputs[..] {
        [Some(stored)] if only_chain && perm.last() == Some(&(perm.len() - 1)) => {
            Some((t, perm, stored))
        }
        _ => None,
    }
}

/// Node `n` when it is `op` ([`is`]).
fn node<'g>(graph: &'g Graph, n: usize, op: &str) -> Option<&'g Node> {
    is(graph, n, op).then_some(&graph.nodes[n])
}

/// `(start, end)` of a Slice of `x` on its last axis with constant one-element bounds (end
/// clamped to `usize`), step 1, and the bound values it reads.
fn slice_bounds(
    graph: &Graph,
    uses: &Uses,
    slice: &Node,
    x: ValueId,
    last: &dyn Fn(i64) -> bool,
) -> Option<((usize, usize), Vec<ValueId>)> {
    let one = |v: Option<ValueId>| -> Option<i64> {
        let t = const_of(graph, uses, v?, 4)?;
        match &t.data {
            Data::I64(d) if d.len() == 1 => Some(d[0]),
            Data::I32(d) if d.len() == 1 => Some(d[0] as i64),
            _ => None,
        }
    };
    let ins = &slice.inputs;
    if ins.len() < 4 || ins[0] != Some(x) {
        return None;
    }
    let (start, end, axis) = (one(ins[1])?, one(ins[2])?, one(ins[3])?);
    let step = match ins.get(4).copied().flatten() {
        Some(s) => one(Some(s))?,
        None => 1,
    };
    if start < 0 || end < 0 || step != 1 || !last(axis) {
        return None;
    }
    let clamp = |v: i64| usize::try_from(v).unwrap_or(usize::MAX);
    Some((
        (clamp(start), clamp(end)),
        ins[1..].iter().flatten().copied().collect(),
    ))
}
