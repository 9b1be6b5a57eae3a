//! Scheduler simulation on published hardware profiles: a [`Costs`] implementation read from a
//! JSON device profile (a roofline per device, per-family efficiencies, link and sync costs),
//! the plan of a model under every [`Policy`] with its predicted latency, and single-layer
//! models (MatMul, Conv) with a grid search over row cuts.
//!
//! Sits between `tandem simulate` (the CLI) and the planner (`plan.rs`, asked with
//! `Request::assume_gpu` so that no GPU is needed) and the scheduler (`schedule.rs`). Nothing
//! here runs a kernel: only shapes are planned (constants are folded on the CPU).

use crate::cost::{family, CostModel};
use crate::costs::{kernel_variant, Costs, NodeCostQuery};
use crate::graph::{Graph, Node, Value};
use crate::plan::{self, Device, Placement, Request, StepKind};
use crate::schedule::{self, Choice, Policy, Task};
use crate::{Error, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use tandem_ops::shape::row_count;
use tandem_ops::{AttrValue, Attrs};
use tandem_ops::{DType, Tensor, TensorMeta};

/// The op families an efficiency factor may name (see [`crate::cost::family`]).
pub const FAMILIES: [&str; 8] = [
    "matmul",
    "conv",
    "softmax",
    "norm",
    "pool",
    "reduce",
    "movement",
    "elementwise",
];

/// One device as a roofline: `launch * dispatches + max(flops / (peak * e), bytes / (bw * e))`
/// where `e` is the efficiency of the op's family (1 when not given).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceProfile {
    /// What the device is, e.g. "Adreno 620 @ 625 MHz".
    pub name: String,
    /// GFLOP/s that well-tuned kernels achieve (not the datasheet peak; see the file's notes).
    pub gflops: f64,
    /// Memory bandwidth kernels achieve, GB/s.
    pub gbs: f64,
    /// Fixed cost per kernel launch (GPU dispatch, CPU parallel-task start), microseconds.
    pub launch_us: f64,
    /// Per-family factors (0, 1] applied to both `gflops` and `gbs`.
    #[serde(default)]
    pub efficiency: BTreeMap<String, f64>,
}

/// A one-way link as `latency + bytes / rate`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LinkProfile {
    pub latency_us: f64,
    pub gbs: f64,
}

/// Where a profile's numbers come from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Source {
    pub title: String,
    pub url: String,
    /// Which values it supports.
    pub used_for: String,
}

/// A simulated machine: CPU, GPU, the links between them and the sync cost, with sources.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    pub name: String,
    pub description: String,
    pub cpu: DeviceProfile,
    pub gpu: DeviceProfile,
    pub upload: LinkProfile,
    pub download: LinkProfile,
    /// One CPU-GPU synchronisation (submit + wait + map), microseconds.
    pub sync_us: f64,
    #[serde(default)]
    pub sources: Vec<Source>,
    /// What was derived or estimated rather than read from a source.
    #[serde(default)]
    pub notes: Vec<String>,
}

impl DeviceProfile {
    /// The family's efficiency factor (1 when the profile names none).
    pub fn efficiency(&self, op_type: &str) -> f64 {
        self.efficiency.get(family(op_type)).copied().unwrap_or(1.0)
    }

    fn check(&self, what: &str) -> std::result::Result<(), String> {
        for (k, v) in [
            ("gflops", self.gflops),
            ("gbs", self.gbs),
            ("launch_us", self.launch_us + 1.0),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(format!("{what}.{k} must be a positive number, got {v}"));
            }
        }
        for (f, e) in &self.efficiency {
            if !FAMILIES.contains(&f.as_str()) {
                return Err(format!(
                    "{what}.efficiency: unknown family `{f}` (known: {})",
                    FAMILIES.join(", ")
                ));
            }
            if !(e.is_finite() && *e > 0.0 && *e <= 1.0) {
                return Err(format!("{what}.efficiency.{f} must be in (0, 1], got {e}"));
            }
        }
        Ok(())
    }

    /// Seconds for `flops` and `bytes` of `op_type` with `dispatches` launches.
    pub fn time(&self, op_type: &str, flops: f64, bytes: f64, dispatches: usize) -> f64 {
        let e = self.efficiency(op_type);
        self.launch_us * 1e-6 * dispatches.max(1) as f64
            + (flops / (self.gflops * 1e9 * e)).max(bytes / (self.gbs * 1e9 * e))
    }
}

