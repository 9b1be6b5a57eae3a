//! Host buffers kept for reuse: the tensors of a run past their last use, handed to the
//! outputs of later CPU steps of this run and of the session's next runs.
//!
//! Sits between the executor (which puts released host tensors here and takes its CPU steps'
//! output tensors from here) and the session (which keeps one store between runs).
//!
//! Why: a fresh allocation of a large tensor is fresh pages from the OS (malloc hands
//! allocations over 128 KiB to `mmap`, and trims its heap on free), and every page costs a
//! fault on first touch. Measured on ppocr_det at 640x640 (1 CPU thread): about 17,900 minor
//! faults per run and 87.6 ms median, against 19,670 faults for 41 runs and 69.9 ms when malloc
//! was told to keep its memory. Kept buffers are zeroed on reuse (a memset, ~10x cheaper than
//! the faults), so kernels see the same zero-filled outputs as from a fresh allocation, except
//! for the kernels that overwrite every element of their outputs (`Op::overwrites_outputs`),
//! which get them as they are.
//!
//! A request takes the smallest kept buffer of its element type whose capacity is at least the
//! request and at most twice it (so a big buffer does not serve, and pin, a small tensor); for a
//! kernel that overwrites its output, the smallest of those that already holds as many elements,
//! where one does (a buffer that served a smaller tensor has zeros to write up to the request:
//! squeezenet's runs spent 10-20 us of their 45-90 outside the kernels on that); else
//! the largest one of at least half the request, grown to it: growing moves the pages a large
//! allocation has (`mremap`) and faults in only the new part, where a fresh allocation faults
//! in all of it (densenet121's Concat outputs grow by 32 channels a layer, and each needed a
//! fresh one).
//! The store holds at most `cap` bytes (counted by capacity): the session sets it before each
//! run to three times the plan's peak of live intermediates. With the peak alone, every steady
//! run of squeezenet1.0 still allocated 9 to 10 fresh tensors (41 over 4 runs), densenet121
//! about 9: the store ends a run holding the sizes of its last tensors, not the first ones the
//! next run asks for, and the fresh ones push out others when released. What the store holds
//! is trimmed by use, not by the cap: a buffer that sits through a whole run untaken is freed
//! before the next one, so from the second run on it holds what runs take (squeezenet 7.9 MB,
//! 2x its peak). The cap used to start at the peak and learn the bytes runs had to free, which
//! ended in the same store, but only after the first runs had allocated what it lacked:
//! magika's second and third runs faulted 700 and 510 pages in and took 7.0-7.4 ms against a
//! steady 4.5 (docs/bench.md, "The second run reuses the first one's buffers"). Without the
//! untaken rule, buffers no request fits (a caller's inputs, handed over each run) piled up,
//! each pushing out a kept one (a decode step: 1,609 buffers after 400 runs, one size 986
//! deep, and every `put` shifting that list). A buffer put into a full store
//! makes room by freeing the buffers kept longest, oldest first: a buffer nobody took since
//! is the least likely to fit the next requests (a store left full of the largest buffers of
//! an earlier part of the run served none of densenet121's later, smaller tensors, and every
//! one was a fresh allocation); what still does not fit is freed.

use std::collections::BTreeMap;
use tandem_ops::{DType, Tensor, TensorMeta};

/// Released host tensors by (element type, capacity in elements), each with the sequence
/// number of its `put` (oldest first within a list).
#[derive(Default)]
pub struct HostBuffers {
    free: BTreeMap<(DType, usize), Vec<(u64, Tensor)>>,
    bytes: u64,
    cap: u64,
    puts: u64,
    /// `puts` when the last run began: buffers put before it and still here sat through that
    /// whole run untaken, and the next `set_cap` frees them.
    run_began: u64,
}

impl HostBuffers {
    /// An empty store that keeps at most `cap` bytes.
    pub fn new(cap: u64) -> HostBuffers {
        HostBuffers {
            cap,
            ..Default::default()
        }
    }

