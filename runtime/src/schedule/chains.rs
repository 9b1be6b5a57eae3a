//! Split chains (CoDL): split nodes linked through row-local inputs share one cut, so the value
//! between them stays in its two halves with no join.
//!
//! Sits inside the scheduler (`schedule.rs`): after HEFT and smoothing, it gives each chain the
//! common cut that balances the chain's summed CPU and GPU time, and keeps it only where the
//! replayed schedule is predicted faster.

use super::{producers, simulate_from, Choice, Explain, Task, ValueKey};
use crate::costs::Costs;
use crate::plan::Device;
use std::collections::HashMap;

/// Chains with at most this many groups re-balanced one by one when re-balancing them all at
/// once is not predicted better (each try replays the whole schedule).
const MAX_CHAIN_TRIES: usize = 16;

/// Give each chain of split nodes (linked through row-local inputs, row counts on one grid) one
/// common cut, so no join happens inside it: the fraction that equalises the chain's summed CPU
/// time with its summed GPU time (the uploads before and the final join after are the host's,
/// [`chain_cuts`]). Kept only where the replayed schedule is predicted faster.
pub(super) fn rebalance(
    tasks: &[Task],
    costs: &dyn Costs,
    order: &[usize],
    gpu_ready: f64,
    choices: &mut [Choice],
    explain: &mut [Explain],
) {
    let producer = producers(tasks);
    let split = |c: &[Choice], i: usize| matches!(c[i], Choice::Split { .. });
    let mut parent: Vec<usize> = (0..tasks.len()).collect();
    fn root(parent: &mut [usize], mut i: usize) -> usize {
        while parent[i] != i {
            parent[i] = parent[parent[i]];
            i = parent[i];
        }
        i
    }
    for (c, t) in tasks.iter().enumerate() {
        for v in t.row_local.iter().filter(|_| split(choices, c)) {
            let Some(&p) = producer.get(v) else { continue };
            let (a, b) = (tasks[p].rows, t.rows);
            if split(choices, p) && a.max(b).is_multiple_of(a.min(b)) {
                let (rp, rc) = (root(&mut parent, p), root(&mut parent, c));
                parent[rp] = rc;
            }
        }
    }
    let mut groups: HashMap<usize, Vec<usize>> = HashMap::new();
    for i in (0..tasks.len()).filter(|&i| split(choices, i)) {
        groups.entry(root(&mut parent, i)).or_default().push(i);
    }
    let mut groups: Vec<Vec<usize>> = groups.into_values().filter(|g| g.len() > 1).collect();
    groups.sort();
    let proposals: Vec<Vec<(usize, usize)>> = groups
        .iter()
        .filter_map(|g| chain_cuts(tasks, costs, g))
        .collect();
    let makespan = |c: &[Choice]| simulate_from(tasks, costs, c, order, gpu_ready).1;
    let apply = |c: &mut [Choice], cuts: &[(usize, usize)]| {
        for &(i, cut) in cuts {
            c[i] = Choice::Split { cut };
        }
    };
    let mut best = makespan(choices);
    let mut all = choices.to_vec();
    proposals.iter().for_each(|p| apply(&mut all, p));
    let mut accepted: Vec<&Vec<(usize, usize)>> = Vec::new();
    if makespan(&all) < best {
        choices.copy_from_slice(&all);
        accepted.extend(&proposals);
    } else {
        for p in proposals.iter().take(MAX_CHAIN_TRIES) {
            let mut c = choices.to_vec();
            apply(&mut c, p);
            let m = makespan(&c);
            if m < best {
                best = m;
                choices.copy_from_slice(&c);
                accepted.push(p);
            }
        }
    }
    for p in accepted {
        for &(i, cut) in p {
            explain[i].why = format!(
                "split at row {cut}/{}, chained with {} row-local neighbour(s) at one cut (no join \
                 inside the chain)",
                tasks[i].rows,
                p.len() - 1
            );
        }
    }
}

/// The common cut of a chain `g` (task indices): per task, its cut at the fraction (on the
/// coarsest row grid) minimising uploads into the chain + max(summed CPU time, summed GPU
/// time) + the last join. The host makes the copies: it uploads before its own rows start and
/// joins after both parts are done.
fn chain_cuts(tasks: &[Task], costs: &dyn Costs, g: &[usize]) -> Option<Vec<(usize, usize)>> {
    let grid = g.iter().map(|&i| tasks[i].rows).min()?;
    if grid < 2 || g.iter().any(|&i| !tasks[i].rows.is_multiple_of(grid)) {
        return None;
    }
    let last = *g.iter().max()?;
    let join_bytes: u64 = tasks[last].outputs.iter().map(|o| o.1).sum();
    let inside: Vec<ValueKey> = g
        .iter()
        .flat_map(|&i| tasks[i].outputs.iter().map(|o| o.0))
        .collect();
    let upload: f64 = g
        .iter()
        .flat_map(|&i| tasks[i].inputs.iter())
        .filter(|(v, _)| !inside.contains(v))
        .map(|&(_, b)| costs.transfer_time(b, Device::Gpu))
        .sum();
    let cost = |k: usize| {
        let f = (grid - k) as f64 / grid as f64;
        let cpu: f64 = g
            .iter()
            .map(|&i| costs.node_time(&tasks[i].query, Device::Cpu, 1.0 - f))
            .sum();
        let gpu: f64 = g
            .iter()
            .map(|&i| {
                let share = tasks[i].gpu_share(k * tasks[i].rows / grid);
                costs.node_time(&tasks[i].query, Device::Gpu, share)
            })
            .sum();
        let join =
            costs.transfer_time((join_bytes as f64 * f) as u64, Device::Cpu) + costs.sync_time();
        upload + cpu.max(gpu) + join
    };
    let step = (grid / 64).max(1);
    let mut k = (1..grid)
        .step_by(step)
        .min_by(|&a, &b| cost(a).total_cmp(&cost(b)))?;
    for c in k.saturating_sub(step).max(1)..(k + step).min(grid) {
        if cost(c) < cost(k) {
            k = c;
        }
    }
    Some(g.iter().map(|&i| (i, k * tasks[i].rows / grid)).collect())
}
