//! Plans: for one set of input shapes, every value's type and shape, the values folded to
//! constants, and one step per remaining node with its device and precomputed GPU kernels.
//!
//! Sits between the graph (`graph.rs`) and the executor (`exec.rs`). Placement decisions come
//! from `Placer` (forced placement here; the cost-model scheduler plugs in the same way); every
//! refusal of the GPU is recorded with its reason so that no fallback is silent.

use crate::costs::{gpu_padding, kernel_variant, Costs, NodeCostQuery};
use crate::gpu::{to_gpu_bytes, Gpu};
use crate::graph::{Graph, Node};
use crate::schedule::{self, Choice, Explain, Policy, Task};
use crate::{Error, Result};
use std::collections::HashMap;
use std::fmt;
use std::ops::Range;
use std::sync::Arc;
use tandem_ops::shape::{row_count, row_len};
use tandem_ops::{DType, GpuKernel, OpError, Tensor, TensorMeta};

/// Where a step runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Device {
    Cpu,
    Gpu,
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Device::Cpu => "cpu",
            Device::Gpu => "gpu",
        })
    }
}

/// How a step's node is executed.
#[derive(Debug, Clone)]
pub enum StepKind {
    /// Output 0 shares input 0's elements (Reshape, Squeeze...): no kernel runs.
    View,
    /// The whole node on one device (GPU kernels precomputed).
    Whole {
        device: Device,
        kernels: Vec<GpuKernel>,
    },
    /// Rows `0..cut` on the CPU and `cut..` on the GPU at the same time (`kernels` compute the
    /// GPU's rows); `row_len` elements per row of output 0.
    Split {
        cut: usize,
        row_len: usize,
        kernels: Vec<GpuKernel>,
    },
}

/// One node to execute.
#[derive(Debug, Clone)]
pub struct Step {
    pub node: usize,
    pub kind: StepKind,
    pub rows: Range<usize>,
    /// Why the node is not where the policy asked (e.g. the GPU refused it).
    pub fallback: Option<String>,
    /// The scheduler's predictions and reason (placement `auto` only).
    pub explain: Option<Explain>,
    /// Metas of the node's inputs as the op sees them (see [`input_metas`]).
    pub inputs: Vec<TensorMeta>,
    /// Metas of the outputs the model asks for (a prefix of the op's outputs).
    pub outputs: Vec<TensorMeta>,
    /// A split step's inputs (indices) that the scheduler expects split at the same fraction of
    /// rows and that the op reads row for row: each half reads the input's half in place, with
    /// no join (a chain). The executor checks the split point and joins if it differs.
    pub chained: Vec<usize>,
}

impl Step {
    pub fn device(&self) -> Option<Device> {
        match &self.kind {
            StepKind::View => None,
            StepKind::Whole { device, .. } => Some(*device),
            StepKind::Split { .. } => None,
        }
    }
}

/// An executable plan for one input-shape signature.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Type and shape of every value; `value` is set for constants (initializers and folded).
    pub metas: Vec<Option<TensorMeta>>,
    pub steps: Vec<Step>,
    /// For each value, the index of the last step that reads it (`None`: no step reads it).
    pub last_use: Vec<Option<usize>>,
    /// For each value, the elements its host buffer is allocated to hold (0: its own): a
    /// CPU Concat's input 0, read there last, gets room for the Concat's output, which then
    /// takes over the buffer and appends the other inputs (`exec/append.rs`).
    pub room: Vec<usize>,
    /// Nodes evaluated at plan time because all their inputs were constants.
    pub folded: Vec<usize>,
    /// Predicted run time (placement `auto` only), seconds.
    pub predicted: Option<f64>,
    /// Seconds the GPU was expected to stay busy with other sessions' work when this plan was
    /// made (see [`build_around_busy_gpu`]); 0 for a plan made for an idle GPU.
    pub gpu_wait: f64,
    /// Peak bytes of intermediate values alive at once on the host
    /// ([`crate::limits::peak_intermediates`]).
    pub host_peak: u64,
    /// Each node's name and op type as run reports share them (allocated once, not per run).
    pub labels: Vec<(Arc<str>, Arc<str>)>,
}

