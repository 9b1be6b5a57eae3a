//! Hybrid plans of real models compute what onnxruntime computes. A cost table drawn at random
//! per seed (each op kind's speed on each device, link and sync costs) makes placement `auto`
//! plan a different mix of CPU, GPU and split nodes, chains and transfers each time; every such
//! plan, run by the executor on the CPU and the real adapter, must match the reference.
//!
//! Sits between the planner + executor and the real models of `models/manifest.json` (made by
//! scripts/setup.sh). The measured cost model rarely leaves the CPU on lavapipe, so without this
//! the executor's hybrid paths meet real graphs only when a loaded machine skews the model
//! (a stress run once hit a wrong magika result that way).

mod common;

use common::*;
use tandem::costs::{Costs, NodeCostQuery};
use tandem::exec::{execute, Context, GpuConstants};
use tandem::plan::{build, Device, Placement, Request, StepKind};
use tandem::schedule::Policy;
use tandem::Session;
use tandem_ops::TensorMeta;

/// Models and how many random plans each gets (about 100 s in all on lavapipe, 2 cores); set
/// `TANDEM_HYBRID_MODELS=name:seeds,...` for a longer soak (e.g. `ppocr_det:50,yolov8n:50`).
const MODELS: &[(&str, u64)] = &[
    ("magika", 60),
    ("tiny_llama_prefill", 200),
    ("tiny_llama_decode", 200),
    ("minilm", 20),
];

fn models() -> Vec<(String, u64)> {
    match std::env::var("TANDEM_HYBRID_MODELS") {
        Ok(list) => list
            .split(',')
            .map(|m| match m.split_once(':') {
                Some((name, n)) => (name.to_string(), n.parse().expect("name:seeds")),
                None => (m.to_string(), 20),
            })
            .collect(),
        Err(_) => MODELS.iter().map(|(m, n)| (m.to_string(), *n)).collect(),
    }
}
/// The tolerance of the model tests (models.rs).
const RTOL: f64 = 1e-3;
const ATOL: f64 = 1e-4;

/// splitmix64: a well-mixed hash of `x`.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Log-uniform in [lo, hi) from a hash.
fn log_between(h: u64, lo: f64, hi: f64) -> f64 {
    let u = (h >> 11) as f64 / (1u64 << 53) as f64;
    lo * (hi / lo).powf(u)
}

/// Costs drawn per (seed, op kind, device): seconds per flop in 1e-12..1e-9 plus a fixed cost
/// in 1e-7..1e-4, so each device wins some op kinds; cheap links, so mixing pays.
struct RandomCosts {
    seed: u64,
}

impl RandomCosts {
    fn draw(&self, what: &str, salt: u64) -> u64 {
        let mut h = mix(self.seed ^ salt);
        for b in what.bytes() {
            h = mix(h ^ b as u64);
        }
        h
    }
}

impl Costs for RandomCosts {
    fn node_time(&self, q: &NodeCostQuery<'_>, device: Device, fraction: f64) -> f64 {
        let salt = match device {
            Device::Cpu => 1,
            Device::Gpu => 2,
        };
        let h = self.draw(&q.cost_key(), salt);
        let per_flop = log_between(h, 1e-12, 1e-9);
        let fixed = log_between(mix(h), 1e-7, 1e-4);
        let bytes = (q.work.bytes_read + q.work.bytes_written) as f64;
        fixed + (q.flops_on(device, fraction) + bytes * fraction) * per_flop
    }

    fn transfer_time(&self, bytes: u64, to: Device) -> f64 {
        let salt = if to == Device::Gpu { 3 } else { 4 };
        log_between(self.draw("link", salt), 1e-7, 1e-5)
            + bytes as f64 * log_between(self.draw("byte", salt), 1e-12, 1e-10)
    }

    fn sync_time(&self) -> f64 {
        log_between(self.draw("sync", 5), 1e-7, 1e-5)
    }
}

