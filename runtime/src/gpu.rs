//! The GPU device layer: adapter choice, pooled buffers, cached pipelines, batched dispatches
//! (one command encoder per batch) and readback.
//!
//! Sits between the executor (which decides what runs where) and wgpu. Knows nothing of graphs:
//! it runs [`GpuKernel`]s on [`GpuTensor`]s. Every element on the GPU is 4 bytes (see
//! `tandem_shaders`); [`to_gpu_bytes`] and [`from_gpu_bytes`] convert at the boundary, narrowing
//! int64 to i32 with a range check (never silently).
//!
//! Faults: a lost device (the driver's callback, or a wait that times out) sets [`Gpu::is_lost`]
//! and every later call fails; [`Gpu::replacement`] opens its successor, shared by every holder
//! of the lost one. Buffer creation fails as out of memory past the driver's memory or the pool's
//! cap ([`GpuOptions::max_memory`]), after unused pooled buffers were released. Validation errors
//! are caught with error scopes. [`Gpu::inject`] makes each of these happen on purpose (tests).

use crate::{Error, Result};
use half::f16;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tandem_ops::{DType, Data, GpuKernel, Tensor};
use web_time::Instant;

/// In-flight batches and GPU time per batch, for planning around other sessions' work.
pub mod busy;
mod wait;

/// What identifies an adapter, as reported by the driver.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AdapterDesc {
    pub name: String,
    pub vendor: u32,
    pub device: u32,
    pub backend: String,
    pub device_type: String,
    pub driver: String,
    pub driver_info: String,
}

impl AdapterDesc {
    fn from_info(info: &wgpu::AdapterInfo) -> AdapterDesc {
        AdapterDesc {
            name: info.name.clone(),
            vendor: info.vendor,
            device: info.device,
            backend: format!("{:?}", info.backend),
            device_type: format!("{:?}", info.device_type),
            driver: info.driver.clone(),
            driver_info: info.driver_info.clone(),
        }
    }
}

impl std::fmt::Display for AdapterDesc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({}, {}, {} {})",
            self.name, self.backend, self.device_type, self.driver, self.driver_info
        )
    }
}

/// Every adapter wgpu can see on this machine, with its limits and features (for `tandem info`).
pub fn list_adapters() -> Vec<(AdapterDesc, wgpu::Limits, wgpu::Features)> {
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
        backends: wgpu::Backends::all(),
        ..wgpu::InstanceDescriptor::new_without_display_handle_from_env()
    });
    pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all()))
        .into_iter()
        .map(|a| {
            (
                AdapterDesc::from_info(&a.get_info()),
                a.limits(),
                a.features(),
            )
        })
        .collect()
}

/// How to open a GPU: limits lower than the adapter's (an app's budget, or tests that make a
/// node exceed them) and a cap on the memory the buffer pool may hold.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GpuOptions {
    /// Largest storage buffer binding (bytes); `None`: the adapter's limit.
    pub max_binding_bytes: Option<u64>,
    /// Most workgroups per dispatch dimension; `None`: the adapter's limit.
    pub max_workgroups_per_dimension: Option<u32>,
    /// Most bytes of tensor buffers the device may hold (uniforms and readback staging, small
    /// and transient, are not counted); `None`: no cap but the driver's.
    pub max_memory: Option<u64>,
}

/// A GPU failure made to happen on purpose (tests); the runtime's ordinary error paths meet it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The next `n` buffer creations fail as out of memory.
    OutOfMemory(usize),
    /// The next `n` pipeline creations fail: their shader is swapped for one that does not
    /// compile, so the real validation error path runs.
    PipelineCreation(usize),
    /// The device is destroyed right after the `at_submit`-th batch from now (0: the next one)
    /// was submitted, while it is in flight.
    DeviceLost { at_submit: usize },
    /// The `at_submit`-th batch from now records an invalid copy, so the whole batch fails
    /// validation and none of its dispatches run.
    InvalidBatch { at_submit: usize },
}

/// Pending injected faults (see [`Fault`]).
#[derive(Debug, Default)]
struct Injected {
    pipelines: usize,
    lose_at: Option<usize>,
    invalid_at: Option<usize>,
}

/// How long a wait for the GPU may take before the device is treated as lost.
pub const GPU_WAIT_TIMEOUT: Duration = Duration::from_secs(120);