impl Plan {
    /// True when `other` puts every step on the same device as this plan (and cuts splits at
    /// the same row): a re-plan that moved nothing.
    pub fn same_placement(&self, other: &Plan) -> bool {
        let kind = |k: &StepKind| match k {
            StepKind::View => (0, None, 0),
            StepKind::Whole { device, .. } => (1, Some(*device), 0),
            StepKind::Split { cut, .. } => (2, None, *cut),
        };
        self.steps.len() == other.steps.len()
            && (self.steps.iter().zip(&other.steps))
                .all(|(x, y)| x.node == y.node && kind(&x.kind) == kind(&y.kind))
    }
}

/// Where nodes run when no override names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Every node on the CPU.
    Cpu,
    /// Every node the GPU can run on the GPU; the others on the CPU, each with its reason in the
    /// run report.
    Gpu,
    /// The scheduler decides per node (CPU, GPU or split) from the cost model.
    Auto,
}

impl std::str::FromStr for Placement {
    type Err = Error;
    fn from_str(s: &str) -> Result<Placement> {
        match s {
            "cpu" => Ok(Placement::Cpu),
            "gpu" => Ok(Placement::Gpu),
            "auto" => Ok(Placement::Auto),
            other => Err(Error::Usage(format!(
                "unknown placement `{other}` (expected cpu, gpu or auto)"
            ))),
        }
    }
}

/// What the planner is asked for.
pub struct Request<'a> {
    pub placement: Placement,
    /// Per-node overrides; later entries win.
    pub overrides: &'a [(Selector, Device)],
    /// Predictions for `Placement::Auto` (required there).
    pub costs: Option<&'a dyn Costs>,
    /// The scheduling policy for `Placement::Auto`.
    pub policy: Policy,
    /// Simulation only (`tandem simulate`): with no GPU given, treat one as present and take
    /// each node's GPU kernels from `op.gpu(...)` alone, skipping the device-limit checks.
    pub assume_gpu: bool,
}

impl Request<'_> {
    fn forced(&self, node: &Node) -> Option<Device> {
        let over = self
            .overrides
            .iter()
            .rev()
            .find(|(s, _)| s.matches(node))
            .map(|(_, d)| *d);
        match self.placement {
            Placement::Cpu => over.or(Some(Device::Cpu)),
            Placement::Gpu => over.or(Some(Device::Gpu)),
            Placement::Auto => over,
        }
    }
}

/// Per value of `graph`, its meta where it is a constant (sharing the constant's data), else
/// `None`.
pub(crate) fn constant_metas(graph: &Graph) -> Vec<Option<TensorMeta>> {
    let meta = |c: &std::sync::Arc<Tensor>| TensorMeta {
        dtype: c.dtype(),
        shape: c.shape.clone(),
        value: Some(c.clone()),
    };
    graph
        .values
        .iter()
        .map(|v| v.constant.as_ref().map(meta))
        .collect()
}

/// Metas of a node's inputs, with an empty constant for omitted optional inputs and trailing
/// omitted inputs dropped (the contract of `tandem_ops::Op`).
pub fn input_metas(node: &Node, metas: &[Option<TensorMeta>]) -> Vec<TensorMeta> {
    let given = node
        .inputs
        .iter()
        .rposition(|i| i.is_some())
        .map_or(0, |p| p + 1);
    node.inputs[..given]
        .iter()
        .map(|i| match i {
            Some(v) => metas[*v]
                .clone()
                .expect("inputs are planned before their readers"),
            None => TensorMeta::constant(Tensor::f32(&[0], vec![])),
        })
        .collect()
}

pub(crate) fn node_error(node: &Node, source: OpError) -> Error {
    Error::Node {
        node: node.name.clone(),
        op_type: node.op_type.clone(),
        opset: node.opset,
        source,
    }
}

/// Largest tensor folded at plan time (elements); bigger constant computations still fold, this
/// only guards against a hostile model making plan time explode.
const MAX_FOLD_ELEMENTS: usize = 64 << 20;
/// Bigger constants (the light zoo's ConstantOfShape weights: vgg19's 411 MB fc6) still fold,
/// once per plan instead of once per run, until their total reaches this many bytes; past it
/// they run every time (the same memory a weight of that size takes).
const MAX_LARGE_FOLD_BYTES: usize = 2 << 30;

/// A node left to execute after folding, with its metas.
struct Pending {
    node: usize,
    ins: Vec<TensorMeta>,
    outs: Vec<TensorMeta>,
    rows: usize,
    row_len: usize,
    view: bool,
}