impl LinkProfile {
    pub fn time(&self, bytes: u64) -> f64 {
        self.latency_us * 1e-6 + bytes as f64 / (self.gbs * 1e9)
    }
}

impl Profile {
    /// Parse and check a profile (positive rates, known families, efficiencies in (0, 1]).
    pub fn from_json(text: &str) -> Result<Profile> {
        let p: Profile =
            serde_json::from_str(text).map_err(|e| Error::Usage(format!("device profile: {e}")))?;
        let bad = |m: String| Error::Usage(format!("device profile `{}`: {m}", p.name));
        p.cpu.check("cpu").map_err(bad)?;
        p.gpu.check("gpu").map_err(bad)?;
        for (k, l) in [("upload", p.upload), ("download", p.download)] {
            if !(l.gbs.is_finite() && l.gbs > 0.0 && l.latency_us >= 0.0) {
                return Err(bad(format!("{k} needs gbs > 0 and latency_us >= 0")));
            }
        }
        if !(p.sync_us >= 0.0 && p.sync_us.is_finite()) {
            return Err(bad("sync_us must be >= 0".into()));
        }
        Ok(p)
    }

    /// Read a profile file.
    pub fn load(path: &Path) -> Result<Profile> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::Usage(format!("cannot read {}: {e}", path.display())))?;
        Profile::from_json(&text)
    }

    fn device(&self, d: Device) -> &DeviceProfile {
        match d {
            Device::Cpu => &self.cpu,
            Device::Gpu => &self.gpu,
        }
    }

    /// Achieved rate of `op_type` on `d` in flop/s (the compute roof of its family).
    pub fn flop_rate(&self, op_type: &str, d: Device) -> f64 {
        let dev = self.device(d);
        dev.gflops * 1e9 * dev.efficiency(op_type)
    }

    /// A simulation profile of a calibrated cost model (e.g. this machine's lavapipe test bed):
    /// the model's roofline priors, links and sync, with per-family efficiencies that make the
    /// roofline answer what the model predicts for a large representative node of each family.
    pub fn from_cost_model(model: &CostModel, name: &str) -> Profile {
        let probes: [(&str, &str, f64, f64); 8] = [
            (
                "matmul",
                "MatMul",
                2.0 * 256.0 * 512.0 * 512.0,
                4.0 * 3.0 * 256.0 * 512.0,
            ),
            (
                "conv",
                "Conv",
                2.0 * 64.0 * 64.0 * 9.0 * 56.0 * 56.0,
                8.0 * 64.0 * 3136.0,
            ),
            ("softmax", "Softmax", 5.0 * 1048576.0, 8.0 * 1048576.0),
            (
                "norm",
                "LayerNormalization",
                8.0 * 1048576.0,
                8.0 * 1048576.0,
            ),
            ("pool", "MaxPool", 9.0 * 262144.0, 5.0 * 262144.0),
            ("reduce", "ReduceMean", 1048576.0, 4.0 * 1048576.0),
            ("movement", "Transpose", 0.0, 8.0 * 1048576.0),
            ("elementwise", "Add", 1048576.0, 12.0 * 1048576.0),
        ];
        let dev = |d: Device, label: &str| {
            let prior = match d {
                Device::Cpu => model.cpu_prior,
                Device::Gpu => model.gpu_prior,
            };
            let mut efficiency = BTreeMap::new();
            for (fam, op, flops, bytes) in probes {
                let want = model.predict(op, DType::F32, d, flops, bytes, 1) - prior.launch;
                let roof = (flops / prior.peak_flops).max(bytes / prior.bandwidth);
                if want > 0.0 && roof > 0.0 {
                    efficiency.insert(fam.to_string(), (roof / want).clamp(1e-4, 1.0));
                }
            }
            DeviceProfile {
                name: label.to_string(),
                gflops: prior.peak_flops / 1e9,
                gbs: prior.bandwidth / 1e9,
                launch_us: prior.launch * 1e6,
                efficiency,
            }
        };
        let link = |l: crate::cost::Line| LinkProfile {
            latency_us: l.latency * 1e6,
            gbs: 1.0 / l.seconds_per_byte.max(1e-15) / 1e9,
        };
        Profile {
            name: name.to_string(),
            description: format!(
                "exported from the calibrated cost model of {} + {}",
                model
                    .adapter
                    .as_ref()
                    .map_or("no GPU".into(), |a| a.name.clone()),
                model.cpu.model
            ),
            cpu: dev(Device::Cpu, &model.cpu.model),
            gpu: dev(
                Device::Gpu,
                &model
                    .adapter
                    .as_ref()
                    .map_or("none".into(), |a| a.name.clone()),
            ),
            upload: link(model.links.upload),
            download: link(model.links.download),
            sync_us: model.links.sync * 1e6,
            sources: vec![Source {
                title: "tandem calibrate on this machine".into(),
                url: "runtime/src/cost/calibrate.rs".into(),
                used_for: "every value (measured, then fitted)".into(),
            }],
            notes: vec![
                "efficiency = roofline time / model prediction for one large node per family"
                    .into(),
            ],
        }
    }
}