/// One GPU device with its queue, pipeline cache and buffer pool. Shared (`Arc`) by sessions.
pub struct Gpu {
    device: wgpu::Device,
    queue: wgpu::Queue,
    desc: AdapterDesc,
    limits: wgpu::Limits,
    timestamps: bool,
    modules: Mutex<HashMap<&'static str, wgpu::ShaderModule>>,
    pipelines: Mutex<HashMap<PipelineKey, wgpu::ComputePipeline>>,
    pool: Arc<BufferPool>,
    lost: Arc<AtomicBool>,
    uncaptured: Arc<Mutex<Vec<String>>>,
    options: GpuOptions,
    backends: wgpu::Backends,
    injected: Mutex<Injected>,
    /// The device opened to replace this one once it was lost (see [`Gpu::replacement`]).
    successor: Mutex<Option<Arc<Gpu>>>,
    /// Batches in flight from every session sharing this GPU (see [`Gpu::expected_wait`]).
    busy: Arc<busy::Busy>,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Gpu({})", self.desc)
    }
}

#[derive(Clone, PartialEq, Eq, Hash)]
struct PipelineKey {
    shader: &'static str,
    overrides: Vec<(&'static str, u64)>,
}

impl Gpu {
    /// Open the best adapter: a hardware one if present, else a software one (lavapipe). GL is
    /// only tried when nothing else exists (its shader compiles take seconds). The backend can be
    /// forced with `WGPU_BACKEND` (e.g. `vulkan`).
    pub fn new() -> Result<Gpu> {
        Self::with_options(GpuOptions::default())
    }

    /// [`Gpu::new`] with lower limits and a memory cap (see [`GpuOptions`]).
    pub fn with_options(options: GpuOptions) -> Result<Gpu> {
        let primary = wgpu::Backends::from_env().unwrap_or(wgpu::Backends::PRIMARY);
        Self::with_backends(primary, options).or_else(|e| {
            if wgpu::Backends::from_env().is_none() {
                Self::with_backends(wgpu::Backends::GL, options)
            } else {
                Err(e)
            }
        })
    }

