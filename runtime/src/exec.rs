//! The executor: runs a plan's steps, keeping each value where it was produced and moving it
//! only when a step on the other device reads it.
//!
//! Sits between a [`Plan`] and the two devices: CPU kernels run on the session's rayon pool,
//! consecutive GPU steps are recorded into one batch (one command encoder, one submit) that is
//! submitted only when the host needs one of its results or at the end of the run.

use crate::gpu::{Batch, Gpu, GpuTensor};
use crate::graph::Graph;
use crate::plan::{input_metas, node_error, Device, Plan, StepKind};
use crate::report::{NodeReport, Ran, RunReport};
use crate::{Error, Result};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tandem_ops::{Tensor, TensorMeta};

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
            return Ok(g.clone());
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

#[derive(Default, Clone)]
struct Slot {
    host: Option<Arc<Tensor>>,
    gpu: Option<GpuTensor>,
}

/// Everything a run reads besides its inputs.
pub struct Context<'a> {
    pub graph: &'a Graph,
    pub plan: &'a Plan,
    pub gpu: Option<&'a Gpu>,
    pub pool: &'a rayon::ThreadPool,
    pub constants: &'a GpuConstants,
}

struct Run<'a> {
    cx: &'a Context<'a>,
    slots: Vec<Slot>,
    batch: Option<Batch<'a>>,
    /// Report indices of the GPU steps recorded in the open batch.
    batch_steps: Vec<usize>,
    report: RunReport,
}

/// Run the plan on `inputs` (in `graph.inputs` order); outputs in `graph.outputs` order.
pub fn execute(cx: &Context<'_>, inputs: Vec<Tensor>) -> Result<(Vec<Tensor>, RunReport)> {
    let start = Instant::now();
    let mut run = Run {
        cx,
        slots: vec![Slot::default(); cx.graph.values.len()],
        batch: None,
        batch_steps: Vec::new(),
        report: RunReport::default(),
    };
    for &n in &cx.plan.folded {
        let node = &cx.graph.nodes[n];
        run.report.nodes.push(NodeReport {
            name: node.name.clone(),
            op_type: node.op_type.clone(),
            ran: Ran::Folded,
            time: Duration::ZERO,
            fallback: None,
        });
    }
    for (&v, t) in cx.graph.inputs.iter().zip(inputs) {
        run.slots[v].host = Some(Arc::new(t));
    }
    for s in 0..cx.plan.steps.len() {
        run.step(s)?;
    }
    run.flush()?;
    let outs = cx.graph.outputs.clone();
    let tensors = run.host_tensors(&outs)?;
    let outputs = tensors
        .into_iter()
        .map(|t| Arc::unwrap_or_clone(t))
        .collect();
    run.report.total = start.elapsed();
    Ok((outputs, run.report))
}

impl<'a> Run<'a> {
    fn meta(&self, v: usize) -> &TensorMeta {
        self.cx.plan.metas[v]
            .as_ref()
            .expect("every value is planned")
    }