impl Costs for Profile {
    fn node_time(&self, q: &NodeCostQuery<'_>, device: Device, fraction: f64) -> f64 {
        if fraction <= 0.0 {
            return 0.0;
        }
        let f = fraction.min(1.0);
        let dispatches = match device {
            Device::Cpu => 1,
            Device::Gpu => q.dispatches,
        };
        self.device(device).time(
            q.op_type,
            q.work.flops as f64 * f,
            (q.work.bytes_read + q.work.bytes_written) as f64 * f,
            dispatches,
        )
    }

    fn transfer_time(&self, bytes: u64, to: Device) -> f64 {
        match to {
            Device::Gpu => self.upload.time(bytes),
            Device::Cpu => self.download.time(bytes),
        }
    }

    fn sync_time(&self) -> f64 {
        self.sync_us * 1e-6
    }
}

/// The predicted outcome of one policy on one model.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyResult {
    pub policy: Policy,
    /// Predicted latency, seconds.
    pub predicted: f64,
    pub cpu_nodes: usize,
    pub gpu_nodes: usize,
    pub split_nodes: usize,
    /// Views (no kernel) and nodes folded at plan time.
    pub free_nodes: usize,
    /// Nodes the GPU cannot run (they stay on the CPU in every policy).
    pub gpu_refused: usize,
}

/// Plan `graph` for inputs of `metas` under every policy of [`Policy::ALL`] with `costs`,
/// treating a GPU as present (no device needed).
pub fn simulate_graph(
    graph: &Graph,
    metas: &[TensorMeta],
    costs: &dyn Costs,
) -> Result<Vec<PolicyResult>> {
    let pool = rayon::ThreadPoolBuilder::new()
        .build()
        .map_err(|e| Error::Usage(format!("cannot start CPU threads: {e}")))?;
    Policy::ALL
        .iter()
        .map(|&policy| {
            let request = Request {
                placement: Placement::Auto,
                overrides: &[],
                costs: Some(costs),
                policy,
                assume_gpu: true,
            };
            let p = plan::build(graph, metas, &request, None, &pool)?;
            let mut r = PolicyResult {
                policy,
                predicted: p.predicted.unwrap_or(0.0),
                cpu_nodes: 0,
                gpu_nodes: 0,
                split_nodes: 0,
                free_nodes: p.folded.len(),
                gpu_refused: 0,
            };
            for s in &p.steps {
                match s.kind {
                    StepKind::View => r.free_nodes += 1,
                    StepKind::Whole { device, .. } => match device {
                        Device::Cpu => r.cpu_nodes += 1,
                        Device::Gpu => r.gpu_nodes += 1,
                    },
                    StepKind::Split { .. } => r.split_nodes += 1,
                }
                if s.explain.as_ref().is_some_and(|e| e.gpu.is_none()) {
                    r.gpu_refused += 1;
                }
            }
            Ok(r)
        })
        .collect()
}