    /// Open the adapter `desc` names (one of [`list_adapters`]), whatever `WGPU_BACKEND` says:
    /// how a benchmark measures every adapter of the machine in one run.
    pub fn open_adapter(desc: &AdapterDesc, options: GpuOptions) -> Result<Gpu> {
        let all = wgpu::Backends::all();
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
            backends: all,
            ..wgpu::InstanceDescriptor::new_without_display_handle_from_env()
        });
        let adapter = pollster::block_on(instance.enumerate_adapters(all))
            .into_iter()
            .find(|a| AdapterDesc::from_info(&a.get_info()) == *desc)
            .ok_or_else(|| Error::Gpu(format!("adapter {desc} is not on this machine")))?;
        let backend = wgpu::Backends::from(adapter.get_info().backend);
        Self::from_adapter(&adapter, backend, options)
    }

    fn with_backends(backends: wgpu::Backends, options: GpuOptions) -> Result<Gpu> {
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
            backends,
            ..wgpu::InstanceDescriptor::new_without_display_handle_from_env()
        });
        let adapter = pollster::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions {
            power_preference: wgpu::PowerPreference::HighPerformance,
            ..Default::default()
        }))
        .map_err(|e| Error::Gpu(format!("no GPU adapter for backends {backends:?}: {e}")))?;
        Self::from_adapter(&adapter, backends, options)
    }

    fn from_adapter(
        adapter: &wgpu::Adapter,
        backends: wgpu::Backends,
        options: GpuOptions,
    ) -> Result<Gpu> {
        pollster::block_on(Self::from_adapter_async(adapter, backends, options))
    }

    /// [`Gpu::from_adapter`] without blocking (the browser opens its device this way).
    async fn from_adapter_async(
        adapter: &wgpu::Adapter,
        backends: wgpu::Backends,
        options: GpuOptions,
    ) -> Result<Gpu> {
        let info = adapter.get_info();
        let mut limits = adapter.limits();
        if let Some(b) = options.max_binding_bytes {
            limits.max_storage_buffer_binding_size = limits.max_storage_buffer_binding_size.min(b);
            limits.max_buffer_size = limits.max_buffer_size.min(b.max(256));
        }
        if let Some(w) = options.max_workgroups_per_dimension {
            limits.max_compute_workgroups_per_dimension =
                limits.max_compute_workgroups_per_dimension.min(w);
        }
        let timestamps = adapter.features().contains(wgpu::Features::TIMESTAMP_QUERY);
        let mut required_features = wgpu::Features::empty();
        if timestamps {
            required_features |= wgpu::Features::TIMESTAMP_QUERY;
        }
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("tandem"),
                required_features,
                required_limits: limits.clone(),
                ..Default::default()
            })
            .await
            .map_err(|e| Error::Gpu(format!("cannot open {}: {e}", info.name)))?;
        let lost = Arc::new(AtomicBool::new(false));
        let lost_flag = lost.clone();
        let name = info.name.clone();
        device.set_device_lost_callback(move |reason, message| {
            lost_flag.store(true, Ordering::SeqCst);
            eprintln!("tandem: GPU device {name} lost ({reason:?}): {message}");
        });
        let uncaptured = Arc::new(Mutex::new(Vec::new()));
        let sink = uncaptured.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            sink.lock().unwrap().push(e.to_string());
        }));
        Ok(Gpu {
            device,
            queue,
            desc: AdapterDesc::from_info(&info),
            limits,
            timestamps,
            modules: Mutex::new(HashMap::new()),
            pipelines: Mutex::new(HashMap::new()),
            pool: Arc::new(BufferPool::with_cap(options.max_memory)),
            lost,
            uncaptured,
            options,
            backends,
            injected: Mutex::new(Injected::default()),
            successor: Mutex::new(None),
            busy: Arc::default(),
        })
    }

    /// The device to use instead of this one once it is lost: opened on first call (same
    /// backends and [`GpuOptions`]) and shared by every caller, so sessions that shared this
    /// device share its successor. Returns `self` while it is not lost.
    pub fn replacement(self: &Arc<Self>) -> Result<Arc<Gpu>> {
        if !self.is_lost() {
            return Ok(self.clone());
        }
        let mut next = self.successor.lock().unwrap();
        if let Some(n) = next.as_ref() {
            return n.replacement();
        }
        let gpu = Arc::new(Self::with_backends(self.backends, self.options)?);
        eprintln!("tandem: opened {} to replace the lost GPU device", gpu.desc);
        *next = Some(gpu.clone());
        Ok(gpu)
    }

    /// The options this device was opened with.
    pub fn options(&self) -> GpuOptions {
        self.options
    }

    /// Cap (or uncap, with `None`) the bytes of buffers this device may hold; allocations past
    /// it fail as out of memory after unused pooled buffers were released.
    pub fn set_memory_cap(&self, bytes: Option<u64>) {
        self.pool
            .cap
            .store(bytes.unwrap_or(u64::MAX), Ordering::SeqCst);
    }

    /// Make a failure happen (tests of the fault handling; see [`Fault`]).
    pub fn inject(&self, fault: Fault) {
        let mut inj = self.injected.lock().unwrap();
        match fault {
            Fault::OutOfMemory(n) => self.pool.fail_next.store(n, Ordering::SeqCst),
            Fault::PipelineCreation(n) => inj.pipelines = n,
            Fault::DeviceLost { at_submit } => inj.lose_at = Some(at_submit),
            Fault::InvalidBatch { at_submit } => inj.invalid_at = Some(at_submit),
        }
    }

    /// The injected faults due at this submit: (lose the device, record an invalid copy).
    fn submit_faults(&self) -> (bool, bool) {
        let mut inj = self.injected.lock().unwrap();
        let due = |at: &mut Option<usize>| match at {
            Some(0) => {
                *at = None;
                true
            }
            Some(k) => {
                *k -= 1;
                false
            }
            None => false,
        };
        let lose = due(&mut inj.lose_at);
        let invalid = due(&mut inj.invalid_at);
        (lose, invalid)
    }

    /// Wait for every submitted command; a wait past [`GPU_WAIT_TIMEOUT`] marks the device lost.
    #[cfg_attr(target_arch = "wasm32", allow(dead_code))] // the browser waits in gpu/wait.rs
    fn wait_idle(&self) -> Result<()> {
        let poll = self.device.poll(wgpu::PollType::Wait {
            submission_index: None,
            timeout: Some(GPU_WAIT_TIMEOUT),
        });
        match poll {
            Ok(_) => Ok(()),
            Err(wgpu::PollError::Timeout) => {
                self.lost.store(true, Ordering::SeqCst);
                Err(Error::Gpu(format!(
                    "device {} lost: the GPU did not finish within {} s",
                    self.desc.name,
                    GPU_WAIT_TIMEOUT.as_secs()
                )))
            }
            Err(e) => Err(Error::Gpu(format!("waiting for the GPU: {e}"))),
        }
    }

    pub fn adapter(&self) -> &AdapterDesc {
        &self.desc
    }

    pub fn limits(&self) -> &wgpu::Limits {
        &self.limits
    }

    /// True when per-dispatch times come from GPU timestamp queries.
    pub fn has_timestamps(&self) -> bool {
        self.timestamps
    }

    /// True once the device was lost; every later call fails and a new `Gpu` is needed.
    /// How long batches already submitted (by any session sharing this GPU) are expected to
    /// keep it busy from now (see [`busy::Busy::expected_wait`]).
    pub fn expected_wait(&self) -> Duration {
        self.busy.expected_wait()
    }

    pub fn is_lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }

    /// Bytes currently held by the buffer pool (free and in use).
    pub fn pooled_bytes(&self) -> u64 {
        self.pool.total.load(Ordering::Relaxed)
    }

    /// The part of [`Gpu::pooled_bytes`] in tensor buffers: what [`GpuOptions::max_memory`]
    /// bounds (uniforms and readback staging are transient and not counted).
    pub fn tensor_bytes(&self) -> u64 {
        self.pool.tensors.load(Ordering::Relaxed)
    }

    /// Why a buffer of `bytes` cannot be bound on this adapter, if it cannot.
    pub fn binding_refusal(&self, bytes: u64) -> Option<String> {
        let max = self
            .limits
            .max_storage_buffer_binding_size
            .min(self.limits.max_buffer_size);
        (bytes > max).then(|| {
            format!(
                "a {bytes}-byte tensor exceeds this adapter's storage binding limit of {max} bytes"
            )
        })
    }

    fn check_alive(&self) -> Result<()> {
        if self.is_lost() {
            return Err(Error::Gpu(format!("device {} was lost", self.desc.name)));
        }
        let errors = std::mem::take(&mut *self.uncaptured.lock().unwrap());
        if !errors.is_empty() {
            return Err(Error::Gpu(errors.join("; ")));
        }
        Ok(())
    }

    /// A zero-initialised-on-first-use device buffer for `elems` 4-byte elements of `dtype`.
    pub fn alloc(&self, dtype: DType, elems: usize) -> Result<GpuTensor> {
        let bytes = (elems as u64 * 4).max(16);
        if let Some(reason) = self.binding_refusal(bytes) {
            return Err(Error::Gpu(reason));
        }
        let buffer = self.pool.take(&self.device, bytes, STORAGE_USAGE)?;
        Ok(GpuTensor {
            buffer: Arc::new(buffer),
            elems,
            dtype,
        })
    }

    /// Write `bytes` into `t` at byte `offset` (ordered before the next submit).
    pub fn write(&self, t: &GpuTensor, offset: u64, bytes: &[u8]) {
        if !bytes.is_empty() {
            self.queue.write_buffer(&t.buffer.buffer, offset, bytes);
        }
    }

    /// Upload a host tensor (converted to 4-byte elements).
    pub fn upload(&self, t: &Tensor) -> Result<GpuTensor> {
        let bytes = to_gpu_bytes(t).map_err(Error::Gpu)?;
        let g = self.alloc(t.dtype(), t.numel())?;
        if !bytes.is_empty() {
            self.queue.write_buffer(&g.buffer.buffer, 0, &bytes);
        }
        Ok(g)
    }

    fn pipeline(&self, kernel: &GpuKernel) -> Result<wgpu::ComputePipeline> {
        let key = PipelineKey {
            shader: kernel.shader.name,
            overrides: kernel
                .overrides
                .iter()
                .map(|(n, v)| (*n, v.to_bits()))
                .collect(),
        };
        if let Some(p) = self.pipelines.lock().unwrap().get(&key) {
            return Ok(p.clone());
        }
        let scope = wait::push_scope(&self.device, wgpu::ErrorFilter::Validation);
        let broken = {
            let mut inj = self.injected.lock().unwrap();
            let due = inj.pipelines > 0;
            inj.pipelines = inj.pipelines.saturating_sub(1);
            due
        };
        let module = if broken {
            // Injected fault: a shader that fails validation, never cached.
            self.device
                .create_shader_module(wgpu::ShaderModuleDescriptor {
                    label: Some("injected-broken-shader"),
                    source: wgpu::ShaderSource::Wgsl(BROKEN_SHADER.into()),
                })
        } else {
            let mut modules = self.modules.lock().unwrap();
            modules
                .entry(kernel.shader.name)
                .or_insert_with(|| {
                    self.device
                        .create_shader_module(wgpu::ShaderModuleDescriptor {
                            label: Some(kernel.shader.name),
                            source: wgpu::ShaderSource::Wgsl(kernel.shader.source.into()),
                        })
                })
                .clone()
        };
        let constants: Vec<(&str, f64)> = kernel.overrides.iter().map(|(n, v)| (*n, *v)).collect();
        let pipeline = self
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(kernel.shader.name),
                layout: None,
                module: &module,
                entry_point: Some("main"),
                compilation_options: wgpu::PipelineCompilationOptions {
                    constants: &constants,
                    zero_initialize_workgroup_memory: false,
                },
                cache: None,
            });
        if let Some(e) = wait::pop_scope(scope) {
            self.modules.lock().unwrap().remove(kernel.shader.name);
            return Err(Error::Gpu(format!(
                "pipeline creation failed for shader {}: {e}",
                kernel.shader.name
            )));
        }
        self.pipelines.lock().unwrap().insert(key, pipeline.clone());
        Ok(pipeline)
    }

    /// Start recording a batch of dispatches (submitted together by [`Batch::submit`]).
    pub fn batch(&self) -> Batch<'_> {
        Batch {
            gpu: self,
            pending: Vec::new(),
        }
    }

    /// Read tensors back to the host: one submit, one wait for all of them.
    pub fn download(&self, tensors: &[(&GpuTensor, &[usize])]) -> Result<Vec<Tensor>> {
        pollster::block_on(self.download_async(tensors))
    }

    /// [`Gpu::download`] without blocking (the readback is awaited; see `gpu/wait.rs`).
    pub async fn download_async(&self, tensors: &[(&GpuTensor, &[usize])]) -> Result<Vec<Tensor>> {
        self.check_alive()?;
        let mut encoder = self.device.create_command_encoder(&Default::default());
        let mut staging = Vec::with_capacity(tensors.len());
        for (t, _) in tensors {
            let bytes = (t.elems as u64 * 4).max(4);
            let s = self.pool.take(&self.device, bytes, READ_USAGE)?;
            encoder.copy_buffer_to_buffer(&t.buffer.buffer, 0, &s.buffer, 0, bytes);
            staging.push((s, bytes));
        }
        self.queue.submit([encoder.finish()]);
        let results = self
            .map_all_async(staging.iter().map(|(s, b)| (&s.buffer, *b)).collect())
            .await?;
        tensors
            .iter()
            .zip(results)
            .map(|((t, shape), bytes)| Ok(from_gpu_bytes(&bytes[..t.elems * 4], t.dtype, shape)))
            .collect()
    }

    #[cfg_attr(target_arch = "wasm32", allow(dead_code))] // the browser waits in gpu/wait.rs
    fn map_all(&self, buffers: Vec<(&wgpu::Buffer, u64)>) -> Result<Vec<Vec<u8>>> {
        let failed = Arc::new(AtomicBool::new(false));
        for (b, size) in &buffers {
            let failed = failed.clone();
            b.slice(..*size).map_async(wgpu::MapMode::Read, move |r| {
                if r.is_err() {
                    failed.store(true, Ordering::SeqCst);
                }
            });
        }
        self.wait_idle()?;
        self.check_alive()?;
        if failed.load(Ordering::SeqCst) {
            return Err(Error::Gpu("mapping a readback buffer failed".into()));
        }
        buffers
            .into_iter()
            .map(|(b, size)| {
                let v = b
                    .slice(..size)
                    .get_mapped_range()
                    .map_err(|e| Error::Gpu(format!("reading back: {e}")))?
                    .to_vec();
                b.unmap();
                Ok(v)
            })
            .collect()
    }

    /// Destroy the device (a test hook for device-loss handling).
    pub fn destroy_for_test(&self) {
        self.device.destroy();
        self.lost.store(true, Ordering::SeqCst);
    }
}