/// A run plans around other sessions' work on a shared GPU when that work is expected to keep
/// the GPU busy for more than this share of the cached plan's predicted time...
pub const BUSY_SHARE: f64 = 0.1;
/// ...and for more than this many seconds.
pub const BUSY_MIN_WAIT_S: f64 = 1e-3;

/// True when an expected GPU wait of `wait` seconds is worth planning around for a plan
/// predicted to take `predicted` seconds (see [`BUSY_SHARE`], [`BUSY_MIN_WAIT_S`]).
pub fn gpu_busy_enough(wait: f64, predicted: f64) -> bool {
    wait > BUSY_MIN_WAIT_S && wait > BUSY_SHARE * predicted
}

/// Build the plan for `graph` given the metas of its inputs (in `graph.inputs` order).
pub fn build(
    graph: &Graph,
    input_metas_given: &[TensorMeta],
    request: &Request<'_>,
    gpu: Option<&Gpu>,
    pool: &rayon::ThreadPool,
) -> Result<Plan> {
    build_around_busy_gpu(graph, input_metas_given, request, gpu, pool, 0.0)
}

/// [`build`] for a GPU that other sessions' batches keep busy for `gpu_wait` seconds: the
/// scheduler (placement `auto`) starts nothing of this run on the GPU before then.
pub fn build_around_busy_gpu(
    graph: &Graph,
    input_metas_given: &[TensorMeta],
    request: &Request<'_>,
    gpu: Option<&Gpu>,
    pool: &rayon::ThreadPool,
    gpu_wait: f64,
) -> Result<Plan> {
    let mut metas = constant_metas(graph);
    for (&v, m) in graph.inputs.iter().zip(input_metas_given) {
        metas[v] = Some(m.clone());
    }
    let mut pending = Vec::new();
    let mut folded = Vec::new();
    let mut large_folded = 0usize;
    // Values some node or the caller reads: a view's other outputs (Dropout's mask) that no one
    // reads need not be produced, so such a node stays a view.
    let mut read = vec![false; graph.values.len()];
    for v in graph.nodes.iter().flat_map(|n| n.inputs.iter().flatten()) {
        read[*v] = true;
    }
    for &v in &graph.outputs {
        read[v] = true;
    }
    for (n, node) in graph.nodes.iter().enumerate() {
        let ins = input_metas(node, &metas);
        let refs: Vec<&TensorMeta> = ins.iter().collect();
        let mut outs = node.op.infer(&refs).map_err(|e| node_error(node, e))?;
        if outs.len() < node.outputs.len() {
            return Err(node_error(
                node,
                OpError::Invalid(format!(
                    "the model asks for {} outputs, the op produces {}",
                    node.outputs.len(),
                    outs.len()
                )),
            ));
        }
        // Kernels compute only the outputs the model asks for (a prefix of the op's outputs).
        outs.truncate(node.outputs.len());
        // A hostile model can ask for any size: refuse what no tensor may be, before allocating.
        for o in &outs {
            let bytes = o
                .shape
                .iter()
                .try_fold(o.dtype.size() as u64, |b, &d| b.checked_mul(d as u64));
            if bytes.is_none_or(|b| b > crate::import::MAX_TENSOR_BYTES) {
                return Err(node_error(
                    node,
                    OpError::Invalid(format!(
                        "an output of shape {:?} exceeds the {}-byte tensor limit",
                        o.shape,
                        crate::import::MAX_TENSOR_BYTES
                    )),
                ));
            }
        }
        if outs.iter().all(|o| o.value.is_some()) {
            // Known from shapes alone (Shape, Size): a constant of this plan.
            for (&v, m) in node.outputs.iter().zip(outs) {
                metas[v] = Some(m);
            }
            folded.push(n);
            continue;
        }
        let axis = node.op.split_axis(&refs, &outs);
        let all_const = ins.iter().all(|m| m.value.is_some());
        let numel = outs.iter().map(|o| o.numel()).sum::<usize>();
        let bytes: usize = outs.iter().map(|o| o.numel() * o.dtype.size()).sum();
        let small = numel <= MAX_FOLD_ELEMENTS;
        let fits = small || large_folded + bytes <= MAX_LARGE_FOLD_BYTES;
        if all_const && fits {
            if !small {
                large_folded += bytes;
            }
            let tensors: Vec<&Tensor> = ins.iter().map(|m| m.value.as_deref().unwrap()).collect();
            let mut out: Vec<Tensor> = outs
                .iter()
                .map(|m| Tensor::zeros(m.dtype, &m.shape))
                .collect();
            let rows = row_count(&outs[0].shape, axis);
            pool.install(|| node.op.cpu(&tensors, &mut out, 0..rows))
                .map_err(|e| node_error(node, e))?;
            for (&v, t) in node.outputs.iter().zip(out) {
                metas[v] = Some(TensorMeta::constant(t));
            }
            folded.push(n);
            continue;
        }
        pending.push(Pending {
            node: n,
            rows: row_count(&outs[0].shape, axis),
            row_len: row_len(&outs[0].shape, axis),
            // A view with more outputs (Dropout's mask) must run to produce them, if read.
            view: node.op.is_view() && node.outputs.iter().skip(1).all(|&v| !read[v]),
            ins,
            outs: outs.clone(),
        });
        for (&v, m) in node.outputs.iter().zip(outs) {
            metas[v] = Some(m);
        }
    }
    let (mut steps, predicted) = place(graph, &pending, &metas, request, gpu, gpu_wait)?;
    order_views(graph, &pending, &mut steps);
    let mut last_use = vec![None; graph.values.len()];
    for (s, step) in steps.iter().enumerate() {
        for v in graph.nodes[step.node].inputs.iter().flatten() {
            last_use[*v] = Some(s);
        }
    }
    let room = append_room(graph, &steps, &last_use);
    let mut plan = Plan {
        metas,
        steps,
        last_use,
        room,
        folded,
        predicted,
        gpu_wait,
        host_peak: 0,
        labels: (graph.nodes.iter())
            .map(|n| (n.name.as_str().into(), n.op_type.as_str().into()))
            .collect(),
    };
    plan.host_peak = crate::limits::peak_intermediates(graph, &plan);
    Ok(plan)
}

