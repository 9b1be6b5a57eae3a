//! tandem's rows: one session per (model, placement), timed cold and under the run rule, with
//! where each node ran, time per op type, the plan's prediction and the timeline of the median
//! run. `run` measures each in a child process of its own (`tandem_process.rs`).
//!
//! Sits between the public `tandem` API (`Session`, `RunReport`, `Gpu::pooled_bytes`) and the
//! report schema.

use crate::interleave::child_slices;
use crate::machine::{peak_rss_mib, reset_peak_rss};
use crate::models::{max_abs_diff, Named};
use crate::schema::{AfterPause, Cold, NodeSummary, OpTime, Row, Settle, Span};
use crate::stats::{Latency, Method, RunRule, Timed};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;
use tandem::gpu::{AdapterDesc, Gpu, GpuOptions};
use tandem::report::Ran;
use tandem::schedule::Policy;
use tandem::{Device, Placement, RunReport, Session, SessionOptions};

/// A placement as the suite names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    Cpu,
    Gpu,
    /// `auto` with row splits (HEFT+split, the default).
    Auto,
    /// `auto` without row splits (HEFT).
    AutoNoSplit,
}

impl Variant {
    pub const ALL: [Variant; 4] = [
        Variant::Cpu,
        Variant::Gpu,
        Variant::Auto,
        Variant::AutoNoSplit,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Variant::Cpu => "cpu",
            Variant::Gpu => "gpu",
            Variant::Auto => "auto",
            Variant::AutoNoSplit => "auto-nosplit",
        }
    }

    /// True when the row opens the GPU adapter.
    pub fn uses_gpu(self) -> bool {
        self != Variant::Cpu
    }

    /// Parse `cpu`, `gpu`, `auto`, `auto-nosplit`.
    pub fn parse(s: &str) -> Option<Variant> {
        Variant::ALL.into_iter().find(|v| v.name() == s)
    }

    fn options(self, threads: usize, pin: bool, gpu: Option<Arc<Gpu>>) -> SessionOptions {
        let mut o = SessionOptions::default()
            .cpu_threads(threads)
            .pin_threads(pin);
        if let (true, Some(g)) = (self.uses_gpu(), gpu) {
            o = o.gpu(g);
        }
        match self {
            Variant::Cpu => o.placement(Placement::Cpu),
            Variant::Gpu => o.placement(Placement::Gpu),
            Variant::Auto => o.placement(Placement::Auto).policy(Policy::HeftSplit),
            Variant::AutoNoSplit => o.placement(Placement::Auto).policy(Policy::Heft),
        }
    }
}

/// `f`'s result, or its panic as an error (`panicked: ...`): a row fails, the suite goes on.
pub fn caught<T>(f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    catch_unwind(AssertUnwindSafe(f))
        .unwrap_or_else(|p| Err(format!("panicked: {}", panic_text(p))))
}

/// The text of a caught panic payload.
fn panic_text(p: Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-text panic".into())
}

/// Where a row runs: its placement and, for rows using the GPU, the adapter the row opens
/// (`None`: the one tandem picks). `suffix` tells rows of extra adapters apart (`@Gl`).
#[derive(Clone, Copy)]
pub struct Target<'a> {
    pub variant: Variant,
    pub adapter: Option<&'a AdapterDesc>,
    pub suffix: &'a str,
}

impl Target<'_> {
    /// The row's placement label: `gpu`, `auto@Gl`.
    pub fn placement(&self) -> String {
        format!("{}{}", self.variant.name(), self.suffix)
    }
}

/// Measure `model` on `target` under `rule` and `method` (threads, slices, runs after a
/// pause, pinning); never panics (a failure is a row with `error` set). The timed runs
/// interleave with the round's other rows' over stdin and stdout (`interleave.rs`: a slice
/// each, or the whole rule at once). `tick(done)` reports timed iterations (progress bars).
pub fn bench(
    model: &Path,
    inputs: &Named,
    reference: Option<&Named>,
    target: Target,
    rule: &RunRule,
    method: &Method,
    tick: &mut dyn FnMut(usize),
) -> Row {
    let version = env!("CARGO_PKG_VERSION");
    let placement = target.placement();
    caught(|| bench_inner(model, inputs, reference, target, rule, method, tick))
        .unwrap_or_else(|e| Row::failed("tandem", &placement, version, e))
}