/// The shader of an injected pipeline-creation fault: it does not type-check.
const BROKEN_SHADER: &str = "@compute @workgroup_size(1) fn main() { let x: u32 = 1.5; }";

const STORAGE_USAGE: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE
    .union(wgpu::BufferUsages::COPY_SRC)
    .union(wgpu::BufferUsages::COPY_DST);
const READ_USAGE: wgpu::BufferUsages =
    wgpu::BufferUsages::MAP_READ.union(wgpu::BufferUsages::COPY_DST);
const UNIFORM_USAGE: wgpu::BufferUsages =
    wgpu::BufferUsages::UNIFORM.union(wgpu::BufferUsages::COPY_DST);

/// A tensor resident on the GPU: a pooled buffer of `elems` 4-byte elements. The buffer goes
/// back to the pool when the last clone is dropped.
#[derive(Clone, Debug)]
pub struct GpuTensor {
    buffer: Arc<PooledBuffer>,
    pub elems: usize,
    /// The host dtype this tensor converts back to.
    pub dtype: DType,
}

impl GpuTensor {
    /// True when this tensor's buffer belongs to `gpu` (not to a device it replaced).
    pub fn is_on(&self, gpu: &Gpu) -> bool {
        std::ptr::eq(self.buffer.pool.as_ptr(), Arc::as_ptr(&gpu.pool))
    }

