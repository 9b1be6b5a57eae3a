//! Keeping the pool's other workers awake while a run is on it.
//!
//! Between two parallel sections of a run (one node's and the next's, or a kernel's sequential
//! setup and its parallel part) rayon's idle workers yield a few dozen times, then sleep on a
//! futex, and the next section's fork waits for them to wake: 20-25 us where cores idle in a
//! hypervisor (this host, 2 threads: the two 15 us halves of a `join` took 38 us once the other
//! worker had slept, 15.8 us with it kept awake). So for the length of a run each other worker
//! takes a spinner job, which looks for the run's work without a system call
//! (`rayon::yield_now`) and returns when the run ends, or after [`IDLE`] without finding any
//! (a GPU wait, a long sequential kernel), handing the worker back to rayon's sleep. The run's
//! worker spawns one spinner and each spinner that starts spawns up to two more, so the wakes
//! (system calls) are spread over the workers. onnxruntime's pool spins between parallel
//! sections the same way. tiny Llama prefill (many forks of 10-50 us): 1.10-1.32 -> 1.07-1.17
//! ms here, 2.03-2.30 -> 1.81-2.09 ms at 16 threads on a lent Xeon; the convnets moved within
//! this host's noise (docs/bench.md). `TANDEM_SPIN=0` turns it off (read once).
//!
//! Sits between `handoff::run_on` (whose job runs the executor on a worker) and rayon.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A spinner that found no work for this long returns.
const IDLE: Duration = Duration::from_micros(500);

/// A spinner that starts this long after it was spawned returns at once: it was not taken by
/// an idle worker but found later by one waiting inside a job, whose job it would hold up.
const CLAIM: Duration = Duration::from_micros(200);

/// Pause instructions between two polls of an idle spinner (about 1 us).
const BACKOFF: usize = 16;

thread_local! {
    /// Whether this thread is running a spinner (one inside another would stall the first).
    static SPINNING: Cell<bool> = const { Cell::new(false) };
}

/// The spinners of one run: they stop when this is dropped (the run's end).
pub(super) struct Spinners(Arc<Shared>);

/// What a run's spinners share: the stop flag, and how many are spinning.
#[derive(Default)]
struct Shared {
    stop: AtomicBool,
    live: AtomicUsize,
    /// Spinners still to spawn: each one that starts spawns up to two more, so the run's own
    /// worker wakes one sleeping worker, not all of them (a wake is a system call).
    unspawned: AtomicUsize,
    /// The run's own worker.
    home: usize,
}

impl Spinners {
    /// Start spinners for the current pool's other workers. Called by the run's job, on a
    /// worker; `None` where spinning is off or the pool has one thread.
    pub(super) fn start() -> Option<Spinners> {
        let home = rayon::current_thread_index()?;
        let others = rayon::current_num_threads().saturating_sub(1);
        if others == 0 || !enabled() {
            return None;
        }
        let shared = Arc::new(Shared {
            unspawned: AtomicUsize::new(others),
            home,
            ..Shared::default()
        });
        spawn_next(&shared);
        Some(Spinners(shared))
    }
}

/// Spawn one more spinner if any is left to spawn.
fn spawn_next(shared: &Arc<Shared>) {
    let left = shared
        .unspawned
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    if left.is_ok() {
        let shared = shared.clone();
        let spawned = Instant::now();
        rayon::spawn(move || {
            spin(&shared, spawned);
        });
    }
}

impl Drop for Spinners {
    fn drop(&mut self) {
        self.0.stop.store(true, Ordering::Relaxed);
    }
}

/// Whether `TANDEM_SPIN=0` left spinning on.
fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("TANDEM_SPIN").as_deref() != Ok("0"))
}

