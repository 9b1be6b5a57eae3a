//! The executor: runs a plan's steps, keeping each value where it was produced and moving it
//! only when a step on the other device reads it.
//!
//! Sits between a [`Plan`] and the two devices. Consecutive GPU steps are recorded into a batch
//! (one command encoder); the batch is submitted, without waiting, as soon as a CPU step comes,
//! so the GPU works while the CPU kernels run on the session's rayon pool, or once it is full
//! ([`Batch::is_full`]), so the GPU works while the host records the next steps. The host waits
//! for the GPU only when a CPU step reads a GPU result (a join), or at the end of the run. Nodes
//! are timed (GPU steps by timestamp queries) only when [`Context::node_times`] asks. A split step
//! submits its GPU rows first, computes its CPU rows meanwhile, and leaves its output in two
//! parts that are joined where they are read.
//!
//! The core is async ([`execute_async`]): its only waits are for the GPU (a batch's completion,
//! a readback), and in the browser those complete only when the JS event loop runs, so they must
//! be awaited, never blocked on. On native targets the awaited futures are already complete when
//! first polled (the GPU layer waits inside them), so [`execute`] is a plain `block_on`.

mod append;
mod fault;
mod host_buffers;

pub use host_buffers::HostBuffers;

use crate::gpu::{to_gpu_bytes, Batch, Gpu, GpuTensor, Submitted};
use crate::graph::Graph;
use crate::plan::{node_error, Device, Plan, StepKind};
use crate::report::{NodeReport, Ran, RunReport, Transfer};
use crate::{Error, Result};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tandem_ops::{GpuKernel, Tensor, TensorMeta};
use web_time::Instant;

/// GPU copies of constant tensors, uploaded once per session (keyed by the tensor's address;
/// the cache holds the tensor so the address stays valid).
#[derive(Default)]
pub struct GpuConstants {
    map: Mutex<HashMap<usize, (Arc<Tensor>, GpuTensor)>>,
}

impl GpuConstants {
    fn get(&self, gpu: &Gpu, t: &Arc<Tensor>, report: &mut RunReport) -> Result<GpuTensor> {
        let key = Arc::as_ptr(t) as usize;
        if let Some((_, g)) = self.map.lock().unwrap().get(&key) {
            if g.is_on(gpu) {
                return Ok(g.clone());
            }
        }
        let g = gpu.upload(t)?;
        report.uploads += 1;
        report.upload_bytes += t.numel() as u64 * 4;
        self.map.lock().unwrap().insert(key, (t.clone(), g.clone()));
        Ok(g)
    }

    /// Forget every upload (after the GPU was replaced).
    pub fn clear(&self) {
        self.map.lock().unwrap().clear();
    }
}

/// Where a value's elements are. A split value has elements `..split` on the host and
/// `split..` on the GPU.
#[derive(Default, Clone)]
struct Slot {
    host: Option<Arc<Tensor>>,
    gpu: Option<GpuTensor>,
    split: Option<usize>,
}

/// Everything a run reads besides its inputs.
pub struct Context<'a> {
    pub graph: &'a Graph,
    pub plan: &'a Plan,
    pub gpu: Option<&'a Gpu>,
    pub pool: &'a rayon::ThreadPool,
    pub constants: &'a GpuConstants,
    /// Whether nodes' times are measured: GPU steps' by timestamp queries ([`Batch::timed`]),
    /// CPU steps' by the clock around their kernel; without, the report's node times and start
    /// times are 0 (its total is measured either way). Two clock reads per CPU step were
    /// 3-5 % of tiny Llama's decode step (50 nodes in 70 us; docs/bench.md, "Winograd's M per
    /// task").
    pub node_times: bool,
}

/// Where a GPU dispatch's measured time goes in the report.
#[derive(Clone, Copy)]
struct GpuLabel {
    report: usize,
    split: bool,
}