    fn binding_size(&self) -> u64 {
        (self.elems as u64 * 4).max(16).min(self.buffer.size)
    }
}

/// Buffers kept for reuse, by (size class, usage).
#[derive(Default)]
struct BufferPool {
    free: Mutex<HashMap<(u64, u32), Vec<wgpu::Buffer>>>,
    /// Bytes of all buffers created and not yet released (free and in use).
    total: AtomicU64,
    /// The part of `total` in tensor (storage) buffers: what the cap bounds. Uniforms and
    /// readback staging are transient and not counted.
    tensors: AtomicU64,
    /// Most bytes `tensors` may reach (`u64::MAX`: no cap).
    cap: AtomicU64,
    /// Injected faults: this many next creations fail as out of memory.
    fail_next: AtomicUsize,
}

#[derive(Debug)]
struct PooledBuffer {
    buffer: wgpu::Buffer,
    size: u64,
    usage: wgpu::BufferUsages,
    pool: Weak<BufferPool>,
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
    fn with_cap(cap: Option<u64>) -> BufferPool {
        BufferPool {
            cap: AtomicU64::new(cap.unwrap_or(u64::MAX)),
            ..BufferPool::default()
        }
    }

    /// Release unused pooled tensor buffers until `need` more bytes fit under the cap (every
    /// unused buffer when `need` is `None`). Returns whether they fit.
    fn make_room(&self, need: Option<u64>) -> bool {
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
    fn create(
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

    fn take(
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

struct Pending {
    /// `None` for a clear of `buffers[0]`.
    pipeline: Option<wgpu::ComputePipeline>,
    buffers: Vec<GpuTensor>,
    params: Vec<u8>,
    workgroups: [u32; 3],
    label: usize,
}

/// Dispatches recorded for one submit. Dispatches run in the order they were added.
pub struct Batch<'g> {
    gpu: &'g Gpu,
    pending: Vec<Pending>,
}

/// Measured time of one submitted batch: wall time from submit to completion and, where the
/// adapter has timestamp queries, the GPU time of each dispatch by its label.
#[derive(Debug, Clone, Default)]
pub struct BatchTiming {
    pub wall: Duration,
    pub per_label: Vec<(usize, Duration)>,
    /// For each entry of `per_label`, when it began after the batch's first dispatch began.
    pub starts: Vec<Duration>,
    /// When the batch was submitted (host clock).
    pub submitted: Option<Instant>,
}

impl<'g> Batch<'g> {
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Record `kernel` reading `inputs` and writing `outputs` (bound in that order, then the
    /// params). `label` identifies the dispatch in [`BatchTiming`] (e.g. a node index).
    pub fn dispatch(
        &mut self,
        kernel: &GpuKernel,
        inputs: &[&GpuTensor],
        outputs: &[&GpuTensor],
        label: usize,
    ) -> Result<()> {
        for w in kernel.workgroups {
            if w > self.gpu.limits.max_compute_workgroups_per_dimension {
                return Err(Error::Gpu(format!(
                    "{}: {w} workgroups exceed the adapter limit {}",
                    kernel.shader.name, self.gpu.limits.max_compute_workgroups_per_dimension
                )));
            }
        }
        let pipeline = self.gpu.pipeline(kernel)?;
        let buffers = inputs.iter().chain(outputs).map(|t| (*t).clone()).collect();
        self.pending.push(Pending {
            pipeline: Some(pipeline),
            buffers,
            params: kernel.params.clone(),
            workgroups: kernel.workgroups,
            label,
        });
        Ok(())
    }

    /// Zero-fill `t` before the dispatches recorded after this call.
    pub fn clear(&mut self, t: &GpuTensor) {
        self.pending.push(Pending {
            pipeline: None,
            buffers: vec![t.clone()],
            params: Vec::new(),
            workgroups: [0; 3],
            label: usize::MAX,
        });
    }

    /// Encode every dispatch into one command encoder and submit it, without waiting.
    pub fn submit(mut self) -> Result<Submitted<'g>> {
        let gpu = self.gpu;
        gpu.check_alive()?;
        if self.pending.is_empty() {
            self.pending.push(Pending {
                pipeline: None,
                buffers: Vec::new(),
                params: Vec::new(),
                workgroups: [0; 3],
                label: usize::MAX,
            });
        }
        let align = gpu.limits.min_uniform_buffer_offset_alignment as u64;
        let mut arena = Vec::new();
        let mut offsets = Vec::with_capacity(self.pending.len());
        for p in &self.pending {
            if p.pipeline.is_none() {
                offsets.push(0);
                continue;
            }
            let off = (arena.len() as u64).div_ceil(align) * align;
            arena.resize(off as usize, 0);
            offsets.push(off);
            arena.extend_from_slice(&p.params);
        }
        let uniforms = gpu
            .pool
            .take(&gpu.device, arena.len() as u64, UNIFORM_USAGE)?;
        gpu.queue.write_buffer(&uniforms.buffer, 0, &arena);
        let n = self.pending.len() as u32;
        let queries = gpu.timestamps.then(|| {
            let set = gpu.device.create_query_set(&wgpu::QuerySetDescriptor {
                label: None,
                ty: wgpu::QueryType::Timestamp,
                count: 2 * n,
            });
            (set, 2 * n as u64 * 8)
        });
        let scope = wait::push_scope(&gpu.device, wgpu::ErrorFilter::Validation);
        let mut encoder = gpu.device.create_command_encoder(&Default::default());
        for (i, (p, off)) in self.pending.iter().zip(&offsets).enumerate() {
            let Some(pipeline) = &p.pipeline else {
                if let Some(t) = p.buffers.first() {
                    encoder.clear_buffer(&t.buffer.buffer, 0, Some(t.binding_size()));
                }
                continue;
            };
            let layout = pipeline.get_bind_group_layout(0);
            let mut entries: Vec<wgpu::BindGroupEntry> = p
                .buffers
                .iter()
                .enumerate()
                .map(|(b, t)| wgpu::BindGroupEntry {
                    binding: b as u32,
                    resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer: &t.buffer.buffer,
                        offset: 0,
                        size: wgpu::BufferSize::new(t.binding_size()),
                    }),
                })
                .collect();
            entries.push(wgpu::BindGroupEntry {
                binding: p.buffers.len() as u32,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer: &uniforms.buffer,
                    offset: *off,
                    size: wgpu::BufferSize::new(p.params.len().max(16) as u64),
                }),
            });
            let bind_group = gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: None,
                layout: &layout,
                entries: &entries,
            });
            let timestamp_writes =
                queries
                    .as_ref()
                    .map(|(set, _)| wgpu::ComputePassTimestampWrites {
                        query_set: set,
                        beginning_of_pass_write_index: Some(2 * i as u32),
                        end_of_pass_write_index: Some(2 * i as u32 + 1),
                    });
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: None,
                timestamp_writes,
            });
            pass.set_pipeline(pipeline);
            pass.set_bind_group(0, &bind_group, &[]);
            let [x, y, z] = p.workgroups;
            pass.dispatch_workgroups(x, y, z);
        }
        let resolved = match &queries {
            Some((set, bytes)) => {
                let resolve = gpu.device.create_buffer(&wgpu::BufferDescriptor {
                    label: None,
                    size: *bytes,
                    usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                    mapped_at_creation: false,
                });
                encoder.resolve_query_set(set, 0..2 * n, &resolve, 0);
                let read = gpu.pool.take(&gpu.device, *bytes, READ_USAGE)?;
                encoder.copy_buffer_to_buffer(&resolve, 0, &read.buffer, 0, *bytes);
                Some((read, *bytes))
            }
            None => None,
        };
        let (lose, invalid) = gpu.submit_faults();
        if invalid {
            // Injected fault: a copy past the end of the uniforms invalidates the whole batch.
            encoder.copy_buffer_to_buffer(&uniforms.buffer, 0, &uniforms.buffer, 0, 1 << 40);
        }
        let start = Instant::now();
        gpu.queue.submit([encoder.finish()]);
        if lose {
            gpu.destroy_for_test();
        }
        if let Some(e) = wait::pop_scope(scope) {
            return Err(Error::Gpu(format!("recording dispatches: {e}")));
        }
        let labels = self
            .pending
            .iter()
            .filter(|p| p.pipeline.is_some())
            .map(|p| p.label)
            .collect();
        Ok(Submitted {
            _ticket: gpu.busy.start(),
            gpu,
            start,
            labels,
            stamps: resolved,
            _keep: (self.pending, uniforms),
        })
    }
}

