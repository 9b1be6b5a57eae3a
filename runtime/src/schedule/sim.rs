//! The scheduler's replay of a plan: two device timelines (busy intervals, insertion into idle
//! gaps), where each value is and when, transfers and syncs on edges that cross devices (made by
//! the host, so on the CPU's timeline), and the halves a split leaves (read in place by a chained
//! split, joined otherwise).
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
    /// Copies take the CPU's timeline (what the executor does); false lets them overlap the
    /// CPU's kernels ([`Sim::overlapping_copies`]).
    host_copies: bool,
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
            host_copies: true,
        }
    }

    /// [`Sim::new`] whose copies overlap the CPU's kernels, as if another thread made them.
    /// HEFT placing with it finds GPU work beside CPU work that the host-copy replay misses
    /// when it replays in rank order: issued first, that work's upload precedes the CPU's
    /// kernel (see `schedule::finalize`).
    pub(super) fn overlapping_copies(costs: &'c dyn Costs, gpu_ready: f64) -> Self {
        Sim {
            host_copies: false,
            ..Sim::new(costs, gpu_ready)
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

    /// When value `v` can be read on `d`, counting a copy if it lives elsewhere. Values never
    /// produced by a task (graph inputs) start on the CPU at time 0.
    fn ready_on(&self, v: ValueKey, bytes: u64, d: Device) -> f64 {
        match self.copy(v, bytes, d) {
            Ok(t) => t,
            Err((start, len)) => start + len,
        }
    }

    /// `Ok(when v is on d)`, or `Err((start, length))` of the copy that puts it there. The
    /// host makes every copy (an upload fills staging memory, a download waits, maps and reads
    /// it), so a copy takes the first idle gap of the CPU's timeline after the value is ready:
    /// the executor runs CPU kernels on the same thread, one step after another.
    fn copy(&self, v: ValueKey, bytes: u64, d: Device) -> Result<f64, (f64, f64)> {
        let a = self.avail.get(&v).copied().unwrap_or([Some(0.0), None]);
        match (a[idx(d)], a[idx(other(d))]) {
            (Some(t), _) => Ok(t),
            (None, Some(t)) => {
                let len = self.transfer(bytes, d);
                match self.host_copies {
                    true => Err((self.lines[0].earliest(t, len), len)),
                    false => Err((t, len)),
                }
            }
            (None, None) => Ok(0.0),
        }
    }

    /// Make the copies `t`'s inputs need on `d` (those `skip` leaves out are read in place):
    /// each takes its gap on the CPU's timeline and the value is then on both devices.
    fn take_copies(&mut self, t: &Task, d: Device, skip: impl Fn(ValueKey) -> bool) {
        for &(v, b) in t.inputs.iter().filter(|(v, _)| !skip(*v)) {
            if let Err((start, len)) = self.copy(v, b, d) {
                if self.host_copies {
                    self.lines[0].occupy(start, start + len);
                }
                self.avail.entry(v).or_insert([Some(0.0), None])[idx(d)] = Some(start + len);
            }
        }
    }

    /// When the host can have joined a split's GPU rows (a download of `bytes`) after its CPU
    /// part ends at `cpu_end` and its GPU part at `gpu_end`: the executor downloads after it ran
    /// the CPU part, in the CPU timeline's first gap after both.
    fn join_slot(&self, cpu_end: f64, gpu_end: f64, bytes: u64) -> (f64, f64) {
        let len = self.transfer(bytes, Device::Cpu);
        match self.host_copies {
            true => (self.lines[0].earliest(cpu_end.max(gpu_end), len), len),
            // Overlapping: the download follows the GPU part, done by the CPU part's end.
            false => ((cpu_end - len).max(gpu_end), len),
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
            let h = self.halves.get(&v).filter(|_| self.chained_on(t, cut, v));
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

    /// True when a split of `t` at `cut` reads input `v` in its halves, in place (a chain).
    fn chained_on(&self, t: &Task, cut: usize, v: ValueKey) -> bool {
        let h = self.halves.get(&v);
        h.is_some_and(|h| t.row_local.contains(&v) && chains(t, cut, h))
    }

    /// When the host is done with the copies a split of `t` at `cut` makes for its GPU rows
    /// (inputs it does not chain on): it makes them before it runs the CPU rows. 0 when there
    /// are none, or when copies overlap the CPU's kernels.
    fn gpu_copies_end(&self, t: &Task, cut: usize) -> f64 {
        if !self.host_copies {
            return 0.0;
        }
        (t.inputs.iter())
            .filter(|(v, _)| !self.chained_on(t, cut, *v))
            .filter_map(|&(v, b)| self.copy(v, b, Device::Gpu).err())
            .map(|(start, len)| start + len)
            .fold(0.0, f64::max)
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
            let cs = self.lines[0].earliest(rc.max(self.gpu_copies_end(t, cut)), tc);
            let gs = self.lines[1].earliest(rg, tg);
            let (js, join) = self.join_slot(cs + tc, gs + tg, (out_bytes as f64 * f) as u64);
            (cs.min(gs), js + join)
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
                self.take_copies(t, d, |_| false);
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
                // Inputs the split chains on stay in their halves; the others are copied to
                // the device that lacks them first, the GPU's before the CPU rows run.
                let chained: Vec<ValueKey> = (t.inputs.iter())
                    .filter(|(v, _)| self.chained_on(t, cut, *v))
                    .map(|(v, _)| *v)
                    .collect();
                let copied = self.gpu_copies_end(t, cut);
                for d in [Device::Cpu, Device::Gpu] {
                    self.take_copies(t, d, |v| chained.contains(&v));
                }
                let [rc, rg] = self.split_ready(t, cut);
                let cs = self.lines[0].earliest(rc.max(copied), tc);
                let gs = self.lines[1].earliest(rg, tg);
                self.lines[0].occupy(cs, cs + tc);
                self.lines[1].occupy(gs, gs + tg);
                let out_bytes: u64 = t.outputs.iter().map(|o| o.1).sum();
                // The join is counted in the finish, but not taken on the CPU's timeline: a
                // chained split reads the halves in place and never makes it.
                let (js, join) = self.join_slot(cs + tc, gs + tg, (out_bytes as f64 * f) as u64);
                let fin = js + join;
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
