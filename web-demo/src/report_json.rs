//! A run report and its plan as JSON for the page: per node where it ran, when and how long,
//! and what the scheduler predicted for it; plus the GPU's limits and the link costs used.
//!
//! Sits between the runtime's `RunReport` / `Plan` and `session.report()` in JS (the timeline
//! drawing reads it). Times are milliseconds.

use serde_json::{json, Value};
use std::collections::HashMap;
use tandem::cost::CostModel;
use tandem::gpu::Gpu;
use tandem::plan::{Plan, StepKind};
use tandem::report::Ran;
use tandem::{Device, RunReport};

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The report of one run of `plan` (per node: device, start, time, predictions), JSON.
pub fn run_json(graph: &tandem::graph::Graph, plan: &Plan, report: &RunReport) -> Value {
    let steps: HashMap<&str, &tandem::plan::Step> = plan
        .steps
        .iter()
        .map(|s| (graph.nodes[s.node].name.as_str(), s))
        .collect();
    let nodes: Vec<Value> = report
        .nodes
        .iter()
        .map(|n| {
            let (device, cut) = match n.ran {
                Ran::On(Device::Cpu) => ("cpu", None),
                Ran::On(Device::Gpu) => ("gpu", None),
                Ran::Split { cut, rows } => ("split", Some((cut, rows))),
                Ran::View => ("view", None),
                Ran::Folded => ("folded", None),
            };
            let step = steps.get(&*n.name);
            let explain = step.and_then(|s| s.explain.as_ref());
            let gpu_kernels = step.is_some_and(|s| !matches!(s.kind, StepKind::View));
            json!({
                "name": &*n.name,
                "op": &*n.op_type,
                "device": device,
                "cut": cut.map(|(c, r)| json!({"cpuRows": c, "rows": r})),
                "startMs": ms(n.start),
                "timeMs": ms(n.time),
                "gpuTimeMs": n.gpu_time.map(ms),
                "fallback": n.fallback,
                "predicted": explain.map(|e| json!({
                    "cpuMs": e.cpu * 1e3,
                    "gpuMs": e.gpu.map(|g| g * 1e3),
                    "splitMs": e.split.map(|(t, _)| t * 1e3),
                    "why": e.why,
                })),
                "ranKernels": gpu_kernels,
            })
        })
        .collect();
    let transfers: Vec<Value> = report
        .transfers
        .iter()
        .map(|t| {
            json!({
                "to": if t.to == Device::Gpu { "gpu" } else { "cpu" },
                "bytes": t.bytes,
                "startMs": ms(t.start),
                "timeMs": ms(t.time),
            })
        })
        .collect();
    json!({
        "totalMs": ms(report.total),
        "predictedMs": plan.predicted.map(|p| p * 1e3),
        "nodes": nodes,
        "transfers": transfers,
        "gpuSubmits": report.gpu_submits,
        "uploads": report.uploads,
        "downloads": report.downloads,
    })
}

/// The GPU as the page sees it: adapter, the limits tandem plans with, features it asked for.
pub fn gpu_json(gpu: &Gpu) -> Value {
    let l = gpu.limits();
    json!({
        "adapter": gpu.adapter().to_string(),
        "maxStorageBufferBindingSize": l.max_storage_buffer_binding_size,
        "maxBufferSize": l.max_buffer_size,
        "maxComputeWorkgroupsPerDimension": l.max_compute_workgroups_per_dimension,
        "timestampQuery": gpu.has_timestamps(),
        // tandem's shaders are f32 only: shader-f16 is never requested.
        "shaderF16Requested": false,
    })
}

/// The link costs `auto` plans with (measured in this browser when a GPU was opened).
pub fn links_json(costs: &CostModel) -> Value {
    let l = &costs.links;
    json!({
        "syncMs": l.sync * 1e3,
        "uploadGBps": 1e-9 / l.upload.seconds_per_byte.max(1e-18),
        "downloadGBps": 1e-9 / l.download.seconds_per_byte.max(1e-18),
    })
}