/// A batch the GPU is working on. The host is free meanwhile; [`Submitted::wait`] blocks until
/// it is done and returns its timing.
pub struct Submitted<'g> {
    /// Counts the batch as in flight until it is dropped.
    _ticket: busy::Ticket,
    gpu: &'g Gpu,
    start: Instant,
    labels: Vec<usize>,
    stamps: Option<(PooledBuffer, u64)>,
    /// Buffers and uniforms stay out of the pool until the GPU is done with them.
    _keep: (Vec<Pending>, PooledBuffer),
}

impl Submitted<'_> {
    pub fn wait(self) -> Result<BatchTiming> {
        pollster::block_on(self.wait_async())
    }

    /// [`Submitted::wait`] without blocking (see `gpu/wait.rs`).
    pub async fn wait_async(self) -> Result<BatchTiming> {
        let gpu = self.gpu;
        let mut timing = BatchTiming {
            submitted: Some(self.start),
            ..BatchTiming::default()
        };
        match &self.stamps {
            Some((read, bytes)) => {
                let stamps = gpu
                    .map_all_async(vec![(&read.buffer, *bytes)])
                    .await?
                    .remove(0);
                timing.wall = self.start.elapsed();
                let period = gpu.queue.get_timestamp_period() as f64;
                let ts: &[u64] = bytemuck::cast_slice(&stamps);
                let first = self
                    ._keep
                    .0
                    .iter()
                    .enumerate()
                    .filter(|(_, p)| p.pipeline.is_some())
                    .map(|(i, _)| ts[2 * i])
                    .min()
                    .unwrap_or(0);
                let mut k = 0;
                for (i, p) in self._keep.0.iter().enumerate() {
                    if p.pipeline.is_none() {
                        continue;
                    }
                    let ns = ts[2 * i + 1].saturating_sub(ts[2 * i]) as f64 * period;
                    timing
                        .per_label
                        .push((self.labels[k], Duration::from_nanos(ns as u64)));
                    let from_first = ts[2 * i].saturating_sub(first) as f64 * period;
                    timing.starts.push(Duration::from_nanos(from_first as u64));
                    k += 1;
                }
            }
            None => {
                gpu.wait_idle_async().await?;
                gpu.check_alive()?;
                timing.wall = self.start.elapsed();
            }
        }
        let gpu_time: Duration = timing.per_label.iter().map(|(_, d)| *d).sum();
        gpu.busy.finished(if timing.per_label.is_empty() {
            timing.wall
        } else {
            gpu_time
        });
        Ok(timing)
    }
}