    /// Bytes held now.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Before a run: free the buffers the last run left untaken, then the oldest ones until the
    /// store holds at most `cap` bytes, the most it keeps during this run.
    pub fn set_cap(&mut self, cap: u64) {
        self.free_untaken_since(self.run_began);
        self.run_began = self.puts;
        self.cap = cap;
        self.free_oldest_until(0);
    }

    /// Free the buffers put at or before sequence number `seq` (see `run_began`).
    fn free_untaken_since(&mut self, seq: u64) {
        let mut freed = 0;
        self.free.retain(|_, list| {
            let stale = list.partition_point(|(at, _)| *at <= seq);
            freed += list
                .drain(..stale)
                .map(|(_, t)| held_bytes(&t))
                .sum::<u64>();
            !list.is_empty()
        });
        self.bytes -= freed;
    }

    /// Keep `t` for reuse, freeing the oldest kept buffers to make room when the store is full;
    /// or free `t` when it is empty or larger than the cap.
    pub fn put(&mut self, t: Tensor) {
        let bytes = held_bytes(&t);
        if bytes == 0 || bytes > self.cap {
            return;
        }
        self.free_oldest_until(bytes);
        self.bytes += bytes;
        self.puts += 1;
        let key = (t.dtype(), t.data.capacity());
        self.free.entry(key).or_default().push((self.puts, t));
    }

    /// Free the oldest kept buffers until `room` more bytes fit under the cap.
    fn free_oldest_until(&mut self, room: u64) {
        while self.bytes + room > self.cap {
            let oldest = (self.free.iter())
                .min_by_key(|(_, list)| list[0].0)
                .map(|(k, _)| *k);
            let Some(key) = oldest else {
                break;
            };
            let list = self.free.get_mut(&key).expect("the key was just found");
            let (_, t) = list.remove(0);
            if list.is_empty() {
                self.free.remove(&key);
            }
            self.bytes -= held_bytes(&t);
        }
    }

    /// A tensor of `m`'s type and shape: a kept buffer when one fits (see the module doc),
    /// zero-filled when `zeroed`, else holding whatever it held (for a kernel that overwrites
    /// every element, `Op::overwrites_outputs`); a new allocation is zeros either way.
    pub fn take(&mut self, m: &TensorMeta, zeroed: bool) -> Tensor {
        self.take_with_room(m, zeroed, 0)
    }

    /// [`HostBuffers::take`] of a tensor whose allocation holds at least `room` elements (a
    /// Concat appends to it later, `exec/append.rs`).
    pub fn take_with_room(&mut self, m: &TensorMeta, zeroed: bool, room: usize) -> Tensor {
        let n = m.numel().max(room);
        let kept = |r: std::ops::RangeInclusive<usize>| {
            self.free.range((m.dtype, *r.start())..=(m.dtype, *r.end()))
        };
        // For a kernel that overwrites its output, the smallest that holds n and already holds
        // as many elements (no zeros to write past its last tensor's end); else the smallest
        // that holds n, else the largest that grows to it (see the module doc).
        let filled = (!zeroed)
            .then(|| {
                kept(n..=n.saturating_mul(2)).find_map(|(k, list)| {
                    let at = list.iter().rposition(|(_, t)| t.numel() >= m.numel())?;
                    Some((*k, at))
                })
            })
            .flatten();
        let fit = filled.or_else(|| {
            (kept(n..=n.saturating_mul(2)).next())
                .or_else(|| kept(n / 2..=n.saturating_sub(1)).next_back())
                .map(|(k, list)| (*k, list.len() - 1))
        });
        let Some((key, at)) = fit.filter(|_| n > 0) else {
            let mut t = Tensor::zeros(m.dtype, &[n]);
            t.data.reset_len(m.numel());
            t.shape.clone_from(&m.shape);
            return t;
        };
        let list = self.free.get_mut(&key).expect("the key was just found");
        let (_, mut t) = list.remove(at);
        if list.is_empty() {
            self.free.remove(&key);
        }
        self.bytes -= held_bytes(&t);
        if room > m.numel() && t.data.capacity() < n {
            t.data.reset_len(n);
        }
        match zeroed {
            true => t.data.reset_zeroed(m.numel()),
            false => t.data.reset_len(m.numel()),
        }
        t.shape.clear();
        t.shape.extend_from_slice(&m.shape);
        t
    }
}