fn bench_inner(
    model: &Path,
    inputs: &Named,
    reference: Option<&Named>,
    target: Target,
    rule: &RunRule,
    method: &Method,
    tick: &mut dyn FnMut(usize),
) -> Result<Row, String> {
    reset_peak_rss();
    let args: Vec<(&str, tandem::Tensor)> = inputs
        .iter()
        .map(|(n, t)| (n.as_str(), t.clone()))
        .collect();
    // The runs share these with the row, which passes them again to each run (as the
    // onnxruntime driver passes its arrays): `Session::run` would copy them every time.
    let shared = shared(&args);
    let t = Instant::now();
    let variant = target.variant;
    // The device is opened inside the timed load, as a session opens its own by default.
    let gpu = match target.adapter.filter(|_| variant.uses_gpu()) {
        Some(d) => Some(Arc::new(
            Gpu::open_adapter(d, GpuOptions::default()).map_err(|e| format!("load: {e}"))?,
        )),
        None => None,
    };
    let session = Session::new(
        model,
        variant.options(method.threads, method.pin_threads, gpu),
    )
    .map_err(|e| format!("load: {e}"))?;
    let load_ms = t.elapsed().as_secs_f64() * 1e3;
    let t = Instant::now();
    let (outs, _) = session
        .run_with_report_owned(shared.clone())
        .map_err(|e| format!("first run: {e}"))?;
    let first_run_ms = t.elapsed().as_secs_f64() * 1e3;
    // The first plan's prediction, from the profile as this process found it (the plan in use
    // at the end may be a re-plan made from the row's own runs).
    let first_predicted = session.plan(&args).ok().and_then(|p| p.predicted);
    let mut row = Row::failed(
        "tandem",
        &target.placement(),
        env!("CARGO_PKG_VERSION"),
        String::new(),
    );
    row.error = None;
    row.adapter = session.gpu().map(|g| {
        let d = g.adapter();
        format!("{} ({})", d.name, d.backend)
    });
    row.notes.extend(session.warnings().iter().cloned());
    if let Some(want) = reference {
        match max_abs_diff(&outs, want) {
            Ok(d) => row.max_abs_diff = Some(d),
            Err(e) => row.notes.push(format!("outputs not compared: {e}")),
        }
    }
    drop(outs);
    let settle = match variant {
        Variant::Auto | Variant::AutoNoSplit => {
            Some(settle(&session, &args, &shared, rule.max_secs)?)
        }
        Variant::Cpu | Variant::Gpu => None,
    };
    // Timed runs as an application makes them (`Session::run`: GPU nodes timed only on the
    // runs the cost model learns from; timestamps around every pass slowed runs of many short
    // kernels 0.65-0.96x on a lent H200). Where the time went comes from REPORTED runs after
    // them, with every GPU node timed: the one of median total.
    let mut timed = Timed::new(*rule);
    let mut run = |args| {
        session
            .run_owned(args)
            .map(drop)
            .map_err(|e| format!("run: {e}"))
    };
    child_slices(
        &mut timed,
        method.slice,
        &mut || shared.clone(),
        &mut run,
        &mut |n| tick(n),
    )?;
    let samples = timed.samples_ms;
    let latency = Latency::from_samples(samples, rule);
    let paused = (method.pause.measure(|| shared.clone(), &mut run))
        .map_err(|e| format!("{e} (a run after a pause)"))?;
    row.after_pause = AfterPause::from_samples(method.pause.ms, paused);
    if latency.capped {
        row.notes.push(format!(
            "capped at {:.0} s after {} runs",
            rule.max_secs, latency.iterations
        ));
    }
    let mut reports = Vec::with_capacity(REPORTED);
    for _ in 0..REPORTED {
        let (_, r) =
            (session.run_with_report_owned(shared.clone())).map_err(|e| format!("run: {e}"))?;
        reports.push(r);
    }
    reports.sort_by_key(|r| r.total);
    if let Some(r) = reports.get(REPORTED / 2) {
        row.nodes = Some(node_summary(r));
        row.op_times = op_times(r);
        row.timeline = timeline(r);
        let mut why: Vec<String> = r
            .fallbacks()
            .map(|n| {
                format!(
                    "{} not on gpu: {}",
                    n.op_type,
                    n.fallback.as_deref().unwrap_or("")
                )
            })
            .collect();
        why.sort();
        why.dedup();
        row.notes.extend(why);
    }
    row.predicted_ms = first_predicted.map(|s| s * 1e3);
    row.gpu_buffers_mib = session
        .gpu()
        .map(|g| g.pooled_bytes() as f64 / (1024.0 * 1024.0));
    row.cold = Some(Cold {
        load_ms,
        first_run_ms,
        settle,
    });
    row.throughput_per_s = Some(latency.throughput());
    row.latency = Some(latency);
    row.peak_rss_mib = peak_rss_mib();
    // After the peak is read: a fresh plan folds the model's constants again (the light zoo's
    // ConstantOfShape weights, hundreds of MB in vgg19), which is no part of running it.
    if row.predicted_ms.is_some() {
        if let Ok(plan) = session.plan_now(&args) {
            row.predicted_now_ms = plan.predicted.map(|s| s * 1e3);
        }
        // What the runs taught goes back to the profile, as `tandem run` saves it: the next
        // round's first plan (and the next process's) starts from it.
        if let Err(e) = session.save_cost_profile() {
            row.notes
                .push(format!("what the runs taught is not saved: {e}"));
        }
    }
    Ok(row)
}