/// A host tensor as the GPU's 4-byte elements. Fails (never truncates) for int64 values outside
/// i32 and for f64 tensors, which the GPU path does not support.
pub fn to_gpu_bytes(t: &Tensor) -> std::result::Result<Vec<u8>, String> {
    Ok(match &t.data {
        Data::F32(v) => bytemuck::cast_slice(v).to_vec(),
        Data::F16(v) => v.iter().flat_map(|x| x.to_f32().to_le_bytes()).collect(),
        Data::F64(_) => return Err("f64 tensors are not supported on the GPU".into()),
        Data::I64(v) => {
            let mut out = Vec::with_capacity(v.len() * 4);
            for (i, &x) in v.iter().enumerate() {
                let n = i32::try_from(x).map_err(|_| {
                    format!("int64 value {x} at index {i} does not fit the GPU's 32-bit integers")
                })?;
                out.extend_from_slice(&n.to_le_bytes());
            }
            out
        }
        Data::I32(v) => bytemuck::cast_slice(v).to_vec(),
        Data::I8(v) => v.iter().flat_map(|x| (*x as i32).to_le_bytes()).collect(),
        Data::U8(v) => v.iter().flat_map(|x| (*x as i32).to_le_bytes()).collect(),
        Data::Bool(v) => v.iter().flat_map(|x| (*x as u32).to_le_bytes()).collect(),
    })
}

