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
//! the faults), so kernels see the same zero-filled outputs as from a fresh allocation.
//!
//! A request takes the smallest kept buffer of its element type whose capacity is at least the
//! request and at most twice it (so a big buffer does not serve, and pin, a small tensor).
//! The store holds at most `cap` bytes (counted by capacity); what does not fit is freed.

use std::collections::BTreeMap;
use tandem_ops::{DType, Tensor, TensorMeta};

/// Released host tensors by (element type, capacity in elements).
#[derive(Default)]
pub struct HostBuffers {
    free: BTreeMap<(DType, usize), Vec<Tensor>>,
    bytes: u64,
    cap: u64,
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

    /// Set the most bytes kept; frees the largest buffers first until the store fits.
    pub fn set_cap(&mut self, cap: u64) {
        self.cap = cap;
        while self.bytes > self.cap {
            let Some(mut entry) = self.free.last_entry() else {
                break;
            };
            let t = entry.get_mut().pop().expect("no empty lists are kept");
            if entry.get().is_empty() {
                entry.remove();
            }
            self.bytes -= held_bytes(&t);
        }
    }

    /// Keep `t` for reuse, or free it when it is empty or the store is full.
    pub fn put(&mut self, t: Tensor) {
        let bytes = held_bytes(&t);
        if bytes == 0 || self.bytes + bytes > self.cap {
            return;
        }
        self.bytes += bytes;
        let key = (t.dtype(), t.data.capacity());
        self.free.entry(key).or_default().push(t);
    }

    /// A zero tensor of `m`'s type and shape: a kept buffer when one fits (see the module doc).
    pub fn zeros(&mut self, m: &TensorMeta) -> Tensor {
        let n = m.numel();
        let fit = (self
            .free
            .range((m.dtype, n)..=(m.dtype, n.saturating_mul(2))))
        .next()
        .map(|(k, _)| *k);
        let Some(key) = fit.filter(|_| n > 0) else {
            return Tensor::zeros(m.dtype, &m.shape);
        };
        let list = self.free.get_mut(&key).expect("the key was just found");
        let mut t = list.pop().expect("no empty lists are kept");
        if list.is_empty() {
            self.free.remove(&key);
        }
        self.bytes -= held_bytes(&t);
        t.data.reset_zeroed(n);
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
        let got = store.zeros(&meta(DType::F32, &[5, 5]));
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
    fn only_buffers_of_the_same_type_up_to_twice_the_size_are_reused() {
        let mut store = HostBuffers::new(1 << 20);
        store.put(Tensor::f32(&[100], vec![1.0; 100]));
        // Too small, another type, and more than twice the request: fresh allocations.
        assert_eq!(
            store
                .zeros(&meta(DType::F32, &[101]))
                .as_f32()
                .unwrap()
                .len(),
            101
        );
        assert_eq!(store.zeros(&meta(DType::I32, &[100])).numel(), 100);
        assert_eq!(store.zeros(&meta(DType::F32, &[49])).numel(), 49);
        assert_eq!(store.bytes(), 400, "the buffer is still kept");
        assert_eq!(store.zeros(&meta(DType::F32, &[50])).numel(), 50);
        assert_eq!(store.bytes(), 0);
    }

    #[test]
    fn the_cap_bounds_what_is_kept() {
        let mut store = HostBuffers::new(1000);
        store.put(Tensor::f32(&[200], vec![0.0; 200]));
        store.put(Tensor::f32(&[100], vec![0.0; 100]));
        assert_eq!(store.bytes(), 800, "the second does not fit");
        store.put(Tensor::f32(&[50], vec![0.0; 50]));
        assert_eq!(store.bytes(), 1000);
        store.set_cap(300);
        assert_eq!(store.bytes(), 200, "the largest went first");
        store.put(Tensor::f32(&[0], vec![]));
        assert_eq!(store.bytes(), 200);
    }
}
