//! The scheduler's replay of a plan: two device timelines (busy intervals, insertion into idle
//! gaps), where each value is and when, transfers and syncs on edges that cross devices, and the
//! halves a split leaves (read in place by a chained split, joined otherwise).
//!
//! Sits inside the scheduler (`schedule.rs`): HEFT asks it what a choice would cost
//! ([`Sim::whole`], [`Sim::best_split`]) and commits the one it takes; [`simulate`] replays fixed
//! choices (chains, smoothing, the final timeline, `tandem simulate`).

use super::{Choice, Task, ValueKey};
use crate::costs::Costs;
use crate::plan::Device;
use std::collections::HashMap;

/// Busy intervals of one device, sorted.
#[derive(Default, Clone)]
struct Timeline {
    busy: Vec<(f64, f64)>,
}

impl Timeline {
    /// Earliest start >= `ready` of a `len`-long idle gap (insertion policy).
    fn earliest(&self, ready: f64, len: f64) -> f64 {
        let mut t = ready;
        for &(s, e) in &self.busy {
            if t + len <= s {
                return t;
            }
            t = t.max(e);
        }
        t
    }

    fn occupy(&mut self, s: f64, e: f64) {
        let at = self.busy.partition_point(|b| b.0 < s);
        self.busy.insert(at, (s, e));
    }
}

fn idx(d: Device) -> usize {
    match d {
        Device::Cpu => 0,
        Device::Gpu => 1,
    }
}

pub(super) fn other(d: Device) -> Device {
    match d {
        Device::Cpu => Device::Gpu,
        Device::Gpu => Device::Cpu,
    }
}

/// Replays choices on two device timelines, tracking where each value is and when.
pub(super) struct Sim<'c> {
    costs: &'c dyn Costs,
    lines: [Timeline; 2],
    /// Per value: time it is available on [cpu, gpu].
    avail: HashMap<ValueKey, [Option<f64>; 2]>,
    /// Per split value: its (cut, rows) and when its CPU and GPU halves are ready.
    halves: HashMap<ValueKey, Halves>,
}

/// A value left in two parts by a split: rows `..cut` of `rows` on the host, the rest on the GPU.
#[derive(Clone, Copy)]
struct Halves {
    cut: usize,
    rows: usize,
    ready: [f64; 2],
}

/// True when a split of `t` at `cut` reads `h`'s halves without a join: the same fraction of
/// rows (so the same element), and `t` row-local on it.
fn chains(t: &Task, cut: usize, h: &Halves) -> bool {
    cut * h.rows == h.cut * t.rows
}

impl<'c> Sim<'c> {
    /// A replay whose GPU is busy with other work until `gpu_ready` seconds.
    pub(super) fn new(costs: &'c dyn Costs, gpu_ready: f64) -> Self {
        let mut gpu = Timeline::default();
        if gpu_ready > 0.0 {
            gpu.occupy(0.0, gpu_ready);
        }
        Sim {
            costs,
            lines: [Timeline::default(), gpu],
            avail: HashMap::new(),
            halves: HashMap::new(),
        }
    }

    fn transfer(&self, bytes: u64, to: Device) -> f64 {
        let sync = if to == Device::Cpu {
            self.costs.sync_time()
        } else {
            0.0
        };
        self.costs.transfer_time(bytes, to) + sync
    }

    /// When value `v` can be read on `d`, counting a transfer if it lives elsewhere. Values
    /// never produced by a task (graph inputs) start on the CPU at time 0.
    fn ready_on(&self, v: ValueKey, bytes: u64, d: Device) -> f64 {
        let a = self.avail.get(&v).copied().unwrap_or([Some(0.0), None]);
        match (a[idx(d)], a[idx(other(d))]) {
            (Some(t), _) => t,
            (None, Some(t)) => t + self.transfer(bytes, d),
            (None, None) => 0.0,
        }
    }

    fn ready(&self, t: &Task, d: Device) -> f64 {
        t.inputs
            .iter()
            .map(|&(v, b)| self.ready_on(v, b, d))
            .fold(0.0, f64::max)
    }

    /// When the CPU and GPU parts of `t` split at `cut` can start: inputs the split chains on
    /// are ready per half, the others as for a whole node.
    fn split_ready(&self, t: &Task, cut: usize) -> [f64; 2] {
        let mut r = [0.0f64; 2];
        for &(v, b) in &t.inputs {
            let h = self
                .halves
                .get(&v)
                .filter(|h| t.row_local.contains(&v) && chains(t, cut, h));
            for d in [Device::Cpu, Device::Gpu] {
                let at = match h {
                    Some(h) => h.ready[idx(d)],
                    None => self.ready_on(v, b, d),
                };
                r[idx(d)] = r[idx(d)].max(at);
            }
        }
        r
    }

    /// Cut of `t` that keeps a split input's halves in place, if one of its row-local inputs
    /// is split at a fraction `t`'s rows can express.
    fn chained_cut(&self, t: &Task) -> Option<usize> {
        t.row_local.iter().find_map(|v| {
            let h = self.halves.get(v)?;
            (h.cut * t.rows)
                .is_multiple_of(h.rows)
                .then_some(h.cut * t.rows / h.rows)
        })
    }

