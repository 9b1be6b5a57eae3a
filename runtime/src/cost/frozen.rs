//! A fixed cost table implementing [`Costs`], for scheduler golden tests: no measurement, no
//! GPU, fully predictable answers.
//!
//! Sits between tests (which build it by hand) and the scheduler (which asks through `Costs`).

use super::{Coeffs, Line};
use crate::costs::{Costs, NodeCostQuery};
use crate::plan::Device;
use std::collections::HashMap;

/// Per (op type, device) coefficients with a default per device; dtype is ignored. Node time is
/// `per_flop*flops*f + per_byte*bytes*f + fixed` for a fraction `f > 0` of the rows, 0 for `f = 0`.
#[derive(Debug, Clone)]
pub struct FrozenCosts {
    pub ops: HashMap<(String, Device), Coeffs>,
    pub cpu_default: Coeffs,
    pub gpu_default: Coeffs,
    pub upload: Line,
    pub download: Line,
    pub sync: f64,
}

impl FrozenCosts {
    /// CPU 10 GFLOP/s and 10 GB/s with 1 us fixed; GPU 100 GFLOP/s and 50 GB/s with 20 us
    /// fixed; links 10 us + 10 GB/s each way; sync 50 us.
    pub fn new() -> FrozenCosts {
        FrozenCosts {
            ops: HashMap::new(),
            cpu_default: Coeffs {
                per_flop: 1e-10,
                per_byte: 1e-10,
                fixed: 1e-6,
            },
            gpu_default: Coeffs {
                per_flop: 1e-11,
                per_byte: 2e-11,
                fixed: 2e-5,
            },
            upload: Line {
                latency: 1e-5,
                seconds_per_byte: 1e-10,
            },
            download: Line {
                latency: 1e-5,
                seconds_per_byte: 1e-10,
            },
            sync: 5e-5,
        }
    }

    /// Set the coefficients of `op` on `device`.
    pub fn with_op(mut self, op: &str, device: Device, c: Coeffs) -> FrozenCosts {
        self.ops.insert((op.to_string(), device), c);
        self
    }
}

impl Default for FrozenCosts {
    fn default() -> FrozenCosts {
        FrozenCosts::new()
    }
}

impl Costs for FrozenCosts {
    fn node_time(&self, q: &NodeCostQuery<'_>, device: Device, fraction: f64) -> f64 {
        if fraction <= 0.0 {
            return 0.0;
        }
        let f = fraction.min(1.0);
        let c = self
            .ops
            .get(&(q.op_type.to_string(), device))
            .unwrap_or(match device {
                Device::Cpu => &self.cpu_default,
                Device::Gpu => &self.gpu_default,
            });
        c.time(
            q.flops_on(device, f),
            (q.work.bytes_read + q.work.bytes_written) as f64 * f,
        )
    }

    fn transfer_time(&self, bytes: u64, to: Device) -> f64 {
        match to {
            Device::Gpu => self.upload.time(bytes),
            Device::Cpu => self.download.time(bytes),
        }
    }

    fn sync_time(&self) -> f64 {
        self.sync
    }
}
