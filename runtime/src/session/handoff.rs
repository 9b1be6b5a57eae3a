//! Handing a run to the session's pool, and waiting for it without sleeping through its end.
//!
//! `ThreadPool::install` from a thread outside the pool parks the caller on a futex until the
//! run ends, and waking a parked thread is slow where cores idle in a hypervisor (two vCPUs
//! here: the tiny Llama decode step's wall time was 0.21 ms against 0.16 measured inside the
//! executor). Here, when the previous run was short ([`SHORT`]), the caller yields until the
//! run ends, so the end is seen at once; a run that takes much longer than expected parks the
//! caller again. Longer runs park the caller throughout: a waking caller that yields beside
//! busy workers costs them about what it saves (squeezenet, shufflenet 2-3 % slower), and the
//! wake-up is a small share of their time.
//!
//! While a run longer than [`SPIN_FROM`] is on the pool, its other workers spin instead of
//! sleeping (`spin.rs`).
//!
//! A run that took under [`SERIAL_TRY`] on the pool is tried once on the caller's own thread
//! with every kernel loop run in order (`tandem_ops::parallel::serially`): no handoff, no
//! worker woken per node. Then runs of those input shapes go where they last took less, every
//! [`RETRY_EVERY`]-th the other way. tiny Llama's decode step (50 nodes, about 60 us): 0.055-
//! 0.066 ms on the pool of two, 0.053-0.055 on the caller (fast mode; docs/bench.md, "1x1s of
//! up to 256 input channels ...; a decode step on the caller's thread").
//!
//! Sits between `Session::run_with_report_owned` and rayon.

use super::spread::Spread;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Runs expected to take at most this long are waited for by yielding.
const SHORT: Duration = Duration::from_millis(1);

/// How long past the expected end the caller keeps yielding before it parks.
const LEAD: Duration = Duration::from_micros(150);

/// Runs expected to take at least this long keep the pool's other workers spinning
/// (`spin.rs`); shorter ones (a decode step: mostly one thread) would pay more to wake them
/// (at 16 threads the decode step took 0.29-0.39 ms with them against 0.24-0.30 without) than
/// their forks save.
const SPIN_FROM: Duration = Duration::from_micros(500);

/// Runs that took less than this on the pool are tried on the caller's thread.
const SERIAL_TRY: Duration = Duration::from_micros(150);

/// Every this many runs of the same shapes, the way that took longer is timed again.
const RETRY_EVERY: u32 = 64;

/// Sets of input shapes whose times are kept (the most recent).
const SHAPES: usize = 8;

/// A session's last run times per set of input shapes: each the expectation of the next run
/// of those shapes, and what decides where it runs.
#[derive(Debug, Default)]
pub(super) struct Expected(Mutex<Vec<(u64, Times)>>);

/// The last times of runs of one set of input shapes (ns, 0: none yet) on the pool and on the
/// caller's thread, and how many ran.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
struct Times {
    pool: u64,
    serial: u64,
    runs: u32,
}

impl Times {
    /// Whether the next run goes to the caller's thread: one that took under [`SERIAL_TRY`] on
    /// the pool, tried there once, then wherever it last took less, every [`RETRY_EVERY`]-th
    /// run the other way.
    fn serial_next(&self) -> bool {
        if self.pool == 0 || self.pool >= SERIAL_TRY.as_nanos() as u64 {
            return false;
        }
        if self.serial == 0 {
            return true;
        }
        let retry = self.runs % RETRY_EVERY == RETRY_EVERY - 1;
        (self.serial <= self.pool) != retry
    }
}

impl Expected {
    fn get(&self, shapes: u64) -> Times {
        let seen = self.0.lock().unwrap_or_else(|e| e.into_inner());
        seen.iter()
            .find(|(k, _)| *k == shapes)
            .map_or_else(Times::default, |e| e.1)
    }

    fn record(&self, shapes: u64, serial: bool, took: Duration) {
        let took = took.as_nanos().clamp(1, u64::MAX as u128) as u64;
        let mut seen = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let at = match seen.iter().position(|(k, _)| *k == shapes) {
            Some(at) => at,
            None => {
                if seen.len() == SHAPES {
                    seen.remove(0);
                }
                seen.push((shapes, Times::default()));
                seen.len() - 1
            }
        };
        let t = &mut seen[at].1;
        match serial {
            true => t.serial = took,
            false => t.pool = took,
        }
        t.runs = t.runs.wrapping_add(1);
    }
}

