//! Real models against onnxruntime's outputs, on the CPU and on the GPU.
//!
//! Sits between `models/` (made by `scripts/setup.sh`: `manifest.json`, `<name>/model.onnx`,
//! `<name>/test_data_set_0` with onnxruntime's reference outputs; see docs/models.md) and the
//! public session API. Each model is its own test. Per placement it prints the max abs error
//! of every output, the median latency of N runs after one warm-up (N = 10 on the cpu, 3 on
//! the gpu, none where the GPU warm-up took over [`SLOW_GPU`]; env `TANDEM_MODEL_RUNS` overrides
//! N) next to onnxruntime's, and the node counts by device. Run with
//! `cargo test --release -p tandem --test models -- --nocapture`.

mod common;

use common::*;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tandem::report::Ran;
use tandem::{Device, Placement, RunReport, SessionOptions};

/// Default tolerance of a model's outputs; loosened per model below only with its measured error.
const RTOL: f64 = 1e-3;
const ATOL: f64 = 1e-4;

/// A GPU warm-up slower than this skips the timed runs: on lavapipe resnet50 takes 12 s a run
/// and vgg19 50 s, and their three timed runs were most of this file's CI time (latency is
/// tandem-bench's job; these runs only give the report line a number).
const SLOW_GPU: Duration = Duration::from_secs(5);

fn models_dir() -> PathBuf {
    repo_root().join("models")
}

/// The manifest entry of `name`, or `None` (after a notice, or a panic under CI) when the
/// models have not been fetched.
fn manifest_entry(name: &str) -> Option<serde_json::Value> {
    let path = models_dir().join("manifest.json");
    let Ok(text) = std::fs::read_to_string(&path) else {
        data_missing(&path);
        return None;
    };
    let all: serde_json::Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()));
    let entry = all
        .as_array()
        .and_then(|a| a.iter().find(|m| m["name"] == name))
        .cloned();
    match entry {
        Some(e)
            if models_dir()
                .join(e["path"].as_str().unwrap_or(""))
                .is_file() =>
        {
            Some(e)
        }
        Some(e) => {
            data_missing(&models_dir().join(e["path"].as_str().unwrap_or(name)));
            None
        }
        None => panic!("model `{name}` is not in {}", path.display()),
    }
}

fn runs(placement: Placement) -> usize {
    std::env::var("TANDEM_MODEL_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(match placement {
            Placement::Cpu => 10,
            _ => 3,
        })
}

fn median_ms(mut times: Vec<Duration>) -> f64 {
    times.sort();
    times
        .get(times.len() / 2)
        .map_or(f64::NAN, |t| t.as_secs_f64() * 1e3)
}

fn node_counts(r: &RunReport) -> String {
    let count = |ran: Ran| r.nodes.iter().filter(|n| n.ran == ran).count();
    let mut s = format!(
        "cpu {}, gpu {}, view {}, folded {}",
        r.count(Device::Cpu),
        r.count(Device::Gpu),
        count(Ran::View),
        count(Ran::Folded)
    );
    let mut ops: Vec<(String, String)> = r
        .fallbacks()
        .map(|n| {
            (
                n.op_type.to_string(),
                one_line(n.fallback.as_deref().unwrap_or(""), 120),
            )
        })
        .collect();
    ops.sort();
    ops.dedup();
    if !ops.is_empty() {
        let list: Vec<String> = ops.iter().map(|(o, why)| format!("{o} ({why})")).collect();
        s += &format!("; fell back: {}", list.join("; "));
    }
    s
}

/// Load, run, compare and time `name` on one placement; prints one report line and returns
/// the first problem.
fn check_on(
    name: &str,
    entry: &serde_json::Value,
    placement: Placement,
    rtol: f64,
    atol: f64,
) -> Result<(), String> {
    let label = format!(
        "{name} {}",
        if placement == Placement::Cpu {
            "cpu"
        } else {
            "gpu"
        }
    );
    let mut options = SessionOptions::default().placement(placement);
    if placement == Placement::Gpu {
        options = options.gpu(tandem::testing::gpu());
    }
    let model = models_dir().join(entry["path"].as_str().unwrap_or_default());
    let data = models_dir().join(entry["test_data"].as_str().unwrap_or_default());
    let session = open_session(&model, options)?;
    let (inputs, want) = load_test_data(&data, &session)?;
    let start = Instant::now();
    let (got, report) = run_once(&session, &inputs)?;
    let warm_up = start.elapsed();
    let errors: Vec<String> = output_errors(&got, &want)
        .into_iter()
        .map(|(n, e)| match e {
            Some(e) => format!("{n} {e:.2e}"),
            None => format!("{n} dtype/shape differ"),
        })
        .collect();
    let verdict = compare_outputs(&got, &want, rtol, atol);
    let ort = entry["ort_latency_ms_median"].as_f64().unwrap_or(f64::NAN);
    let latency = if placement == Placement::Gpu && warm_up > SLOW_GPU {
        format!(
            "warm-up {:.1} s: too slow, timed runs skipped",
            warm_up.as_secs_f64()
        )
    } else {
        let n = runs(placement);
        let mut times = Vec::with_capacity(n);
        for _ in 0..n {
            let t = Instant::now();
            run_once(&session, &inputs)?;
            times.push(t.elapsed());
        }
        format!(
            "median {:.2} ms of {n} (warm-up {:.1} ms)",
            median_ms(times),
            warm_up.as_secs_f64() * 1e3
        )
    };
    println!(
        "model {label}: {}; max abs err {}; {latency}, ort {ort:.2} ms; nodes {}",
        if verdict.is_ok() { "ok" } else { "MISMATCH" },
        errors.join(", "),
        node_counts(&report)
    );
    verdict.map(|_| ())
}

