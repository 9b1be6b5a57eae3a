//! The CPU kernels' way onto rayon's pool. Sits between the kernels, which say what runs on
//! one piece of their output, and rayon, which runs the pieces on its threads.
//!
//! Each kernel's closure reaches rayon as a `&dyn Fn`, so rayon's generic job and bridge code
//! (about 1,600 lines of LLVM IR a copy) is compiled once per element or item type rather than
//! once per kernel closure: with closures handed straight to rayon, 490 copies of it made 46 %
//! of this crate's IR (`cargo llvm-lines -p tandem-ops --lib --release`: 776k of 1.70M lines)
//! and about half its release build time. The price is one indirect call per piece, and pieces are thousands of elements.
//! Kernels with several outputs zip their pieces into items ([`for_each_item`]); the softmax,
//! which needs rayon's `with_min_len` on pairs of chunks, calls rayon itself and asks
//! [`serial`] first (serial mode: [`serially`]; `runtime/tests/serial.rs` holds the global
//! pool's workers and runs one case of each kernel family in it).

use rayon::prelude::*;
use std::cell::Cell;

thread_local! {
    /// Whether this thread runs every parallel loop of the kernels in order itself ([`serially`]).
    static SERIAL: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with every parallel loop of the kernels it calls run in order on this thread:
/// no job reaches any rayon pool (the helpers below, the kernels that call rayon themselves and
/// the `gemm` crate's parallelism all ask [`serial`]). For runs too short to pay for waking
/// another worker, and for a caller that is not on the session's pool at all (a decode step
/// run on the application's own thread; `tandem::session`).
pub fn serially<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            SERIAL.with(|s| s.set(self.0));
        }
    }
    let _restore = Restore(SERIAL.with(|s| s.replace(true)));
    f()
}

/// Whether this thread is inside [`serially`].
pub fn serial() -> bool {
    SERIAL.with(Cell::get)
}

/// `f(i, piece)` for `out` cut into `chunk`-long pieces (the last may be shorter; `chunk` 0
/// is taken as 1), in parallel on the current rayon pool.
pub fn for_each_chunk_mut<T: Send>(
    out: &mut [T],
    chunk: usize,
    f: impl Fn(usize, &mut [T]) + Sync,
) {
    chunks_dyn(out, chunk.max(1), &f);
}

#[inline(never)]
fn chunks_dyn<T: Send>(out: &mut [T], chunk: usize, f: &(dyn Fn(usize, &mut [T]) + Sync)) {
    if serial() {
        return out.chunks_mut(chunk).enumerate().for_each(|(i, p)| f(i, p));
    }
    out.par_chunks_mut(chunk)
        .enumerate()
        .for_each(|(i, piece)| f(i, piece));
}

/// `f(i)` for every `i` in `0..n`, in parallel on the current rayon pool.
pub fn for_each_index(n: usize, f: impl Fn(usize) + Sync) {
    indices_dyn(n, &f);
}

#[inline(never)]
fn indices_dyn(n: usize, f: &(dyn Fn(usize) + Sync)) {
    if serial() {
        return (0..n).for_each(f);
    }
    (0..n).into_par_iter().for_each(f);
}

/// `f(&item)` for every item of `items`, in parallel on the current rayon pool.
pub fn for_each_ref<I: Sync>(items: &[I], f: impl Fn(&I) + Sync) {
    refs_dyn(items, &f);
}

#[inline(never)]
fn refs_dyn<I: Sync>(items: &[I], f: &(dyn Fn(&I) + Sync)) {
    if serial() {
        return items.iter().for_each(f);
    }
    items.par_iter().for_each(f);
}

/// `f(item)` for every item, in parallel on the current rayon pool.
pub fn for_each_item<I: Send>(items: Vec<I>, f: impl Fn(I) + Sync) {
    items_dyn(items, &f);
}

#[inline(never)]
fn items_dyn<I: Send>(items: Vec<I>, f: &(dyn Fn(I) + Sync)) {
    if serial() {
        return items.into_iter().for_each(f);
    }
    items.into_par_iter().for_each(f);
}

/// `f(scratch, item)` for every item, in parallel on the current rayon pool, at least
/// `min_len` items a task, each thread's `scratch` made once by `init` (rayon's
/// `for_each_init`): the planes of the pools and depthwise convs.
pub fn for_each_item_init<I: Send, S>(
    items: Vec<I>,
    min_len: usize,
    init: impl Fn() -> S + Sync + Send,
    f: impl Fn(&mut S, I) + Sync + Send,
) {
    if serial() {
        let mut scratch = init();
        return items.into_iter().for_each(|i| f(&mut scratch, i));
    }
    items
        .into_par_iter()
        .with_min_len(min_len.max(1))
        .for_each_init(init, f);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn chunks_cover_the_output_once_with_their_indices() {
        let mut out = vec![0usize; 1001];
        for_each_chunk_mut(&mut out, 100, |i, piece| {
            assert!(piece.len() == 100 || (i == 10 && piece.len() == 1));
            for (k, o) in piece.iter_mut().enumerate() {
                *o += i * 100 + k + 1;
            }
        });
        assert!(out.iter().enumerate().all(|(e, &o)| o == e + 1));
        let mut one = vec![7u8; 3];
        for_each_chunk_mut(&mut one, 0, |i, piece| piece[0] = i as u8);
        assert_eq!(one, [0, 1, 2]);
    }

    #[test]
    fn indices_items_and_refs_each_run_once() {
        let hits: Vec<AtomicUsize> = (0..500).map(|_| AtomicUsize::new(0)).collect();
        for_each_index(500, |i| {
            hits[i].fetch_add(1, Ordering::Relaxed);
        });
        for_each_item((0..500).collect(), |i: usize| {
            hits[i].fetch_add(10, Ordering::Relaxed);
        });
        let items: Vec<usize> = (0..500).collect();
        for_each_ref(&items, |&i| {
            hits[i].fetch_add(100, Ordering::Relaxed);
        });
        assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 111));
    }
}