/// Run `f` on `pool`, or on this thread serially where runs of these input `shapes` (a key)
/// take less so ([`Times::serial_next`]), and return its result (a panic in `f` resumes
/// here). A caller already in serial mode (`tandem_ops::parallel::serially` around
/// `Session::run`: the application keeps the run on its thread) runs `f` as it is; one that is
/// a worker of a rayon pool goes through [`crate::limits::install`]. On the pool, the run
/// begins and ends in `spread` (after a pause, the workers it wakes start on other CPUs).
pub(super) fn run_on<R: Send>(
    pool: &rayon::ThreadPool,
    spread: &Spread,
    expected: &Expected,
    shapes: u64,
    f: impl FnOnce() -> R + Send,
) -> R {
    if tandem_ops::parallel::serial() {
        return f();
    }
    if rayon::current_thread_index().is_some() {
        return crate::limits::install(pool, f);
    }
    let times = expected.get(shapes);
    if times.serial_next() {
        let start = Instant::now();
        let r = tandem_ops::parallel::serially(f);
        expected.record(shapes, true, start.elapsed());
        return r;
    }
    struct Slot<R> {
        done: AtomicBool,
        result: std::cell::UnsafeCell<Option<std::thread::Result<R>>>,
    }
    // SAFETY: `result` is written once by the job before `done` is set (Release), and read by
    // the caller only after it sees `done` (Acquire).
    unsafe impl<R: Send> Sync for Slot<R> {}
    let slot = Slot {
        done: AtomicBool::new(false),
        result: std::cell::UnsafeCell::new(None),
    };
    let waiter = std::thread::current();
    let expect = Duration::from_nanos(times.pool);
    let awake = expect >= SPIN_FROM;
    let job = {
        let slot = &slot;
        move || {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                // After a pause, the workers it wakes start on other CPUs (spread.rs).
                let _running = spread.begin();
                // The pool's other workers stay awake for a longer run (spin.rs).
                let _awake = awake.then(super::spin::Spinners::start);
                f()
            }));
            // SAFETY: see `Slot`; nothing else touches `result` until `done` is set.
            unsafe { *slot.result.get() = Some(r) };
            // `slot` is not touched after this store: the caller may return at once.
            slot.done.store(true, Ordering::Release);
            waiter.unpark();
        }
    };
    let job: Box<dyn FnOnce() + Send + '_> = Box::new(job);
    // SAFETY: the job borrows `slot` and whatever `f` borrows; this function does not return
    // before the job has set `done` (its last use of them), and nothing between here and that
    // wait can unwind, so the borrows outlive every use.
    let job: Box<dyn FnOnce() + Send + 'static> = unsafe { std::mem::transmute(job) };
    let start = Instant::now();
    pool.spawn(job);
    let spin_until = if expect <= SHORT {
        expect + LEAD
    } else {
        Duration::ZERO
    };
    while !slot.done.load(Ordering::Acquire) {
        if start.elapsed() < spin_until {
            std::thread::yield_now();
        } else {
            std::thread::park();
        }
    }
    expected.record(shapes, false, start.elapsed());
    // SAFETY: `done` was seen (Acquire): the job wrote `result` and no longer touches it.
    match unsafe { (*slot.result.get()).take() } {
        Some(Ok(r)) => r,
        Some(Err(panic)) => std::panic::resume_unwind(panic),
        None => unreachable!("a run's job sets its result before `done`"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool() -> rayon::ThreadPool {
        super::super::pool::tests_pool(2)
    }

    fn expecting(pool_ns: u64) -> Expected {
        let e = Expected::default();
        if pool_ns > 0 {
            e.record(1, false, Duration::from_nanos(pool_ns));
        }
        e
    }

    #[test]
    fn runs_on_the_pool_with_borrows_and_returns_the_result_either_way_of_waiting() {
        let pool = pool();
        // Nothing expected yet (yields), then a long previous run (parks).
        for expect in [0, 50_000_000] {
            let expected = expecting(expect);
            let mut seen = vec![0u32; 4];
            let on_pool = run_on(&pool, &Spread::default(), &expected, 1, || {
                std::thread::sleep(Duration::from_millis(2));
                seen.iter_mut().for_each(|v| *v += 1);
                pool.current_thread_index().is_some()
            });
            assert!(on_pool, "the job ran off the pool");
            assert_eq!(seen, [1; 4]);
            // The run's time is the next expectation.
            let next = Duration::from_nanos(expected.get(1).pool);
            assert!(next >= Duration::from_millis(2), "{next:?}");
        }
    }

    #[test]
    fn a_short_run_is_tried_on_the_callers_thread_then_goes_where_it_took_less() {
        let pool = pool();
        let expected = expecting(100_000);
        // Under SERIAL_TRY on the pool: tried on this thread, every loop in order.
        let (on_pool, serial) = run_on(&pool, &Spread::default(), &expected, 1, || {
            (
                rayon::current_thread_index(),
                tandem_ops::parallel::serial(),
            )
        });
        assert_eq!((on_pool, serial), (None, true));
        assert!(
            !tandem_ops::parallel::serial(),
            "serial mode outlived the run"
        );
        // Other shapes have no times yet: the pool.
        assert!(run_on(&pool, &Spread::default(), &expected, 2, || pool
            .current_thread_index()
            .is_some()));
        // The choice, from the times: the faster way, every RETRY_EVERY-th run the other.
        let t = |pool, serial, runs| Times { pool, serial, runs }.serial_next();
        assert!(!t(0, 0, 0), "no pool time yet");
        assert!(!t(200_000, 0, 1), "longer than SERIAL_TRY");
        assert!(t(100_000, 0, 1), "not tried yet");
        assert!(t(100_000, 80_000, 5) && !t(100_000, 120_000, 5));
        assert!(!t(100_000, 80_000, RETRY_EVERY - 1) && t(100_000, 120_000, RETRY_EVERY - 1));
        // Shapes beyond SHAPES push out the oldest.
        for k in 10..10 + SHAPES as u64 {
            expected.record(k, false, Duration::from_micros(1));
        }
        assert_eq!(expected.get(1), Times::default());
        assert_eq!(expected.get(10).pool, 1_000);
    }

    #[test]
    fn a_panic_in_the_run_resumes_in_the_caller() {
        let pool = pool();
        // On the pool, and on this thread (serial mode ends with the panic).
        for expected in [Expected::default(), expecting(100_000)] {
            let got = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                run_on(&pool, &Spread::default(), &expected, 1, || -> u8 {
                    panic!("kernel failed")
                })
            }));
            let payload = got.expect_err("the panic was lost");
            assert_eq!(payload.downcast_ref::<&str>(), Some(&"kernel failed"));
            assert!(!tandem_ops::parallel::serial());
            // The pool still runs work afterwards.
            assert_eq!(run_on(&pool, &Spread::default(), &expected, 1, || 7), 7);
        }
    }
}
