//! Batched dispatches: the dispatches recorded for one submit ([`Batch`]), one command encoder
//! per batch with timestamp queries where the adapter has them, and the wait for its completion
//! ([`Submitted::wait`]) with per-dispatch GPU times ([`BatchTiming`]).
//!
//! Sits between the executor (which records and submits) and [`Gpu`]'s queue.

use super::buffers::PooledBuffer;
use super::{busy, wait, Gpu, GpuTensor, READ_USAGE, UNIFORM_USAGE};
use crate::{Error, Result};
use std::time::Duration;
use tandem_ops::{GpuKernel, UniformWindow, TEXTURE_WIDTH, UNIFORM_WINDOW_BYTES};
use web_time::Instant;

/// Timestamps per query set: wgpu's most (4096, an even number: both of a dispatch's stamps
/// fall in one set; 4096 x 8 bytes keeps each set's resolve offset 256-aligned).
const QUERIES_PER_SET: u32 = wgpu::QUERY_SET_MAX_QUERIES;

/// Dispatches and clears a batch holds before [`Batch::is_full`]: submitted then, the GPU works
/// on them while the host encodes the next ones instead of idling until a whole stretch of GPU
/// steps is recorded. On a lent H200, all-GPU runs took 0.77-0.99x the time of one batch per
/// stretch (docs/bench.md, "GPU batches submitted when full"). `TANDEM_GPU_SUBMIT_AFTER=N`
/// sets it (a large N keeps one batch per stretch).
const ENTRIES_PER_SUBMIT: usize = 16;

/// `ENTRIES_PER_SUBMIT`, or `TANDEM_GPU_SUBMIT_AFTER` where it is set to a positive number.
pub fn entries_per_submit() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| {
        std::env::var("TANDEM_GPU_SUBMIT_AFTER")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|&n| n > 0)
            .unwrap_or(ENTRIES_PER_SUBMIT)
    })
}

pub(super) struct Pending {
    /// `None` for a clear of `buffers[0]`.
    pipeline: Option<wgpu::ComputePipeline>,
    buffers: Vec<GpuTensor>,
    params: Vec<u8>,
    /// A part of an input bound as a uniform copy ([`GpuKernel::uniform_window`]).
    window: Option<UniformWindow>,
    /// Inputs bound as texture copies ([`GpuKernel::texture_inputs`]).
    textures: Vec<usize>,
    workgroups: [u32; 3],
    label: usize,
}