#[test]
fn random_hybrid_plans_of_real_models_match_onnxruntime() {
    let dir = repo_root().join("models");
    let manifest = dir.join("manifest.json");
    let Ok(text) = std::fs::read_to_string(&manifest) else {
        data_missing(&manifest);
        return;
    };
    let all: serde_json::Value = serde_json::from_str(&text).expect("manifest.json is JSON");
    let gpu = tandem::testing::gpu();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    let (mut failures, mut totals) = (Vec::new(), [0usize; 4]);
    let models = models();
    for (name, seeds) in &models {
        let began = std::time::Instant::now();
        let entry = all
            .as_array()
            .and_then(|a| a.iter().find(|m| m["name"] == *name))
            .unwrap_or_else(|| panic!("{name} is not in the manifest"));
        let model = dir.join(entry["path"].as_str().unwrap());
        if !model.is_file() {
            data_missing(&model);
            return;
        }
        let session = Session::new(
            model.as_path(),
            tandem::SessionOptions::default().placement(Placement::Cpu),
        )
        .unwrap();
        let (inputs, want) =
            load_test_data(&dir.join(entry["test_data"].as_str().unwrap()), &session).unwrap();
        let graph = session.graph();
        let ordered: Vec<tandem::Tensor> = graph
            .inputs
            .iter()
            .map(|&v| {
                let n = &graph.values[v].name;
                inputs.iter().find(|(k, _)| k == n).unwrap().1.clone()
            })
            .collect();
        let metas: Vec<TensorMeta> = ordered.iter().map(|t| t.meta()).collect();
        for seed in 0..*seeds {
            let costs = RandomCosts {
                seed: mix(seed + 1),
            };
            let request = Request {
                placement: Placement::Auto,
                overrides: &[],
                costs: Some(&costs),
                policy: Policy::HeftSplit,
                assume_gpu: false,
            };
            let plan = build(graph, &metas, &request, Some(gpu.as_ref()), &pool).expect("plan");
            let mut counts = [0usize; 4];
            for s in &plan.steps {
                let k = match &s.kind {
                    StepKind::View => continue,
                    StepKind::Whole {
                        device: Device::Cpu,
                        ..
                    } => 0,
                    StepKind::Whole { .. } => 1,
                    StepKind::Split { .. } if s.chained.is_empty() => 2,
                    StepKind::Split { .. } => 3,
                };
                counts[k] += 1;
            }
            for (t, c) in totals.iter_mut().zip(counts) {
                *t += c;
            }
            let constants = GpuConstants::default();
            let cx = Context {
                graph,
                plan: &plan,
                gpu: Some(gpu.as_ref()),
                pool: &pool,
                constants: &constants,
                node_times: true,
            };
            let label = format!(
                "{name} seed {seed} (cpu {}, gpu {}, split {}, chained {})",
                counts[0], counts[1], counts[2], counts[3]
            );
            match execute(&cx, ordered.clone()) {
                Err(e) => failures.push(format!("{label}: {e}")),
                Ok((outs, _)) => {
                    let names = graph.outputs.iter().map(|&v| graph.values[v].name.clone());
                    let got: Named = names.zip(outs).collect();
                    if let Err(e) = compare_outputs(&got, &want, RTOL, ATOL) {
                        failures.push(format!("{label}: {}", one_line(&e, 300)));
                    }
                }
            }
        }
        println!(
            "{name}: {seeds} plans in {:.1} s",
            began.elapsed().as_secs_f64()
        );
    }
    println!(
        "hybrid plans of {} models: nodes cpu {}, gpu {}, split {}, chained split {}",
        models.len(),
        totals[0],
        totals[1],
        totals[2],
        totals[3]
    );
    assert!(
        failures.is_empty(),
        "{} hybrid plans differ from onnxruntime:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(
        totals.iter().all(|&t| t > 0),
        "the random costs did not exercise every kind of step: {totals:?}"
    );
}