/// [`Plan::room`]: from the last step back, so that a Concat whose output is itself input 0 of
/// a later one (densenet121's dense blocks) passes that one's room on to its own input 0.
fn append_room(graph: &Graph, steps: &[Step], last_use: &[Option<usize>]) -> Vec<usize> {
    let mut room = vec![0; graph.values.len()];
    for (s, step) in steps.iter().enumerate().rev() {
        let node = &graph.nodes[step.node];
        let (Some(Some(v)), Some(&out), Some(meta)) = (
            node.inputs.first(),
            node.outputs.first(),
            step.outputs.first(),
        ) else {
            continue;
        };
        let on_cpu = matches!(
            step.kind,
            StepKind::Whole {
                device: Device::Cpu,
                ..
            }
        );
        if on_cpu
            && last_use[*v] == Some(s)
            && !graph.inputs.contains(v)
            && !graph.outputs.contains(v)
            && node.inputs[1..].iter().all(|i| *i != Some(*v))
            && node
                .op
                .appends_inputs(&step.inputs.iter().collect::<Vec<_>>())
        {
            room[*v] = room[out].max(meta.numel());
        }
    }
    room
}

/// Steps for the non-view nodes, in execution order, plus the predicted run time for `auto`.
fn place(
    graph: &Graph,
    pending: &[Pending],
    metas: &[Option<TensorMeta>],
    request: &Request<'_>,
    gpu: Option<&Gpu>,
    gpu_wait: f64,
) -> Result<(Vec<Step>, Option<f64>)> {
    let work: Vec<&Pending> = pending.iter().filter(|p| !p.view).collect();
    let kernels: Vec<std::result::Result<Vec<GpuKernel>, String>> = work
        .iter()
        .map(|p| {
            let node = &graph.nodes[p.node];
            match request.forced(node) {
                Some(Device::Cpu) => Err("placed on the CPU".into()),
                _ if gpu.is_none() && request.assume_gpu => {
                    assumed_gpu_kernels(node, &p.ins, &p.outs, 0..p.rows)
                }
                _ => gpu_kernels(node, &p.ins, &p.outs, 0..p.rows, gpu),
            }
        })
        .collect();
    let whole = |p: &Pending, k: &std::result::Result<Vec<GpuKernel>, String>, d: Device| {
        let node = &graph.nodes[p.node];
        match (d, k) {
            (Device::Gpu, Ok(k)) => (
                StepKind::Whole {
                    device: Device::Gpu,
                    kernels: k.clone(),
                },
                None,
            ),
            (Device::Gpu, Err(reason)) => (cpu_kind(), Some(reason.clone())),
            (Device::Cpu, _) => {
                let asked_gpu = request.forced(node) == Some(Device::Gpu);
                (
                    cpu_kind(),
                    if asked_gpu {
                        k.as_ref().err().cloned()
                    } else {
                        None
                    },
                )
            }
        }
    };
    let step =
        |p: &Pending, kind: StepKind, fallback: Option<String>, explain: Option<Explain>| Step {
            node: p.node,
            kind,
            rows: 0..p.rows,
            fallback,
            explain,
            inputs: p.ins.clone(),
            outputs: p.outs.clone(),
            chained: Vec::new(),
        };
    if request.placement != Placement::Auto {
        let steps = work
            .iter()
            .zip(&kernels)
            .map(|(p, k)| {
                let d = request.forced(&graph.nodes[p.node]).unwrap_or(Device::Cpu);
                let (kind, fallback) = whole(p, k, d);
                step(p, kind, fallback, None)
            })
            .collect();
        return Ok((steps, None));
    }
    let costs = request
        .costs
        .ok_or_else(|| Error::Usage("placement auto needs a cost model".into()))?;
    let alias = view_aliases(graph, pending);
    let key = |v: usize| *alias.get(&v).unwrap_or(&v);
    let is_const = |v: usize| metas[v].as_ref().is_some_and(|m| m.value.is_some());
    let tasks: Vec<Task> = work
        .iter()
        .zip(&kernels)
        .map(|(p, k)| {
            let node = &graph.nodes[p.node];
            let refs: Vec<&TensorMeta> = p.ins.iter().collect();
            Task {
                query: NodeCostQuery {
                    op_type: &node.op_type,
                    dtype: p.outs[0].dtype,
                    work: node.op.work(&refs, &p.outs),
                    dispatches: k.as_ref().map_or(1, |k| k.len()),
                    variant: kernel_variant(node.op.as_ref(), &refs, &p.outs),
                    gpu_pad: gpu_padding(&node.op_type, &p.outs),
                    rows: row_count(&p.outs[0].shape, node.op.split_axis(&refs, &p.outs)) as f64,
                },
                inputs: node
                    .inputs
                    .iter()
                    .flatten()
                    .filter(|&&v| !is_const(v))
                    .map(|&v| {
                        (
                            key(v),
                            metas[v].as_ref().map_or(0, |m| m.numel() as u64 * 4),
                        )
                    })
                    .collect(),
                outputs: node
                    .outputs
                    .iter()
                    .zip(&p.outs)
                    .map(|(&v, m)| (key(v), m.numel() as u64 * 4))
                    .collect(),
                rows: if node.outputs.len() == 1 { p.rows } else { 1 },
                gpu_tile: match k {
                    Ok(_) if node.outputs.len() == 1 && p.rows > 1 => {
                        gpu_tile_rows(node.op.as_ref(), &refs, &p.outs)
                    }
                    _ => 1,
                },
                gpu_refusal: k.as_ref().err().cloned(),
                forced: request.forced(node),
                row_local: node
                    .op
                    .row_local(&refs, &p.outs)
                    .into_iter()
                    .filter_map(|i| node.inputs.get(i).copied().flatten())
                    .filter(|&v| !is_const(v))
                    .map(key)
                    .collect(),
            }
        })
        .collect();
    let sched = schedule::schedule_from(&tasks, costs, request.policy, gpu_wait);
    // Split values by (aliased) key: their cut and rows, to mark chained inputs.
    let halves: HashMap<usize, (usize, usize)> = tasks
        .iter()
        .zip(&sched.choices)
        .filter_map(|(t, c)| match c {
            Choice::Split { cut } => Some((t.outputs[0].0, (*cut, t.rows))),
            Choice::On(_) => None,
        })
        .collect();
    // A plan with every node on one device runs in the graph's order, exactly as placement
    // `cpu`/`gpu` would (the upward-rank order keeps more tensors alive; one device gains nothing).
    let one_device = sched.choices.windows(2).all(|w| w[0] == w[1])
        && matches!(sched.choices.first(), None | Some(Choice::On(_)));
    let order: Vec<usize> = if one_device {
        (0..work.len()).collect()
    } else {
        sched.order.clone()
    };
    let mut steps = Vec::with_capacity(work.len());
    for &i in &order {
        let p = work[i];
        let node = &graph.nodes[p.node];
        let explain = Some(sched.explain[i].clone());
        let (kind, fallback) = match sched.choices[i] {
            Choice::On(d) => whole(p, &kernels[i], d),
            Choice::Split { cut } => {
                let refs: Vec<&TensorMeta> = p.ins.iter().collect();
                match node.op.gpu(&refs, &p.outs, cut..p.rows) {
                    Ok(k) => (
                        StepKind::Split {
                            cut,
                            row_len: p.row_len,
                            kernels: k,
                        },
                        None,
                    ),
                    Err(e) => (
                        cpu_kind(),
                        Some(format!("split refused by the GPU kernel: {e}")),
                    ),
                }
            }
        };
        let mut s = step(p, kind, fallback, explain);
        if let (StepKind::Split { cut, .. }, Choice::Split { .. }) = (&s.kind, sched.choices[i]) {
            let refs: Vec<&TensorMeta> = p.ins.iter().collect();
            s.chained = node
                .op
                .row_local(&refs, &p.outs)
                .into_iter()
                .filter(|&j| {
                    let h = node.inputs.get(j).copied().flatten().map(key);
                    h.and_then(|v| halves.get(&v))
                        .is_some_and(|&(hc, hr)| cut * hr == hc * tasks[i].rows)
                })
                .collect();
        }
        steps.push(s);
    }
    Ok((steps, Some(sched.makespan)))
}

