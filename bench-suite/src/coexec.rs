//! `tandem-bench coexec`: the hybrid scheduler's four benchmarks on the two-device test bed (a
//! 1-thread CPU pool next to lavapipe with `LP_NUM_THREADS=1`, so each device owns a core), all
//! from one run and one freshly calibrated cost model:
//! (a) MatMul, Gemm and Conv layers: measured time of the best cut of a 0%, 5%, ..., 100% GPU
//!     grid / measured time of the cut the scheduler chose (1 = the scheduler found the best);
//! (b) every model of `models/manifest.json`: auto / min(cpu-only, gpu-only), medians;
//! (c) the cost model's share of held-out predictions within +-10% (this run's calibration);
//! (d) runtime overhead per node on a 1000-node elementwise chain on the CPU: (session run -
//!     a tight loop calling the same kernels) / nodes.
//!
//! Sits between the runtime (`cost::calibrate`, `plan::build`, `exec::execute`, `Session`) and
//! the command line; prints the tables and optionally writes them as JSON.

use crate::stats::{geomean, measure, RunRule};
use anyhow::{anyhow, Context, Result};
use prost::Message;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tandem::cost::calibrate::calibrate_on_threads;
use tandem::cost::{CalibrationOptions, CostModel};
use tandem::exec::{self, GpuConstants};
use tandem::gpu::Gpu;
use tandem::graph::{Graph, Node, Value};
use tandem::import::proto::*;
use tandem::plan::{self, Plan, Request, StepKind};
use tandem::schedule::Policy;
use tandem::{DType, Device, Placement, Session, SessionOptions, Tensor, TensorMeta};
use tandem_ops::{AttrValue, Attrs};