/// `args` as tensors a caller shares with every run ([`Session::run_owned`] reads them in place).
fn shared<'a>(args: &[(&'a str, tandem::Tensor)]) -> Vec<(&'a str, Arc<tandem::Tensor>)> {
    (args.iter())
        .map(|(n, t)| (*n, Arc::new(t.clone())))
        .collect()
}

/// Runs after the timed ones whose reports (every GPU node timed) give a row's placement
/// counts, op times and timeline: the one of median total.
const REPORTED: usize = 5;

/// Runs in a row on one placement after which an `auto` row's timed runs begin.
pub const SETTLED_RUNS: usize = 8;

/// Run an `auto` session, untimed, until [`SETTLED_RUNS`] runs in a row kept one placement, or
/// `cap_secs` passed. The session refines its cost model from each run and re-plans after
/// `tandem::session::REPLAN_AFTER` runs that missed the prediction; a re-plan that moves nodes to
/// the GPU compiles their pipelines in the run after it. Timed, those runs were the steady
/// state's p90 (lent H200, 2026-12-04: vgg19's runs 34, 33, 322, 19 ms in each round). The
/// runs read `shared` in place, as the timed ones do; plans read `args`, the same tensors.
fn settle(
    session: &Session,
    args: &[(&str, tandem::Tensor)],
    shared: &[(&str, Arc<tandem::Tensor>)],
    cap_secs: f64,
) -> Result<Settle, String> {
    let t = Instant::now();
    let plan_now = || session.plan(args).map_err(|e| format!("settling: {e}"));
    let mut plan = plan_now()?;
    let (mut runs, mut held, mut placement_changes) = (0, 0, 0);
    while held < SETTLED_RUNS && t.elapsed().as_secs_f64() < cap_secs {
        (session.run_owned(shared.to_vec())).map_err(|e| format!("settling: {e}"))?;
        runs += 1;
        // A stale plan is re-built here rather than in the next run.
        let next = plan_now()?;
        if next.same_placement(&plan) {
            held += 1;
        } else {
            placement_changes += 1;
            held = 0;
        }
        plan = next;
    }
    Ok(Settle {
        runs,
        ms: t.elapsed().as_secs_f64() * 1e3,
        placement_changes,
        held: held >= SETTLED_RUNS,
    })
}

