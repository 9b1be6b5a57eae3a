//! A session's CPU kernel threads: its rayon pool, and, where asked, which CPU each worker is
//! pinned to.
//!
//! Pinning keeps each worker on one CPU for the session's life. It is not needed for a run
//! that follows a pause, where a scheduler that packs woken threads onto busy CPUs (this KVM
//! guest) would run it on one CPU for its first milliseconds: every session spreads its workers
//! over the CPUs for such a run (`spread.rs`). It stays off by default: back to back it gains
//! nothing measurable here, and a pinned thread cannot leave a CPU another process keeps busy.
//! (Pinned resnet50 once read slower in a third of the processes, 43.1 against 39.2 ms; later
//! its 46 ms processes came pinned, unpinned and spread alike, each when the host had put the
//! two vCPUs on different core complexes: docs/bench.md, "A run after a pause spreads its
//! workers".)
//!
//! Sits between `Session::new` and rayon's pool builder (and, for pinning, the OS: Linux and
//! Android; elsewhere pinning asked for is a session warning).

use super::spread::Spread;
use crate::{Error, Result};
use std::sync::Arc;

/// A session's pool and the CPUs its workers are pinned to (worker `i` to `pinned[i]`; empty:
/// not pinned), with a warning where pinning was asked for and not done, and how a run after a
/// pause spreads the workers (`spread.rs`).
pub(super) struct CpuPool {
    pub pool: Arc<rayon::ThreadPool>,
    pub pinned: Vec<usize>,
    pub warning: Option<String>,
    pub spread: Spread,
}

/// The pool of `threads` workers (0: one per CPU the process may run on); with `pin`, worker
/// `i` pinned to the `i`-th CPU the process may run on (modulo their number).
#[cfg(not(target_arch = "wasm32"))]
pub(super) fn cpu_pool(threads: usize, pin: bool) -> Result<CpuPool> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("tandem-cpu-{i}"))
        .build()
        .map(Arc::new)
        .map_err(|e| Error::Usage(format!("cannot start {threads} CPU threads: {e}")))?;
    let (pinned, warning) = match pin {
        true => pin_workers(&pool),
        false => (Vec::new(), None),
    };
    let spread = Spread::new(&pool, !pinned.is_empty());
    Ok(CpuPool {
        pool,
        pinned,
        warning,
        spread,
    })
}

/// Pin worker `i` of `pool` to the `i`-th CPU this thread may run on (modulo their number):
/// the CPUs, or none and why not.
#[cfg(not(target_arch = "wasm32"))]
fn pin_workers(pool: &rayon::ThreadPool) -> (Vec<usize>, Option<String>) {
    let cpus = affinity::allowed_cpus(0);
    if cpus.is_empty() {
        let why = format!("CPU threads not pinned: {}", affinity::NO_CPUS);
        return (Vec::new(), Some(why));
    }
    let plan: Vec<usize> = (0..pool.current_num_threads())
        .map(|i| cpus[i % cpus.len()])
        .collect();
    let results = pool.broadcast(|cx| affinity::set_cpus(0, &plan[cx.index()..][..1]));
    let failed: Vec<String> = (results.into_iter().enumerate())
        .filter_map(|(i, r)| {
            r.err()
                .map(|e| format!("thread {i} to CPU {}: {e}", plan[i]))
        })
        .collect();
    match failed.is_empty() {
        true => (plan, None),
        false => (
            Vec::new(),
            Some(format!("CPU threads not pinned: {}", failed.join("; "))),
        ),
    }
}