/// Bytes a tensor's allocation holds.
fn held_bytes(t: &Tensor) -> u64 {
    (t.data.capacity() * t.dtype().size()) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(dtype: DType, shape: &[usize]) -> TensorMeta {
        TensorMeta::new(dtype, shape.to_vec())
    }

    #[test]
    fn a_kept_buffer_comes_back_zeroed_with_the_requested_shape() {
        let mut store = HostBuffers::new(1 << 20);
        let t = Tensor::f32(&[4, 8], vec![7.0; 32]);
        let ptr = t.as_f32().unwrap().as_ptr();
        store.put(t);
        assert_eq!(store.bytes(), 128);
        let got = store.take(&meta(DType::F32, &[5, 5]), true);
        assert_eq!(got.shape, vec![5, 5]);
        assert_eq!(got.as_f32().unwrap(), &[0.0; 25][..]);
        assert_eq!(
            got.as_f32().unwrap().as_ptr(),
            ptr,
            "the kept allocation is reused"
        );
        assert_eq!(store.bytes(), 0);
    }

    #[test]
    fn a_buffer_taken_unzeroed_keeps_its_values() {
        let mut store = HostBuffers::new(1 << 20);
        store.put(Tensor::f32(&[4, 8], vec![7.0; 32]));
        let got = store.take(&meta(DType::F32, &[5, 5]), false);
        assert_eq!(got.shape, vec![5, 5]);
        assert_eq!(got.as_f32().unwrap(), &[7.0; 25][..]);
        // Grown within its capacity: the new tail is zeros.
        let mut t = Tensor::f32(&[2], vec![7.0; 2]);
        t.data.reset_len(1);
        store.put(t);
        let got = store.take(&meta(DType::F32, &[2]), false);
        assert_eq!(got.as_f32().unwrap(), &[7.0, 0.0][..]);
    }

    /// squeezenet: a 48,400-element tensor took the 93,312-element buffer of a MaxPool's
    /// output, and the next run's MaxPool got it back with 44,912 zeros to write first.
    #[test]
    fn an_overwritten_output_takes_a_buffer_that_holds_it_already() {
        let mut store = HostBuffers::new(1 << 20);
        // 100 elements of room, 50 in use since a smaller tensor had it; then a full 120.
        let mut short = Tensor::f32(&[100], vec![1.0; 100]);
        short.data.reset_len(50);
        short.shape = vec![50];
        store.put(short);
        store.put(Tensor::f32(&[120], vec![2.0; 120]));
        let got = store.take(&meta(DType::F32, &[100]), false);
        assert_eq!(
            got.data.capacity(),
            120,
            "the buffer holding 100 elements already"
        );
        assert_eq!(got.as_f32().unwrap(), &[2.0; 100][..]);
        // Zeroed outputs are written whole either way: the smallest that holds them.
        let got = store.take(&meta(DType::F32, &[100]), true);
        assert_eq!(got.data.capacity(), 100);
    }

    #[test]
    fn a_full_store_frees_its_oldest_buffers_first() {
        let mut store = HostBuffers::new(1000);
        store.put(Tensor::f32(&[100], vec![0.0; 100]));
        store.put(Tensor::f32(&[50], vec![0.0; 50]));
        store.put(Tensor::f32(&[50], vec![0.0; 50]));
        assert_eq!(store.bytes(), 800);
        // 600 more bytes: the 400-byte buffer, the oldest, goes; the younger 200s stay.
        store.put(Tensor::f32(&[150], vec![0.0; 150]));
        assert_eq!(store.bytes(), 1000);
        assert_eq!(store.take(&meta(DType::F32, &[50]), true).numel(), 50);
        assert_eq!(store.take(&meta(DType::F32, &[50]), true).numel(), 50);
        assert_eq!(store.bytes(), 600, "both 200-byte buffers were kept");
        assert_eq!(store.take(&meta(DType::F32, &[100]), true).numel(), 100);
        assert_eq!(
            store.bytes(),
            0,
            "the 150-element buffer served 100 elements"
        );
        // Larger than the cap: not kept.
        store.put(Tensor::f32(&[300], vec![0.0; 300]));
        assert_eq!(store.bytes(), 0);
    }

    #[test]
    fn a_buffer_serves_requests_from_half_its_size_to_twice_it() {
        let mut store = HostBuffers::new(1 << 20);
        store.put(Tensor::f32(&[100], vec![1.0; 100]));
        // Another type, more than twice the request, or less than half of it: fresh ones.
        assert_eq!(store.take(&meta(DType::I32, &[100]), true).numel(), 100);
        assert_eq!(store.take(&meta(DType::F32, &[49]), true).numel(), 49);
        assert_eq!(store.take(&meta(DType::F32, &[202]), true).numel(), 202);
        assert_eq!(store.bytes(), 400, "the buffer is still kept");
        // 101 elements: the buffer grown to exactly that, zero-filled.
        let grown = store.take(&meta(DType::F32, &[101]), true);
        assert_eq!(grown.as_f32().unwrap(), &[0.0; 101][..]);
        assert_eq!(grown.data.capacity(), 101);
        assert_eq!(store.bytes(), 0);
        store.put(grown);
        assert_eq!(store.take(&meta(DType::F32, &[51]), true).numel(), 51);
        assert_eq!(store.bytes(), 0);
    }

    #[test]
    fn the_cap_bounds_what_is_kept() {
        let mut store = HostBuffers::new(1000);
        store.put(Tensor::f32(&[200], vec![0.0; 200]));
        store.put(Tensor::f32(&[100], vec![0.0; 100]));
        assert_eq!(store.bytes(), 400, "the first made room for the second");
        store.put(Tensor::f32(&[50], vec![0.0; 50]));
        assert_eq!(store.bytes(), 600);
        store.set_cap(300);
        assert_eq!(store.bytes(), 200, "the oldest went first");
        store.put(Tensor::f32(&[0], vec![]));
        assert_eq!(store.bytes(), 200);
    }

    /// One run of a chain where each tensor is released once the next is made, the last one
    /// handed to the caller: 800, 800, 100, 100, 10 elements (peak of live ones: 1,600 =
    /// 6,400 bytes). Returns the requests allocated fresh.
    fn chain_run(store: &mut HostBuffers, cap: u64) -> usize {
        store.set_cap(cap);
        let (mut prev, mut fresh) = (None, 0);
        for n in [800, 800, 100, 100, 10] {
            let held = store.bytes();
            let t = store.take(&meta(DType::F32, &[n]), true);
            fresh += usize::from(store.bytes() == held);
            if let Some(p) = prev.replace(t) {
                store.put(p);
            }
        }
        fresh
    }

    #[test]
    fn the_second_run_takes_all_but_its_output_from_the_first() {
        let mut store = HostBuffers::default();
        let fresh: Vec<_> = (0..4).map(|_| chain_run(&mut store, 3 * 6_400)).collect();
        assert_eq!(fresh, [5, 1, 1, 1], "fresh allocations per run");
        // The store ends a run holding its last tensors, not the first ones the next run asks
        // for: with the peak alone as the cap, every run allocates again.
        let mut tight = HostBuffers::default();
        let fresh: Vec<_> = (0..4).map(|_| chain_run(&mut tight, 6_400)).collect();
        assert!(fresh[1..].iter().all(|&f| f > 1), "{fresh:?}");
    }

    #[test]
    fn buffers_no_run_takes_are_freed() {
        // Besides the chain, every run puts a 30-element buffer that no request fits (as a
        // caller's inputs, handed over each run).
        let mut store = HostBuffers::default();
        for _ in 0..30 {
            chain_run(&mut store, 3 * 6_400);
            store.put(Tensor::zeros(DType::F32, &[30]));
        }
        let untaken = store.free.get(&(DType::F32, 30)).map_or(0, Vec::len);
        assert!(untaken <= 2, "{untaken} untaken buffers kept");
        assert_eq!(chain_run(&mut store, 3 * 6_400), 1);
    }
}
