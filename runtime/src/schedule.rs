//! The hybrid scheduler: decides for every node of a plan whether it runs on the CPU, on the GPU,
//! or split by output rows across both, from predicted times.
//!
//! Sits between the planner (`plan.rs`, which describes nodes as [`Task`]s) and the cost model
//! (through the [`Costs`] trait). Algorithm: HEFT list scheduling (upward rank; earliest finish
//! time with insertion into idle gaps; transfer and sync costs on every edge that crosses
//! devices), a row split where splitting beats both devices by a margin (the cut equalises the
//! two parts' predicted finish times), then smoothing so isolated nodes do not bounce between
//! devices, then one common cut per chain of row-local splits (`schedule/chains.rs`): a split
//! value read row for row by a split at the same fraction stays in its halves, with no join. The
//! final timeline is re-simulated; a policy never predicts worse than the best single device,
//! because both are candidates.

mod chains;
mod sim;

use sim::{other, Sim};
pub use sim::{simulate, simulate_from};

use crate::costs::{Costs, NodeCostQuery};
use crate::plan::Device;
use std::collections::HashMap;

/// A value id as the scheduler sees it (views resolved to the value they alias).
pub type ValueKey = usize;

/// One node to place.
#[derive(Debug, Clone)]
pub struct Task<'a> {
    pub query: NodeCostQuery<'a>,
    /// Values read (non-constant), with their bytes.
    pub inputs: Vec<(ValueKey, u64)>,
    /// Values written, with their bytes.
    pub outputs: Vec<(ValueKey, u64)>,
    /// Rows of output 0 (1 when the op cannot be split).
    pub rows: usize,
    /// Rows one GPU workgroup covers along the split (the kernel's tile height, e.g. 64 for the
    /// tiled MatMul; 1 when a row is one or more whole workgroups): the GPU part of a split
    /// costs whole tiles, so cuts leave it a multiple of this many rows
    /// ([`crate::plan::gpu_tile_rows`]).
    pub gpu_tile: usize,
    /// Why the GPU cannot run it, if it cannot.
    pub gpu_refusal: Option<String>,
    /// A device the user forced.
    pub forced: Option<Device>,
    /// Inputs the node reads row for row along its split (`Op::row_local`): a split of this
    /// node at the same fraction of rows as the input's split reads the input's two halves
    /// where they are, with no join (a chain).
    pub row_local: Vec<ValueKey>,
}

impl Task<'_> {
    fn can(&self, d: Device) -> bool {
        match (self.forced, d) {
            (Some(f), _) => f == d && (d == Device::Cpu || self.gpu_refusal.is_none()),
            (None, Device::Gpu) => self.gpu_refusal.is_none(),
            (None, Device::Cpu) => true,
        }
    }

    fn can_split(&self) -> bool {
        self.forced.is_none() && self.gpu_refusal.is_none() && self.rows >= 2
    }

    /// Share of the whole node's GPU work that rows `cut..rows` cost: whole tiles of
    /// [`Task::gpu_tile`] rows each, over the tiles of all rows (workgroup quantisation, as in
    /// CoDL: a tile with one row in it costs a full tile).
    fn gpu_share(&self, cut: usize) -> f64 {
        let tile = self.gpu_tile.max(1);
        let tiles = |rows: usize| rows.div_ceil(tile) as f64;
        tiles(self.rows - cut.min(self.rows)) / tiles(self.rows).max(1.0)
    }

    /// `cut` moved so that the GPU part (`cut..rows`) is a whole number of tiles (the nearer
    /// such cut; `None` when that leaves a device no rows). Unchanged with a tile of 1 row.
    fn tile_cut(&self, cut: usize) -> Option<usize> {
        let tile = self.gpu_tile.max(1);
        let gpu = ((self.rows - cut.min(self.rows)) as f64 / tile as f64).round() as usize * tile;
        (gpu > 0 && gpu < self.rows).then(|| self.rows - gpu)
    }
}

/// Where a node runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Choice {
    On(Device),
    /// Rows `0..cut` on the CPU, `cut..rows` on the GPU.
    Split {
        cut: usize,
    },
}

