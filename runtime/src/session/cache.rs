//! The session's plan cache entries: how well each plan's prediction held, when it learns and
//! when it is re-planned.
//!
//! Sits between `Session` (which counts runs and misses here) and the plans it caches.

use crate::plan::{Device, Plan, StepKind};
use std::sync::Arc;

/// A plan and how well its prediction held.
pub(super) struct CachedPlan {
    pub(super) plan: Arc<Plan>,
    /// Consecutive runs whose time missed the prediction by more than [`super::REPLAN_MARGIN`].
    pub(super) misses: usize,
    /// Runs of this plan so far (how often it learns: [`learns_from_run`]).
    pub(super) runs: u64,
    /// Re-plans in a row that gave the same placement; each doubles the misses the next
    /// re-plan needs, so a prediction that stays off costs O(log runs) plan builds.
    pub(super) same_replans: u32,
    /// Set after too many misses: the next run builds the plan again.
    pub(super) stale: bool,
}

/// A plan's first runs, which neither teach the cost model nor count as misses: they pay
/// first-touch costs (fresh host buffers, page faults, cold caches, pipelines compiled), and
/// squeezenet's took 3-6x, 1.5-3x and 1.2-2.4x its steady time here; learnt, they set the
/// re-planned plan's prediction (and a saved profile's) at twice the runs that followed.
pub const WARM_UP_RUNS: u64 = 3;
/// Runs of a plan, after its warm-up, whose every report refines the cost model; after them,
/// one run in [`LEARN_EVERY`] does (observing a report costs about 0.3 us per node, which a
/// sub-millisecond model would feel on every run).
pub const LEARN_FIRST: u64 = 8;
/// See [`LEARN_FIRST`].
pub const LEARN_EVERY: u64 = 16;

/// Whether run number `run` (0-based) of a plan feeds the cost model.
pub(super) fn learns_from_run(run: u64) -> bool {
    run >= WARM_UP_RUNS && (run < WARM_UP_RUNS + LEARN_FIRST || run.is_multiple_of(LEARN_EVERY))
}

/// True when some step of `plan` runs (in part) on the GPU.
pub(super) fn uses_gpu(plan: &Plan) -> bool {
    (plan.steps.iter()).any(|s| {
        matches!(
            s.kind,
            StepKind::Split { .. }
                | StepKind::Whole {
                    device: Device::Gpu,
                    ..
                }
        )
    })
}