    fn step(&mut self, s: usize) -> Result<()> {
        let cx = self.cx;
        let step = &cx.plan.steps[s];
        let node = &cx.graph.nodes[step.node];
        let mut entry = NodeReport {
            name: node.name.clone(),
            op_type: node.op_type.clone(),
            ran: Ran::View,
            time: Duration::ZERO,
            fallback: step.fallback.clone(),
        };
        match &step.kind {
            StepKind::View => {
                let src = node.inputs[0].expect("a view has an input");
                let out = node.outputs[0];
                let shape = self.meta(out).shape.clone();
                let slot = self.slot(src);
                self.slots[out] = match (slot.gpu, slot.host) {
                    (Some(g), _) => Slot {
                        host: None,
                        gpu: Some(g),
                    },
                    (None, Some(h)) => Slot {
                        host: Some(Arc::new(Tensor::new(shape, h.data.clone()))),
                        gpu: None,
                    },
                    (None, None) => unreachable!("value {src} has no storage"),
                };
            }
            StepKind::Whole {
                device: Device::Gpu,
                kernels,
            } => match self.gpu_step(s, kernels) {
                Ok(()) => {
                    entry.ran = Ran::On(Device::Gpu);
                    self.batch_steps.push(self.report.nodes.len());
                }
                Err(Error::Gpu(reason)) if !reason.contains("lost") => {
                    entry.fallback = Some(reason);
                    entry.ran = Ran::On(Device::Cpu);
                    entry.time = self.cpu_step(s)?;
                }
                Err(e) => return Err(e),
            },
            StepKind::Whole {
                device: Device::Cpu,
                ..
            } => {
                entry.ran = Ran::On(Device::Cpu);
                entry.time = self.cpu_step(s)?;
            }
        }
        self.report.nodes.push(entry);
        for v in node.inputs.iter().flatten() {
            if cx.plan.last_use[*v] == Some(s) && !cx.graph.outputs.contains(v) {
                self.slots[*v] = Slot::default();
            }
        }
        Ok(())
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
        }
    }

    fn cpu_step(&mut self, s: usize) -> Result<Duration> {
        let cx = self.cx;
        let step = &cx.plan.steps[s];
        let node = &cx.graph.nodes[step.node];
        let given: Vec<usize> = input_metas(node, &cx.plan.metas)
            .iter()
            .enumerate()
            .filter_map(|(i, _)| node.inputs[i])
            .collect();
        let hosts = self.host_tensors(&given)?;
        let metas = input_metas(node, &cx.plan.metas);
        let mut k = 0;
        let ins: Vec<Arc<Tensor>> = metas
            .iter()
            .enumerate()
            .map(|(i, m)| match node.inputs[i] {
                Some(_) => {
                    k += 1;
                    hosts[k - 1].clone()
                }
                None => m.value.clone().expect("omitted inputs are empty constants"),
            })
            .collect();
        let refs: Vec<&Tensor> = ins.iter().map(|t| t.as_ref()).collect();
        let mut outs: Vec<Tensor> = node
            .outputs
            .iter()
            .map(|&v| {
                let m = self.meta(v);
                Tensor::zeros(m.dtype, &m.shape)
            })
            .collect();
        let start = Instant::now();
        cx.pool
            .install(|| node.op.cpu(&refs, &mut outs, step.rows.clone()))
            .map_err(|e| node_error(node, e))?;
        let took = start.elapsed();
        for (&v, t) in node.outputs.iter().zip(outs) {
            self.slots[v].host = Some(Arc::new(t));
        }
        Ok(took)
    }

    fn gpu_step(&mut self, s: usize, kernels: &[tandem_ops::GpuKernel]) -> Result<()> {
        let cx = self.cx;
        let gpu = cx.gpu.ok_or_else(|| Error::Gpu("no GPU adapter".into()))?;
        let step = &cx.plan.steps[s];
        let node = &cx.graph.nodes[step.node];
        let metas = input_metas(node, &cx.plan.metas);
        let mut inputs = Vec::with_capacity(metas.len());
        for (i, m) in metas.iter().enumerate() {
            let g = match node.inputs[i] {
                Some(v) => self.gpu_tensor(gpu, v)?,
                None => gpu.alloc(m.dtype, 0)?,
            };
            inputs.push(g);
        }
        let outputs: Vec<GpuTensor> = node
            .outputs
            .iter()
            .map(|&v| {
                let m = self.meta(v);
                gpu.alloc(m.dtype, m.numel())
            })
            .collect::<Result<_>>()?;
        let batch = self.batch.get_or_insert_with(|| gpu.batch());
        for o in &outputs {
            batch.clear(o);
        }
        for k in kernels {
            let i: Vec<&GpuTensor> = k.inputs.iter().map(|&i| &inputs[i]).collect();
            let o: Vec<&GpuTensor> = k.outputs.iter().map(|&o| &outputs[o]).collect();
            batch.dispatch(k, &i, &o, self.report.nodes.len())?;
        }
        for (&v, g) in node.outputs.iter().zip(outputs) {
            self.slots[v].gpu = Some(g);
        }
        Ok(())
    }

    /// Value `v` on the GPU, uploading it (once per session for constants) if needed.
    fn gpu_tensor(&mut self, gpu: &Gpu, v: usize) -> Result<GpuTensor> {
        if let Some(g) = &self.slots[v].gpu {
            return Ok(g.clone());
        }
        if let (None, Some(c)) = (&self.slots[v].host, &self.meta(v).value) {
            let c = c.clone();
            return self.cx.constants.get(gpu, &c, &mut self.report);
        }
        let host = self.slots[v]
            .host
            .clone()
            .expect("value computed before use");
        let g = gpu.upload(&host)?;
        self.report.uploads += 1;
        self.report.upload_bytes += host.numel() as u64 * 4;
        self.slots[v].gpu = Some(g.clone());
        Ok(g)
    }

    /// Submit the open batch and record its GPU times in the report.
    fn flush(&mut self) -> Result<()> {
        let Some(batch) = self.batch.take() else {
            return Ok(());
        };
        if batch.is_empty() {
            return Ok(());
        }
        let timing = batch.submit()?;
        self.report.gpu_submits += 1;
        let steps = std::mem::take(&mut self.batch_steps);
        if timing.per_label.is_empty() {
            let share = timing.wall / steps.len().max(1) as u32;
            for r in steps {
                self.report.nodes[r].time = share;
            }
        } else {
            for (label, t) in timing.per_label {
                self.report.nodes[label].time += t;
            }
        }
        Ok(())
    }

    /// Values `vs` on the host, downloading (in one submit) those that are only on the GPU.
    fn host_tensors(&mut self, vs: &[usize]) -> Result<Vec<Arc<Tensor>>> {
        let missing: Vec<usize> = vs
            .iter()
            .copied()
            .filter(|&v| self.slot(v).host.is_none())
            .collect();
        if !missing.is_empty() {
            self.flush()?;
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
            let got = gpu.download(&req)?;
            for (&v, t) in missing.iter().zip(got) {
                self.report.downloads += 1;
                self.report.download_bytes += t.numel() as u64 * 4;
                self.slots[v].host = Some(Arc::new(t));
            }
        }
        Ok(vs
            .iter()
            .map(|&v| self.slot(v).host.expect("downloaded above"))
            .collect())
    }
}