/// Node counts by where they ran and each device's share of the summed node time.
pub fn node_summary(r: &RunReport) -> NodeSummary {
    let mut s = NodeSummary::default();
    let (mut cpu_t, mut gpu_t, mut split_t) = (0.0, 0.0, 0.0);
    for n in &r.nodes {
        let t = n.time.as_secs_f64();
        match n.ran {
            Ran::On(Device::Cpu) => {
                s.cpu += 1;
                cpu_t += t;
            }
            Ran::On(Device::Gpu) => {
                s.gpu += 1;
                gpu_t += t;
            }
            Ran::Split { .. } => {
                s.split += 1;
                split_t += t + n.gpu_time.map_or(0.0, |g| g.as_secs_f64());
            }
            Ran::View => s.view += 1,
            Ran::Folded => s.folded += 1,
        }
        s.fallbacks += n.fallback.is_some() as usize;
    }
    let total = (cpu_t + gpu_t + split_t).max(1e-12);
    s.cpu_time_share = cpu_t / total;
    s.gpu_time_share = gpu_t / total;
    s.split_time_share = split_t / total;
    s
}

/// Summed node time per op type, largest first (split nodes count both halves).
pub fn op_times(r: &RunReport) -> Vec<OpTime> {
    let mut by: Vec<OpTime> = Vec::new();
    for n in &r.nodes {
        if matches!(n.ran, Ran::View | Ran::Folded) {
            continue;
        }
        let ms = (n.time + n.gpu_time.unwrap_or_default()).as_secs_f64() * 1e3;
        match by.iter_mut().find(|o| *o.op == *n.op_type) {
            Some(o) => {
                o.count += 1;
                o.ms += ms;
            }
            None => by.push(OpTime {
                op: n.op_type.to_string(),
                count: 1,
                ms,
            }),
        }
    }
    by.sort_by(|a, b| b.ms.total_cmp(&a.ms));
    by
}

