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
//! each on one CPU, dealt out in turn so that every CPU holds its share), and gives them back
//! the CPUs they had (as the run's worker finds its own: an affinity the application set since
//! stays) when the run ends: the probe's woken thread started 0.08-0.10 ms late, on the idle
//! CPU, and magika after 50 ms idle took 4.44 ms against 8.14 (4.39 with the threads pinned
//! throughout; onnxruntime 4.83-5.21). Keeping only the others off it was not enough: its
//! worker was moved onto theirs. A mask change costs about 1 us. Back to back nothing is
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
    runs: Mutex<Runs>,
}

/// How many runs are on the pool, and when the last one ended.
#[derive(Debug, Default)]
struct Runs {
    running: usize,
    last_end: Option<Instant>,
}

/// One run on the pool, from its first step to its end (the drop), and the CPUs it narrowed the
/// workers from (empty: it narrowed nothing), which they get back at its end.
pub(super) struct Running<'a> {
    spread: &'a Spread,
    widen_to: Vec<usize>,
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
            widen_to: match after_pause {
                true => self.narrow(),
                false => Vec::new(),
            },
        }
    }

    /// Keep this worker on its CPU and the others on the other CPUs it may run on now (the
    /// application may have set them since): with at least one worker a CPU, each on one, in
    /// turn from the CPU after this one's (so that where workers outnumber the CPUs, every CPU
    /// holds its share); with fewer, anywhere but here. The CPUs it narrowed them from (empty:
    /// it did nothing).
    fn narrow(&self) -> Vec<usize> {
        if self.workers.is_empty() {
            return Vec::new();
        }
        let (Some(home), Some(here)) = (rayon::current_thread_index(), affinity::current_cpu())
        else {
            return Vec::new();
        };
        let cpus = affinity::allowed_cpus(0);
        let n = cpus.len();
        let Some(at) = cpus.iter().position(|&c| c == here).filter(|_| n >= 2) else {
            return Vec::new();
        };
        let others: Vec<usize> = (1..n).map(|d| cpus[(at + d) % n]).collect();
        let in_turn = self.workers.len() >= n;
        let mut k = 0;
        for (i, &thread) in self.workers.iter().enumerate() {
            let to = match (i == home, in_turn) {
                (true, _) => &[here][..],
                (false, true) => &cpus[(at + 1 + k) % n..][..1],
                (false, false) => &others[..],
            };
            k += usize::from(i != home);
            // A mask the OS refuses leaves that worker as it was: this only speeds its wake.
            let _ = affinity::set_cpus(thread, to);
        }
        cpus
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        let spread = self.spread;
        if !self.widen_to.is_empty() {
            for &thread in &spread.workers {
                let _ = affinity::set_cpus(thread, &self.widen_to);
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
            assert!(
                !run.widen_to.is_empty(),
                "the first run follows no run: a pause"
            );
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
        let narrowed = |spread: &Spread| pool.install(|| !spread.begin().widen_to.is_empty());
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
            assert!(!run.widen_to.is_empty());
            masks(&spread)
        });
        for cpu in &cpus {
            let on_it = during.iter().filter(|m| m[..] == [*cpu]).count();
            assert_eq!(on_it, 2, "two workers on CPU {cpu}: {during:?}");
        }
    }

    #[test]
    fn a_run_gives_the_workers_back_the_cpus_the_application_left_them() {
        let cpus = affinity::allowed_cpus(0);
        assert!(cpus.len() >= 2, "this test needs two CPUs: {cpus:?}");
        let pool = pool(2);
        let spread = Spread::new(&pool, false);
        // The application keeps the pool's threads off its last CPU after the session started.
        let kept = &cpus[..cpus.len() - 1];
        for &t in &spread.workers {
            affinity::set_cpus(t, kept).unwrap();
        }
        std::thread::sleep(PAUSE * 2);
        pool.install(|| drop(spread.begin()));
        assert_eq!(masks(&spread), vec![kept.to_vec(); 2]);
    }

    #[test]
    fn pinned_or_single_worker_pools_are_never_narrowed() {
        for (threads, pinned) in [(2, true), (1, false)] {
            let pool = pool(threads);
            let spread = Spread::new(&pool, pinned);
            assert!(spread.workers.is_empty());
            assert!(pool.install(|| spread.begin().widen_to.is_empty()));
        }
    }

    #[test]
    fn a_run_beside_another_narrows_nothing() {
        let pool = pool(2);
        let spread = Spread::new(&pool, false);
        let first = spread.begin();
        assert!(
            spread.begin().widen_to.is_empty(),
            "another run is on the pool"
        );
        drop(first);
    }
}