/// A single-layer model built in memory.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Layer {
    /// `[m, k] x [k, n]` with the weight a constant.
    MatMul { m: usize, k: usize, n: usize },
    /// NCHW conv of `c -> oc` channels, square `kernel`, `stride`, symmetric `pad`, weight a
    /// constant.
    Conv {
        n: usize,
        c: usize,
        h: usize,
        w: usize,
        oc: usize,
        kernel: usize,
        stride: usize,
        pad: usize,
    },
}

impl std::str::FromStr for Layer {
    type Err = Error;
    /// `matmul:M,K,N` or `conv:N,C,H,W,OC,K[,STRIDE[,PAD]]` (pad defaults to K/2).
    fn from_str(s: &str) -> Result<Layer> {
        let usage = || {
            Error::Usage(format!(
                "layer `{s}`: expected matmul:M,K,N or conv:N,C,H,W,OC,K[,STRIDE[,PAD]]"
            ))
        };
        let (kind, dims) = s.split_once(':').ok_or_else(usage)?;
        let v: Vec<usize> = dims
            .split(',')
            .map(|d| d.trim().parse::<usize>())
            .collect::<std::result::Result<_, _>>()
            .map_err(|_| usage())?;
        if v.contains(&0) {
            return Err(usage());
        }
        match (kind, v.as_slice()) {
            ("matmul", &[m, k, n]) => Ok(Layer::MatMul { m, k, n }),
            ("conv", [n, c, h, w, oc, kernel, rest @ ..]) if rest.len() <= 2 => Ok(Layer::Conv {
                n: *n,
                c: *c,
                h: *h,
                w: *w,
                oc: *oc,
                kernel: *kernel,
                stride: rest.first().copied().unwrap_or(1),
                pad: rest.get(1).copied().unwrap_or(*kernel / 2),
            }),
            _ => Err(usage()),
        }
    }
}

impl std::fmt::Display for Layer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Layer::MatMul { m, k, n } => write!(f, "matmul {m}x{k} * {k}x{n}"),
            Layer::Conv {
                n,
                c,
                h,
                w,
                oc,
                kernel,
                stride,
                pad,
            } => write!(
                f,
                "conv {n}x{c}x{h}x{w} -> {oc} ch, {kernel}x{kernel} s{stride} p{pad}"
            ),
        }
    }
}

impl Layer {
    /// The one-node graph and the metas of its input.
    pub fn graph(&self) -> Result<(Graph, Vec<TensorMeta>)> {
        let value = |name: &str, constant: Option<Tensor>| Value {
            name: name.into(),
            dtype: Some(DType::F32),
            shape: None,
            constant: constant.map(Arc::new),
        };
        let (op_type, attrs, x_shape, w_shape) = match *self {
            Layer::MatMul { m, k, n } => ("MatMul", Attrs::new(13), vec![m, k], vec![k, n]),
            Layer::Conv {
                n,
                c,
                h,
                w,
                oc,
                kernel,
                stride,
                pad,
            } => {
                let (kernel, stride, pad) = (kernel as i64, stride as i64, pad as i64);
                let attrs = Attrs::new(13)
                    .with("kernel_shape", AttrValue::Ints(vec![kernel, kernel]))
                    .with("strides", AttrValue::Ints(vec![stride, stride]))
                    .with("pads", AttrValue::Ints(vec![pad; 4]));
                let ws = vec![oc, c, kernel as usize, kernel as usize];
                ("Conv", attrs, vec![n, c, h, w], ws)
            }
        };
        let numel: usize = w_shape.iter().product();
        let weight = Tensor::f32(&w_shape, vec![0.01; numel]);
        let op = tandem_ops::registry::build(op_type, &attrs)
            .map_err(|e| Error::Usage(format!("{self}: {e}")))?;
        let graph = Graph {
            values: vec![value("x", None), value("w", Some(weight)), value("y", None)],
            nodes: vec![Node {
                name: op_type.to_lowercase(),
                op_type: op_type.into(),
                domain: String::new(),
                opset: 13,
                inputs: vec![Some(0), Some(1)],
                outputs: vec![2],
                op,
                attributes: None,
            }],
            inputs: vec![0],
            outputs: vec![2],
        };
        Ok((graph, vec![TensorMeta::new(DType::F32, x_shape)]))
    }
}