/// 4-byte GPU elements back to a host tensor of `dtype`.
pub fn from_gpu_bytes(bytes: &[u8], dtype: DType, shape: &[usize]) -> Tensor {
    let words: Vec<u32> = bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let data = match dtype {
        DType::F32 => Data::F32(words.iter().map(|w| f32::from_bits(*w)).collect()),
        DType::F16 => Data::F16(
            words
                .iter()
                .map(|w| f16::from_f32(f32::from_bits(*w)))
                .collect(),
        ),
        DType::F64 => Data::F64(words.iter().map(|w| f32::from_bits(*w) as f64).collect()),
        DType::I64 => Data::I64(words.iter().map(|w| *w as i32 as i64).collect()),
        DType::I32 => Data::I32(words.iter().map(|w| *w as i32).collect()),
        DType::I8 => Data::I8(words.iter().map(|w| *w as i32 as i8).collect()),
        DType::U8 => Data::U8(words.iter().map(|w| *w as i32 as u8).collect()),
        DType::Bool => Data::Bool(words.iter().map(|w| *w != 0).collect()),
    };
    Tensor::new(shape.to_vec(), data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_classes_round_up_by_at_most_an_eighth() {
        for b in [
            1u64,
            15,
            16,
            17,
            100,
            1000,
            4096,
            4097,
            1 << 20,
            (1 << 20) + 1,
        ] {
            let c = size_class(b);
            assert!(c >= b && c.is_multiple_of(16), "{b} -> {c}");
            assert!(c <= (b + b / 8).max(16) + 16, "{b} -> {c}");
        }
    }

    #[test]
    fn int64_out_of_i32_range_is_refused_not_truncated() {
        let t = Tensor::i64(&[2], vec![1, 1 << 40]);
        let e = to_gpu_bytes(&t).unwrap_err();
        assert!(e.contains("1099511627776"), "{e}");
        let ok = Tensor::i64(&[2], vec![-5, 7]);
        let back = from_gpu_bytes(&to_gpu_bytes(&ok).unwrap(), DType::I64, &[2]);
        assert_eq!(back, ok);
    }
}