/// The policies `tandem simulate` compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    CpuOnly,
    GpuOnly,
    /// Each node on the device with the lower predicted time, transfers ignored.
    GreedyPerOp,
    Heft,
    HeftSplit,
}

impl Policy {
    pub const ALL: [Policy; 5] = [
        Policy::CpuOnly,
        Policy::GpuOnly,
        Policy::GreedyPerOp,
        Policy::Heft,
        Policy::HeftSplit,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Policy::CpuOnly => "cpu-only",
            Policy::GpuOnly => "gpu-only",
            Policy::GreedyPerOp => "greedy per-op",
            Policy::Heft => "HEFT",
            Policy::HeftSplit => "HEFT+split",
        }
    }
}

/// Predictions that explain one node's choice.
#[derive(Debug, Clone, PartialEq)]
pub struct Explain {
    pub cpu: f64,
    pub gpu: Option<f64>,
    /// Best split: predicted finish-to-finish time of the node and its cut.
    pub split: Option<(f64, usize)>,
    pub why: String,
}

/// The scheduler's answer: a choice per task, an execution order, and the predicted timeline.
#[derive(Debug, Clone)]
pub struct Schedule {
    pub choices: Vec<Choice>,
    pub explain: Vec<Explain>,
    /// Task indices in the order to issue them (by predicted start time).
    pub order: Vec<usize>,
    /// Predicted (start, finish) per task, seconds from the run's start.
    pub times: Vec<(f64, f64)>,
    pub makespan: f64,
}

/// Gain a split must show over the best single device before it is chosen.
pub const SPLIT_MARGIN: f64 = 0.05;
/// Gain a plan mixing both devices must show over the better whole-model single-device plan.
pub const MIX_MARGIN: f64 = 0.05;

/// Upward ranks: a task's mean time plus the longest path (with mean transfers) to an exit.
fn upward_ranks(tasks: &[Task], costs: &dyn Costs) -> Vec<f64> {
    let mut consumers: HashMap<ValueKey, Vec<usize>> = HashMap::new();
    for (i, t) in tasks.iter().enumerate() {
        for &(v, _) in &t.inputs {
            consumers.entry(v).or_default().push(i);
        }
    }
    let mut rank = vec![0.0; tasks.len()];
    for i in (0..tasks.len()).rev() {
        let t = &tasks[i];
        let mean = match t.gpu_refusal {
            None => {
                (costs.node_time(&t.query, Device::Cpu, 1.0)
                    + costs.node_time(&t.query, Device::Gpu, 1.0))
                    / 2.0
            }
            Some(_) => costs.node_time(&t.query, Device::Cpu, 1.0),
        };
        let mut tail: f64 = 0.0;
        for &(v, b) in &t.outputs {
            let comm =
                (costs.transfer_time(b, Device::Cpu) + costs.transfer_time(b, Device::Gpu)) / 4.0;
            for &c in consumers.get(&v).into_iter().flatten() {
                if c > i {
                    tail = tail.max(comm + rank[c]);
                }
            }
        }
        rank[i] = mean + tail;
    }
    rank
}

/// The task that writes each value.
fn producers(tasks: &[Task]) -> HashMap<ValueKey, usize> {
    (tasks.iter().enumerate())
        .flat_map(|(i, t)| t.outputs.iter().map(move |o| (o.0, i)))
        .collect()
}

