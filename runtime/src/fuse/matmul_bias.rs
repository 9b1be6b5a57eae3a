//! MatMul bias fusion: `Add(MatMul(a, b), bias)` (either order) with a constant bias of one
//! row, shape ones then N, becomes the MatMul's third input ([`MatMul::bias`]): both kernels
//! add it as they write a row, so the Add's pass over the output and its dispatch go (BERT-style
//! encoders have one after each of their six linear layers a block: minilm's 18).
//!
//! Sits inside the fusion pass (`fuse.rs`), which asks [`bias_after`] about each MatMul, last,
//! after the folds that look for MatMuls and Adds of their own. Only where the MatMul's output
//! has the Add as its only reader, B is constant (its last dim, read through a folded
//! permutation, is N, which the bias's last dim must match) and the bias has no higher rank
//! than B or A (where `fuse::rank_of` knows A's), so the Add does not broadcast the product to
//! a larger shape.

use super::{const_of, is, rank_of, Uses};
use crate::graph::{Graph, ValueId};
use tandem_ops::matmul::MatMul;
use tandem_ops::DType;

/// The fused MatMul, the Add it takes in and the bias, when MatMul node `i` has such an Add.
pub(super) fn bias_after(graph: &Graph, uses: &Uses, i: usize) -> Option<(MatMul, usize, ValueId)> {
    let node = &graph.nodes[i];
    let mm = node.op.as_any()?.downcast_ref::<MatMul>()?;
    let (Some(b), 2, false) = (
        node.inputs.get(1).copied().flatten(),
        node.inputs.len(),
        mm.bias,
    ) else {
        return None;
    };
    if !is(graph, i, "MatMul") {
        return None;
    }
    let out = node.outputs[0];
    let add = uses.sole_reader(out)?;
    let add_node = &graph.nodes[add];
    if !is(graph, add, "Add") {
        return None;
    }
    let bias = match add_node.inputs[..] {
        [Some(p), Some(q)] if p == out => q,
        [Some(p), Some(q)] if q == out => p,
        _ => return None,
    };
    let (bt, ct) = (
        const_of(graph, uses, b, 4)?,
        const_of(graph, uses, bias, 4)?,
    );
    let b_shape: Vec<usize> = match &mm.perms[1] {
        Some(p) => p
            .iter()
            .map(|&d| bt.shape.get(d).copied())
            .collect::<Option<_>>()?,
        None => bt.shape.clone(),
    };
    // the output's rank: at least B's (when B is a matrix), and A's where that is known
    let a_rank = match (&mm.perms[0], node.inputs[0]) {
        (Some(p), _) => Some(p.len()),
        (None, Some(a)) => rank_of(graph, uses, a, 8),
        _ => None,
    };
    let out_rank = b_shape.len().max(a_rank.unwrap_or(0));
    let c = &ct.shape;
    let one_row = c.iter().rev().skip(1).all(|&d| d == 1);
    let fits = b_shape.len() >= 2 && c.len() <= out_rank && c.last() == b_shape.last();
    (one_row && fits && ct.dtype() == DType::F32 && bt.dtype() == DType::F32).then(|| {
        let fused = MatMul {
            bias: true,
            ..mm.clone()
        };
        (fused, add, bias)
    })
}