/// The whole check of one model: cpu then gpu; panics listing each placement's first problem.
fn check_model(name: &str, rtol: f64, atol: f64) {
    let Some(entry) = manifest_entry(name) else {
        return;
    };
    assert!(
        entry["benchmark_only"] != true,
        "{name} is benchmark-only: not a test"
    );
    let mut failures = Vec::new();
    for placement in [Placement::Cpu, Placement::Gpu] {
        if let Err(e) = check_on(name, &entry, placement, rtol, atol) {
            let p = if placement == Placement::Cpu {
                "cpu"
            } else {
                "gpu"
            };
            println!("model {name} {p}: FAILED: {}", one_line(&e, 400));
            failures.push(format!("{name} {p}: {}", one_line(&e, 400)));
        }
    }
    if !failures.is_empty() {
        panic!("{}", failures.join("\n"));
    }
}

/// The models with a test below; every non-benchmark model of the manifest must be here.
const TESTED: &[&str] = &[
    "magika",
    "minilm",
    "ppocr_det",
    "tiny_llama_prefill",
    "tiny_llama_decode",
    "light_bvlc_alexnet",
    "light_densenet121",
    "light_inception_v1",
    "light_inception_v2",
    "light_resnet50",
    "light_shufflenet",
    "light_squeezenet",
    "light_vgg19",
    "light_zfnet512",
];

#[test]
fn every_manifest_model_has_a_test() {
    let path = models_dir().join("manifest.json");
    let Ok(text) = std::fs::read_to_string(&path) else {
        data_missing(&path);
        return;
    };
    let all: serde_json::Value = serde_json::from_str(&text).expect("manifest.json is JSON");
    for m in all.as_array().expect("manifest.json is a list") {
        let name = m["name"].as_str().unwrap_or_default();
        let tested = TESTED.contains(&name);
        if m["benchmark_only"] == true {
            assert!(!tested, "{name} is benchmark-only but has a test");
        } else {
            assert!(
                tested,
                "{name} has no test in runtime/tests/models.rs: add one"
            );
        }
    }
}

#[test]
fn magika() {
    check_model("magika", RTOL, ATOL);
}

#[test]
fn minilm() {
    check_model("minilm", RTOL, ATOL);
}

#[test]
fn ppocr_det() {
    check_model("ppocr_det", RTOL, ATOL);
}

#[test]
fn tiny_llama_prefill() {
    check_model("tiny_llama_prefill", RTOL, ATOL);
}

#[test]
fn tiny_llama_decode() {
    check_model("tiny_llama_decode", RTOL, ATOL);
}

#[test]
fn light_bvlc_alexnet() {
    check_model("light_bvlc_alexnet", RTOL, ATOL);
}

#[test]
fn light_densenet121() {
    check_model("light_densenet121", RTOL, ATOL);
}

#[test]
fn light_inception_v1() {
    check_model("light_inception_v1", RTOL, ATOL);
}

#[test]
fn light_inception_v2() {
    check_model("light_inception_v2", RTOL, ATOL);
}

#[test]
fn light_resnet50() {
    check_model("light_resnet50", RTOL, ATOL);
}

#[test]
fn light_shufflenet() {
    check_model("light_shufflenet", RTOL, ATOL);
}

#[test]
fn light_squeezenet() {
    check_model("light_squeezenet", RTOL, ATOL);
}

#[test]
fn light_vgg19() {
    check_model("light_vgg19", RTOL, ATOL);
}

#[test]
fn light_zfnet512() {
    check_model("light_zfnet512", RTOL, ATOL);
}
