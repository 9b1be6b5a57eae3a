//! The executor's side of GPU fault recovery (the policy is in [`crate::recover`]).
//!
//! Sits inside the executor (a child module, so it reads a run's slots): a GPU error of one node
//! that left the device usable runs that node on the CPU ([`Run::gpu_refused`]); any other GPU
//! error ([`Run::recover`]) turns the GPU off for the rest of the run, drops every value that was
//! only on the GPU, recomputes on the CPU the finished steps whose results are still needed
//! (host results already computed are kept), then redoes the interrupted step on the CPU.

use super::{Run, Slot};
use crate::plan::{Device, StepKind};
use crate::report::Ran;
use crate::{Error, Result};

impl Run<'_> {
    /// Value `v` was read for the last time. Its GPU copy goes at once; a whole host copy stays
    /// until the GPU work recorded so far is done (a fault there must not lose a result the CPU
    /// already computed), and a model input's host copy stays to the end of the run.
    pub(super) fn release(&mut self, v: usize) {
        let gpu_busy = self.batch.is_some() || !self.inflight.is_empty();
        let input = self.cx.graph.inputs.contains(&v);
        let slot = &mut self.slots[v];
        if slot.host.is_some() && slot.split.is_none() && (gpu_busy || input) {
            slot.gpu = None;
            if !input {
                self.released.push(v);
            }
        } else {
            *slot = Slot::default();
        }
    }

    /// The GPU finished everything submitted: drop the host copies kept by [`Run::release`].
    pub(super) fn drop_released(&mut self) {
        if self.batch.as_ref().is_some_and(|b| !b.is_empty()) {
            return;
        }
        for v in std::mem::take(&mut self.released) {
            self.slots[v] = Slot::default();
        }
    }

    /// `Err` (the reason) once the GPU was turned off for this run.
    pub(super) fn gpu_usable(&self) -> Result<()> {
        match &self.gpu_off {
            Some(r) => Err(Error::Gpu(format!(
                "the GPU is off for the rest of this run after a fault ({r})"
            ))),
            None => Ok(()),
        }
    }

    /// True when a GPU error of one node can be handled by running that node on the CPU alone:
    /// the device is not lost (or the GPU is already off for this run).
    pub(super) fn node_fault_is_local(&self) -> bool {
        self.gpu_off.is_some() || !self.cx.gpu.is_some_and(|g| g.is_lost())
    }

    /// Node `node`'s GPU kernels could not be recorded (`reason`) and it runs on the CPU: the
    /// reason for its report entry, recorded as a fault unless the GPU is off or absent.
    pub(super) fn gpu_refused(&mut self, node: &str, reason: String) -> String {
        let reason = crate::report::one_line(&reason);
        if self.gpu_off.is_none() && self.cx.gpu.is_some() {
            self.report
                .record_fault(Some(node), &reason, false, "the node ran on the CPU");
        }
        reason
    }

    /// Recover from `e`, met at step `at` (`None`: after the last step). Errors other than GPU
    /// errors, and a second GPU error in one run, are returned as they are.
    pub(super) async fn recover(&mut self, at: Option<usize>, e: Error) -> Result<()> {
        let Error::Gpu(reason) = e else {
            return Err(e);
        };
        let reason = crate::report::one_line(&reason);
        let (Some(gpu), None) = (self.cx.gpu, &self.gpu_off) else {
            return Err(Error::Gpu(reason));
        };
        self.gpu_off = Some(reason.clone());
        self.batch = None;
        // Let a live device finish what it was given before its buffers are reused.
        for sub in std::mem::take(&mut self.inflight) {
            if !gpu.is_lost() {
                let _ = sub.wait_async().await;
            }
        }
        let lost = gpu.is_lost();
        for slot in &mut self.slots {
            if slot.gpu.is_some() {
                if slot.host.is_none() || slot.split.is_some() {
                    *slot = Slot::default();
                } else {
                    slot.gpu = None;
                }
            }
        }
        let cx = self.cx;
        let resume = at.unwrap_or(cx.plan.steps.len());
        let redo = crate::recover::steps_to_recompute(cx.graph, cx.plan, resume, |v| {
            let s = self.slot(v);
            s.host.is_some() && s.split.is_none()
        });
        let names: Vec<&str> = redo
            .iter()
            .map(|&p| cx.graph.nodes[cx.plan.steps[p].node].name.as_str())
            .collect();
        let action = format!(
            "the GPU is off for the rest of this run; {} finished node(s) recomputed on the CPU \
             [{}]{}",
            redo.len(),
            names.join(", "),
            if lost {
                "; the next run opens a new device"
            } else {
                ""
            }
        );
        let at_node = at.map(|s| cx.graph.nodes[cx.plan.steps[s].node].name.as_str());
        self.report.record_fault(at_node, &reason, lost, &action);
        let first_entry = cx.plan.folded.len();
        for p in redo {
            if let StepKind::View = cx.plan.steps[p].kind {
                self.view(p);
                continue;
            }
            let took = self.cpu_step(p, None).await?;
            if let Some(entry) = self.report.nodes.get_mut(first_entry + p) {
                entry.ran = Ran::On(Device::Cpu);
                entry.time = took;
                entry.gpu_time = None;
                entry.fallback = Some(format!(
                    "recomputed on the CPU: its GPU result was lost ({reason})"
                ));
            }
        }
        match at {
            Some(s) => self.step(s).await,
            None => Ok(()),
        }
    }
}
