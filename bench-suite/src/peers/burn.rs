//! burn as a peer: burn-onnx (burn-import) generates Rust code per model at build time, run on
//! burn's CPU backend (ndarray) and its wgpu backend on the same Vulkan adapter as tandem. The
//! build takes ~30 min and 2 GB here, so it sits behind the cargo feature `burn` and stays out
//! of CI.
//!
//! Sits between the suite and burn. Status: the feature is a scaffold: it compiles without burn
//! and reports every burn row as not built, naming what is missing (the generated model
//! modules and the burn dependencies); see docs/bench.md.

use crate::schema::Row;

/// Why burn rows are absent from this build.
pub const MISSING: &str = "burn rows need burn-import code generated per model (a build.rs \
    over models/manifest.json) and the burn ndarray/wgpu backends as dependencies of the \
    `burn` feature; neither is in this build (docs/bench.md)";

/// burn's rows for one model: none without the `burn` feature; with it, rows saying what is
/// missing until the generated models land.
pub fn bench(_model: &str) -> Vec<Row> {
    if cfg!(feature = "burn") {
        ["burn-ndarray", "burn-wgpu"]
            .iter()
            .map(|rt| {
                let placement = if *rt == "burn-wgpu" { "gpu" } else { "cpu" };
                Row::failed(rt, placement, "0.22", MISSING.into())
            })
            .collect()
    } else {
        Vec::new()
    }
}