/// Arguments of `tandem-bench coexec`.
#[derive(clap::Args)]
pub struct Args {
    /// Calibration budget, seconds (the held-out share (c) is this calibration's).
    #[arg(long = "budget-s", default_value_t = 60.0)]
    pub budget_s: f64,
    /// The models folder with manifest.json.
    #[arg(long, default_value = "models")]
    pub models_dir: PathBuf,
    /// Only models whose name contains one of these (default: all of the manifest).
    #[arg(long)]
    pub models: Vec<String>,
    /// Most seconds of timed GPU-only runs per model (lavapipe runs vgg19 for seconds).
    #[arg(long = "gpu-cap-s", default_value_t = 8.0)]
    pub gpu_cap_s: f64,
    /// Parts to skip: layers, models, overhead.
    #[arg(long)]
    pub skip: Vec<String>,
    /// Write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

impl crate::Subcommand for Args {
    fn main(self) -> Result<()> {
        run(&self)
    }
}

/// The test bed: lavapipe with one worker thread. Must happen before the GPU opens.
fn one_lavapipe_thread() {
    if std::env::var_os("LP_NUM_THREADS").is_none() {
        std::env::set_var("LP_NUM_THREADS", "1");
    }
}

/// Run all parts; see the module doc.
pub fn run(a: &Args) -> Result<()> {
    one_lavapipe_thread();
    let gpu = Arc::new(Gpu::new().context("coexec needs a GPU adapter (lavapipe here)")?);
    let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build()?;
    eprintln!(
        "test bed: CPU pool 1 thread, {} with LP_NUM_THREADS={}",
        gpu.adapter(),
        std::env::var("LP_NUM_THREADS").unwrap_or_default()
    );
    let opts = CalibrationOptions {
        budget: Duration::from_secs_f64(a.budget_s),
        ..Default::default()
    };
    let (model, report) = calibrate_on_threads(Some(&gpu), 1, &opts, &mut |_| {});
    println!("{report}");
    let model = Arc::new(model);
    let mut out = json!({
        "test_bed": {"cpu_threads": 1, "adapter": gpu.adapter().to_string(),
                     "lp_num_threads": std::env::var("LP_NUM_THREADS").ok()},
        "accuracy": {"within_10": report.overall_within_10, "samples": report.samples},
    });
    println!(
        "(c) cost model: {:.0}% of held-out predictions within +-10%",
        report.overall_within_10 * 100.0
    );
    let skip = |p: &str| a.skip.iter().any(|s| s == p);
    if !skip("layers") {
        out["layers"] = layers(&gpu, &pool, &model)?;
    }
    if !skip("models") {
        out["models"] = models(a, &gpu, &model)?;
    }
    if !skip("overhead") {
        out["overhead"] = overhead()?;
    }
    if let Some(p) = &a.json {
        std::fs::write(p, serde_json::to_string_pretty(&out)?)?;
        eprintln!("wrote {}", p.display());
    }
    Ok(())
}

fn fill(shape: &[usize], seed: usize) -> Tensor {
    let n: usize = shape.iter().product();
    let v = (0..n)
        .map(|i| ((i * 7 + seed * 13) % 29) as f32 / 29.0 - 0.5)
        .collect();
    Tensor::f32(shape, v)
}

/// A one-node graph: input `x`, constant `weights` (laid out as a `Session` lays
/// them out, `tandem::layout`), output `y`.
fn one_node(op_type: &str, attrs: &Attrs, weights: Vec<Tensor>) -> Result<Graph> {
    let op = tandem_ops::registry::build(op_type, attrs).map_err(|e| anyhow!("{op_type}: {e}"))?;
    let value = |name: String, constant: Option<Tensor>| Value {
        name,
        dtype: Some(DType::F32),
        shape: None,
        constant: constant.map(Arc::new),
    };
    let mut values = vec![value("x".into(), None)];
    for (i, w) in weights.into_iter().enumerate() {
        values.push(value(format!("w{i}"), Some(w)));
    }
    let y = values.len();
    values.push(value("y".into(), None));
    let mut graph = Graph {
        nodes: vec![Node {
            name: op_type.to_lowercase(),
            op_type: op_type.into(),
            domain: String::new(),
            opset: attrs.opset,
            inputs: (0..y).map(Some).collect(),
            outputs: vec![y],
            op,
            attributes: None,
        }],
        values,
        inputs: vec![0],
        outputs: vec![y],
    };
    tandem::layout::store_weights(&mut graph);
    Ok(graph)
}

/// One benchmark layer: its name, graph and input.
struct Layer {
    name: String,
    graph: Graph,
    x: Tensor,
}

fn layer_suite() -> Result<Vec<Layer>> {
    let mut v = Vec::new();
    for (m, k, n) in [(128, 256, 256), (256, 512, 256), (512, 512, 512)] {
        v.push(Layer {
            name: format!("MatMul {m}x{k}x{n}"),
            graph: one_node("MatMul", &Attrs::new(13), vec![fill(&[k, n], 1)])?,
            x: fill(&[m, k], 2),
        });
    }
    for (m, k, n) in [(64, 512, 512), (256, 768, 768), (512, 1024, 256)] {
        let attrs = Attrs::new(13).with("transB", AttrValue::Int(1));
        v.push(Layer {
            name: format!("Gemm {m}x{k}x{n}"),
            graph: one_node("Gemm", &attrs, vec![fill(&[n, k], 1), fill(&[n], 3)])?,
            x: fill(&[m, k], 2),
        });
    }
    for (c, oc, hw, k) in [(32, 64, 56, 3), (64, 64, 28, 3), (64, 128, 56, 1)] {
        let p = (k / 2) as i64;
        let attrs = Attrs::new(13)
            .with("kernel_shape", AttrValue::Ints(vec![k as i64; 2]))
            .with("pads", AttrValue::Ints(vec![p; 4]));
        v.push(Layer {
            name: format!("Conv {c}x{hw}x{hw} -> {oc}, {k}x{k}"),
            graph: one_node(
                "Conv",
                &attrs,
                vec![fill(&[oc, c, k, k], 1), fill(&[oc], 3)],
            )?,
            x: fill(&[1, c, hw, hw], 2),
        });
    }
    Ok(v)
}

/// `plan` with its single step cut at `cut` (rows `0..cut` on the CPU, the rest on the GPU).
fn with_cut(graph: &Graph, plan: &Plan, cut: usize) -> Result<Plan> {
    let mut p = plan.clone();
    let step = &mut p.steps[0];
    let rows = step.rows.end;
    let node = &graph.nodes[step.node];
    let ins: Vec<&TensorMeta> = step.inputs.iter().collect();
    let gpu_rows = |from: usize| {
        node.op
            .gpu(&ins, &step.outputs, from..rows)
            .map_err(|e| anyhow!("{}: {e}", node.name))
    };
    step.kind = if cut >= rows {
        StepKind::Whole {
            device: Device::Cpu,
            kernels: Vec::new(),
        }
    } else if cut == 0 {
        StepKind::Whole {
            device: Device::Gpu,
            kernels: gpu_rows(0)?,
        }
    } else {
        StepKind::Split {
            cut,
            row_len: step.outputs[0].numel() / rows.max(1),
            kernels: gpu_rows(cut)?,
        }
    };
    step.fallback = None;
    Ok(p)
}

/// Median milliseconds of running `plan` (one untimed warm-up): at least 5 runs and 0.3 s,
/// at most 3 s.
fn time_plan(
    graph: &Graph,
    plan: &Plan,
    gpu: &Gpu,
    pool: &rayon::ThreadPool,
    x: &Tensor,
) -> Result<f64> {
    let constants = GpuConstants::default();
    let cx = exec::Context {
        graph,
        plan,
        gpu: Some(gpu),
        pool,
        constants: &constants,
        node_times: false,
    };
    exec::execute(&cx, vec![x.clone()])?;
    let rule = RunRule {
        min_iters: 5,
        min_secs: 0.3,
        max_secs: 3.0,
    };
    let ms = measure(
        &rule,
        || vec![x.clone()],
        |x| exec::execute(&cx, x).map(|_| ()),
        |_| {},
    )?;
    Ok(median(ms))
}

/// Median milliseconds of two plans run in turns (one untimed warm-up each): at least 9
/// rounds and 0.5 s, at most 6 s.
fn paired(
    graph: &Graph,
    plans: [&Plan; 2],
    gpu: &Gpu,
    pool: &rayon::ThreadPool,
    x: &Tensor,
) -> Result<(f64, f64)> {
    let constants = [GpuConstants::default(), GpuConstants::default()];
    let cx = |i: usize| exec::Context {
        graph,
        plan: plans[i],
        gpu: Some(gpu),
        pool,
        constants: &constants[i],
        node_times: false,
    };
    let mut ms = [Vec::new(), Vec::new()];
    for i in 0..2 {
        exec::execute(&cx(i), vec![x.clone()])?;
    }
    let start = Instant::now();
    while ms[0].len() < 9 || start.elapsed().as_secs_f64() < 0.5 {
        for (i, v) in ms.iter_mut().enumerate() {
            let t = Instant::now();
            exec::execute(&cx(i), vec![x.clone()])?;
            v.push(t.elapsed().as_secs_f64() * 1e3);
        }
        if start.elapsed().as_secs_f64() > 6.0 {
            break;
        }
    }
    let [a, b] = ms;
    Ok((median(a), median(b)))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// (a) chosen cut vs the grid's best, per layer.
fn layers(gpu: &Gpu, pool: &rayon::ThreadPool, model: &CostModel) -> Result<serde_json::Value> {
    println!(
        "\n(a) co-execution: chosen cut vs grid search over 0%, 5%, ..., 100% of rows on the GPU"
    );
    println!(
        "{:<28} {:>6} {:>9} {:>10} {:>9} {:>10} {:>8}",
        "layer", "rows", "chosen", "chosen ms", "grid best", "best ms", "best/ch"
    );
    let mut rows_json = Vec::new();
    let mut worst = f64::INFINITY;
    for l in layer_suite()? {
        let metas = vec![l.x.meta()];
        let request = Request {
            placement: Placement::Auto,
            overrides: &[],
            costs: Some(model),
            policy: Policy::HeftSplit,
            assume_gpu: false,
        };
        let auto = plan::build(&l.graph, &metas, &request, Some(gpu), pool)?;
        let step = &auto.steps[0];
        let rows = step.rows.end;
        let chosen_cut = match &step.kind {
            StepKind::Split { cut, .. } => *cut,
            StepKind::Whole {
                device: Device::Gpu,
                ..
            } => 0,
            _ => rows,
        };
        let mut best = (0u32, f64::INFINITY, rows);
        // Past the point where the GPU's share alone is 3x slower than the best so far, larger
        // shares only get slower (lavapipe is 10-30x slower than the CPU): stop there.
        for pct in (0..=100).step_by(5) {
            let cut = ((rows as f64) * (1.0 - pct as f64 / 100.0)).round() as usize;
            let t = time_plan(&l.graph, &with_cut(&l.graph, &auto, cut)?, gpu, pool, &l.x)?;
            if t < best.1 {
                best = (pct, t, cut);
            }
            if t > 3.0 * best.1 {
                break;
            }
        }
        // The chosen cut against the grid's best, measured in turns so that load from other
        // processes falls on both alike (the same cut: the same plan, ratio 1).
        let (chosen_ms, best_ms) = if best.2 == chosen_cut {
            (best.1, best.1)
        } else {
            let chosen = with_cut(&l.graph, &auto, chosen_cut)?;
            let grid = with_cut(&l.graph, &auto, best.2)?;
            paired(&l.graph, [&chosen, &grid], gpu, pool, &l.x)?
        };
        let best = (best.0, best_ms);
        let ratio = best.1 / chosen_ms;
        worst = worst.min(ratio);
        let pct = 100.0 * (rows - chosen_cut) as f64 / rows as f64;
        println!(
            "{:<28} {:>6} {:>8.1}% {:>10.3} {:>8}% {:>10.3} {:>8.3}",
            l.name, rows, pct, chosen_ms, best.0, best.1, ratio
        );
        rows_json.push(json!({"layer": l.name, "rows": rows, "chosen_gpu_pct": pct,
            "chosen_ms": chosen_ms, "grid_best_gpu_pct": best.0, "grid_best_ms": best.1,
            "best_over_chosen": ratio}));
    }
    println!("(a) worst best/chosen: {worst:.3} (target >= 0.95)");
    Ok(json!({"rows": rows_json, "worst_best_over_chosen": worst}))
}

/// Median ms of a session's runs under `rule` after `warm` untimed runs.
fn time_session(
    s: &Session,
    inputs: &[(&str, Tensor)],
    warm: usize,
    rule: &RunRule,
) -> Result<f64> {
    for _ in 0..warm {
        s.run(inputs)?;
    }
    Ok(median(measure(
        rule,
        || (),
        |()| s.run(inputs).map(|_| ()),
        |_| {},
    )?))
}

/// Sessions per placement in part (b): a session's own state (memory layout, its pool thread)
/// shifts its times by a few percent for as long as it lives, so each placement's time pools
/// several.
const SESSIONS: usize = 4;

/// The order of round `round` over the CPU-only sessions `0..SESSIONS` and the auto sessions
/// `SESSIONS..2 * SESSIONS`: the placements alternate, the leading placement flips every round
/// and the sessions move one position every two rounds, so that over `2 * SESSIONS` rounds
/// every session runs in every position once, and load from other processes and cache state
/// left by the previous run fall on all sessions alike.
fn round_order(round: usize) -> Vec<usize> {
    let mut order = Vec::with_capacity(2 * SESSIONS);
    for j in 0..SESSIONS {
        let k = (j + round / 2) % SESSIONS;
        if round.is_multiple_of(2) {
            order.extend([k, SESSIONS + k]);
        } else {
            order.extend([SESSIONS + k, k]);
        }
    }
    order
}

/// (b) auto vs the best single device, per model of the manifest.
fn models(a: &Args, gpu: &Arc<Gpu>, model: &Arc<CostModel>) -> Result<serde_json::Value> {
    let manifest: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(a.models_dir.join("manifest.json"))
            .context("models/manifest.json (run scripts/setup.sh)")?,
    )?;
    println!(
        "\n(b) models: median ms, CPU 1 thread, lavapipe 1 thread; cpu and auto: geometric mean \
         of {SESSIONS} sessions' medians; A/A = that of the second half of one placement's \
         sessions / the first half's, timed in the same rounds (its distance from 1 is the noise \
         floor)"
    );
    println!(
        "{:<22} {:>10} {:>10} {:>10} {:>10} {:>7} {:>7} {:>6}",
        "model", "cpu", "gpu", "auto", "auto/best", "cpu A/A", "autoA/A", "rounds"
    );
    let mut rows_json = Vec::new();
    let mut worst: f64 = 0.0;
    let mut worst_aa: f64 = 0.0;
    for m in manifest.as_array().into_iter().flatten() {
        let name = m["name"].as_str().unwrap_or_default();
        if !a.models.is_empty() && !a.models.iter().any(|f| name.contains(f.as_str())) {
            continue;
        }
        let path = a.models_dir.join(m["path"].as_str().unwrap_or_default());
        let data = a
            .models_dir
            .join(m["test_data"].as_str().unwrap_or_default());
        let inputs = read_inputs(m, &data)?;
        let named: Vec<(&str, Tensor)> = inputs
            .iter()
            .map(|(n, t)| (n.as_str(), t.clone()))
            .collect();
        let session = |p: Placement| {
            Session::new(
                path.as_path(),
                SessionOptions::default()
                    .placement(p)
                    .cpu_threads(1)
                    .gpu(gpu.clone())
                    .cost_model(model.clone()),
            )
        };
        let slow = RunRule {
            min_iters: 3,
            min_secs: 0.0,
            max_secs: a.gpu_cap_s,
        };
        let gpu_ms = time_session(&session(Placement::Gpu)?, &named, 1, &slow)?;
        // SESSIONS CPU-only and SESSIONS auto sessions run in rounds ([`round_order`]). A/A =
        // the geometric mean of the second half of one placement's sessions over the first
        // half's: the noise floor of comparing two such pools. Auto's first runs, past the
        // WARM_UP_RUNS, refine the cost model on every run (LEARN_FIRST of them; they may
        // re-plan); steady state, which is timed, is what a user sees after them: learning 1
        // run in LEARN_EVERY, and any re-plan the misses still cause.
        let mut sessions = Vec::with_capacity(2 * SESSIONS);
        for p in [Placement::Cpu, Placement::Auto] {
            for _ in 0..SESSIONS {
                sessions.push(session(p)?);
            }
        }
        for s in &sessions[..SESSIONS] {
            s.run(&named)?;
        }
        for s in &sessions[SESSIONS..] {
            for _ in 0..tandem::session::WARM_UP_RUNS + tandem::session::LEARN_FIRST {
                s.run(&named)?;
            }
        }
        let mut ms: Vec<Vec<f64>> = vec![Vec::new(); 2 * SESSIONS];
        let start = Instant::now();
        let mut round = 0;
        while round < 8 || (start.elapsed().as_secs_f64() < 6.0 && round < 5000) {
            for i in round_order(round) {
                let t = Instant::now();
                sessions[i].run(&named)?;
                ms[i].push(t.elapsed().as_secs_f64() * 1e3);
            }
            round += 1;
            if start.elapsed().as_secs_f64() > 60.0 {
                break;
            }
        }
        let medians: Vec<f64> = ms.into_iter().map(median).collect();
        let (cpu_ms, auto_ms) = medians.split_at(SESSIONS);
        let half = SESSIONS / 2;
        let a_a = |m: &[f64]| geomean(&m[half..]) / geomean(&m[..half]);
        let (aa, auto_aa) = (a_a(cpu_ms), a_a(auto_ms));
        let cpu = geomean(cpu_ms);
        let auto = geomean(auto_ms);
        let ratio = auto / cpu.min(gpu_ms);
        worst = worst.max(ratio);
        worst_aa = worst_aa.max((aa - 1.0).abs());
        let auto_session = &sessions[2 * SESSIONS - 1];
        // Where auto put the nodes in its last run.
        let (_, r) = auto_session.run_with_report(&named)?;
        let split = (r.nodes.iter())
            .filter(|n| matches!(n.ran, tandem::report::Ran::Split { .. }))
            .count();
        let placed = format!(
            "{} cpu, {} gpu, {split} split",
            r.count(Device::Cpu),
            r.count(Device::Gpu)
        );
        println!(
            "{name:<22} {cpu:>10.2} {gpu_ms:>10.1} {auto:>10.2} {ratio:>10.3} {aa:>7.3} \
             {auto_aa:>7.3} {round:>6}  auto: {placed}"
        );
        for note in &r.notes {
            println!("    note: {note}");
        }
        rows_json.push(
            json!({"model": name, "cpu_ms": cpu, "gpu_ms": gpu_ms, "auto_ms": auto,
            "auto_over_best": ratio, "session_medians_ms": medians,
            "cpu_a_a": aa, "auto_a_a": auto_aa,
            "rounds": round,
            "auto_nodes": placed}),
        );
    }
    println!(
        "(b) worst auto/min(cpu, gpu): {worst:.3} (target <= 1.02); noise floor: worst \
         |A/A - 1| = {worst_aa:.3} (CPU-only sessions measured alike)"
    );
    Ok(json!({"rows": rows_json, "worst_auto_over_best": worst,
              "worst_aa_deviation": worst_aa}))
}

/// The model's inputs from its test data (`input_<i>.pb`), named as the manifest says.
fn read_inputs(m: &serde_json::Value, dir: &Path) -> Result<Vec<(String, Tensor)>> {
    let mut v = Vec::new();
    for (i, inp) in m["inputs"].as_array().into_iter().flatten().enumerate() {
        let f = dir.join(format!("input_{i}.pb"));
        let bytes = std::fs::read(&f).with_context(|| format!("{}", f.display()))?;
        let (_, t) = tandem::import::read_tensor_pb(&bytes)?;
        v.push((inp["name"].as_str().unwrap_or_default().to_string(), t));
    }
    Ok(v)
}

/// Nodes of the overhead chain.
const CHAIN: usize = 1000;

/// A chain of `CHAIN` elementwise nodes (Relu and Neg alternating) on a [1, 16] input, as ONNX.
fn chain_model() -> Vec<u8> {
    let vi = |name: &str| ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            tensor_type: Some(TypeProtoTensor {
                elem_type: data_type::FLOAT,
                shape: Some(TensorShapeProto {
                    dim: [1, 16]
                        .iter()
                        .map(|&v| Dimension {
                            dim_value: Some(v),
                            dim_param: None,
                        })
                        .collect(),
                }),
            }),
            ..Default::default()
        }),
    };
    let name = |i: usize| {
        if i == 0 {
            "x".to_string()
        } else if i == CHAIN {
            "y".to_string()
        } else {
            format!("v{i}")
        }
    };
    let node = (0..CHAIN)
        .map(|i| NodeProto {
            input: vec![name(i)],
            output: vec![name(i + 1)],
            name: format!("n{i}"),
            op_type: if i % 2 == 0 { "Relu" } else { "Neg" }.into(),
            ..Default::default()
        })
        .collect();
    ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: 17,
        }],
        graph: Some(GraphProto {
            node,
            name: "chain".into(),
            input: vec![vi("x")],
            output: vec![vi("y")],
            ..Default::default()
        }),
        ..Default::default()
    }
    .encode_to_vec()
}