/// Dispatches recorded for one submit. Dispatches run in the order they were added.
pub struct Batch<'g> {
    pub(super) gpu: &'g Gpu,
    pub(super) pending: Vec<Pending>,
    /// Whether each dispatch's GPU time is measured (timestamp queries, where the adapter has
    /// them; see [`Batch::timed`]).
    pub(super) timed: bool,
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

    /// Measure each dispatch's GPU time (`true`, the default where the adapter has timestamp
    /// queries) or not. Timestamps around every pass cost the GPU a pause each: on a lent H200,
    /// runs of many short kernels took 0.65-0.96x the time without them (docs/bench.md).
    pub fn timed(mut self, on: bool) -> Self {
        self.timed = on && self.gpu.timestamps;
        self
    }

    /// Whether the batch holds [`entries_per_submit`] dispatches and clears: enough that
    /// submitting it now lets the GPU start on them while the host records the rest.
    pub fn is_full(&self) -> bool {
        self.pending.len() >= entries_per_submit()
    }

    /// Record `kernel` (its dispatches for this adapter, [`GpuKernel::for_adapter`]) reading
    /// `inputs` and writing `outputs` (bound in that order, then the params). `label`
    /// identifies the dispatches in [`BatchTiming`] (e.g. a node index).
    pub fn dispatch(
        &mut self,
        kernel: &GpuKernel,
        inputs: &[&GpuTensor],
        outputs: &[&GpuTensor],
        label: usize,
    ) -> Result<()> {
        for kernel in kernel.for_adapter(self.gpu.runs_on_cpu()) {
            for w in kernel.workgroups {
                if w > self.gpu.limits.max_compute_workgroups_per_dimension {
                    return Err(Error::Gpu(format!(
                        "{}: {w} workgroups exceed the adapter limit {}",
                        kernel.shader.name, self.gpu.limits.max_compute_workgroups_per_dimension
                    )));
                }
            }
            if let Some(w) = kernel.uniform_window {
                let elems = inputs.get(w.binding).map_or(0, |t| t.elems);
                if w.first + w.len > elems || w.len * 4 > UNIFORM_WINDOW_BYTES {
                    return Err(Error::Gpu(format!(
                        "{}: uniform window of elements {}..{} of binding {} (of {elems}), at most \
                         {UNIFORM_WINDOW_BYTES} bytes",
                        kernel.shader.name,
                        w.first,
                        w.first + w.len,
                        w.binding
                    )));
                }
            }
            for &b in &kernel.texture_inputs {
                let rows = inputs.get(b).map_or(0, |t| texture_rows(t));
                let most = self.gpu.limits.max_texture_dimension_2d as usize;
                if rows > most {
                    return Err(Error::Gpu(format!(
                        "{}: input {b} as a texture needs {rows} rows of {TEXTURE_WIDTH} \
                         texels, more than the adapter's {most}",
                        kernel.shader.name
                    )));
                }
            }
            let pipeline = self.gpu.pipeline(kernel)?;
            let buffers = inputs.iter().chain(outputs).map(|t| (*t).clone()).collect();
            self.pending.push(Pending {
                pipeline: Some(pipeline),
                buffers,
                params: kernel.params.clone(),
                window: kernel.uniform_window,
                textures: kernel.texture_inputs.clone(),
                workgroups: kernel.workgroups,
                label,
            });
        }
        Ok(())
    }

    /// Zero-fill `t` before the dispatches recorded after this call.
    pub fn clear(&mut self, t: &GpuTensor) {
        self.pending.push(Pending {
            pipeline: None,
            buffers: vec![t.clone()],
            params: Vec::new(),
            window: None,
            textures: Vec::new(),
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
                window: None,
                textures: Vec::new(),
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
        // Each uniform window gets UNIFORM_WINDOW_BYTES of one buffer, filled by a copy
        // recorded before its dispatch.
        let window_bytes = UNIFORM_WINDOW_BYTES as u64;
        let n_windows = self.pending.iter().filter(|p| p.window.is_some()).count() as u64;
        let windows = match n_windows {
            0 => None,
            n => Some(
                gpu.pool
                    .take(&gpu.device, n * window_bytes, UNIFORM_USAGE)?,
            ),
        };
        let mut next_window = 0;
        // The last dispatch's texture inputs' buffers and textures, which the next dispatch
        // reading the same buffer binds again (a product's row windows): each is copied right
        // before its first reader.
        let mut textures: Vec<(wgpu::Buffer, wgpu::TextureView)> = Vec::new();
        // Two timestamps per entry, in query sets of at most QUERY_SET_MAX_QUERIES (a batch of
        // more than 2048 dispatches in one set failed validation and lost the whole run).
        let n = self.pending.len() as u32;
        let queries = self.timed.then(|| {
            // (set, its first query's index in the batch, its count)
            let sets: Vec<(wgpu::QuerySet, u32, u32)> = (0..2 * n)
                .step_by(QUERIES_PER_SET as usize)
                .map(|first| {
                    let count = (2 * n - first).min(QUERIES_PER_SET);
                    let set = gpu.device.create_query_set(&wgpu::QuerySetDescriptor {
                        label: None,
                        ty: wgpu::QueryType::Timestamp,
                        count,
                    });
                    (set, first, count)
                })
                .collect();
            (sets, 2 * n as u64 * 8)
        });
        let scope = wait::push_scope(&gpu.device, wgpu::ErrorFilter::Validation);
        let mut encoder = gpu.device.create_command_encoder(&Default::default());
        for (i, (p, off)) in self.pending.iter().zip(&offsets).enumerate() {
            let Some(pipeline) = &p.pipeline else {
                textures.clear();
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
            if let (Some(w), Some(windows)) = (p.window, &windows) {
                let at = next_window * window_bytes;
                next_window += 1;
                let source = &p.buffers[w.binding].buffer.buffer;
                let (first, len) = (w.first as u64 * 4, w.len as u64 * 4);
                encoder.copy_buffer_to_buffer(source, first, &windows.buffer, at, len);
                entries[w.binding].resource = wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer: &windows.buffer,
                    offset: at,
                    size: wgpu::BufferSize::new(window_bytes),
                });
            }
            let bound: Vec<(wgpu::Buffer, wgpu::TextureView)> = (p.textures.iter())
                .map(|&b| {
                    let buffer = &p.buffers[b].buffer.buffer;
                    match textures.iter().find(|(kept, _)| kept == buffer) {
                        Some(kept) => kept.clone(),
                        None => (
                            buffer.clone(),
                            copy_to_texture(gpu, &mut encoder, &p.buffers[b]),
                        ),
                    }
                })
                .collect();
            textures = bound;
            for (&b, (_, view)) in p.textures.iter().zip(&textures) {
                entries[b].resource = wgpu::BindingResource::TextureView(view);
            }
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
            let q = 2 * i as u32;
            let timestamp_writes =
                queries
                    .as_ref()
                    .map(|(sets, _)| wgpu::ComputePassTimestampWrites {
                        query_set: &sets[(q / QUERIES_PER_SET) as usize].0,
                        beginning_of_pass_write_index: Some(q % QUERIES_PER_SET),
                        end_of_pass_write_index: Some(q % QUERIES_PER_SET + 1),
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
            Some((sets, bytes)) => {
                let resolve = gpu.device.create_buffer(&wgpu::BufferDescriptor {
                    label: None,
                    size: *bytes,
                    usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                    mapped_at_creation: false,
                });
                for (set, first, count) in sets {
                    encoder.resolve_query_set(set, 0..*count, &resolve, *first as u64 * 8);
                }
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
        let index = gpu.queue.submit([encoder.finish()]);
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
            index,
            _keep: (self.pending, uniforms, windows),
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
    /// The queue's index of this submit: an untimed batch waits for it alone.
    index: wgpu::SubmissionIndex,
    /// Buffers and uniforms stay out of the pool until the GPU is done with them.
    _keep: (Vec<Pending>, PooledBuffer, Option<PooledBuffer>),
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
                gpu.wait_submission_async(self.index.clone()).await?;
                gpu.check_alive()?;
                timing.wall = self.start.elapsed();
            }
        }
        let gpu_time: Duration = timing.per_label.iter().map(|(_, d)| *d).sum();
        if !timing.per_label.is_empty() {
            gpu.busy.finished(gpu_time);
        } else if self.stamps.is_some() || !gpu.timestamps {
            // A timed batch of clears alone, or an adapter without timestamps: the wall time
            // is all there is.
            gpu.busy.finished(timing.wall);
        }
        // Else untimed by choice ([`Batch::timed`]): its wall time runs to when the host came
        // to wait (often the end of the run), so it would overstate the batch's GPU time.
        Ok(timing)
    }
}

/// A texture [`TEXTURE_WIDTH`] rgba32uint texels wide holding `t`'s vec4s in order, filled by
/// copies recorded in `encoder` ([`GpuKernel::texture_inputs`]; [`Batch::dispatch`] checked its
/// height against the adapter's limit).
fn copy_to_texture(
    gpu: &Gpu,
    encoder: &mut wgpu::CommandEncoder,
    t: &GpuTensor,
) -> wgpu::TextureView {
    let texels = t.elems / 4;
    let width = TEXTURE_WIDTH as u32;
    let texture = gpu.device.create_texture(&wgpu::TextureDescriptor {
        label: None,
        size: wgpu::Extent3d {
            width,
            height: texture_rows(t) as u32,
            depth_or_array_layers: 1,
        },
        mip_level_count: 1,
        sample_count: 1,
        dimension: wgpu::TextureDimension::D2,
        format: wgpu::TextureFormat::Rgba32Uint,
        usage: wgpu::TextureUsages::TEXTURE_BINDING | wgpu::TextureUsages::COPY_DST,
        view_formats: &[],
    });
    // whole rows in one copy, the last part row in another
    let (full, rest) = (texels / TEXTURE_WIDTH, texels % TEXTURE_WIDTH);
    let row_bytes = width * 16;
    for (first_row, height, width) in [(0, full, TEXTURE_WIDTH), (full, 1, rest)] {
        if height == 0 || width == 0 {
            continue;
        }
        encoder.copy_buffer_to_texture(
            wgpu::TexelCopyBufferInfo {
                buffer: &t.buffer.buffer,
                layout: wgpu::TexelCopyBufferLayout {
                    offset: first_row as u64 * row_bytes as u64,
                    bytes_per_row: Some(row_bytes),
                    rows_per_image: None,
                },
            },
            wgpu::TexelCopyTextureInfo {
                texture: &texture,
                mip_level: 0,
                origin: wgpu::Origin3d {
                    x: 0,
                    y: first_row as u32,
                    z: 0,
                },
                aspect: wgpu::TextureAspect::All,
            },
            wgpu::Extent3d {
                width: width as u32,
                height: height as u32,
                depth_or_array_layers: 1,
            },
        );
    }
    texture.create_view(&Default::default())
}

/// Rows of the texture that holds `t` ([`copy_to_texture`]).
fn texture_rows(t: &GpuTensor) -> usize {
    (t.elems / 4).div_ceil(TEXTURE_WIDTH).max(1)
}