/// A topological order of tasks by decreasing upward rank (tasks are given topologically).
fn rank_order(tasks: &[Task], rank: &[f64]) -> Vec<usize> {
    let producer = producers(tasks);
    let mut waiting: Vec<usize> = tasks
        .iter()
        .map(|t| {
            t.inputs
                .iter()
                .filter(|(v, _)| producer.contains_key(v))
                .count()
        })
        .collect();
    let mut consumers: Vec<Vec<usize>> = vec![Vec::new(); tasks.len()];
    for (i, t) in tasks.iter().enumerate() {
        for (v, _) in &t.inputs {
            if let Some(&p) = producer.get(v) {
                consumers[p].push(i);
            }
        }
    }
    let mut ready: Vec<usize> = (0..tasks.len()).filter(|&i| waiting[i] == 0).collect();
    let mut order = Vec::with_capacity(tasks.len());
    while !ready.is_empty() {
        let (pos, _) = ready
            .iter()
            .enumerate()
            .max_by(|a, b| rank[*a.1].total_cmp(&rank[*b.1]).then(b.1.cmp(a.1)))
            .expect("ready is not empty");
        let i = ready.swap_remove(pos);
        order.push(i);
        for &c in &consumers[i] {
            waiting[c] -= 1;
            if waiting[c] == 0 {
                ready.push(c);
            }
        }
    }
    assert_eq!(
        order.len(),
        tasks.len(),
        "tasks must form a DAG in topological order"
    );
    order
}

fn single(t: &Task, d: Device) -> Choice {
    if t.can(d) {
        Choice::On(d)
    } else {
        Choice::On(other(d))
    }
}

/// Schedule `tasks` (in topological order) under `policy`.
pub fn schedule(tasks: &[Task], costs: &dyn Costs, policy: Policy) -> Schedule {
    schedule_from(tasks, costs, policy, 0.0)
}

/// [`schedule`] for a GPU that other work keeps busy for `gpu_ready` seconds from the run's
/// start (another session's batches in flight): nothing of this run starts on the GPU before.
pub fn schedule_from(
    tasks: &[Task],
    costs: &dyn Costs,
    policy: Policy,
    gpu_ready: f64,
) -> Schedule {
    let rank = upward_ranks(tasks, costs);
    let order = rank_order(tasks, &rank);
    let mut explain: Vec<Explain> = tasks
        .iter()
        .map(|t| Explain {
            cpu: costs.node_time(&t.query, Device::Cpu, 1.0),
            gpu: t
                .gpu_refusal
                .is_none()
                .then(|| costs.node_time(&t.query, Device::Gpu, 1.0)),
            split: None,
            why: String::new(),
        })
        .collect();
    let fixed = |choices: Vec<Choice>| finalize(tasks, costs, choices, &order, gpu_ready);
    let mut best = match policy {
        Policy::CpuOnly => fixed(tasks.iter().map(|t| single(t, Device::Cpu)).collect()),
        Policy::GpuOnly => fixed(tasks.iter().map(|t| single(t, Device::Gpu)).collect()),
        Policy::GreedyPerOp => fixed(
            (tasks.iter().zip(&explain))
                .map(|(t, e)| match (t.forced, e.gpu) {
                    (Some(d), _) => single(t, d),
                    (None, Some(g)) if g < e.cpu => Choice::On(Device::Gpu),
                    _ => Choice::On(Device::Cpu),
                })
                .collect(),
        ),
        Policy::Heft | Policy::HeftSplit => {
            // Placed twice: with the host making copies, and with copies overlapping its
            // kernels (GPU branches beside CPU ones); both replayed as the executor runs them.
            let split = policy == Policy::HeftSplit;
            let mut other = explain.clone();
            let host = fixed(heft(
                tasks,
                costs,
                &order,
                split,
                &mut explain,
                gpu_ready,
                true,
            ));
            let overlap = fixed(heft(
                tasks, costs, &order, split, &mut other, gpu_ready, false,
            ));
            if overlap.3 < host.3 {
                explain = other;
                overlap
            } else {
                host
            }
        }
    };
    if matches!(policy, Policy::Heft | Policy::HeftSplit) {
        // Never predict worse than the best single device: both are candidates, and a mix
        // must beat the better of them by MIX_MARGIN (its prediction adds up many per-node
        // errors and transfers; the single device is the safe choice).
        let mixed = best.3;
        let mut still_mixed = true;
        for d in [Device::Cpu, Device::Gpu] {
            let candidate = fixed(tasks.iter().map(|t| single(t, d)).collect());
            if candidate.0 == best.0 {
                // The plan already is this single device.
                continue;
            }
            if candidate.3 < best.3 || (still_mixed && candidate.3 <= mixed * (1.0 + MIX_MARGIN)) {
                let why = if candidate.3 < mixed {
                    format!("whole model on {d} is predicted faster than any mix")
                } else {
                    format!(
                        "whole model on {d} is predicted within {:.0}% of the best mix",
                        MIX_MARGIN * 100.0
                    )
                };
                for (e, task) in explain.iter_mut().zip(tasks) {
                    if task.forced.is_none() && task.can(d) {
                        e.why = why.clone();
                    }
                }
                best = candidate;
                still_mixed = false;
            }
        }
    }
    let (choices, order, times, makespan) = best;
    Schedule {
        choices,
        explain,
        order,
        times,
        makespan,
    }
}

