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
//! Sits between `Session::run_with_report_owned` and rayon.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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

/// A session's last handed-off run time, the next run's expectation.
#[derive(Debug, Default)]
pub(super) struct Expected(AtomicU64);

/// Run `f` on `pool` and return its result (a panic in `f` resumes here). A caller that is a
/// worker of a rayon pool goes through [`crate::limits::install`] instead.
pub(super) fn run_on<R: Send>(
    pool: &rayon::ThreadPool,
    expected: &Expected,
    f: impl FnOnce() -> R + Send,
) -> R {
    if rayon::current_thread_index().is_some() {
        return crate::limits::install(pool, f);
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
    let expect = Duration::from_nanos(expected.0.load(Ordering::Relaxed));
    let awake = expect >= SPIN_FROM;
    let job = {
        let slot = &slot;
        move || {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
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
    let took = start.elapsed().as_nanos().min(u64::MAX as u128) as u64;
    expected.0.store(took, Ordering::Relaxed);
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
        rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap()
    }

    #[test]
    fn runs_on_the_pool_with_borrows_and_returns_the_result_either_way_of_waiting() {
        let pool = pool();
        // Nothing expected yet (yields), then a long previous run (parks).
        for expect in [Duration::ZERO, Duration::from_millis(50)] {
            let expected = Expected(AtomicU64::new(expect.as_nanos() as u64));
            let mut seen = vec![0u32; 4];
            let on_pool = run_on(&pool, &expected, || {
                std::thread::sleep(Duration::from_millis(2));
                seen.iter_mut().for_each(|v| *v += 1);
                pool.current_thread_index().is_some()
            });
            assert!(on_pool, "the job ran off the pool");
            assert_eq!(seen, [1; 4]);
            // The run's time is the next expectation.
            let next = Duration::from_nanos(expected.0.load(Ordering::Relaxed));
            assert!(next >= Duration::from_millis(2), "{next:?}");
        }
    }

    #[test]
    fn a_panic_in_the_run_resumes_in_the_caller() {
        let pool = pool();
        let expected = Expected::default();
        let got = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            run_on(&pool, &expected, || -> u8 { panic!("kernel failed") })
        }));
        let payload = got.expect_err("the panic was lost");
        assert_eq!(payload.downcast_ref::<&str>(), Some(&"kernel failed"));
        // The pool still runs work afterwards.
        assert_eq!(run_on(&pool, &expected, || 7), 7);
    }
}
