//! Attention fusion: `MatMul(Q, Kt)`, then a Div or Mul by a scalar constant (optional), a mask
//! (optional: an Add of it, or a `Where(mask, scores, c)` or `Where(mask, c, scores)` of a
//! scalar constant c, as tiny Llama's causal mask), a Softmax over the last axis and
//! `MatMul(P, V)` become one Attention node ([`tandem_ops::attention::Attention`]): per block
//! of a head's query rows, the scores stay in the core's cache instead of passing through four
//! host buffers. The Transposes of the head splits, already folded into the MatMuls
//! (`matmul_operands.rs`), carry over.
//!
//! Sits inside the fusion pass (`fuse.rs`), which asks [`chain_from`] about each MatMul. Only
//! where every value between the nodes has the next node as its only reader, and where the
//! ranks of Q, Kt, V (each at least 2) and of the mask are known before any input is given:
//! from a folded permutation's length, else as `fuse::rank_of` finds them (minilm's mask:
//! `Mul(Sub(1, Cast(Unsqueeze(Unsqueeze(attention_mask)))), min)`). The ranks settle which
//! axis the Softmax normalises; a rank-1 operand (which MatMul promotes) is left unfused.

use super::{default_domain, rank_of, scalar, Uses};
use crate::graph::{Graph, ValueId};
use tandem_ops::attention::{Attention, Masking, Scale};
use tandem_ops::matmul::MatMul;

/// An attention chain found from its first MatMul.
pub(super) struct AttentionChain {
    pub op: Attention,
    /// Q, Kt, V and the mask, the fused node's inputs.
    pub inputs: Vec<ValueId>,
    /// The nodes after the first MatMul up to the Softmax (absorbed), and the last MatMul (which
    /// becomes the fused node: every input is made before it).
    pub absorbed: Vec<usize>,
    pub last: usize,
    /// The scale's and the selecting mask's constants, no longer read by the fused node.
    pub dropped: Vec<ValueId>,
}

/// The attention chain that starts at MatMul node `i`, if any (see the module doc).
pub(super) fn chain_from(graph: &Graph, uses: &Uses, i: usize) -> Option<AttentionChain> {
    let matmul = |n: usize| {
        let nd = &graph.nodes[n];
        let ok = nd.op_type == "MatMul" && default_domain(nd) && nd.outputs.len() == 1;
        let mm = nd.op.as_any()?.downcast_ref::<MatMul>()?;
        match (ok, nd.inputs.as_slice()) {
            (true, [Some(a), Some(b)]) => Some((mm, *a, *b)),
            _ => None,
        }
    };
    let (qk, q, kt) = matmul(i)?;
    let rank = |v: ValueId, perm: &Option<Vec<usize>>| match perm {
        Some(p) => Some(p.len()),
        None => rank_of(graph, uses, v, 8),
    };
    let (rq, rk) = (rank(q, &qk.perms[0])?, rank(kt, &qk.perms[1])?);
    if rq < 2 || rk < 2 {
        return None;
    }
    let next = |v: ValueId| {
        let r = uses.sole_reader(v)?;
        let nd = &graph.nodes[r];
        (default_domain(nd) && nd.outputs.len() == 1).then_some((r, nd))
    };
    let mut absorbed = Vec::new();
    let mut cur = graph.nodes[i].outputs[0];
    let (mut scale, mut dropped) = (Scale::None, Vec::new());
    let (mut r, mut nd) = next(cur)?;
    if let ("Div" | "Mul", [Some(a), Some(b)]) = (nd.op_type.as_str(), nd.inputs.as_slice()) {
        let c = match (nd.op_type.as_str(), *a == cur, *b == cur) {
            ("Div", true, false) => *b,
            ("Mul", true, false) => *b,
            ("Mul", false, true) => *a,
            _ => return None,
        };
        let value = scalar(graph, uses, c)?;
        scale = match nd.op_type.as_str() {
            "Div" => Scale::Div(value),
            _ => Scale::Mul(value),
        };
        dropped.push(c);
        absorbed.push(r);
        cur = nd.outputs[0];
        (r, nd) = next(cur)?;
    }
    let (mut mask, mut masking) = (None, Masking::Add);
    let mut scores_rank = rq.max(rk);
    match (nd.op_type.as_str(), nd.inputs.as_slice()) {
        ("Add", [Some(a), Some(b)]) => {
            let m = match (*a == cur, *b == cur) {
                (true, false) => *b,
                (false, true) => *a,
                _ => return None,
            };
            scores_rank = scores_rank.max(rank_of(graph, uses, m, 8)?);
            mask = Some(m);
        }
        ("Where", [Some(m), Some(a), Some(b)]) if *m != cur => {
            let (c, keep) = match (*a == cur, *b == cur) {
                (true, false) => (*b, true),
                (false, true) => (*a, false),
                _ => return None,
            };
            let fill = scalar(graph, uses, c)?;
            scores_rank = scores_rank.max(rank_of(graph, uses, *m, 8)?);
            // A constant of a higher rank would broadcast the scores into more dimensions.
            if rank_of(graph, uses, c, 8)? > scores_rank {
                return None;
            }
            masking = Masking::Select { fill, keep };
            mask = Some(*m);
            dropped.push(c);
        }
        _ => {}
    }
    if mask.is_some() {
        absorbed.push(r);
        cur = nd.outputs[0];
        (r, nd) = next(cur)?;
    }
    let softmax_ok = nd.op_type == "Softmax"
        && tandem_ops::softmax::is_softmax_over_last_axis(nd.op.as_ref(), scores_rank);
    if !softmax_ok {
        return None;
    }
    absorbed.push(r);
    let (last, _) = next(nd.outputs[0])?;
    let (pv, p, v) = matmul(last)?;
    if p != nd.outputs[0] || pv.perms[0].is_some() || rank(v, &pv.perms[1])? < 2 {
        return None;
    }
    let mut inputs = vec![q, kt, v];
    inputs.extend(mask);
    Some(AttentionChain {
        op: Attention {
            perms: [
                qk.perms[0].clone(),
                qk.perms[1].clone(),
                pv.perms[1].clone(),
            ],
            scale,
            masking,
        },
        inputs,
        absorbed,
        last,
        dropped,
    })
}
