//! MatMul operand fusion: a Transpose whose only reader is a MatMul folds into it
//! ([`MatMul::perms`]), so the MatMul reads the Transpose's input through strides instead of a
//! transposed copy. Attention blocks transpose every head split this way: `Q` and `V` by
//! `[0, 2, 1, 3]`, `K^T` by `[0, 2, 3, 1]` or `[0, 1, 3, 2]`.
//!
//! Sits inside the fusion pass (`fuse.rs`), which asks [`transposes_into`] about each MatMul.
//! Only a Transpose with an explicit `perm` folds: whether the perm fits the input's rank is
//! then checked by the MatMul when shapes are known, with the same outcome the Transpose's own
//! check would have had.

use super::{default_domain, Uses};
use crate::graph::Graph;
use tandem_ops::matmul::MatMul;
use tandem_ops::transpose::Transpose;

/// For MatMul node `i` (as loaded, reading no operand through a permutation): the MatMul that
/// reads its Transpose-fed operands through their perms, and for each folded operand its input
/// slot and the Transpose node. `None` when no operand is the output of such a Transpose that
/// nothing else reads.
pub(super) fn transposes_into(
    graph: &Graph,
    uses: &Uses,
    i: usize,
) -> Option<(MatMul, Vec<(usize, usize)>)> {
    let node = &graph.nodes[i];
    if node.op_type != "MatMul" || !default_domain(node) || node.inputs.len() != 2 {
        return None;
    }
    let loaded = node.op.as_any()?.downcast_ref::<MatMul>()?;
    if loaded.perms.iter().any(Option::is_some) {
        return None;
    }
    let mut fused = MatMul::default();
    let mut folded = Vec::new();
    for (slot, v) in node.inputs.iter().enumerate() {
        let Some(v) = *v else { continue };
        let Some(t) = uses.producer[v] else { continue };
        let tnode = &graph.nodes[t];
        let transpose = tnode
            .op
            .as_any()
            .and_then(|a| a.downcast_ref::<Transpose>());
        let perm = transpose.and_then(Transpose::explicit_perm);
        let folds = tnode.op_type == "Transpose"
            && default_domain(tnode)
            && uses.sole_reader(v) == Some(i)
            && matches!(tnode.inputs.as_slice(), [Some(_)]);
        if let (true, Some(perm)) = (folds, perm) {
            fused.perms[slot] = Some(perm);
            folded.push((slot, t));
        }
    }
    (!folded.is_empty()).then_some((fused, folded))
}