/// For each view's output, the value it aliases (following chains of views).
fn view_aliases(graph: &Graph, pending: &[Pending]) -> HashMap<usize, usize> {
    let mut alias = HashMap::new();
    for p in pending.iter().filter(|p| p.view) {
        let node = &graph.nodes[p.node];
        if let Some(src) = node.inputs[0] {
            let root = *alias.get(&src).unwrap_or(&src);
            alias.insert(node.outputs[0], root);
        }
    }
    alias
}

/// Insert each view step right after the step producing its input (or first, for inputs and
/// constants), keeping views in topological order.
fn order_views(graph: &Graph, pending: &[Pending], steps: &mut Vec<Step>) {
    let views: Vec<&Pending> = pending.iter().filter(|p| p.view).collect();
    if views.is_empty() {
        return;
    }
    let mut placed = vec![false; views.len()];
    let mut out: Vec<Step> = Vec::with_capacity(steps.len() + views.len());
    let mut available: std::collections::HashSet<usize> = std::collections::HashSet::new();
    let mut produced_by_steps: std::collections::HashSet<usize> = std::collections::HashSet::new();
    for s in steps.iter() {
        produced_by_steps.extend(graph.nodes[s.node].outputs.iter().copied());
    }
    let view_outputs: std::collections::HashSet<usize> = views
        .iter()
        .map(|p| graph.nodes[p.node].outputs[0])
        .collect();
    let ready = |v: usize, available: &std::collections::HashSet<usize>| {
        available.contains(&v) || (!produced_by_steps.contains(&v) && !view_outputs.contains(&v))
    };
    let drain = |out: &mut Vec<Step>,
                 available: &mut std::collections::HashSet<usize>,
                 placed: &mut Vec<bool>| loop {
        let mut progress = false;
        for (i, p) in views.iter().enumerate() {
            let node = &graph.nodes[p.node];
            if !placed[i] && node.inputs[0].is_none_or(|v| ready(v, available)) {
                placed[i] = true;
                progress = true;
                available.insert(node.outputs[0]);
                out.push(Step {
                    node: p.node,
                    kind: StepKind::View,
                    rows: 0..p.rows,
                    fallback: None,
                    explain: None,
                    inputs: p.ins.clone(),
                    outputs: p.outs.clone(),
                    chained: Vec::new(),
                });
            }
        }
        if !progress {
            break;
        }
    };
    drain(&mut out, &mut available, &mut placed);
    for s in steps.drain(..) {
        available.extend(graph.nodes[s.node].outputs.iter().copied());
        out.push(s);
        drain(&mut out, &mut available, &mut placed);
    }
    *steps = out;
}

