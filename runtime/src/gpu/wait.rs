//! The GPU layer's waits as futures: opening a device, a batch's completion, a readback, and the
//! error scopes around buffer and pipeline creation.
//!
//! Sits between the async executor (`exec::execute_async`, the only way to run in a browser) and
//! `gpu.rs`. On native targets each future does the blocking wait of its sync twin and is complete
//! when first polled, so native behaviour and speed are those of the sync calls. In the browser
//! (wasm32) wgpu's WebGPU backend settles `mapAsync` and `onSubmittedWorkDone` only when the JS
//! event loop runs, so these futures yield to it. Error scopes are not pushed there (their answer
//! is a promise too, which nothing here could wait for): validation and out-of-memory errors reach
//! the device's uncaptured-error handler and fail the next wait (`check_alive`), so they fail the
//! run with their message instead of moving one node to the CPU.

use super::Gpu;
use crate::Result;

/// An error scope whose answer can be read without waiting on the JS event loop: pushed on
/// native targets, absent in the browser (see the module doc).
pub(super) struct Scope(Option<wgpu::ErrorScopeGuard>);

/// Push an error scope of `filter` (native only; see [`Scope`]).
pub(super) fn push_scope(device: &wgpu::Device, filter: wgpu::ErrorFilter) -> Scope {
    #[cfg(not(target_arch = "wasm32"))]
    return Scope(Some(device.push_error_scope(filter)));
    #[cfg(target_arch = "wasm32")]
    {
        let _ = (device, filter);
        Scope(None)
    }
}

/// Pop `scope`: the error it caught, if any (always `None` in the browser).
pub(super) fn pop_scope(scope: Scope) -> Option<wgpu::Error> {
    scope.0.and_then(|s| pollster::block_on(s.pop()))
}

impl Gpu {
    /// Open a GPU without blocking. Native: [`Gpu::new`]. In the browser: the WebGPU adapter of
    /// `navigator.gpu` with the adapter's own limits (`maxStorageBufferBindingSize`,
    /// `maxBufferSize`, ...) and no optional feature but `timestamp-query` where it exists; fails
    /// with the reason when there is none (no `navigator.gpu`, or `requestAdapter()` gave null).
    pub async fn new_async() -> Result<Gpu> {
        #[cfg(not(target_arch = "wasm32"))]
        return Self::new();
        #[cfg(target_arch = "wasm32")]
        {
            let backends = wgpu::Backends::BROWSER_WEBGPU;
            let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
                backends,
                ..wgpu::InstanceDescriptor::new_without_display_handle()
            });
            let adapter = instance
                .request_adapter(&wgpu::RequestAdapterOptions {
                    power_preference: wgpu::PowerPreference::HighPerformance,
                    ..Default::default()
                })
                .await
                .map_err(|e| crate::Error::Gpu(format!("no WebGPU adapter: {e}")))?;
            Self::from_adapter_async(&adapter, backends, super::GpuOptions::default()).await
        }
    }

    /// Wait until the submit of `index` (and every one before it) is done. In the browser,
    /// until every submitted command is (`onSubmittedWorkDone`: WebGPU has no per-submit wait).
    pub(super) async fn wait_submission_async(&self, index: wgpu::SubmissionIndex) -> Result<()> {
        #[cfg(not(target_arch = "wasm32"))]
        return self.wait_for(Some(index));
        #[cfg(target_arch = "wasm32")]
        {
            let _ = index;
            let (signal, done) = oneshot::<()>();
            self.queue.on_submitted_work_done(move || signal(()));
            done.await;
            self.check_alive()
        }
    }

    /// Map `buffers` for reading and copy their first `size` bytes out.
    pub(super) async fn map_all_async(
        &self,
        buffers: Vec<(&wgpu::Buffer, u64)>,
    ) -> Result<Vec<Vec<u8>>> {
        #[cfg(not(target_arch = "wasm32"))]
        return self.map_all(buffers);
        #[cfg(target_arch = "wasm32")]
        {
            let mut waits = Vec::with_capacity(buffers.len());
            for (b, size) in &buffers {
                let (signal, done) = oneshot();
                b.slice(..*size)
                    .map_async(wgpu::MapMode::Read, move |r| signal(r.is_ok()));
                waits.push(done);
            }
            let mut mapped = true;
            for w in waits {
                mapped &= w.await;
            }
            self.check_alive()?;
            if !mapped {
                return Err(crate::Error::Gpu("mapping a readback buffer failed".into()));
            }
            buffers
                .into_iter()
                .map(|(b, size)| {
                    let v = b
                        .slice(..size)
                        .get_mapped_range()
                        .map_err(|e| crate::Error::Gpu(format!("reading back: {e}")))?
                        .to_vec();
                    b.unmap();
                    Ok(v)
                })
                .collect()
        }
    }
}

/// A one-shot callback-to-future bridge: the returned closure settles the future (browser only,
/// where wgpu's callbacks fire from the JS event loop).
#[cfg(target_arch = "wasm32")]
fn oneshot<T: Send + 'static>() -> (
    impl FnOnce(T) + Send + 'static,
    impl std::future::Future<Output = T>,
) {
    use std::sync::{Arc, Mutex};
    use std::task::{Poll, Waker};
    type Shared<T> = Arc<Mutex<(Option<T>, Option<Waker>)>>;
    let shared: Shared<T> = Arc::new(Mutex::new((None, None)));
    let tx = shared.clone();
    let signal = move |v: T| {
        let mut s = tx.lock().unwrap();
        s.0 = Some(v);
        if let Some(w) = s.1.take() {
            w.wake();
        }
    };
    let done = std::future::poll_fn(move |cx| {
        let mut s = shared.lock().unwrap();
        match s.0.take() {
            Some(v) => Poll::Ready(v),
            None => {
                s.1 = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    });
    (signal, done)
}
