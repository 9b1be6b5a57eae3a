//! Spreading a run's workers over the CPUs when the run follows a pause.
//!
//! Some schedulers place a woken thread on the CPU of the thread that woke it rather than wake
//! a CPU that has idled for a while: this host's kernel (a KVM guest, `sched_vcpu_pack=15`)
//! does so once a CPU has idled for about 8 ms (a C probe: the woken thread started 1.7-3.9 ms
//! late, on its waker's busy CPU, against 0.02-0.07 ms after 2-5 ms of idling), and it moves
//! running threads onto a busy CPU too. A run that follows such a pause then woke the pool's
//! other workers onto its own worker's CPU and ran on one CPU for its first milliseconds. So
//! where the session's last run ended at least [`PAUSE`] ago, the run's worker first keeps
//! itself on its CPU and the other workers off it (where the pool has a worker a CPU or more,
//! each on one CPU, dealt out in turn so that every CPU holds its share), and lets them all run
//! anywhere again when the run ends: the probe's woken thread started 0.08-0.10 ms late, on the
//! idle CPU, and magika after 50 ms idle took 4.44 ms against 8.14 (4.39 with the threads
//! pinned throughout; onnxruntime 4.83-5.21). Keeping only the others off it was not enough:
//! its worker was moved onto theirs. A mask change costs about 1 us. Back to back nothing is
//! narrowed, as holding the threads throughout gained nothing measurable (`pool.rs`). Sessions
//! pinned with `pin_threads` need none of it.
//! docs/bench.md, "A run after a pause spreads its workers".
//!
//! Sits between `handoff::run_on` (whose job begins and ends each run on a worker) and the OS's
//! CPU affinity (`pool::affinity`: Linux and Android; elsewhere nothing is narrowed).

use super::pool::affinity::{self, Thread};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A run that starts at least this long after the last one ended spreads its workers.
pub(super) const PAUSE: Duration = Duration::from_millis(2);

/// A pool's workers, and when its last run ended.
#[derive(Debug, Default)]
pub(super) struct Spread {
    /// Each worker's thread (by its index in the pool); empty where nothing is narrowed.
    workers: Vec<Thread>,
    /// The CPUs the workers may run on when not narrowed.
    cpus: Vec<usize>,
    runs: Mutex<Runs>,
}

/// How many runs are on the pool, and when the last one ended.
#[derive(Debug, Default)]
struct Runs {
    running: usize,
    last_end: Option<Instant>,
}

/// One run on the pool, from its first step to its end (the drop), and whether it narrowed the
/// other workers' CPUs.
pub(super) struct Running<'a> {
    spread: &'a Spread,
    narrowed: bool,
}

impl Spread {
    /// The spread of `pool`'s workers; nothing is narrowed where they are `pinned`, where
    /// there is one worker or one CPU, or where the OS does not say which thread is which.
    pub(super) fn new(pool: &rayon::ThreadPool, pinned: bool) -> Spread {
        let cpus = affinity::allowed_cpus(0);
        if pinned || pool.current_num_threads() < 2 || cpus.len() < 2 {
            return Spread::default();
        }
        let workers: Option<Vec<Thread>> = (pool.broadcast(|_| affinity::this_thread()))
            .into_iter()
            .collect();
        Spread {
            workers: workers.unwrap_or_default(),
            cpus,
            runs: Mutex::default(),
        }
    }

    /// Begin a run, on the worker that runs it: where no other run is on the pool and the last
    /// one ended at least [`PAUSE`] ago (or none ran yet), narrow the workers' CPUs.
    pub(super) fn begin(&self) -> Running<'_> {
        let after_pause = {
            let mut runs = self.runs.lock().unwrap_or_else(|e| e.into_inner());
            runs.running += 1;
            runs.running == 1 && runs.last_end.is_none_or(|end| end.elapsed() >= PAUSE)
        };
        Running {
            spread: self,
            narrowed: after_pause && self.narrow(),
        }
    }

    /// Keep this worker on its CPU and the others on the other CPUs: with at least one worker
    /// a CPU, each on one, in turn from the CPU after this one's (so that where workers
    /// outnumber the CPUs, every CPU holds its share); with fewer, anywhere but here. Whether
    /// it did.
    fn narrow(&self) -> bool {
        let (Some(home), Some(here)) = (rayon::current_thread_index(), affinity::current_cpu())
        else {
            return false;
        };
        let Some(at) = self.cpus.iter().position(|&c| c == here) else {
            return false;
        };
        let n = self.cpus.len();
        let others: Vec<usize> = (1..n).map(|d| self.cpus[(at + d) % n]).collect();
        let in_turn = self.workers.len() >= n;
        let mut k = 0;
        for (i, &thread) in self.workers.iter().enumerate() {
            let cpus = match (i == home, in_turn) {
                (true, _) => &[here][..],
                (false, true) => &self.cpus[(at + 1 + k) % n..][..1],
                (false, false) => &others[..],
            };
            k += usize::from(i != home);
            // A mask the OS refuses leaves that worker as it was: this only speeds its wake.
            let _ = affinity::set_cpus(thread, cpus);
        }
        true
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        let spread = self.spread;
        if self.narrowed {
            for &thread in &spread.workers {
                let _ = affinity::set_cpus(thread, &spread.cpus);
            }
        }
        let mut runs = spread.runs.lock().unwrap_or_else(|e| e.into_inner());
        runs.running -= 1;
        runs.last_end = Some(Instant::now());
    }
}