fn cpu_kind() -> StepKind {
    StepKind::Whole {
        device: Device::Cpu,
        kernels: Vec::new(),
    }
}

/// The GPU kernels of a node, or why it cannot run on this GPU.
pub fn gpu_kernels(
    node: &Node,
    ins: &[TensorMeta],
    outs: &[TensorMeta],
    rows: Range<usize>,
    gpu: Option<&Gpu>,
) -> std::result::Result<Vec<GpuKernel>, String> {
    let gpu = gpu.ok_or("no GPU adapter is available")?;
    let refs: Vec<&TensorMeta> = ins.iter().collect();
    let kernels = node.op.gpu(&refs, outs, rows).map_err(|e| e.to_string())?;
    // Only what the kernels bind goes to the GPU (a Slice's INT64_MAX `ends` never does).
    let bound: std::collections::BTreeSet<usize> = kernels
        .iter()
        .flat_map(|k| k.inputs.iter().copied())
        .collect();
    for m in bound.iter().map(|&i| &ins[i]).chain(outs) {
        if m.dtype == DType::F64 {
            return Err("f64 tensors are not supported on the GPU".into());
        }
        if let Some(reason) = gpu.binding_refusal(m.numel() as u64 * 4) {
            return Err(reason);
        }
        if let Some(v) = &m.value {
            to_gpu_bytes(v)?;
        }
    }
    let max = gpu.limits().max_compute_workgroups_per_dimension;
    let uniform_most = gpu.limits().max_uniform_buffer_binding_size as usize;
    for k in kernels
        .iter()
        .flat_map(|k| k.for_adapter(gpu.runs_on_cpu()))
    {
        if k.workgroups.iter().any(|&w| w > max) {
            return Err(format!(
                "{} needs {:?} workgroups, over this adapter's {max} per dimension",
                k.shader.name, k.workgroups
            ));
        }
        if k.uniform_window.is_some() && uniform_most < tandem_ops::UNIFORM_WINDOW_BYTES {
            return Err(format!(
                "{} binds a {}-byte uniform buffer, over this adapter's {uniform_most}",
                k.shader.name,
                tandem_ops::UNIFORM_WINDOW_BYTES
            ));
        }
    }
    Ok(kernels)
}

