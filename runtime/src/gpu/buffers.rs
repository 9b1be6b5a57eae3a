//! GPU memory: [`GpuTensor`]s on pooled buffers, kept by (size class, usage) for reuse, with the
//! pool's byte accounting, its cap and injected out-of-memory faults.
//!
//! Sits between [`Gpu`] (which allocates through it) and wgpu's buffers.

use super::{wait, Gpu, STORAGE_USAGE};
use crate::{Error, Result};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use tandem_ops::DType;

/// A tensor resident on the GPU: a pooled buffer of `elems` 4-byte elements. The buffer goes
/// back to the pool when the last clone is dropped.
#[derive(Clone, Debug)]
pub struct GpuTensor {
    pub(super) buffer: Arc<PooledBuffer>,
    pub elems: usize,
    /// The host dtype this tensor converts back to.
    pub dtype: DType,
}

impl GpuTensor {
    /// True when this tensor's buffer belongs to `gpu` (not to a device it replaced).
    pub fn is_on(&self, gpu: &Gpu) -> bool {
        std::ptr::eq(self.buffer.pool.as_ptr(), Arc::as_ptr(&gpu.pool))
    }

    pub(super) fn binding_size(&self) -> u64 {
        (self.elems as u64 * 4).max(16).min(self.buffer.size)
    }
}

/// Buffers kept for reuse, by (size class, usage).
#[derive(Default)]
pub(super) struct BufferPool {
    pub(super) free: Mutex<HashMap<(u64, u32), Vec<wgpu::Buffer>>>,
    /// Bytes of all buffers created and not yet released (free and in use).
    pub(super) total: AtomicU64,
    /// The part of `total` in tensor (storage) buffers: what the cap bounds. Uniforms and
    /// readback staging are transient and not counted.
    pub(super) tensors: AtomicU64,
    /// Most bytes `tensors` may reach (`u64::MAX`: no cap).
    pub(super) cap: AtomicU64,
    /// Injected faults: this many next creations fail as out of memory.
    pub(super) fail_next: AtomicUsize,
}

#[derive(Debug)]
pub(super) struct PooledBuffer {
    pub(super) buffer: wgpu::Buffer,
    pub(super) size: u64,
    pub(super) usage: wgpu::BufferUsages,
    pub(super) pool: Weak<BufferPool>,
}

impl Drop for PooledBuffer {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.upgrade() {
            pool.free
                .lock()
                .unwrap()
                .entry((self.size, self.usage.bits()))
                .or_default()
                .push(self.buffer.clone());
        }
    }
}

/// Round up to one of 8 sizes per power of two (at most 12.5% waste), multiple of 16.
pub(crate) fn size_class(bytes: u64) -> u64 {
    let b = bytes.max(16);
    let k = 63 - b.leading_zeros() as u64;
    let step = if k < 4 { 16 } else { (1u64 << (k - 3)).max(16) };
    b.div_ceil(step) * step
}

impl BufferPool {
    pub(super) fn with_cap(cap: Option<u64>) -> BufferPool {
        BufferPool {
            cap: AtomicU64::new(cap.unwrap_or(u64::MAX)),
            ..BufferPool::default()
        }
    }

    /// Release unused pooled tensor buffers until `need` more bytes fit under the cap (every
    /// unused buffer when `need` is `None`). Returns whether they fit.
    pub(super) fn make_room(&self, need: Option<u64>) -> bool {
        let cap = self.cap.load(Ordering::SeqCst);
        let fits = |tensors: u64| need.is_some_and(|n| tensors.saturating_add(n) <= cap);
        if fits(self.tensors.load(Ordering::SeqCst)) {
            return true;
        }
        let mut free = self.free.lock().unwrap();
        for ((size, usage), buffers) in free.iter_mut() {
            let tensor = wgpu::BufferUsages::from_bits_truncate(*usage).contains(STORAGE_USAGE);
            if need.is_some() && !tensor {
                continue;
            }
            while let Some(b) = buffers.pop() {
                b.destroy();
                self.total.fetch_sub(*size, Ordering::SeqCst);
                if tensor {
                    self.tensors.fetch_sub(*size, Ordering::SeqCst);
                }
                if fits(self.tensors.load(Ordering::SeqCst)) {
                    return true;
                }
            }
        }
        fits(self.tensors.load(Ordering::SeqCst))
    }

    /// A new buffer of `size` bytes, within the cap; after a driver out-of-memory error the
    /// unused pooled buffers are released and the creation tried once more.
    pub(super) fn create(
        &self,
        device: &wgpu::Device,
        size: u64,
        usage: wgpu::BufferUsages,
    ) -> Result<wgpu::Buffer> {
        let injected = self
            .fail_next
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if injected {
            return Err(Error::Gpu(format!(
                "out of memory allocating {size} bytes (injected fault)"
            )));
        }
        let tensor = usage.contains(STORAGE_USAGE);
        if tensor && !self.make_room(Some(size)) {
            return Err(Error::Gpu(format!(
                "out of memory allocating {size} bytes: {} of the device's {}-byte cap in use",
                self.tensors.load(Ordering::SeqCst),
                self.cap.load(Ordering::SeqCst)
            )));
        }
        let mut last = String::new();
        for attempt in 0..2 {
            let scope = wait::push_scope(device, wgpu::ErrorFilter::OutOfMemory);
            let b = device.create_buffer(&wgpu::BufferDescriptor {
                label: None,
                size,
                usage,
                mapped_at_creation: false,
            });
            match wait::pop_scope(scope) {
                None => {
                    self.total.fetch_add(size, Ordering::SeqCst);
                    if tensor {
                        self.tensors.fetch_add(size, Ordering::SeqCst);
                    }
                    return Ok(b);
                }
                Some(e) => last = e.to_string(),
            }
            if attempt == 0 {
                self.make_room(None);
            }
        }
        Err(Error::Gpu(format!(
            "out of memory allocating {size} bytes: {last}"
        )))
    }

    pub(super) fn take(
        self: &Arc<Self>,
        device: &wgpu::Device,
        bytes: u64,
        usage: wgpu::BufferUsages,
    ) -> Result<PooledBuffer> {
        let size = size_class(bytes);
        let reused = self
            .free
            .lock()
            .unwrap()
            .get_mut(&(size, usage.bits()))
            .and_then(|v| v.pop());
        let buffer = match reused {
            Some(b) => b,
            None => self.create(device, size, usage)?,
        };
        Ok(PooledBuffer {
            buffer,
            size,
            usage,
            pool: Arc::downgrade(self),
        })
    }
}
