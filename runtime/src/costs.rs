//! The interface between the scheduler and the cost model: predicted times of nodes on each
//! device and of the transfers between them.
//!
//! Sits between `schedule.rs` (which only asks questions through [`Costs`]) and `cost/` (the
//! learned, persisted model that answers them). Frozen cost tables in tests implement it too.

use crate::plan::Device;
use tandem_ops::{DType, Work};

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