    pub(super) fn whole(&self, t: &Task, d: Device) -> (f64, f64) {
        let len = self.costs.node_time(&t.query, d, 1.0);
        let s = self.lines[idx(d)].earliest(self.ready(t, d), len);
        (s, s + len)
    }

    /// Best split of `t`: (start, finish, cut), finish including the join on the host.
    pub(super) fn best_split(&self, t: &Task) -> Option<(f64, f64, usize)> {
        if !t.can_split() {
            return None;
        }
        let out_bytes: u64 = t.outputs.iter().map(|o| o.1).sum();
        let eval = |cut: usize| -> (f64, f64) {
            let [rc, rg] = self.split_ready(t, cut);
            let f = (t.rows - cut) as f64 / t.rows as f64;
            let tc = self.costs.node_time(&t.query, Device::Cpu, 1.0 - f);
            let tg = self
                .costs
                .node_time(&t.query, Device::Gpu, t.gpu_share(cut));
            let cs = self.lines[0].earliest(rc, tc);
            let gs = self.lines[1].earliest(rg, tg);
            let join = self.transfer((out_bytes as f64 * f) as u64, Device::Cpu);
            (cs.min(gs), (cs + tc).max(gs + tg + join))
        };
        let consider = |best: &mut Option<(f64, f64, usize)>, cut: usize| {
            if cut == 0 || cut >= t.rows {
                return;
            }
            let (s, f) = eval(cut);
            if best.is_none_or(|b| f < b.1) {
                *best = Some((s, f, cut));
            }
        };
        let mut best = None;
        // A chained cut keeps its input's halves in place: taken as it is.
        if let Some(cut) = self.chained_cut(t) {
            consider(&mut best, cut);
        }
        // Other cuts are rounded to the kernel's tile height (the GPU part in whole tiles).
        let tiled = |best: &mut Option<(f64, f64, usize)>, cut: usize| {
            if let Some(c) = t.tile_cut(cut) {
                consider(best, c);
            }
        };
        for i in 1..20 {
            tiled(
                &mut best,
                (t.rows as f64 * i as f64 / 20.0).round() as usize,
            );
        }
        if let Some((_, _, c)) = best {
            let step = (t.rows / 20).max(t.gpu_tile).max(1);
            let lo = c.saturating_sub(step);
            let stride = (2 * step / 16).max(t.gpu_tile).max(1);
            for cut in (lo..=(c + step).min(t.rows)).step_by(stride) {
                tiled(&mut best, cut);
            }
        }
        best
    }

    pub(super) fn commit(&mut self, t: &Task, choice: Choice) -> (f64, f64) {
        match choice {
            Choice::On(d) => {
                for &(v, b) in &t.inputs {
                    let r = self.ready_on(v, b, d);
                    self.avail.entry(v).or_insert([Some(0.0), None])[idx(d)] = Some(r);
                }
                let (s, f) = self.whole(t, d);
                self.lines[idx(d)].occupy(s, f);
                for &(v, _) in &t.outputs {
                    let mut a = [None, None];
                    a[idx(d)] = Some(f);
                    self.avail.insert(v, a);
                }
                (s, f)
            }
            Choice::Split { cut } => {
                let f = (t.rows - cut) as f64 / t.rows as f64;
                let tc = self.costs.node_time(&t.query, Device::Cpu, 1.0 - f);
                let tg = self
                    .costs
                    .node_time(&t.query, Device::Gpu, t.gpu_share(cut));
                let [rc, rg] = self.split_ready(t, cut);
                let cs = self.lines[0].earliest(rc, tc);
                let gs = self.lines[1].earliest(rg, tg);
                self.lines[0].occupy(cs, cs + tc);
                self.lines[1].occupy(gs, gs + tg);
                let out_bytes: u64 = t.outputs.iter().map(|o| o.1).sum();
                let join = self.transfer((out_bytes as f64 * f) as u64, Device::Cpu);
                let fin = (cs + tc).max(gs + tg + join);
                for &(v, _) in &t.outputs {
                    self.avail.insert(v, [Some(fin), None]);
                    let ready = [cs + tc, gs + tg];
                    let rows = t.rows;
                    self.halves.insert(v, Halves { cut, rows, ready });
                }
                (cs.min(gs), fin)
            }
        }
    }
}

/// Replay fixed choices in `order`; returns per-task (start, finish) and the makespan.
pub fn simulate(
    tasks: &[Task],
    costs: &dyn Costs,
    choices: &[Choice],
    order: &[usize],
) -> (Vec<(f64, f64)>, f64) {
    simulate_from(tasks, costs, choices, order, 0.0)
}

/// [`simulate`] with the GPU busy with other work until `gpu_ready` seconds.
pub fn simulate_from(
    tasks: &[Task],
    costs: &dyn Costs,
    choices: &[Choice],
    order: &[usize],
    gpu_ready: f64,
) -> (Vec<(f64, f64)>, f64) {
    let mut sim = Sim::new(costs, gpu_ready);
    let mut times = vec![(0.0, 0.0); tasks.len()];
    for &i in order {
        times[i] = sim.commit(&tasks[i], choices[i]);
    }
    let makespan = times.iter().map(|t| t.1).fold(0.0, f64::max);
    (times, makespan)
}