/// The rayon pool of a session's CPU kernels, in the browser: wasm32 without atomics cannot
/// spawn threads (rayon-core 1.13 refuses to build a pool there; only its global pool falls back
/// to the current thread), so every session shares one pool whose single worker is the calling
/// thread (`use_current_thread`), and kernels run inline on it. `threads` and `pin` are ignored.
#[cfg(target_arch = "wasm32")]
pub(super) fn cpu_pool(_threads: usize, _pin: bool) -> Result<CpuPool> {
    thread_local! {
        static POOL: std::cell::OnceCell<Arc<rayon::ThreadPool>> = const { std::cell::OnceCell::new() };
    }
    let pool = POOL.with(|cell| {
        if let Some(p) = cell.get() {
            return Ok(p.clone());
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .use_current_thread()
            .build()
            .map(Arc::new)
            .map_err(|e| Error::Usage(format!("cannot make this thread a CPU pool: {e}")))?;
        Ok(cell.get_or_init(|| pool).clone())
    })?;
    let spread = Spread::new(&pool, false);
    Ok(CpuPool {
        pool,
        pinned: Vec::new(),
        warning: None,
        spread,
    })
}

/// The OS side: which CPUs a thread may run on, and setting that.
#[cfg(any(target_os = "linux", target_os = "android"))]
pub(super) mod affinity {
    /// Why no CPU could be pinned to.
    pub const NO_CPUS: &str = "this thread's CPU affinity mask could not be read";

    /// A thread: the OS's id of it (0: the calling thread).
    pub type Thread = libc::pid_t;

    /// The calling thread's id.
    pub fn this_thread() -> Option<Thread> {
        // SAFETY: gettid takes nothing and cannot fail.
        Some(unsafe { libc::gettid() })
    }

    /// The CPU the calling thread runs on.
    pub fn current_cpu() -> Option<usize> {
        // SAFETY: sched_getcpu takes nothing; a negative result is an error.
        usize::try_from(unsafe { libc::sched_getcpu() }).ok()
    }

    /// The CPUs `thread` may run on, in order (its affinity mask; empty if unreadable).
    pub fn allowed_cpus(thread: Thread) -> Vec<usize> {
        // SAFETY: `set` is a plain bit set the call fills; its size is passed with it.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        let size = std::mem::size_of::<libc::cpu_set_t>();
        if unsafe { libc::sched_getaffinity(thread, size, &mut set) } != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
            .collect()
    }

    /// Let `thread` run on `cpus` alone (each below CPU_SETSIZE, as `allowed_cpus` gives them).
    pub fn set_cpus(thread: Thread, cpus: &[usize]) -> std::io::Result<()> {
        // SAFETY: as above.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        for &cpu in cpus {
            unsafe { libc::CPU_SET(cpu, &mut set) };
        }
        let size = std::mem::size_of::<libc::cpu_set_t>();
        match unsafe { libc::sched_setaffinity(thread, size, &set) } {
            0 => Ok(()),
            _ => Err(std::io::Error::last_os_error()),
        }
    }
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
pub(super) mod affinity {
    pub const NO_CPUS: &str = "tandem pins threads on Linux and Android only";

    pub type Thread = i32;

    pub fn this_thread() -> Option<Thread> {
        None
    }

    pub fn current_cpu() -> Option<usize> {
        None
    }

    pub fn allowed_cpus(_thread: Thread) -> Vec<usize> {
        Vec::new()
    }

    pub fn set_cpus(_thread: Thread, _cpus: &[usize]) -> std::io::Result<()> {
        Err(std::io::Error::other(NO_CPUS))
    }
}

/// A plain pool of `threads` workers, for the tests of the session's pool-side modules.
#[cfg(test)]
pub(super) fn tests_pool(threads: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap()
}

#[cfg(all(test, any(target_os = "linux", target_os = "android")))]
mod tests {
    use super::*;

    /// Each worker's own affinity mask, read on the worker.
    fn masks(pool: &rayon::ThreadPool) -> Vec<Vec<usize>> {
        pool.broadcast(|_| affinity::allowed_cpus(0))
    }

    #[test]
    fn pinned_workers_may_run_on_their_cpu_alone() {
        let cpus = affinity::allowed_cpus(0);
        assert!(!cpus.is_empty(), "this thread's affinity mask is readable");
        let p = cpu_pool(2, true).unwrap();
        assert_eq!(p.warning, None);
        assert_eq!(p.pinned, [cpus[0], cpus[1 % cpus.len()]]);
        let want: Vec<Vec<usize>> = p.pinned.iter().map(|&c| vec![c]).collect();
        assert_eq!(masks(&p.pool), want);
    }

    #[test]
    fn unpinned_workers_may_run_on_every_cpu() {
        let cpus = affinity::allowed_cpus(0);
        let p = cpu_pool(2, false).unwrap();
        assert!(p.pinned.is_empty());
        assert_eq!(masks(&p.pool), [cpus.clone(), cpus]);
    }
}
