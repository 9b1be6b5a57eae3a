//! Resource bounds of a session: the GPU memory its plans may use, the host memory a run may
//! need, and the threads its CPU kernels run on.
//!
//! Sits between the planner's output ([`Plan`]: every tensor's size and last use is known there)
//! and the session, which applies these bounds to each plan before running it. Nothing here
//! allocates a tensor: the bounds are checked on sizes, before the executor allocates.

use crate::gpu::size_class;
use crate::graph::Graph;
use crate::plan::{Device, Plan, StepKind};
use crate::{Error, Result};
use std::collections::{BTreeSet, HashMap, HashSet};

/// The bounds set in `SessionOptions` (`None`: unbounded).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    /// Bytes of GPU buffers a plan may keep at once (uploaded constants + live intermediates).
    pub gpu_memory: Option<u64>,
    /// Bytes of host memory a run may need (inputs + constants + peak live intermediates).
    pub host_memory: Option<u64>,
}

/// For each value, the value whose storage it shares (views alias their input; chains followed).
fn storage_roots(graph: &Graph, plan: &Plan) -> Vec<usize> {
    let mut root: Vec<usize> = (0..graph.values.len()).collect();
    for step in &plan.steps {
        if let StepKind::View = step.kind {
            let node = &graph.nodes[step.node];
            if let Some(src) = node.inputs.first().copied().flatten() {
                root[node.outputs[0]] = root[src];
            }
        }
    }
    root
}

/// For each storage root, the last step reading it or any of its aliases (`usize::MAX` for model
/// outputs, kept to the end; `None`: never read).
fn release_steps(graph: &Graph, plan: &Plan, root: &[usize]) -> Vec<Option<usize>> {
    let mut until: Vec<Option<usize>> = vec![None; graph.values.len()];
    for (v, &r) in root.iter().enumerate() {
        let last = if graph.outputs.contains(&v) {
            Some(usize::MAX)
        } else {
            plan.last_use[v]
        };
        until[r] = until[r].max(last);
    }
    until
}

fn is_constant(plan: &Plan, v: usize) -> bool {
    plan.metas[v].as_ref().is_some_and(|m| m.value.is_some())
}

/// GPU bytes of `v` as the buffer pool holds it (4-byte elements, rounded to a size class).
fn gpu_bytes(plan: &Plan, v: usize) -> u64 {
    let elems = plan.metas[v].as_ref().map_or(0, |m| m.numel() as u64);
    size_class(elems * 4)
}

/// Keep `plan`'s GPU tensor memory within `cap` bytes. The steps are walked in order with the
/// GPU bytes the executor holds: constants once uploaded stay; an intermediate stays past its
/// last reader until the host next waits for the GPU (a CPU or split step reading a value that
/// is on the GPU), because the batches recorded meanwhile still bind it. A GPU or split step
/// whose new buffers would take the total past `cap` runs on the CPU instead, with the reason as
/// its fallback (never silent). Returns how many steps moved.
pub fn fit_gpu_memory(plan: &mut Plan, graph: &Graph, cap: u64) -> usize {
    let root = storage_roots(graph, plan);
    let until = release_steps(graph, plan, &root);
    let mut resident: HashMap<usize, u64> = HashMap::new();
    let mut held: Vec<usize> = Vec::new();
    let mut constants: HashSet<usize> = HashSet::new();
    let mut constant_bytes = 0u64;
    let mut moved = 0;
    for s in 0..plan.steps.len() {
        let node = &graph.nodes[plan.steps[s].node];
        let reads_gpu = node
            .inputs
            .iter()
            .flatten()
            .any(|&v| !is_constant(plan, v) && resident.contains_key(&root[v]));
        let (gpu, split) = match &plan.steps[s].kind {
            StepKind::Whole {
                device: Device::Gpu,
                ..
            } => (true, false),
            StepKind::Split { .. } => (true, true),
            _ => (false, false),
        };
        let mut joined = reads_gpu && (split || !gpu);
        if joined {
            for r in held.drain(..) {
                resident.remove(&r);
            }
        }
        if gpu {
            let (new_constants, new_values) =
                new_gpu_buffers(plan, graph, s, &root, &resident, &constants);
            let adding: u64 = new_constants
                .iter()
                .map(|&v| gpu_bytes(plan, v))
                .chain(new_values.iter().map(|(_, b)| *b))
                .sum();
            let in_use = constant_bytes + resident.values().sum::<u64>();
            if in_use + adding > cap {
                let step = &mut plan.steps[s];
                step.kind = StepKind::Whole {
                    device: Device::Cpu,
                    kernels: Vec::new(),
                };
                step.fallback = Some(format!(
                    "GPU memory cap: its buffers need {adding} more bytes with {in_use} of the \
                     session's max_gpu_memory of {cap} bytes in use"
                ));
                moved += 1;
                if reads_gpu && !joined {
                    joined = true;
                    for r in held.drain(..) {
                        resident.remove(&r);
                    }
                }
            } else {
                for v in new_constants {
                    constant_bytes += gpu_bytes(plan, v);
                    constants.insert(v);
                }
                resident.extend(new_values);
            }
        }
        let released: Vec<usize> = resident
            .keys()
            .copied()
            .filter(|r| until[*r] == Some(s))
            .collect();
        for r in released {
            if joined {
                resident.remove(&r);
            } else {
                held.push(r);
            }
        }
    }
    moved
}

