//! The interface between the scheduler and the cost model: predicted times of nodes on each
//! device and of the transfers between them.
//!
//! Sits between `schedule.rs` (which only asks questions through [`Costs`]) and `cost/` (the
//! learned, persisted model that answers them). Frozen cost tables in tests implement it too.

use crate::plan::Device;
use std::borrow::Cow;
use tandem_ops::{DType, TensorMeta, Work};

/// What the scheduler needs to know of one node to predict its time.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeCostQuery<'a> {
    /// ONNX op type, e.g. "Conv".
    pub op_type: &'a str,
    /// Dtype of output 0.
    pub dtype: DType,
    /// Work of the whole node (all rows).
    pub work: Work,
    /// Number of GPU dispatches (launch overhead), usually 1.
    pub dispatches: usize,
    /// Which kernel path of the op runs (see [`kernel_variant`]); "" when the op has one.
    pub variant: &'static str,
    /// GPU work launched per unit of useful work, >= 1 ([`gpu_padding`]): the GPU's cost
    /// features are `work.flops * gpu_pad`. 1.0 where unknown.
    pub gpu_pad: f64,
}

impl NodeCostQuery<'_> {
    /// The cost model's key for this node: `op_type`, or `op_type/variant`.
    pub fn cost_key(&self) -> Cow<'_, str> {
        cost_key(self.op_type, self.variant)
    }

    /// Flops of `fraction` of the rows as `device` executes them (padded on the GPU).
    pub fn flops_on(&self, device: Device, fraction: f64) -> f64 {
        let pad = match device {
            Device::Cpu => 1.0,
            Device::Gpu => self.gpu_pad.max(1.0),
        };
        self.work.flops as f64 * fraction * pad
    }
}

/// Output rows and columns of one GPU MatMul/Gemm workgroup tile (matmul.wgsl).
const MATMUL_TILE: usize = 64;

/// Work the GPU kernel launches per unit of useful work (>= 1) where its launch geometry rounds
/// the output up (workgroup quantisation, as in CoDL): MatMul and Gemm compute whole 64x64
/// output tiles, so a 16-row product costs what a 64-row one does. 1.0 for other ops (their
/// kernels run one invocation per output element or row, rounded up by at most one workgroup).
pub fn gpu_padding(op_type: &str, outs: &[TensorMeta]) -> f64 {
    if !matches!(op_type, "MatMul" | "Gemm") {
        return 1.0;
    }
    let (m, n) = match outs.first().map(|o| o.shape.as_slice()) {
        Some([.., m, n]) => (*m, *n),
        Some([n]) => (1, *n),
        _ => return 1.0,
    };
    if m == 0 || n == 0 {
        return 1.0;
    }
    let up = |v: usize| v.div_ceil(MATMUL_TILE) * MATMUL_TILE;
    (up(m) * up(n)) as f64 / (m * n) as f64
}

/// `op`, or `op/variant` when the variant is not empty.
pub fn cost_key<'a>(op: &'a str, variant: &str) -> Cow<'a, str> {
    if variant.is_empty() {
        Cow::Borrowed(op)
    } else {
        Cow::Owned(format!("{op}/{variant}"))
    }
}

/// The kernel path an op takes for these shapes, where one op type runs kernels whose time
/// per flop differs a lot, so that they get separate cost entries: Conv is `depthwise`,
/// `grouped`, `1x1` or `kxk` (from the weight shape and the input channels); MatMul and Gemm
/// with a single output row are `gemv` (bandwidth-bound, and a tiled GPU kernel computes a
/// whole tile of rows for it). "" for everything else.
pub fn kernel_variant(op_type: &str, ins: &[&TensorMeta], outs: &[TensorMeta]) -> &'static str {
    match op_type {
        "Conv" => {
            let (Some(x), Some(w)) = (ins.first(), ins.get(1)) else {
                return "";
            };
            if x.shape.len() < 3 || w.shape.len() != x.shape.len() || w.shape[1] == 0 {
                return "";
            }
            let group = x.shape[1] / w.shape[1];
            if group > 1 && w.shape[1] == 1 {
                "depthwise"
            } else if group > 1 {
                "grouped"
            } else if w.shape[2..].iter().product::<usize>() == 1 {
                "1x1"
            } else {
                "kxk"
            }
        }
        "MatMul" | "Gemm" => match outs.first().map(|o| o.shape.as_slice()) {
            Some([.., m, _]) if *m == 1 => "gemv",
            Some([_]) => "gemv",
            _ => "",
        },
        _ => "",
    }
}

/// Predicted times, in seconds.
pub trait Costs: Send + Sync {
    /// Time of `fraction` (0..=1) of the node's rows on `device`.
    fn node_time(&self, q: &NodeCostQuery<'_>, device: Device, fraction: f64) -> f64;
    /// Time to move `bytes` to `to` (upload when `to` is the GPU, download otherwise).
    fn transfer_time(&self, bytes: u64, to: Device) -> f64;
    /// Fixed cost of one CPU-GPU synchronisation (submit + map + wait).
    fn sync_time(&self) -> f64;
}
