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
//!
//! Parts: `buffers.rs` (tensors on pooled buffers, the cap), `batch.rs` (recording, submitting
//! and waiting for a batch of dispatches, timestamps), `wait.rs` (bounded waits), `busy.rs`
//! (other sessions' work in flight), `headless.rs` (the GL adapter without a desktop).

use crate::{Error, Result};
use half::f16;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tandem_ops::{DType, Data, GpuKernel, Tensor};

mod batch;
mod buffers;
/// In-flight batches and GPU time per batch, for planning around other sessions' work.
pub mod busy;
mod headless;
mod wait;

pub use headless::quiet_wayland_probe;

pub use batch::{entries_per_submit, Batch, BatchTiming, Submitted};
pub(crate) use buffers::size_class;
use buffers::BufferPool;
pub use buffers::GpuTensor;

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
    /// Device type Cpu ([`Gpu::runs_on_cpu`]).
    cpu_adapter: bool,
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
            cpu_adapter: info.device_type == wgpu::DeviceType::Cpu,
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
        self.wait_for(None)
    }

    /// Wait for the submit of `index` and those before it (`None`: every submit); a wait past
    /// [`GPU_WAIT_TIMEOUT`] marks the device lost.
    fn wait_for(&self, index: Option<wgpu::SubmissionIndex>) -> Result<()> {
        let poll = self.device.poll(wgpu::PollType::Wait {
            submission_index: index,
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

    /// True for an adapter that runs shaders on the CPU (device type Cpu: lavapipe, SwiftShader,
    /// WARP): kernels with a variant for such adapters dispatch it
    /// ([`GpuKernel::on_cpu_adapter`](tandem_ops::GpuKernel::on_cpu_adapter)).
    pub fn runs_on_cpu(&self) -> bool {
        self.cpu_adapter
    }

    /// True when this adapter's shader threads take cores from `cpu_threads` threads of CPU
    /// kernels running beside them: it runs shaders on the CPU, and the two together want more
    /// threads than the machine has cores. Splitting a node across both then adds no compute,
    /// and each part slows the other (magika's Conv split on lavapipe beside 2 kernel threads
    /// on 2 cores: 24 ms for 91 % of its rows, 16 ms for all of them alone).
    pub fn shares_cores_with(&self, cpu_threads: usize) -> bool {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        self.runs_on_cpu() && oversubscribed(cpu_threads, cpu_adapter_threads(cores), cores)
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
            timed: self.timestamps,
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

/// Threads a CPU adapter runs shaders on: llvmpipe's `LP_NUM_THREADS` (0 runs them on the
/// submitting thread), else one per core, as llvmpipe and SwiftShader do by default.
fn cpu_adapter_threads(cores: usize) -> usize {
    std::env::var("LP_NUM_THREADS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .map_or(cores, |n| n.max(1))
}

/// True when `cpu_threads` kernel threads and `adapter_threads` shader threads want more than
/// `cores` cores.
fn oversubscribed(cpu_threads: usize, adapter_threads: usize, cores: usize) -> bool {
    cpu_threads + adapter_threads > cores
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

    /// The co-execution bed of `tandem-bench coexec` (1 kernel thread, `LP_NUM_THREADS=1`, 2
    /// cores) keeps its splits; a default session beside a default llvmpipe does not.
    #[test]
    fn threads_past_the_cores_oversubscribe() {
        assert!(!oversubscribed(1, 1, 2));
        assert!(oversubscribed(2, 2, 2));
        assert!(oversubscribed(1, 2, 2));
        assert!(!oversubscribed(8, 8, 16));
    }
}