/// The buffers GPU step `s` adds: constants not `uploaded` yet, and (storage root, bytes) of
/// its inputs not on the GPU and of its outputs.
fn new_gpu_buffers(
    plan: &Plan,
    graph: &Graph,
    s: usize,
    root: &[usize],
    resident: &HashMap<usize, u64>,
    uploaded: &HashSet<usize>,
) -> (Vec<usize>, Vec<(usize, u64)>) {
    let kernels = match &plan.steps[s].kind {
        StepKind::Whole { kernels, .. } | StepKind::Split { kernels, .. } => kernels,
        StepKind::View => return (Vec::new(), Vec::new()),
    };
    let node = &graph.nodes[plan.steps[s].node];
    let bound: BTreeSet<usize> = kernels
        .iter()
        .flat_map(|k| k.inputs.iter().copied())
        .collect();
    let mut constants = Vec::new();
    let mut values: Vec<(usize, u64)> = Vec::new();
    for v in bound
        .iter()
        .filter_map(|&i| node.inputs.get(i).copied().flatten())
    {
        if is_constant(plan, v) {
            if !uploaded.contains(&v) && !constants.contains(&v) {
                constants.push(v);
            }
        } else if !resident.contains_key(&root[v]) && !values.iter().any(|(r, _)| *r == root[v]) {
            values.push((root[v], gpu_bytes(plan, v)));
        }
    }
    for &o in &node.outputs {
        values.push((root[o], gpu_bytes(plan, o)));
    }
    (constants, values)
}

/// Host bytes a run of `plan` needs at its peak: the inputs, every constant (initializers and
/// values folded at plan time) and the intermediates live at the busiest step (each kept until
/// its last reader; model outputs to the end). Views share their input's storage.
pub fn host_working_set(graph: &Graph, plan: &Plan) -> u64 {
    let host_bytes = |v: usize| plan.metas[v].as_ref().map_or(0, |m| m.bytes());
    let inputs: u64 = graph.inputs.iter().map(|&v| host_bytes(v)).sum();
    let constants: u64 = (0..graph.values.len())
        .filter(|&v| !graph.inputs.contains(&v) && is_constant(plan, v))
        .map(host_bytes)
        .sum();
    inputs + constants + plan.host_peak
}

/// Peak bytes of the intermediate values (not inputs, not constants) alive at once during a
/// run of `plan`, each counted once per storage (views share their source's).
pub fn peak_intermediates(graph: &Graph, plan: &Plan) -> u64 {
    let host_bytes = |v: usize| plan.metas[v].as_ref().map_or(0, |m| m.bytes());
    let root = storage_roots(graph, plan);
    let until = release_steps(graph, plan, &root);
    let mut live: HashMap<usize, u64> = HashMap::new();
    let mut peak = 0u64;
    for (s, step) in plan.steps.iter().enumerate() {
        live.retain(|r, _| until[*r].is_some_and(|u| u >= s));
        for &o in &graph.nodes[step.node].outputs {
            if root[o] == o && !is_constant(plan, o) {
                live.insert(o, host_bytes(o));
            }
        }
        peak = peak.max(live.values().sum());
    }
    peak
}

/// Fail with [`Error::ResourceLimit`] when a run of `plan` needs more host memory than `cap`.
pub fn check_host_memory(graph: &Graph, plan: &Plan, cap: Option<u64>) -> Result<()> {
    let Some(cap) = cap else {
        return Ok(());
    };
    let needed = host_working_set(graph, plan);
    if needed > cap {
        return Err(Error::ResourceLimit {
            resource: "host memory",
            needed,
            limit: cap,
            detail: "inputs + constants + peak live intermediates, computed from the plan \
                     before allocating (SessionOptions::max_host_memory)"
                .into(),
        });
    }
    Ok(())
}

/// Run `f` (a CPU kernel) on `pool`, unless the caller is a worker of another rayon pool (then
/// on the caller's own pool) or runs serially (`tandem_ops::parallel::serially`: then on the
/// caller's thread). A cross-pool `install` blocks that worker, which meanwhile runs
/// other queued jobs of its pool on its stack (more `Session::run`s, nested without bound: a
/// stack overflow, or a deadlock when such a job waits for a lock the blocked one holds), and
/// two pools busy at once oversubscribe the cores. A caller already on rayon brings its threads.
pub fn install<R: Send>(pool: &rayon::ThreadPool, f: impl FnOnce() -> R + Send) -> R {
    if tandem_ops::parallel::serial()
        || rayon::current_thread_index().is_some() && pool.current_thread_index().is_none()
    {
        f()
    } else {
        pool.install(f)
    }
}

/// Run `f` (planning, which folds constants with CPU kernels on `pool`) so that a caller on a
/// worker of another rayon pool does not block that worker in a cross-pool `install` (see
/// [`install`]): from such a worker, `f` runs on a short-lived plain thread that the worker
/// waits for without running other jobs. Planning happens once per input shape, so the thread
/// costs nothing that matters.
pub fn off_foreign_pool<R: Send>(pool: &rayon::ThreadPool, f: impl FnOnce() -> R + Send) -> R {
    if rayon::current_thread_index().is_none() || pool.current_thread_index().is_some() {
        return f();
    }
    std::thread::scope(|s| match s.spawn(f).join() {
        Ok(r) => r,
        Err(panic) => std::panic::resume_unwind(panic),
    })
}