/// Choices, issue order, per-task (start, finish) and makespan.
type Finalized = (Vec<Choice>, Vec<usize>, Vec<(f64, f64)>, f64);

/// The issue order of `choices` and the timeline replayed in exactly that order, which is the
/// order the executor follows. Two orders are tried, the faster kept: by simulated start time
/// (kept topological), and GPU work first ([`gpu_first`]).
fn finalize(
    tasks: &[Task],
    costs: &dyn Costs,
    choices: Vec<Choice>,
    rank_order: &[usize],
    gpu_ready: f64,
) -> Finalized {
    let (times, _) = simulate_from(tasks, costs, &choices, rank_order, gpu_ready);
    let mut by_start = rank_order.to_vec();
    by_start.sort_by(|&a, &b| times[a].0.total_cmp(&times[b].0).then(a.cmp(&b)));
    let issued = topological_by_start(tasks, &by_start);
    let (times, makespan) = simulate_from(tasks, costs, &choices, &issued, gpu_ready);
    let early = gpu_first(tasks, &choices, &issued);
    if early != issued {
        let (t, m) = simulate_from(tasks, costs, &choices, &early, gpu_ready);
        if m < makespan {
            return (choices, early, t, m);
        }
    }
    (choices, issued, times, makespan)
}

/// `order` changed so that a whole-GPU task is issued as soon as its inputs are: recording it
/// costs the host little, and the GPU then runs it beside the CPU kernels issued after it (the
/// executor submits recorded GPU work before each CPU step). Otherwise `order`'s order.
fn gpu_first(tasks: &[Task], choices: &[Choice], order: &[usize]) -> Vec<usize> {
    let producer = producers(tasks);
    let mut done = vec![false; tasks.len()];
    let ready = |i: usize, done: &[bool]| {
        (tasks[i].inputs.iter()).all(|(v, _)| producer.get(v).is_none_or(|&p| done[p]))
    };
    let mut gpu: Vec<usize> = (order.iter().copied())
        .filter(|&i| choices[i] == Choice::On(Device::Gpu))
        .collect();
    let mut out = Vec::with_capacity(order.len());
    for &i in order {
        while let Some(at) = gpu.iter().position(|&g| ready(g, &done)) {
            let g = gpu.remove(at);
            done[g] = true;
            out.push(g);
        }
        // `order` is topological, so `i`'s producers are done.
        if !done[i] {
            done[i] = true;
            out.push(i);
        }
    }
    out
}

/// `preferred` reordered minimally so that producers precede consumers.
fn topological_by_start(tasks: &[Task], preferred: &[usize]) -> Vec<usize> {
    let producer = producers(tasks);
    let mut done = vec![false; tasks.len()];
    let mut out = Vec::with_capacity(tasks.len());
    fn visit(
        i: usize,
        tasks: &[Task],
        producer: &HashMap<ValueKey, usize>,
        done: &mut [bool],
        out: &mut Vec<usize>,
    ) {
        if done[i] {
            return;
        }
        done[i] = true;
        for (v, _) in &tasks[i].inputs {
            if let Some(&p) = producer.get(v) {
                visit(p, tasks, producer, done, out);
            }
        }
        out.push(i);
    }
    for &i in preferred {
        visit(i, tasks, &producer, &mut done, &mut out);
    }
    out
}

