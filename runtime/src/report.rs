//! What a run did: per node, where it ran, how long it took, and why it is not where the policy
//! asked; plus transfer counts and the GPU faults the run met and survived.
//!
//! Sits between the executor (which fills it) and callers (the CLI prints it, the cost model
//! learns from it).

use crate::plan::Device;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// Where a node's result came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ran {
    On(Device),
    /// Output aliases its input (Reshape, Squeeze...): nothing ran.
    View,
    /// Evaluated once at plan time from constants.
    Folded,
    /// Rows `0..cut` on the CPU and `cut..rows` on the GPU, at the same time.
    Split {
        cut: usize,
        rows: usize,
    },
}

impl fmt::Display for Ran {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Ran::On(d) => write!(f, "{d}"),
            Ran::View => f.write_str("view"),
            Ran::Folded => f.write_str("folded"),
            Ran::Split { cut, rows } => write!(f, "split {cut}/{rows}"),
        }
    }
}

#[derive(Debug, Clone)]
pub struct NodeReport {
    pub name: Arc<str>,
    /// When it started, from the start of the run (GPU nodes: placed on the host clock from
    /// their batch's submit time and timestamp offsets).
    pub start: Duration,
    pub op_type: Arc<str>,
    pub ran: Ran,
    /// Measured time: CPU wall time, or GPU time (timestamp queries where the adapter has them,
    /// else the batch's wall time shared by the batch's dispatches).
    pub time: Duration,
    /// GPU time of the GPU rows of a split node (its `time` is the CPU rows' time).
    pub gpu_time: Option<Duration>,
    /// Why the node is not on the device the policy asked for.
    pub fallback: Option<String>,
}

/// A copy between host and GPU memory.
#[derive(Debug, Clone)]
pub struct Transfer {
    /// Where the data went.
    pub to: Device,
    pub bytes: u64,
    pub start: Duration,
    pub time: Duration,
}

/// What kind of GPU failure a run met.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// The device was lost (driver reset, destroyed, or a wait that never finished).
    DeviceLost,
    /// A buffer could not be created: the driver's memory or the device's cap.
    OutOfMemory,
    /// A shader module or compute pipeline failed to build.
    PipelineCreation,
    /// A tensor or a dispatch over the adapter's limits.
    AdapterLimit,
    /// The session's `max_gpu_memory` kept the node off the GPU.
    MemoryCap,
    /// Any other GPU error (a batch that failed validation, a failed readback).
    Other,
}

impl FaultKind {
    /// The kind of a GPU error message of this crate; `lost` when the device is known lost.
    pub fn classify(reason: &str, lost: bool) -> FaultKind {
        if lost || reason.contains(" lost") {
            FaultKind::DeviceLost
        } else if reason.contains("out of memory") {
            FaultKind::OutOfMemory
        } else if reason.contains("pipeline creation") {
            FaultKind::PipelineCreation
        } else if reason.contains("GPU memory cap") {
            FaultKind::MemoryCap
        } else if reason.contains("limit") || reason.contains("workgroups") {
            FaultKind::AdapterLimit
        } else {
            FaultKind::Other
        }
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FaultKind::DeviceLost => "device lost",
            FaultKind::OutOfMemory => "out of memory",
            FaultKind::PipelineCreation => "pipeline creation failed",
            FaultKind::AdapterLimit => "adapter limit",
            FaultKind::MemoryCap => "GPU memory cap",
            FaultKind::Other => "GPU error",
        })
    }
}

/// A GPU failure a run met and what the runtime did about it.
#[derive(Debug, Clone)]
pub struct GpuFault {
    pub kind: FaultKind,
    /// The node being run when it happened (`None`: between nodes, e.g. while waiting).
    pub node: Option<String>,
    pub reason: String,
    /// What was done (e.g. "ran on the CPU", "recomputed 3 nodes on the CPU").
    pub action: String,
}

/// `text` on one line: runs of whitespace (driver messages span lines) become one space.
pub fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

impl GpuFault {
    /// A fault classified from `reason` (`lost`: the device is known lost), written to the log
    /// (stderr) as it is made.
    pub fn logged(node: Option<&str>, reason: &str, lost: bool, action: &str) -> GpuFault {
        let fault = GpuFault {
            kind: FaultKind::classify(reason, lost),
            node: node.map(str::to_string),
            reason: one_line(reason),
            action: action.to_string(),
        };
        eprintln!("tandem: {fault}");
        fault
    }
}

impl fmt::Display for GpuFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "gpu fault ({})", self.kind)?;
        if let Some(n) = &self.node {
            write!(f, " at node `{n}`")?;
        }
        write!(f, ": {}; {}", self.reason, self.action)
    }
}