struct Run<'a> {
    cx: &'a Context<'a>,
    started: Instant,
    slots: Vec<Slot>,
    batch: Option<Batch<'a>>,
    labels: Vec<GpuLabel>,
    inflight: Vec<Submitted<'a>>,
    report: RunReport,
    /// Start of the last CPU kernel, from the start of the run.
    cpu_started: Duration,
    /// When the last batch waited for ended on the GPU, from the start of the run.
    gpu_free_at: Duration,
    /// Why the GPU is off for the rest of this run (a fault; see `exec/fault.rs`).
    gpu_off: Option<String>,
    /// Host copies past their last use, kept until the GPU work in flight is done.
    released: Vec<usize>,
    /// Released host tensors for reuse by later CPU steps (and, through the session, runs).
    spare: HostBuffers,
    /// Argument lists of CPU steps, reused (empty between steps).
    ins_buf: Vec<Arc<Tensor>>,
    outs_buf: Vec<Tensor>,
}

/// Run the plan on `inputs` (in `graph.inputs` order); outputs in `graph.outputs` order.
/// Blocks until done; native targets only (in the browser use [`execute_async`]).
pub fn execute(cx: &Context<'_>, inputs: Vec<Tensor>) -> Result<(Vec<Tensor>, RunReport)> {
    pollster::block_on(execute_async(cx, inputs))
}

/// Bytes of released host tensors a run without a session's store keeps for its later steps.
const RUN_LOCAL_BUFFERS: u64 = 4 << 20;

/// [`execute`] without blocking: GPU completions and readbacks are awaited.
pub async fn execute_async(
    cx: &Context<'_>,
    inputs: Vec<Tensor>,
) -> Result<(Vec<Tensor>, RunReport)> {
    let inputs = inputs.into_iter().map(Arc::new).collect();
    execute_reusing(cx, inputs, &mut HostBuffers::new(RUN_LOCAL_BUFFERS)).await
}

/// [`execute_async`] taking its CPU steps' output tensors from `buffers` and leaving the run's
/// released host tensors there (up to its cap), for the next run to reuse. An input the caller
/// still holds is read in place and left to it.
pub async fn execute_reusing(
    cx: &Context<'_>,
    inputs: Vec<Arc<Tensor>>,
    buffers: &mut HostBuffers,
) -> Result<(Vec<Tensor>, RunReport)> {
    let start = Instant::now();
    let mut run = Run {
        cx,
        started: start,
        slots: vec![Slot::default(); cx.graph.values.len()],
        batch: None,
        labels: Vec::new(),
        inflight: Vec::new(),
        report: RunReport::default(),
        cpu_started: Duration::ZERO,
        gpu_free_at: Duration::ZERO,
        gpu_off: None,
        released: Vec::new(),
        spare: std::mem::take(buffers),
        ins_buf: Vec::new(),
        outs_buf: Vec::new(),
    };
    let outputs = run.all_steps(inputs).await;
    *buffers = std::mem::take(&mut run.spare);
    run.report.total = start.elapsed();
    Ok((outputs?, run.report))
}

impl<'a> Run<'a> {
    /// Every step of the plan, then the outputs (see [`execute_reusing`]).
    async fn all_steps(&mut self, inputs: Vec<Arc<Tensor>>) -> Result<Vec<Tensor>> {
        let cx = self.cx;
        for &n in &cx.plan.folded {
            let (name, op_type) = cx.plan.labels[n].clone();
            self.report.nodes.push(NodeReport {
                name,
                op_type,
                ran: Ran::Folded,
                start: Duration::ZERO,
                time: Duration::ZERO,
                gpu_time: None,
                fallback: None,
            });
        }
        for (&v, t) in cx.graph.inputs.iter().zip(inputs) {
            self.slots[v].host = Some(t);
        }
        let mut result = Ok(());
        for s in 0..cx.plan.steps.len() {
            result = self.step(s).await;
            if let Err(e) = result {
                // A GPU fault: finish on the CPU (exec/fault.rs).
                result = self.recover(Some(s), e).await;
            }
            if result.is_err() {
                break;
            }
        }
        // Whatever happened, let the GPU finish before buffers go back to the pool.
        let drained = match self.submit() {
            Ok(()) => self.wait_all().await,
            Err(e) => Err(e),
        };
        result?;
        if let Err(e) = drained {
            self.recover(None, e).await?;
        }
        let outs = cx.graph.outputs.clone();
        let tensors = match self.host_tensors(&outs).await {
            Ok(t) => t,
            Err(e) => {
                self.recover(None, e).await?;
                self.host_tensors(&outs).await?
            }
        };
        self.wait_all().await?;
        // The slots' references go first, so that each output not also held elsewhere (an input,
        // a constant) is moved out instead of copied. Host tensors only the slots hold (values
        // nobody read, the inputs) are kept for the next run.
        for slot in std::mem::take(&mut self.slots) {
            if let Some(t) = slot.host.and_then(Arc::into_inner) {
                self.spare.put(t);
            }
        }
        let outputs = tensors.into_iter().map(Arc::unwrap_or_clone).collect();
        Ok(outputs)
    }

