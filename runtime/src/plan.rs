//! Plans: for one set of input shapes, every value's type and shape, the values folded to
//! constants, and one step per remaining node with its device and precomputed GPU kernels.
//!
//! Sits between the graph (`graph.rs`) and the executor (`exec.rs`). Placement decisions come
//! from [`Placer`] (forced placement here; the cost-model scheduler plugs in the same way); every
//! refusal of the GPU is recorded with its reason so that no fallback is silent.

use crate::gpu::{to_gpu_bytes, Gpu};
use crate::graph::{Graph, Node};
use crate::{Error, Result};
use std::fmt;
use std::ops::Range;
use std::sync::Arc;
use tandem_ops::shape::row_count;
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
}

/// One node to execute.
#[derive(Debug, Clone)]
pub struct Step {
    pub node: usize,
    pub kind: StepKind,
    pub rows: Range<usize>,
    /// Why the node is not where the policy asked (e.g. the GPU refused it).
    pub fallback: Option<String>,
}

impl Step {
    pub fn device(&self) -> Option<Device> {
        match &self.kind {
            StepKind::View => None,
            StepKind::Whole { device, .. } => Some(*device),
        }
    }
}

/// An executable plan for one input-shape signature.
#[derive(Debug)]
pub struct Plan {
    /// Type and shape of every value; `value` is set for constants (initializers and folded).
    pub metas: Vec<Option<TensorMeta>>,
    pub steps: Vec<Step>,
    /// For each value, the index of the last step that reads it (`None`: no step reads it).
    pub last_use: Vec<Option<usize>>,
    /// Nodes evaluated at plan time because all their inputs were constants.
    pub folded: Vec<usize>,
}

/// Decides the device of each node of a plan.
pub trait Placer {
    /// The device wanted for `node` (before GPU feasibility checks).
    fn place(&self, node: &Node) -> Device;
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

/// Build the plan for `graph` given the metas of its inputs (in `graph.inputs` order).
pub fn build(
    graph: &Graph,
    input_metas_given: &[TensorMeta],
    placer: &dyn Placer,
    gpu: Option<&Gpu>,
    pool: &rayon::ThreadPool,
) -> Result<Plan> {
    let mut metas: Vec<Option<TensorMeta>> = vec![None; graph.values.len()];
    for (v, value) in graph.values.iter().enumerate() {
        if let Some(c) = &value.constant {
            metas[v] = Some(TensorMeta {
                dtype: c.dtype(),
                shape: c.shape.clone(),
                value: Some(c.clone()),
            });
        }
    }
    for (&v, m) in graph.inputs.iter().zip(input_metas_given) {
        metas[v] = Some(m.clone());
    }
    let mut steps = Vec::new();
    let mut folded = Vec::new();
    for (n, node) in graph.nodes.iter().enumerate() {
        let ins = input_metas(node, &metas);
        let refs: Vec<&TensorMeta> = ins.iter().collect();
        let outs = node.op.infer(&refs).map_err(|e| node_error(node, e))?;
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
        if outs.iter().all(|o| o.value.is_some()) {
            // Known from shapes alone (Shape, Size): a constant of this plan.
            for (&v, m) in node.outputs.iter().zip(outs) {
                metas[v] = Some(m);
            }
            folded.push(n);
            continue;
        }
        let all_const = ins.iter().all(|m| m.value.is_some());
        let small = outs.iter().map(|o| o.numel()).sum::<usize>() <= MAX_FOLD_ELEMENTS;
        if all_const && small {
            let tensors: Vec<&Tensor> = ins.iter().map(|m| m.value.as_deref().unwrap()).collect();
            let mut out: Vec<Tensor> = outs
                .iter()
                .map(|m| Tensor::zeros(m.dtype, &m.shape))
                .collect();
            let rows = row_count(&outs[0].shape, node.op.split_axis(&refs, &outs));
            pool.install(|| node.op.cpu(&tensors, &mut out, 0..rows))
                .map_err(|e| node_error(node, e))?;
            for (&v, t) in node.outputs.iter().zip(out) {
                metas[v] = Some(TensorMeta::constant(t));
            }
            folded.push(n);
            continue;
        }
        let rows = 0..row_count(&outs[0].shape, node.op.split_axis(&refs, &outs));
        let (kind, fallback) = if node.op.is_view() {
            (StepKind::View, None)
        } else {
            match placer.place(node) {
                Device::Cpu => (cpu_kind(), None),
                Device::Gpu => match gpu_kernels(node, &ins, &outs, rows.clone(), gpu) {
                    Ok(kernels) => (
                        StepKind::Whole {
                            device: Device::Gpu,
                            kernels,
                        },
                        None,
                    ),
                    Err(reason) => (cpu_kind(), Some(reason)),
                },
            }
        };
        steps.push(Step {
            node: n,
            kind,
            rows,
            fallback,
        });
        for (&v, m) in node.outputs.iter().zip(outs) {
            metas[v] = Some(m);
        }
    }
    let mut last_use = vec![None; graph.values.len()];
    for (s, step) in steps.iter().enumerate() {
        for v in graph.nodes[step.node].inputs.iter().flatten() {
            last_use[*v] = Some(s);
        }
    }
    Ok(Plan {
        metas,
        steps,
        last_use,
        folded,
    })
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
    for m in ins.iter().chain(outs) {
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
    let refs: Vec<&TensorMeta> = ins.iter().collect();
    let kernels = node.op.gpu(&refs, outs, rows).map_err(|e| e.to_string())?;
    let max = gpu.limits().max_compute_workgroups_per_dimension;
    for k in &kernels {
        if k.workgroups.iter().any(|&w| w > max) {
            return Err(format!(
                "{} needs {:?} workgroups, over this adapter's {max} per dimension",
                k.shader.name, k.workgroups
            ));
        }
    }
    Ok(kernels)
}

/// A placer that puts every node on one device, except nodes matched by an override.
#[derive(Debug, Clone)]
pub struct ForcedPlacer {
    pub default: Device,
    pub overrides: Arc<Vec<(Selector, Device)>>,
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

impl Placer for ForcedPlacer {
    fn place(&self, node: &Node) -> Device {
        self.overrides
            .iter()
            .rev()
            .find(|(s, _)| s.matches(node))
            .map_or(self.default, |(_, d)| *d)
    }
}