#[cfg(all(test, any(target_os = "linux", target_os = "android")))]
mod tests {
    use super::super::pool::tests_pool as pool;
    use super::*;

    /// Every worker's CPUs, as the OS has them.
    fn masks(spread: &Spread) -> Vec<Vec<usize>> {
        (spread.workers.iter())
            .map(|&t| affinity::allowed_cpus(t))
            .collect()
    }

    #[test]
    fn a_run_after_a_pause_keeps_the_other_workers_off_its_cpu_until_it_ends() {
        let cpus = affinity::allowed_cpus(0);
        assert!(cpus.len() >= 2, "this test needs two CPUs: {cpus:?}");
        let pool = pool(cpus.len());
        let spread = Spread::new(&pool, false);
        assert_eq!(spread.workers.len(), cpus.len());
        let (home, here, during) = pool.install(|| {
            let run = spread.begin();
            assert!(run.narrowed, "the first run follows no run: a pause");
            let home = rayon::current_thread_index().unwrap();
            (home, affinity::current_cpu().unwrap(), masks(&spread))
        });
        assert_eq!(
            during[home],
            [here],
            "the run's own worker stays on its CPU"
        );
        let mut others: Vec<usize> = (during.iter().enumerate())
            .filter(|&(i, _)| i != home)
            .map(|(_, m)| {
                assert_eq!(m.len(), 1, "one worker a CPU: each on one: {during:?}");
                m[0]
            })
            .collect();
        others.sort();
        let want: Vec<usize> = cpus.iter().copied().filter(|&c| c != here).collect();
        assert_eq!(
            others, want,
            "the others, each on a CPU but the run's ({here})"
        );
        assert_eq!(
            masks(&spread),
            vec![cpus.clone(); cpus.len()],
            "widened at the end"
        );
        // Back to back: nothing narrowed; after a pause again: narrowed.
        let narrowed = |spread: &Spread| pool.install(|| spread.begin().narrowed);
        assert!(!narrowed(&spread));
        std::thread::sleep(PAUSE * 2);
        assert!(narrowed(&spread));
    }

    #[test]
    fn workers_that_outnumber_the_cpus_are_dealt_out_to_every_cpu_in_turn() {
        let cpus = affinity::allowed_cpus(0);
        assert!(cpus.len() >= 2, "this test needs two CPUs: {cpus:?}");
        let pool = pool(cpus.len() * 2);
        let spread = Spread::new(&pool, false);
        let during = pool.install(|| {
            let run = spread.begin();
            assert!(run.narrowed);
            masks(&spread)
        });
        for cpu in &cpus {
            let on_it = during.iter().filter(|m| m[..] == [*cpu]).count();
            assert_eq!(on_it, 2, "two workers on CPU {cpu}: {during:?}");
        }
    }

    #[test]
    fn pinned_or_single_worker_pools_are_never_narrowed() {
        for (threads, pinned) in [(2, true), (1, false)] {
            let pool = pool(threads);
            let spread = Spread::new(&pool, pinned);
            assert!(spread.workers.is_empty());
            assert!(!pool.install(|| spread.begin().narrowed));
        }
    }

    #[test]
    fn a_run_beside_another_narrows_nothing() {
        let pool = pool(2);
        let spread = Spread::new(&pool, false);
        let first = spread.begin();
        assert!(!spread.begin().narrowed, "another run is on the pool");
        drop(first);
    }
}