#[derive(Debug, Clone, Default)]
pub struct RunReport {
    pub nodes: Vec<NodeReport>,
    pub transfers: Vec<Transfer>,
    pub total: Duration,
    pub uploads: usize,
    pub upload_bytes: u64,
    pub downloads: usize,
    pub download_bytes: u64,
    pub gpu_submits: usize,
    /// GPU failures met during the run, in order, each also written to the log (stderr).
    pub faults: Vec<GpuFault>,
    /// How this run was planned when it was not the cached plan (e.g. around another
    /// session's work on a shared GPU).
    pub notes: Vec<String>,
    /// Node name -> label of the nodes fusion made (`Conv+BatchNormalization+Relu`), printed
    /// in place of their op type.
    pub fused: std::sync::Arc<std::collections::HashMap<String, String>>,
    /// The nodes fusion dropped at load for repeating an earlier one (`fuse/repeated.rs`),
    /// counted by op type before the total.
    pub merged: std::sync::Arc<Vec<crate::fuse::repeated::Merged>>,
}

impl RunReport {
    /// Number of nodes that ran on `d`.
    pub fn count(&self, d: Device) -> usize {
        self.nodes.iter().filter(|n| n.ran == Ran::On(d)).count()
    }

    /// Nodes with a fallback reason.
    pub fn fallbacks(&self) -> impl Iterator<Item = &NodeReport> {
        self.nodes.iter().filter(|n| n.fallback.is_some())
    }

    /// One line on the nodes merged at load: how many, then how many of each op type
    /// (`merged at load: 14 node(s) repeated ... (9 Conv, 5 Relu)`).
    pub fn merged_summary(&self) -> String {
        let mut by_op: Vec<(String, usize)> = Vec::new();
        for m in self.merged.iter() {
            match by_op.iter_mut().find(|(o, _)| *o == m.op_type) {
                Some((_, c)) => *c += 1,
                None => by_op.push((m.op_type.clone(), 1)),
            }
        }
        let counts: Vec<String> = by_op.iter().map(|(o, c)| format!("{c} {o}")).collect();
        format!(
            "merged at load: {} node(s) repeated an earlier node's op, attributes and inputs and \
             read its outputs instead ({})",
            self.merged.len(),
            counts.join(", ")
        )
    }

    /// Record a GPU fault (see [`GpuFault::logged`]).
    pub fn record_fault(&mut self, node: Option<&str>, reason: &str, lost: bool, action: &str) {
        self.faults
            .push(GpuFault::logged(node, reason, lost, action));
    }
}

impl fmt::Display for RunReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let w = self
            .nodes
            .iter()
            .map(|n| n.name.len())
            .max()
            .unwrap_or(4)
            .clamp(4, 48);
        writeln!(
            f,
            "{:<w$}  {:<28} {:<6} {:>10}",
            "node", "op", "ran", "time"
        )?;
        for n in &self.nodes {
            let name: String = n.name.chars().take(48).collect();
            write!(
                f,
                "{:<w$}  {:<28} {:<12} {:>10}",
                name,
                self.fused.get(&*n.name).map_or(&*n.op_type, |s| s.as_str()),
                n.ran.to_string(),
                format!("{:.3} ms", n.time.as_secs_f64() * 1e3)
            )?;
            if let Some(g) = n.gpu_time {
                write!(f, "  (gpu rows {:.3} ms)", g.as_secs_f64() * 1e3)?;
            }
            if let Some(r) = &n.fallback {
                write!(f, "  (not on gpu: {r})")?;
            }
            writeln!(f)?;
        }
        for fault in &self.faults {
            writeln!(f, "{fault}")?;
        }
        for note in &self.notes {
            writeln!(f, "note: {note}")?;
        }
        if !self.merged.is_empty() {
            writeln!(f, "{}", self.merged_summary())?;
        }
        write!(
            f,
            "total {:.3} ms: {} nodes on cpu, {} on gpu, {} split, {} views, {} folded; {} uploads ({} B), {} downloads ({} B), {} GPU submits",
            self.total.as_secs_f64() * 1e3,
            self.count(Device::Cpu),
            self.count(Device::Gpu),
            self.nodes.iter().filter(|n| matches!(n.ran, Ran::Split { .. })).count(),
            self.nodes.iter().filter(|n| n.ran == Ran::View).count(),
            self.nodes.iter().filter(|n| n.ran == Ran::Folded).count(),
            self.uploads,
            self.upload_bytes,
            self.downloads,
            self.download_bytes,
            self.gpu_submits
        )
    }
}