/// Spawn up to two more spinners, then run the pool's pending jobs as they come until `stop`,
/// or [`IDLE`] without any; whether it spun at all: not when taken later than [`CLAIM`], and
/// not on the run's own worker or inside another spinner (it is spawned again instead).
fn spin(shared: &Arc<Shared>, spawned: Instant) -> bool {
    if spawned.elapsed() > CLAIM {
        return false;
    }
    if rayon::current_thread_index() == Some(shared.home) || SPINNING.with(Cell::get) {
        // Handed on, so that the spinners it would spawn are not lost: another worker may
        // take it until it is late.
        let shared = shared.clone();
        rayon::spawn(move || {
            spin(&shared, spawned);
        });
        return false;
    }
    SPINNING.with(|s| s.set(true));
    shared.live.fetch_add(1, Ordering::Relaxed);
    spawn_next(shared);
    spawn_next(shared);
    let mut idle_since = Instant::now();
    let mut idle_rounds = 0u32;
    while !shared.stop.load(Ordering::Relaxed) {
        match rayon::yield_now() {
            Some(rayon::Yield::Executed) => idle_rounds = 0,
            _ => {
                if idle_rounds == 0 {
                    idle_since = Instant::now();
                }
                idle_rounds += 1;
                // A pause between polls: each poll tries to steal from every other worker,
                // touching the deques the busy ones push to and pop from.
                for _ in 0..BACKOFF {
                    std::hint::spin_loop();
                }
                if idle_rounds.is_multiple_of(64) && idle_since.elapsed() > IDLE {
                    break;
                }
            }
        }
    }
    shared.live.fetch_sub(1, Ordering::Relaxed);
    SPINNING.with(|s| s.set(false));
    true
}

#[cfg(test)]
mod tests {
    use super::super::pool::tests_pool as pool;
    use super::*;

    /// Spinners that were taken have all returned once the run's guard is dropped.
    #[test]
    fn spinners_stop_with_the_run() {
        let pool = pool(3);
        let shared = pool.install(|| {
            let guard = Spinners::start().expect("3 threads, spinning on");
            let forked = rayon::join(|| 1, || 2);
            assert_eq!(forked, (1, 2));
            let shared = guard.0.clone();
            drop(guard);
            shared
        });
        for _ in 0..500 {
            if shared.live.load(Ordering::Relaxed) == 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(shared.live.load(Ordering::Relaxed), 0);
    }

    /// A spinner spins on another worker until stopped, and returns at once on the run's own
    /// worker, inside another spinner, or when found late.
    #[test]
    fn spinners_spin_only_where_they_cannot_hold_up_the_run() {
        let pool = pool(2);
        let (home, other) = pool.install(|| {
            let me = rayon::current_thread_index().unwrap();
            let with_home = |home| {
                Arc::new(Shared {
                    home,
                    ..Shared::default()
                })
            };
            let now = Instant::now();
            let on_home = spin(&with_home(me), now);
            let late = spin(&with_home(1 - me), now - Duration::from_secs(1));
            SPINNING.with(|s| s.set(true));
            let nested = spin(&with_home(1 - me), Instant::now());
            SPINNING.with(|s| s.set(false));
            let elsewhere = with_home(1 - me);
            let stopper = {
                let shared = elsewhere.clone();
                std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_millis(50));
                    shared.stop.store(true, Ordering::Relaxed);
                })
            };
            let spun = spin(&elsewhere, Instant::now());
            stopper.join().unwrap();
            assert_eq!(elsewhere.live.load(Ordering::Relaxed), 0);
            ((on_home, late, nested), spun)
        });
        assert_eq!(home, (false, false, false));
        assert!(other, "a spinner on another worker did not spin");
    }

    /// Each spinner that starts spawns at most two more, and no more than the run asked for.
    #[test]
    fn spinners_spawn_at_most_one_per_other_worker() {
        let pool = pool(4);
        let left = pool.install(|| {
            let guard = Spinners::start().expect("4 threads, spinning on");
            std::thread::sleep(Duration::from_millis(20));
            let left = guard.0.unspawned.load(Ordering::Relaxed);
            assert!(guard.0.live.load(Ordering::Relaxed) <= 3);
            left
        });
        assert!(left <= 3);
    }
}
