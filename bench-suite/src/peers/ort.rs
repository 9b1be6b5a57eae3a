//! onnxruntime (CPU execution provider, the PyPI wheel) as a peer: `scripts/ort_driver.py`
//! runs in a child Python process on the same inputs (written as .npy), under the same rule,
//! and hands back its timings as JSON and its outputs as .npy.
//!
//! Sits between the suite and the pip-installed onnxruntime; no binary download at build time.
//! The Python is `$TANDEM_BENCH_PYTHON`, else `<repo>/.venv/bin/python` (made by setup.sh).

use crate::models::{max_abs_diff, read_npys, stderr_tail, write_npys, Named};
use crate::schema::{Cold, OpTime, Row};
use crate::stats::{Latency, RunRule};
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The repository root this binary was built from.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("bench-suite/ has a parent")
        .to_path_buf()
}

/// The Python with onnxruntime.
pub fn python() -> PathBuf {
    std::env::var_os("TANDEM_BENCH_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".venv/bin/python"))
}

#[derive(Deserialize)]
struct DriverOut {
    version: String,
    load_ms: f64,
    first_run_ms: f64,
    samples_ms: Vec<f64>,
    outputs: Vec<DriverOutput>,
    peak_rss_kb: f64,
    /// Per op type, from a profiled session after the timed runs (`--profile-runs`).
    #[serde(default)]
    op_times: Vec<OpTime>,
}

/// Profiled runs for onnxruntime's per-op times: the rule's run count (of a round's share,
/// `run --rounds`), within 3..=10 (each is a run beyond the timed ones, in a second
/// session).
fn profile_runs(rule: &RunRule) -> usize {
    rule.min_iters.clamp(3, 10)
}

/// One output file of a driver report (`ort_driver.py`'s protocol, which burn's driver speaks
/// too).
#[derive(Deserialize)]
pub(crate) struct DriverOutput {
    pub(crate) name: String,
    pub(crate) path: PathBuf,
}

/// The outputs a driver wrote.
pub(crate) fn read_outputs(outputs: &[DriverOutput]) -> Result<Named, String> {
    let files: Vec<(String, PathBuf)> = outputs
        .iter()
        .map(|o| (o.name.clone(), o.path.clone()))
        .collect();
    read_npys(&files).map_err(|e| format!("output {e}"))
}

/// The timing fields of a driver's row: cold start, latency under `rule`, throughput, peak RSS.
pub(crate) fn fill_timing(
    row: &mut Row,
    load_ms: f64,
    first_run_ms: f64,
    samples_ms: Vec<f64>,
    peak_rss_kb: f64,
    rule: &RunRule,
) {
    let latency = Latency::from_samples(samples_ms, rule);
    row.cold = Some(Cold {
        load_ms,
        first_run_ms,
        settle: None,
    });
    row.throughput_per_s = Some(latency.throughput());
    row.latency = Some(latency);
    row.peak_rss_mib = Some(peak_rss_kb / 1024.0);
}

/// Measure `model` on onnxruntime with `threads` intra-op threads. Returns the row and
/// onnxruntime's outputs (the reference where the model has no stored one) and its per-op times
/// (each round's: the report keeps the fastest round's, `Row::pool`). `work` is a scratch
/// folder for the .npy files.
pub fn bench(
    model: &Path,
    inputs: &Named,
    reference: Option<&Named>,
    threads: usize,
    rule: &RunRule,
    work: &Path,
) -> (Row, Option<Named>) {
    match run(model, inputs, reference, threads, rule, work) {
        Ok(r) => r,
        Err(e) => (Row::failed("onnxruntime", "cpu", "?", e), None),
    }
}

fn run(
    model: &Path,
    inputs: &Named,
    reference: Option<&Named>,
    threads: usize,
    rule: &RunRule,
    work: &Path,
) -> Result<(Row, Option<Named>), String> {
    let out_dir = work.join("ort_out");
    let mut cmd = Command::new(python());
    cmd.arg(repo_root().join("scripts/ort_driver.py"))
        .arg("--model")
        .arg(model)
        .arg("--out-dir")
        .arg(&out_dir)
        .args(["--iters", &rule.min_iters.to_string()])
        .args(["--secs", &rule.min_secs.to_string()])
        .args(["--max-secs", &rule.max_secs.to_string()])
        .args(["--threads", &threads.to_string()])
        .args(["--profile-runs", &profile_runs(rule).to_string()]);
    for (name, p) in write_npys(inputs, &work.join("in"))? {
        cmd.arg("--input").arg(format!("{name}={}", p.display()));
    }
    let out = cmd.output().map_err(|e| {
        format!(
            "cannot start {}: {e} (run scripts/setup.sh)",
            python().display()
        )
    })?;
    if !out.status.success() {
        return Err(format!(
            "ort_driver.py failed ({}): {}",
            out.status,
            stderr_tail(&String::from_utf8_lossy(&out.stderr))
        ));
    }
    let d: DriverOut = serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("ort_driver.py printed no report: {e}"))?;
    let got = read_outputs(&d.outputs)?;
    let mut row = Row::failed("onnxruntime", "cpu", &d.version, String::new());
    row.error = None;
    if let Some(want) = reference {
        match max_abs_diff(&got, want) {
            Ok(x) => row.max_abs_diff = Some(x),
            Err(e) => row.notes.push(format!("outputs not compared: {e}")),
        }
    } else {
        row.max_abs_diff = Some(0.0);
        row.notes
            .push("this run's outputs are the reference".into());
    }
    row.op_times = d.op_times;
    fill_timing(
        &mut row,
        d.load_ms,
        d.first_run_ms,
        d.samples_ms,
        d.peak_rss_kb,
        rule,
    );
    row.notes
        .push("peak RSS includes the Python interpreter and numpy".into());
    Ok((row, Some(got)))
}