/// Rows of output 0 that one GPU workgroup covers along the split axis (the kernel's tile
/// height): the most trailing rows `rows - r..rows` whose kernels launch as many workgroups as
/// the last row alone, found by bisection over the op's own launch geometry (`Op::gpu`). 64
/// for the 64x64-tiled MatMul and for kernels running 64 rows per workgroup (elementwise ops,
/// whose rows are single elements; Softmax); 1 when a row is one or more whole workgroups, or
/// when the op cannot describe its kernels for these rows.
pub fn gpu_tile_rows(op: &dyn tandem_ops::Op, ins: &[&TensorMeta], outs: &[TensorMeta]) -> usize {
    let axis = op.split_axis(ins, outs);
    let Some(rows) = outs.first().map(|o| row_count(&o.shape, axis)) else {
        return 1;
    };
    let launched = |r: usize| -> Option<u64> {
        let k = op.gpu(ins, outs, rows - r..rows).ok()?;
        Some(
            k.iter()
                .map(|k| k.workgroups.iter().map(|&w| w as u64).product::<u64>())
                .sum(),
        )
    };
    if rows < 2 {
        return 1;
    }
    let Some(one) = launched(1).filter(|&w| w > 0) else {
        return 1;
    };
    let (mut lo, mut hi) = (1, rows);
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if launched(mid) == Some(one) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}

/// The GPU kernels of a node for simulation without a device: the op's own description, with
/// the dtype checks of [`gpu_kernels`] but none of an adapter's limits.
fn assumed_gpu_kernels(
    node: &Node,
    ins: &[TensorMeta],
    outs: &[TensorMeta],
    rows: Range<usize>,
) -> std::result::Result<Vec<GpuKernel>, String> {
    for m in ins.iter().chain(outs) {
        if m.dtype == DType::F64 {
            return Err("f64 tensors are not supported on the GPU".into());
        }
        if let Some(v) = &m.value {
            to_gpu_bytes(v)?;
        }
    }
    let refs: Vec<&TensorMeta> = ins.iter().collect();
    node.op.gpu(&refs, outs, rows).map_err(|e| e.to_string())
}

/// Selects nodes for a placement override.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selector {
    NodeName(String),
    OpType(String),
}

impl Selector {
    pub fn matches(&self, node: &Node) -> bool {
        match self {
            Selector::NodeName(n) => *n == node.name,
            Selector::OpType(t) => *t == node.op_type,
        }
    }
}
