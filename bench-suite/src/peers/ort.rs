//! onnxruntime (CPU execution provider, the PyPI wheel) as a peer: `scripts/ort_driver.py`
//! runs in a child Python process on the same inputs (written as .npy), under the same rule,
//! interleaved with the round's other rows' (`interleave.rs`), and hands back its outputs as .npy
//! after its first run and its timings as JSON at the end.
//!
//! Sits between the suite and the pip-installed onnxruntime; no binary download at build time.
//! The Python is `$TANDEM_BENCH_PYTHON`, else `<repo>/.venv/bin/python` (made by setup.sh).

use crate::interleave::{ChildSlices, Failed, RoundRow, Slices};
use crate::models::{max_abs_diff, read_npys, write_npys, Named};
use crate::schema::{AfterPause, Cold, OpTime, Row};
use crate::stats::{Latency, Method, RunRule};
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

/// The driver's `ready` line: the first run's outputs.
#[derive(Deserialize)]
struct Ready {
    outputs: Vec<DriverOutput>,
}

/// The timing fields of a driver's report (`ort_driver.py`'s, and burn's driver's), each
/// required.
#[derive(Deserialize, Default)]
pub(crate) struct Timing {
    load_ms: f64,
    first_run_ms: f64,
    samples_ms: Vec<f64>,
    peak_rss_kb: f64,
    /// Runs after a pause (`--pause-runs`), absent where the driver makes none (burn's).
    #[serde(default)]
    after_pause_ms: Vec<f64>,
}

/// The driver's result, after `finish`.
#[derive(Deserialize)]
struct DriverOut {
    version: String,
    #[serde(flatten)]
    timing: Timing,
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

/// The timing fields of a driver's row: cold start, latency under `rule`, throughput, peak RSS,
/// the runs after a pause of `pause_ms`.
pub(crate) fn fill_timing(row: &mut Row, t: Timing, rule: &RunRule, pause_ms: f64) {
    let latency = Latency::from_samples(t.samples_ms, rule);
    row.cold = Some(Cold {
        load_ms: t.load_ms,
        first_run_ms: t.first_run_ms,
        settle: None,
    });
    row.throughput_per_s = Some(latency.throughput());
    row.latency = Some(latency);
    row.peak_rss_mib = Some(t.peak_rss_kb / 1024.0);
    row.after_pause = AfterPause::from_samples(pause_ms, t.after_pause_ms);
}

/// onnxruntime's driver at `ready` (its first run made), its timed runs to come in slices.
pub struct Started {
    slices: ChildSlices,
    rule: RunRule,
    pause_ms: f64,
    /// The row so far: the comparison of the first run's outputs with the reference.
    row: Row,
}

impl Slices for Started {
    fn process(&self) -> Option<u32> {
        self.slices.process()
    }

    fn next_slice(&mut self) -> Result<bool, String> {
        self.slices.next_slice()
    }
}

/// Starts onnxruntime's driver on `model` with `method`'s intra-op threads (pinned where it
/// pins) and waits for its first run. Returns it (or the failed row) and onnxruntime's outputs
/// (the reference where the model has no stored one). `work` is a scratch folder for the .npy
/// files; the timed runs come in `method`'s slices under `rule`, then its runs after a pause;
/// `tick` gets the timed runs so far after each.
pub fn start(
    model: &Path,
    inputs: &Named,
    reference: Option<&Named>,
    rule: &RunRule,
    method: &Method,
    work: &Path,
    tick: Box<dyn FnMut(usize)>,
) -> (Box<dyn RoundRow>, Option<Named>) {
    match start_inner(model, inputs, reference, rule, method, work, tick) {
        Ok((started, outs)) => (Box::new(started), Some(outs)),
        Err(e) => (
            Box::new(Failed(Row::failed("onnxruntime", "cpu", "?", e))),
            None,
        ),
    }
}

fn start_inner(
    model: &Path,
    inputs: &Named,
    reference: Option<&Named>,
    rule: &RunRule,
    method: &Method,
    work: &Path,
    tick: Box<dyn FnMut(usize)>,
) -> Result<(Started, Named), String> {
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
        .args(["--threads", &method.threads.to_string()])
        .args(["--profile-runs", &profile_runs(rule).to_string()])
        .args([
            "--slice-secs",
            &method.slice.map_or(0.0, |s| s.as_secs_f64()).to_string(),
        ])
        .args(["--pause-ms", &method.pause.ms.to_string()])
        .args(["--pause-runs", &method.pause.runs.to_string()]);
    if method.pin_threads {
        cmd.arg("--pin-threads");
    }
    for (name, p) in write_npys(inputs, &work.join("in"))? {
        cmd.arg("--input").arg(format!("{name}={}", p.display()));
    }
    let name = format!("ort_driver.py ({})", python().display());
    let (slices, ready) = ChildSlices::start(&name, cmd, tick)
        .map_err(|e| format!("{e} (run scripts/setup.sh if it did not start)"))?;
    let ready: Ready =
        serde_json::from_str(&ready).map_err(|e| format!("ort_driver.py's `ready`: {e}"))?;
    let got = read_outputs(&ready.outputs)?;
    let mut row = Row::failed("onnxruntime", "cpu", "?", String::new());
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
    let started = Started {
        slices,
        rule: *rule,
        pause_ms: method.pause.ms,
        row,
    };
    Ok((started, got))
}

impl RoundRow for Started {
    fn finish(self: Box<Self>, err: Result<(), String>) -> Row {
        let Started {
            slices,
            rule,
            pause_ms,
            mut row,
        } = *self;
        let out = err.and_then(|()| slices.finish()).and_then(|out| {
            serde_json::from_str::<DriverOut>(&out)
                .map_err(|e| format!("ort_driver.py printed no report: {e}"))
        });
        let d = match out {
            Ok(d) => d,
            Err(e) => return Row::failed("onnxruntime", "cpu", "?", e),
        };
        row.version = d.version;
        row.op_times = d.op_times;
        fill_timing(&mut row, d.timing, &rule, pause_ms);
        row.notes
            .push("peak RSS includes the Python interpreter and numpy".into());
        row
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// onnxruntime's report must carry every timing field: one without its samples is no
    /// report, not a row of no runs.
    #[test]
    fn a_driver_report_without_its_timings_is_refused() {
        let full = r#"{"version": "1.2", "load_ms": 1.0, "first_run_ms": 2.0,
                       "samples_ms": [3.0], "peak_rss_kb": 4.0}"#;
        let d: DriverOut = serde_json::from_str(full).unwrap();
        assert_eq!(d.timing.samples_ms, [3.0]);
        let short =
            r#"{"version": "1.2", "load_ms": 1.0, "first_run_ms": 2.0, "peak_rss_kb": 4.0}"#;
        assert!(serde_json::from_str::<DriverOut>(short).is_err());
    }
}