/// (d) runtime overhead per node on the CPU chain.
fn overhead() -> Result<serde_json::Value> {
    let bytes = chain_model();
    let s = Session::new(
        bytes.as_slice(),
        SessionOptions::default()
            .placement(Placement::Cpu)
            .cpu_threads(1),
    )?;
    let x = fill(&[1, 16], 5);
    let inputs = [("x", x.clone())];
    let rule = RunRule {
        min_iters: 50,
        min_secs: 2.0,
        max_secs: 10.0,
    };
    let run_ms = time_session(&s, &inputs, 3, &rule)?;
    // The same kernels in a tight loop, outputs preallocated, on a 1-thread pool.
    let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build()?;
    let plan = s.plan(&inputs)?;
    let graph = s.graph();
    let steps: Vec<_> = plan
        .steps
        .iter()
        .map(|st| (&graph.nodes[st.node].op, st.rows.clone()))
        .collect();
    let mut bufs = [x.clone(), Tensor::zeros(DType::F32, &[1, 16])];
    let loop_ms = pool.install(|| -> Result<f64> {
        let mut times = Vec::new();
        let start = Instant::now();
        while times.len() < 50 || start.elapsed().as_secs_f64() < 1.0 {
            let t = Instant::now();
            for (op, rows) in &steps {
                let (a, b) = bufs.split_at_mut(1);
                op.cpu(&[&a[0]], &mut b[..1], rows.clone())
                    .map_err(|e| anyhow!("{e}"))?;
                bufs.swap(0, 1);
            }
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
        Ok(median(times))
    })?;
    let per_node_us = (run_ms - loop_ms) * 1e3 / CHAIN as f64;
    println!(
        "\n(d) {CHAIN}-node elementwise chain on the CPU: run {run_ms:.3} ms, kernels alone \
         {loop_ms:.3} ms, overhead {per_node_us:.2} us/node (target <= 5)"
    );
    Ok(
        json!({"nodes": CHAIN, "run_ms": run_ms, "kernels_ms": loop_ms,
        "overhead_us_per_node": per_node_us}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_alternate_placements_and_move_every_session() {
        let mut seen = std::collections::BTreeSet::new();
        for round in 0..2 * SESSIONS {
            let order = round_order(round);
            let mut sorted = order.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..2 * SESSIONS).collect::<Vec<_>>(), "{order:?}");
            for pair in order.windows(2) {
                let cpu = |i: usize| i < SESSIONS;
                assert_ne!(cpu(pair[0]), cpu(pair[1]), "round {round}: {order:?}");
            }
            for (position, &session) in order.iter().enumerate() {
                seen.insert((session, position));
            }
        }
        // Over 2 * SESSIONS rounds, every session runs in every position.
        assert_eq!(seen.len(), 4 * SESSIONS * SESSIONS);
    }
}