fn heft(
    tasks: &[Task],
    costs: &dyn Costs,
    order: &[usize],
    split: bool,
    explain: &mut [Explain],
    gpu_ready: f64,
    host_copies: bool,
) -> Vec<Choice> {
    let mut sim = match host_copies {
        true => Sim::new(costs, gpu_ready),
        false => Sim::overlapping_copies(costs, gpu_ready),
    };
    let mut choices = vec![Choice::On(Device::Cpu); tasks.len()];
    for &i in order {
        let t = &tasks[i];
        let mut options: Vec<(Choice, f64)> = Vec::new();
        for d in [Device::Cpu, Device::Gpu] {
            if t.can(d) {
                options.push((Choice::On(d), sim.whole(t, d).1));
            }
        }
        let best_single = options.iter().map(|o| o.1).fold(f64::INFINITY, f64::min);
        let e = &mut explain[i];
        if split {
            if let Some((_, fin, cut)) = sim.best_split(t) {
                e.split = Some((fin, cut));
                if fin < best_single * (1.0 - SPLIT_MARGIN) {
                    options.push((Choice::Split { cut }, fin));
                }
            }
        }
        let (choice, fin) = options
            .iter()
            .copied()
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .expect("the CPU is always an option");
        e.why = match (choice, t.forced, &t.gpu_refusal) {
            (_, Some(d), _) => format!("forced to {d}"),
            (Choice::On(Device::Cpu), None, Some(r)) => format!("the GPU cannot run it: {r}"),
            (Choice::Split { cut }, ..) => format!(
                "split at row {cut}/{}: finishes at {:.3} ms vs {:.3} ms on one device",
                t.rows,
                fin * 1e3,
                best_single * 1e3
            ),
            (Choice::On(d), ..) => format!(
                "earliest finish on {d} ({:.3} ms, transfers counted)",
                fin * 1e3
            ),
        };
        choices[i] = choice;
        sim.commit(t, choice);
    }
    smooth(tasks, costs, &mut choices, explain);
    chains::rebalance(tasks, costs, order, gpu_ready, &mut choices, explain);
    choices
}

/// Move a whole-device node whose neighbours all run on the other device there, when the
/// transfers it causes cost more than the time it saves.
fn smooth(tasks: &[Task], costs: &dyn Costs, choices: &mut [Choice], explain: &mut [Explain]) {
    let producer = producers(tasks);
    let mut consumers: Vec<Vec<usize>> = vec![Vec::new(); tasks.len()];
    for (i, t) in tasks.iter().enumerate() {
        for (v, _) in &t.inputs {
            if let Some(&p) = producer.get(v) {
                consumers[p].push(i);
            }
        }
    }
    for i in 0..tasks.len() {
        let t = &tasks[i];
        let Choice::On(d) = choices[i] else { continue };
        if t.forced.is_some() || !t.can(other(d)) {
            continue;
        }
        let o = other(d);
        let preds: Vec<usize> = t
            .inputs
            .iter()
            .filter_map(|(v, _)| producer.get(v).copied())
            .collect();
        let neighbours: Vec<usize> = preds
            .iter()
            .copied()
            .chain(consumers[i].iter().copied())
            .collect();
        if neighbours.is_empty() || !neighbours.iter().all(|&n| choices[n] == Choice::On(o)) {
            continue;
        }
        let here = costs.node_time(&t.query, d, 1.0);
        let there = costs.node_time(&t.query, o, 1.0);
        let in_bytes: u64 = t.inputs.iter().map(|x| x.1).sum();
        let out_bytes: u64 = t.outputs.iter().map(|x| x.1).sum();
        let sync = costs.sync_time();
        let moves = costs.transfer_time(in_bytes, d) + costs.transfer_time(out_bytes, o) + sync;
        if there <= here + moves {
            choices[i] = Choice::On(o);
            explain[i].why = format!(
                "smoothed onto {o}: its neighbours run there and moving data costs {:.3} ms > the {:.3} ms it saves",
                moves * 1e3,
                (there - here).max(0.0) * 1e3
            );
        }
    }
}
