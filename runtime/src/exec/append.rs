//! Concat by appending: a CPU step whose output is its inputs one after another
//! ([`tandem_ops::Op::appends_inputs`]) takes over input 0's buffer, where this step is its last
//! reader, and appends the other inputs to it, instead of copying every input into a fresh
//! output.
//!
//! Sits inside the executor (a child module, so it reads a run's slots), called by its CPU
//! step. Why: densenet121's dense blocks concatenate each layer's 32 new channels to all the
//! channels before them, so a plain Concat copies the whole block's features again at every
//! layer (58 Concats, about 2 ms of a 56 ms run here); squeezenet's fire modules concatenate
//! their two expand convs. Appending copies only the new parts. The plan ([`Plan::room`])
//! has input 0 allocated with room for the whole output: a buffer grown later would be fresh
//! pages, and appending into one measured slower than the copy (docs/bench.md, "Concat by
//! appending to its first input").
//!
//! [`Plan::room`]: crate::plan::Plan::room

use super::Run;
use std::sync::Arc;
use tandem_ops::Tensor;

impl Run<'_> {
    /// Step `s`'s output by appending `ins[1..]` to input 0's buffer, or `None` (with `ins`
    /// as it was) where that does not apply: the plan gave input 0 no room (the op does not
    /// append, runs elsewhere, or input 0 is read later, twice, or is a model input or
    /// output), the buffer lacks the room (a view's or a split's), input 0 is not whole on
    /// the host, GPU work is pending, or something else holds its tensor.
    pub(super) fn appended(&mut self, s: usize, ins: &mut [Arc<Tensor>]) -> Option<Tensor> {
        let step = &self.cx.plan.steps[s];
        let node = &self.cx.graph.nodes[step.node];
        let v = node.inputs.first().copied().flatten()?;
        let out = &step.outputs[0];
        let slot = &self.slots[v];
        // The plan gives room only to input 0 of a CPU Concat that appends, read there last
        // and once.
        let movable = self.cx.plan.room[v] != 0
            && ins.iter().map(|t| t.numel()).sum::<usize>() == out.numel()
            && ins.iter().all(|t| t.dtype() == out.dtype)
            && self.host_free_after(v, s)
            && slot.gpu.is_none()
            && slot.split.is_none()
            && slot.host.as_ref().is_some_and(|h| Arc::ptr_eq(h, &ins[0]))
            && ins[0].data.capacity() >= out.numel();
        if !movable {
            return None;
        }
        // Two references: the slot's and `ins[0]`. Swap `ins[0]` for the second input's (any
        // other tensor would do) so that the slot's is the only one left.
        let taken = self.slots[v].host.take()?;
        let placeholder = ins.get(1).cloned().unwrap_or_else(|| taken.clone());
        let mine = std::mem::replace(&mut ins[0], placeholder);
        drop(mine);
        let mut first = match Arc::try_unwrap(taken) {
            Ok(t) => t,
            Err(shared) => {
                ins[0] = shared.clone();
                self.slots[v].host = Some(shared);
                return None;
            }
        };
        // Same element types: checked above. Large tails are copied on the session's pool.
        crate::limits::install(self.cx.pool, || {
            for t in &ins[1..] {
                first.data.append(&t.data);
            }
        });
        first.shape = out.shape.clone();
        Some(first)
    }
}