/// The scheduler's view of a one-node graph: the same [`Task`] `plan.rs` builds for it (the
/// constant weight is not an input; the input starts on the CPU).
pub fn layer_task<'g>(graph: &'g Graph, metas: &[TensorMeta]) -> Result<Task<'g>> {
    let node = &graph.nodes[0];
    let w = graph.values[1]
        .constant
        .as_ref()
        .expect("layer graphs have a constant weight");
    let ins = [metas[0].clone(), TensorMeta::constant((**w).clone())];
    let refs: Vec<&TensorMeta> = ins.iter().collect();
    let outs = node
        .op
        .infer(&refs)
        .map_err(|e| plan::node_error(node, e))?;
    let axis = node.op.split_axis(&refs, &outs);
    Ok(Task {
        query: NodeCostQuery {
            op_type: &node.op_type,
            dtype: DType::F32,
            work: node.op.work(&refs, &outs),
            dispatches: node
                .op
                .gpu(&refs, &outs, 0..row_count(&outs[0].shape, axis))
                .map_or(1, |k| k.len()),
            variant: kernel_variant(node.op.as_ref(), &refs, &outs),
            gpu_pad: crate::costs::gpu_padding(&node.op_type, &outs),
            rows: row_count(&outs[0].shape, axis) as f64,
        },
        inputs: vec![(0, metas[0].numel() as u64 * 4)],
        outputs: vec![(2, outs[0].numel() as u64 * 4)],
        rows: row_count(&outs[0].shape, axis),
        gpu_tile: plan::gpu_tile_rows(node.op.as_ref(), &refs, &outs),
        gpu_refusal: None,
        forced: None,
        row_local: Vec::new(),
    })
}

/// A layer's co-execution outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerResult {
    pub cpu: f64,
    pub gpu: f64,
    /// HEFT+split's predicted time and choice.
    pub chosen: f64,
    pub choice: Choice,
    /// Best of the grid 0%, 5%, ..., 100% of rows on the GPU: (GPU percent, time).
    pub grid_best: (u32, f64),
    pub rows: usize,
}

impl LayerResult {
    /// Speedup of the chosen schedule over the best single device.
    pub fn speedup(&self) -> f64 {
        self.cpu.min(self.gpu) / self.chosen
    }

    /// Chosen split's quality against the grid's best (1 = as good; > 1 = better).
    pub fn vs_grid(&self) -> f64 {
        self.grid_best.1 / self.chosen
    }
}

/// Simulate one layer: each device alone, HEFT+split, and a 5%-step grid over the cut.
pub fn simulate_layer(layer: Layer, costs: &dyn Costs) -> Result<LayerResult> {
    let (graph, metas) = layer.graph()?;
    let task = layer_task(&graph, &metas)?;
    let tasks = std::slice::from_ref(&task);
    let run = |c: Choice| schedule::simulate(tasks, costs, &[c], &[0]).1;
    let cpu = run(Choice::On(Device::Cpu));
    let gpu = run(Choice::On(Device::Gpu));
    let s = schedule::schedule(tasks, costs, Policy::HeftSplit);
    let mut grid_best = (0, cpu);
    for pct in (5..=100).step_by(5) {
        let cut = ((task.rows as f64) * (1.0 - pct as f64 / 100.0)).round() as usize;
        let choice = match cut {
            0 => Choice::On(Device::Gpu),
            c if c >= task.rows => Choice::On(Device::Cpu),
            c => Choice::Split { cut: c },
        };
        let t = run(choice);
        if t < grid_best.1 {
            grid_best = (pct, t);
        }
    }
    Ok(LayerResult {
        cpu,
        gpu,
        chosen: s.makespan,
        choice: s.choices[0],
        grid_best,
        rows: task.rows,
    })
}