/// The run as lanes of spans (what `tandem::trace::chrome_trace` writes, as data).
pub fn timeline(r: &RunReport) -> Vec<Span> {
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    let mut spans = Vec::new();
    for n in &r.nodes {
        let mut push = |lane: &str, dur: f64| {
            spans.push(Span {
                lane: lane.into(),
                name: n.name.to_string(),
                op: n.op_type.to_string(),
                start_ms: ms(n.start),
                dur_ms: dur,
            })
        };
        match n.ran {
            Ran::On(Device::Cpu) => push("cpu", ms(n.time)),
            Ran::On(Device::Gpu) => push("gpu", ms(n.time)),
            Ran::Split { .. } => {
                push("cpu", ms(n.time));
                push("gpu", n.gpu_time.map_or(0.0, ms));
            }
            Ran::View | Ran::Folded => {}
        }
    }
    for t in &r.transfers {
        spans.push(Span {
            lane: "transfer".into(),
            name: format!(
                "{} {} B",
                if t.to == Device::Gpu {
                    "upload"
                } else {
                    "download"
                },
                t.bytes
            ),
            op: "transfer".into(),
            start_ms: ms(t.start),
            dur_ms: ms(t.time),
        });
    }
    spans
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;
    use tandem::cost::CostModel;
    use tandem::fuzzgen::{tensor_proto, value_info};
    use tandem::import::proto::*;
    use tandem::{DType, Tensor};

    /// y = x [256, 512] @ W [512, 512]: 134 MFLOP, a few ms on the CPU and about 100 ms on
    /// lavapipe, so a CPU run slowed by other tests' load (a 64 x 256 x 256 product was, into
    /// looking slower than lavapipe: 1 CI run in 6) cannot teach the model otherwise.
    fn matmul_model() -> Vec<u8> {
        let w = Tensor::f32(
            &[512, 512],
            (0..512 * 512).map(|i| (i % 7) as f32 * 0.01).collect(),
        );
        ModelProto {
            ir_version: 8,
            opset_import: vec![OperatorSetIdProto {
                domain: String::new(),
                version: 17,
            }],
            graph: Some(GraphProto {
                node: vec![NodeProto {
                    input: vec!["x".into(), "W".into()],
                    output: vec!["y".into()],
                    name: "mm".into(),
                    op_type: "MatMul".into(),
                    ..Default::default()
                }],
                name: "mm".into(),
                initializer: vec![tensor_proto("W", &w)],
                input: vec![value_info("x", DType::F32, &[256, 512])],
                output: vec![value_info("y", DType::F32, &[256, 512])],
                ..Default::default()
            }),
            ..Default::default()
        }
        .encode_to_vec()
    }

    /// A cost model that believes MatMul runs at `cpu_flops` on the CPU and 1 TFLOP/s on the
    /// GPU: a plan made from it puts the product on lavapipe (about 1 GFLOP/s), and the runs
    /// that miss teach it otherwise.
    fn gpu_believed_fast(gpu: &Gpu, cpu_flops: f64) -> CostModel {
        let mut model = tandem::testing::matmul_believed(gpu, 2, 1.0 / cpu_flops, 1e-12);
        // GPU node times are learnt from timestamp queries, which lavapipe has.
        assert!(gpu.has_timestamps(), "{:?}", gpu.adapter());
        model.gpu_timestamps = true;
        model
    }

    #[test]
    fn settling_runs_until_the_placement_held_and_counts_the_moves() {
        let gpu = Arc::new(Gpu::new().unwrap_or_else(|e| {
            panic!("no GPU adapter ({e}); install lavapipe: apt-get install mesa-vulkan-drivers")
        }));
        let bytes = matmul_model();
        let options = Variant::Auto
            .options(2, false, Some(gpu.clone()))
            .cost_model(Arc::new(gpu_believed_fast(&gpu, 1e11)));
        let session = Session::new(bytes.as_slice(), options).unwrap();
        let x = Tensor::f32(
            &[256, 512],
            (0..256 * 512).map(|i| (i % 5) as f32).collect(),
        );
        let args = [("x", x)];
        let on_gpu =
            |p: &tandem::plan::Plan| p.steps.iter().any(|s| s.device() == Some(Device::Gpu));
        assert!(
            on_gpu(&session.plan(&args).unwrap()),
            "the first plan believes the GPU"
        );
        session.run(&args).unwrap();
        let s = settle(&session, &args, &shared(&args), 60.0).unwrap();
        assert!(s.held, "{s:?}");
        assert!(s.runs >= SETTLED_RUNS, "{s:?}");
        // The product moved to the CPU once lavapipe's times were learnt.
        assert!(s.placement_changes >= 1, "{s:?}");
        let settled = session.plan(&args).unwrap();
        assert!(!on_gpu(&settled), "{s:?}");
        // The timed runs keep that placement.
        for _ in 0..SETTLED_RUNS {
            session.run(&args).unwrap();
            assert!(session.plan(&args).unwrap().same_placement(&settled));
        }
    }

    #[test]
    fn settling_stops_at_its_cap() {
        let gpu = Arc::new(Gpu::new().unwrap());
        let bytes = matmul_model();
        let options = Variant::Auto
            .options(2, false, Some(gpu.clone()))
            .cost_model(Arc::new(gpu_believed_fast(&gpu, 1e11)));
        let session = Session::new(bytes.as_slice(), options).unwrap();
        let args = [("x", Tensor::f32(&[256, 512], vec![1.0; 256 * 512]))];
        session.run(&args).unwrap();
        let s = settle(&session, &args, &shared(&args), 0.0).unwrap();
        assert_eq!((s.runs, s.held), (0, false), "{s:?}");
    }
}
