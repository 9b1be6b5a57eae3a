//! Recovery from GPU faults: which finished steps a run must redo on the CPU after its GPU
//! results were lost, and the session's device, replaced after it was lost.
//!
//! Sits between the executor (which meets the faults mid-run, see `exec/fault.rs`), the session
//! (which holds the device across runs) and the GPU layer ([`Gpu::replacement`]). The policy:
//! a fault confined to one node (out of memory, a pipeline that does not build, a tensor over the
//! adapter's limits) runs that node on the CPU; a fault that may have lost GPU results (a lost
//! device, a batch that failed validation, a failed wait or readback) turns the GPU off for the
//! rest of the run and recomputes on the CPU exactly the finished steps whose results are still
//! needed and were only on the GPU, keeping every host result already computed; the next run of
//! the session opens a new device when the old one was lost. Every fault is in the run report
//! and the log.

use crate::exec::GpuConstants;
use crate::gpu::Gpu;
use crate::graph::Graph;
use crate::plan::Plan;
use crate::report::{FaultKind, GpuFault};
use std::collections::HashSet;
use std::sync::{Arc, RwLock};

/// The steps before `resume` to run again, in plan order, so that every value read by the steps
/// from `resume` on (and every model output) is on the host. `valid(v)`: value `v` is whole on the
/// host (or a constant, or a model input). A step is redone when it produces a needed value that
/// is not valid; its own inputs then become needed in turn.
pub fn steps_to_recompute(
    graph: &Graph,
    plan: &Plan,
    resume: usize,
    valid: impl Fn(usize) -> bool,
) -> Vec<usize> {
    let mut needed: HashSet<usize> = graph.outputs.iter().copied().collect();
    for step in &plan.steps[resume.min(plan.steps.len())..] {
        needed.extend(graph.nodes[step.node].inputs.iter().flatten().copied());
    }
    let mut redo = Vec::new();
    for p in (0..resume.min(plan.steps.len())).rev() {
        let node = &graph.nodes[plan.steps[p].node];
        if node
            .outputs
            .iter()
            .any(|o| needed.contains(o) && !valid(*o))
        {
            redo.push(p);
            needed.extend(node.inputs.iter().flatten().copied());
        }
    }
    redo.reverse();
    redo
}

/// The session's GPU, replaced by a new device on the run after it was lost.
pub struct GpuSlot {
    current: RwLock<Option<Arc<Gpu>>>,
}

impl GpuSlot {
    pub fn new(gpu: Option<Arc<Gpu>>) -> GpuSlot {
        GpuSlot {
            current: RwLock::new(gpu),
        }
    }

    /// The device now (possibly lost).
    pub fn get(&self) -> Option<Arc<Gpu>> {
        self.current.read().unwrap().clone()
    }

    /// The device a run should use. When the current one was lost, its replacement is opened
    /// (shared with every other holder of the lost device; see [`Gpu::replacement`]) and the
    /// session's constant uploads are forgotten, so they are uploaded again to the new device.
    /// When no replacement opens, the run gets no GPU (its GPU nodes run on the CPU, each with
    /// the reason) and the next run tries again. Returns the event for the run report.
    pub fn for_run(&self, constants: &GpuConstants) -> (Option<Arc<Gpu>>, Option<GpuFault>) {
        let Some(gpu) = self.get() else {
            return (None, None);
        };
        if !gpu.is_lost() {
            return (Some(gpu), None);
        }
        let mut current = self.current.write().unwrap();
        // Another run may have replaced it meanwhile.
        if let Some(g) = current.as_ref().filter(|g| !g.is_lost()) {
            return (Some(g.clone()), None);
        }
        let reason = format!("device {} was lost in an earlier run", gpu.adapter().name);
        match gpu.replacement() {
            Ok(new) => {
                constants.clear();
                *current = Some(new.clone());
                let action = format!(
                    "opened a new device ({}); constants are uploaded to it again",
                    new.adapter().name
                );
                (
                    Some(new),
                    Some(GpuFault::logged(None, &reason, true, &action)),
                )
            }
            Err(e) => {
                let action = format!("no new device ({e}): this run stays on the CPU");
                (None, Some(GpuFault::logged(None, &reason, true, &action)))
            }
        }
    }
}

/// Write to the log (stderr) the nodes a new plan keeps off the GPU because of the adapter's
/// limits or the session's GPU memory cap (the run reports carry the same reasons).
pub fn log_limit_fallbacks(graph: &Graph, plan: &Plan) {
    for step in &plan.steps {
        let Some(reason) = &step.fallback else {
            continue;
        };
        if matches!(
            FaultKind::classify(reason, false),
            FaultKind::AdapterLimit | FaultKind::MemoryCap
        ) {
            let node = &graph.nodes[step.node];
            eprintln!(
                "tandem: node `{}` ({}) runs on the CPU: {reason}",
                node.name, node.op_type
            );
        }
    }
}