    fn meta(&self, v: usize) -> &'a TensorMeta {
        self.cx.plan.metas[v]
            .as_ref()
            .expect("every value is planned")
    }

    async fn step(&mut self, s: usize) -> Result<()> {
        let cx = self.cx;
        let step = &cx.plan.steps[s];
        let node = &cx.graph.nodes[step.node];
        let (name, op_type) = cx.plan.labels[step.node].clone();
        let mut entry = NodeReport {
            name,
            op_type,
            ran: Ran::View,
            // CPU steps take the start of their kernel (below): no clock read here for them.
            start: match step.kind {
                StepKind::Whole {
                    device: Device::Cpu,
                    ..
                } => Duration::ZERO,
                _ => self.since_start(self.clock()),
            },
            time: Duration::ZERO,
            gpu_time: None,
            fallback: step.fallback.clone(),
        };
        match &step.kind {
            StepKind::View => self.view(s),
            StepKind::Whole {
                device: Device::Gpu,
                kernels,
            } => match self.gpu_step(s, kernels, false) {
                Ok(()) => {
                    entry.ran = Ran::On(Device::Gpu);
                    self.submit_if_full()?;
                }
                Err(Error::Gpu(reason)) if self.node_fault_is_local() => {
                    self.orphan_last_label();
                    entry.fallback = Some(self.gpu_refused(&node.name, reason));
                    entry.ran = Ran::On(Device::Cpu);
                    entry.time = self.cpu_step(s, None).await?;
                }
                Err(e) => return Err(e),
            },
            StepKind::Whole {
                device: Device::Cpu,
                ..
            } => {
                entry.ran = Ran::On(Device::Cpu);
                entry.time = self.cpu_step(s, None).await?;
            }
            StepKind::Split {
                cut,
                row_len,
                kernels,
            } => {
                // Inputs on both sides first, so neither half waits on the other; chained
                // inputs stay in their halves.
                let halves = self.halves(s);
                self.host_inputs(s, &halves).await?;
                match self.gpu_step(s, kernels, true) {
                    Ok(()) => {
                        self.submit()?;
                        entry.ran = Ran::Split {
                            cut: *cut,
                            rows: step.rows.end,
                        };
                        entry.time = self.cpu_step(s, Some(0..*cut)).await?;
                        for &v in &node.outputs[..1] {
                            self.slots[v].split = Some(cut * row_len);
                        }
                    }
                    Err(Error::Gpu(reason)) if self.node_fault_is_local() => {
                        self.orphan_last_label();
                        entry.fallback = Some(self.gpu_refused(&node.name, reason));
                        entry.ran = Ran::On(Device::Cpu);
                        entry.time = self.cpu_step(s, None).await?;
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        if matches!(entry.ran, Ran::On(Device::Cpu) | Ran::Split { .. }) {
            entry.start = self.cpu_started;
        }
        self.report.nodes.push(entry);
        for v in node.inputs.iter().flatten() {
            if cx.plan.last_use[*v] == Some(s) && !cx.graph.outputs.contains(v) {
                // Its host tensor, when the step may let go of it and nothing else holds it
                // (a constant), is reused by a later CPU step.
                let host = match self.host_free_after(*v, s) {
                    true => self.slots[*v].host.take(),
                    false => None,
                };
                self.release(*v);
                if let Some(t) = host.and_then(Arc::into_inner) {
                    self.spare.put(t);
                }
            }
        }
        Ok(())
    }

    fn view(&mut self, s: usize) {
        let node = &self.cx.graph.nodes[self.cx.plan.steps[s].node];
        let src = node.inputs[0].expect("a view has an input");
        let out = node.outputs[0];
        let shape = self.meta(out).shape.clone();
        let slot = self.slot(src);
        // Its host tensor free after this step and whole on the host: the slot lets go of it,
        // so that the data is moved, not copied (shufflenet's channel shuffles: 6 % of its
        // samples in that copy).
        if self.host_free_after(src, s) && slot.gpu.is_none() && slot.split.is_none() {
            self.slots[src].host = None;
        }
        self.slots[out] = Slot {
            host: slot.host.map(|h| {
                let data = Arc::try_unwrap(h).map_or_else(|h| h.data.clone(), |t| t.data);
                Arc::new(Tensor::new(shape, data))
            }),
            gpu: slot.gpu,
            split: slot.split,
        };
        // A host copy is only needed when no GPU copy exists.
        if self.slots[out].gpu.is_some() && self.slots[out].split.is_none() {
            self.slots[out].host = None;
        }
    }

    /// Whether step `s` may let go of value `v`'s host tensor: its last reader, `v` neither a
    /// model output nor a model input (kept to the end of the run), and no GPU work pending
    /// (host copies outlive their last use until then: a fault would make the CPU redo that
    /// work, exec/fault.rs).
    fn host_free_after(&self, v: usize, s: usize) -> bool {
        let graph = &self.cx.graph;
        self.cx.plan.last_use[v] == Some(s)
            && !graph.outputs.contains(&v)
            && !graph.inputs.contains(&v)
            && self.batch.is_none()
            && self.inflight.is_empty()
    }

    /// The storage of value `v`: computed, an input, or a constant.
    fn slot(&self, v: usize) -> Slot {
        let s = &self.slots[v];
        if s.host.is_some() || s.gpu.is_some() {
            return s.clone();
        }
        Slot {
            host: self.meta(v).value.clone(),
            gpu: None,
            split: None,
        }
    }

    /// Values split step `s` reads in their halves with no join (a chain): its `chained`
    /// inputs that are split exactly at the step's cut; any other split point is joined.
    fn halves(&self, s: usize) -> Vec<usize> {
        let step = &self.cx.plan.steps[s];
        let StepKind::Split { cut, .. } = step.kind else {
            return Vec::new();
        };
        let node = &self.cx.graph.nodes[step.node];
        let rows = step.rows.end.max(1);
        step.chained
            .iter()
            .filter_map(|&i| {
                let v = node.inputs.get(i).copied().flatten()?;
                let n = step.inputs.get(i)?.numel();
                let at = n.is_multiple_of(rows).then_some(cut * (n / rows));
                let slot = &self.slots[v];
                // A value also read whole (at an input the op does not read row for row) is
                // joined instead.
                let only_chained = (node.inputs.iter().enumerate())
                    .all(|(j, x)| *x != Some(v) || step.chained.contains(&j));
                (at.is_some()
                    && only_chained
                    && slot.split == at
                    && slot.gpu.is_some()
                    && slot.host.is_some())
                .then_some(v)
            })
            .collect()
    }

    /// Host copies of step `s`'s inputs (omitted optional inputs as empty constants); values in
    /// `halves` as their host half, unjoined.
    async fn host_inputs(&mut self, s: usize, halves: &[usize]) -> Result<Vec<Arc<Tensor>>> {
        let cx = self.cx;
        let step = &cx.plan.steps[s];
        let node = &cx.graph.nodes[step.node];
        let metas = &step.inputs;
        // Into the run's reused Vec (cpu_step gives it back).
        let mut direct = std::mem::take(&mut self.ins_buf);
        direct.clear();
        // The common case on the CPU: every input whole on the host (one Vec, no lookups twice).
        let on_host = |v: usize| {
            let s = &self.slots[v];
            match &s.host {
                Some(h) if s.split.is_none() => Some(h.clone()),
                None if s.gpu.is_none() => self.meta(v).value.clone(),
                _ => None,
            }
        };
        if halves.is_empty() {
            let whole = (0..metas.len()).all(|i| {
                let t = match node.inputs[i] {
                    Some(v) => on_host(v),
                    None => metas[i].value.clone(),
                };
                t.map(|t| direct.push(t)).is_some()
            });
            if whole {
                return Ok(direct);
            }
        }
        direct.clear();
        self.ins_buf = direct;
        let given: Vec<usize> = (0..metas.len())
            .filter_map(|i| node.inputs[i])
            .filter(|v| !halves.contains(v))
            .collect();
        let mut hosts = self.host_tensors(&given).await?.into_iter();
        Ok(metas
            .iter()
            .enumerate()
            .map(|(i, m)| match node.inputs[i] {
                Some(v) if halves.contains(&v) => self.slots[v]
                    .host
                    .clone()
                    .expect("a split value has a host half"),
                Some(_) => hosts.next().expect("one host tensor per given input"),
                None => m.value.clone().expect("omitted inputs are empty constants"),
            })
            .collect())
    }

    /// Now, where the run measures its nodes' times ([`Context::node_times`]).
    fn clock(&self) -> Option<Instant> {
        self.cx.node_times.then(Instant::now)
    }

    /// `at` from the start of the run; 0 where nodes are not timed.
    fn since_start(&self, at: Option<Instant>) -> Duration {
        at.map_or(Duration::ZERO, |t| t - self.started)
    }

    /// Time since `at` ([`Run::clock`]); 0 where nodes are not timed.
    fn took(at: Option<Instant>) -> Duration {
        at.map_or(Duration::ZERO, |t| t.elapsed())
    }

    /// Run step `s` on the CPU: all its rows, or `rows` of them (the CPU half of a split).
    async fn cpu_step(
        &mut self,
        s: usize,
        rows: Option<std::ops::Range<usize>>,
    ) -> Result<Duration> {
        let cx = self.cx;
        let step = &cx.plan.steps[s];
        let node = &cx.graph.nodes[step.node];
        // GPU work recorded so far starts now and overlaps this kernel.
        self.submit()?;
        let halves = match rows {
            Some(_) => self.halves(s),
            None => Vec::new(),
        };
        let mut ins = self.host_inputs(s, &halves).await?;
        if rows.is_none() {
            let start = self.clock();
            if let Some(t) = self.appended(s, &mut ins) {
                self.cpu_started = self.since_start(start);
                self.slots[node.outputs[0]].host = Some(Arc::new(t));
                ins.clear();
                self.ins_buf = ins;
                return Ok(Self::took(start));
            }
        }
        // No allocation per step for the argument lists: up to 8 inputs in an array, the
        // input and output Vecs reused from step to step.
        let (small, many): ([&Tensor; 8], Vec<&Tensor>);
        let refs: &[&Tensor] = match ins.first() {
            Some(first) if ins.len() <= 8 => {
                let mut a = [first.as_ref(); 8];
                for (r, t) in a.iter_mut().zip(&ins) {
                    *r = t.as_ref();
                }
                small = a;
                &small[..ins.len()]
            }
            _ => {
                many = ins.iter().map(|t| t.as_ref()).collect();
                &many
            }
        };
        let mut outs = std::mem::take(&mut self.outs_buf);
        outs.clear();
        let zeroed = !node.op.overwrites_outputs();
        let room = &cx.plan.room;
        outs.extend(
            (step.outputs.iter().zip(&node.outputs))
                .map(|(m, &v)| self.spare.take_with_room(m, zeroed, room[v])),
        );
        let start = self.clock();
        self.cpu_started = self.since_start(start);
        let rows = rows.unwrap_or_else(|| step.rows.clone());
        crate::limits::install(cx.pool, || node.op.cpu(refs, &mut outs, rows))
            .map_err(|e| node_error(node, e))?;
        let took = Self::took(start);
        for (&v, t) in node.outputs.iter().zip(outs.drain(..)) {
            self.slots[v].host = Some(Arc::new(t));
        }
        self.outs_buf = outs;
        ins.clear();
        self.ins_buf = ins;
        Ok(took)
    }

    /// Record step `s`'s GPU kernels into the open batch.
    fn gpu_step(&mut self, s: usize, kernels: &[GpuKernel], split: bool) -> Result<()> {
        let cx = self.cx;
        self.gpu_usable()?;
        let gpu = cx.gpu.ok_or_else(|| Error::Gpu("no GPU adapter".into()))?;
        let step = &cx.plan.steps[s];
        let node = &cx.graph.nodes[step.node];
        let metas = &step.inputs;
        // Only inputs some kernel binds go to the GPU.
        let bound: std::collections::BTreeSet<usize> = kernels
            .iter()
            .flat_map(|k| k.inputs.iter().copied())
            .collect();
        let halves = if split { self.halves(s) } else { Vec::new() };
        let mut inputs = HashMap::new();
        for &i in &bound {
            let g = match node.inputs.get(i).copied().flatten() {
                // A chained input: the GPU half is already in place in its buffer.
                Some(v) if halves.contains(&v) => {
                    self.slots[v].gpu.clone().expect("checked by halves")
                }
                Some(v) => self.gpu_tensor(gpu, v)?,
                None => gpu.alloc(metas[i].dtype, 0)?,
            };
            inputs.insert(i, g);
        }
        let outputs: Vec<GpuTensor> = step
            .outputs
            .iter()
            .map(|m| gpu.alloc(m.dtype, m.numel()))
            .collect::<Result<_>>()?;
        let label = self.labels.len();
        self.labels.push(GpuLabel {
            report: self.report.nodes.len(),
            split,
        });
        let batch = (self.batch).get_or_insert_with(|| gpu.batch().timed(cx.node_times));
        for o in &outputs {
            batch.clear(o);
        }
        for k in kernels {
            let i: Vec<&GpuTensor> = k.inputs.iter().map(|i| &inputs[i]).collect();
            let o: Vec<&GpuTensor> = k.outputs.iter().map(|&o| &outputs[o]).collect();
            batch.dispatch(k, &i, &o, label)?;
        }
        for (&v, g) in node.outputs.iter().zip(outputs) {
            if !split {
                self.slots[v].host = None;
            }
            self.slots[v].gpu = Some(g);
        }
        Ok(())
    }

    /// Value `v` whole on the GPU: uploaded (once per session for constants), or its host half
    /// written into its GPU buffer when it is split.
    fn gpu_tensor(&mut self, gpu: &Gpu, v: usize) -> Result<GpuTensor> {
        let slot = self.slot(v);
        match (slot.gpu, slot.split) {
            (Some(g), None) => return Ok(g),
            (Some(g), Some(at)) => {
                let host = slot.host.expect("a split value has a host half");
                let mut part = Tensor::zeros(host.dtype(), &[at]);
                part.copy_from(&host, 0..at);
                let bytes = to_gpu_bytes(&part).map_err(Error::Gpu)?;
                gpu.write(&g, 0, &bytes);
                self.report.uploads += 1;
                self.report.upload_bytes += bytes.len() as u64;
                self.slots[v] = Slot {
                    host: None,
                    gpu: Some(g.clone()),
                    split: None,
                };
                return Ok(g);
            }
            (None, _) => {}
        }
        if self.slots[v].host.is_none() {
            if let Some(c) = &self.meta(v).value {
                return self.cx.constants.get(gpu, c, &mut self.report);
            }
        }
        let host = slot.host.expect("value computed before use");
        let began = Instant::now();
        let g = gpu.upload(&host)?;
        self.report.uploads += 1;
        self.report.upload_bytes += host.numel() as u64 * 4;
        self.report.transfers.push(Transfer {
            to: Device::Gpu,
            bytes: host.numel() as u64 * 4,
            start: began - self.started,
            time: began.elapsed(),
        });
        self.slots[v].gpu = Some(g.clone());
        Ok(g)
    }

    /// The GPU step just attempted failed (and runs on the CPU instead): dispatches it may have
    /// recorded still run, but their times belong to no node.
    fn orphan_last_label(&mut self) {
        if let Some(l) = self.labels.last_mut() {
            if l.report == self.report.nodes.len() {
                l.report = usize::MAX;
            }
        }
    }

    /// Submit the open batch once it is full ([`Batch::is_full`]), so that the GPU works on it
    /// while the next steps are recorded.
    fn submit_if_full(&mut self) -> Result<()> {
        match self.batch.as_ref().is_some_and(Batch::is_full) {
            true => self.submit(),
            false => Ok(()),
        }
    }

    /// Submit the open batch without waiting for it.
    fn submit(&mut self) -> Result<()> {
        if let Some(batch) = self.batch.take() {
            if !batch.is_empty() {
                self.inflight.push(batch.submit()?);
                self.report.gpu_submits += 1;
            }
        }
        Ok(())
    }

    /// Wait for every submitted batch and put its GPU times in the report.
    async fn wait_all(&mut self) -> Result<()> {
        for sub in std::mem::take(&mut self.inflight) {
            let timing = sub.wait_async().await?;
            let labelled: Vec<usize> = timing.per_label.iter().map(|(l, _)| *l).collect();
            if labelled.is_empty() {
                continue;
            }
            // A batch starts when it is submitted, or when the one before it ends if the GPU
            // was still on that one (batches in one run follow each other on the queue).
            let submitted = timing.submitted.map_or(Duration::ZERO, |t| {
                t.saturating_duration_since(self.started)
            });
            let base = submitted.max(self.gpu_free_at);
            let ends = (timing.per_label.iter().zip(&timing.starts)).map(|((_, t), off)| *off + *t);
            self.gpu_free_at = base + ends.max().unwrap_or_default();
            for ((l, t), off) in timing.per_label.into_iter().zip(timing.starts) {
                let GpuLabel { report, split } = self.labels[l];
                let Some(node) = self.report.nodes.get_mut(report) else {
                    continue;
                };
                if !split {
                    node.start = base + off;
                }
                if split {
                    *node.gpu_time.get_or_insert(Duration::ZERO) += t;
                } else {
                    node.time += t;
                }
            }
        }
        self.drop_released();
        Ok(())
    }

    /// Values `vs` whole on the host: downloading (in one submit) what is only on the GPU and
    /// joining split values.
    async fn host_tensors(&mut self, vs: &[usize]) -> Result<Vec<Arc<Tensor>>> {
        // Once each: a node reading one value twice (Mul(x, x)) must not join it twice (the
        // second join would overwrite the joined copy with the GPU half alone).
        let mut missing: Vec<usize> = vs
            .iter()
            .copied()
            .filter(|&v| {
                let s = self.slot(v);
                s.host.is_none() || s.split.is_some()
            })
            .collect();
        missing.sort_unstable();
        missing.dedup();
        if !missing.is_empty() {
            self.submit()?;
            let gpu = self
                .cx
                .gpu
                .expect("a value lives on the GPU only if there is one");
            let shapes: Vec<Vec<usize>> = missing
                .iter()
                .map(|&v| self.meta(v).shape.clone())
                .collect();
            let gts: Vec<GpuTensor> = missing
                .iter()
                .map(|&v| {
                    self.slots[v]
                        .gpu
                        .clone()
                        .expect("value computed before use")
                })
                .collect();
            let req: Vec<(&GpuTensor, &[usize])> = gts
                .iter()
                .zip(&shapes)
                .map(|(g, s)| (g, s.as_slice()))
                .collect();
            let began = Instant::now();
            let got = gpu.download_async(&req).await?;
            let took = began.elapsed();
            self.wait_all().await?;
            for (&v, mut t) in missing.iter().zip(got) {
                self.report.downloads += 1;
                self.report.download_bytes += t.numel() as u64 * 4;
                self.report.transfers.push(Transfer {
                    to: Device::Cpu,
                    bytes: t.numel() as u64 * 4,
                    start: began - self.started,
                    time: took,
                });
                let slot = &mut self.slots[v];
                if let (Some(at), Some(host)) = (slot.split, &slot.host) {
                    t.copy_from(host, 0..at);
                    slot.split = None;
                    slot.gpu = None;
                }
                slot.host = Some(Arc::new(t));
            }
        }
        Ok(vs
            .iter()
            .map(|&v| self.slot(v).host.expect("downloaded above"))
            .collect())
    }
}
