//! burn as a peer: burn-onnx generates Rust code per model at build time (a separate crate,
//! `bench-suite/burn-driver`, built by `scripts/build_burn.sh`: ~30 min and ~2 GB here, so it
//! is out of the workspace and of CI), run on burn's CPU backend (ndarray, row `burn-ndarray
//! cpu`) and its wgpu backend pinned to Vulkan, the adapter tandem uses (row `burn-wgpu gpu`).
//!
//! Sits between the suite and that driver binary: writes the inputs as .npy, spawns it once per
//! backend under the suite's rule, and reads back its JSON (scripts/ort_driver.py's format) and
//! outputs, compared with the reference like every peer. Every model gets both rows: one burn
//! did not import, or a driver that is not built, gives rows saying why.
//!
//! The driver is `$TANDEM_BURN_DRIVER`, else `<repo>/../target-burn/release/burn-driver`
//! (build_burn.sh's default target dir). The cargo feature `burn` makes burn required: without
//! it, `--quick` (CI) leaves burn out; with it, quick mode runs burn too and a missing driver
//! fails the run. Full mode always has burn rows.

use crate::models::{max_abs_diff, stderr_tail, write_npys, Named};
use crate::peers::ort::{fill_timing, read_outputs, repo_root, DriverOutput, Timing};
use crate::schema::Row;
use crate::stats::RunRule;
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The burn release the driver pins (bench-suite/burn-driver/Cargo.toml).
pub const VERSION: &str = "0.22.1";

/// The suite's rows for burn: (runtime, placement, driver backend).
const BACKENDS: [(&str, &str, &str); 2] = [
    ("burn-ndarray", "cpu", "ndarray"),
    ("burn-wgpu", "gpu", "wgpu"),
];

/// Where the driver binary is looked for.
pub fn driver() -> PathBuf {
    std::env::var_os("TANDEM_BURN_DRIVER")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("../target-burn/release/burn-driver"))
}

/// Whether a run has burn rows: always in full mode; in `--quick` only with the `burn` feature.
pub fn included(quick: bool) -> bool {
    !quick || cfg!(feature = "burn")
}

/// The driver's report (one JSON object on stdout).
#[derive(Deserialize)]
struct DriverOut {
    error: Option<String>,
    device: Option<String>,
    #[serde(default)]
    outputs: Vec<DriverOutput>,
    /// Absent from a report of a failure (`error`); read as zeros and no runs then, as each
    /// field was before the struct was shared.
    #[serde(flatten)]
    timing: Option<Timing>,
}

/// burn's two rows for `model` (a manifest name): `cpu_rule` for ndarray, `gpu_rule` for wgpu
/// (lavapipe is slow); `work` is a scratch folder.
pub fn bench(
    model: &str,
    inputs: &Named,
    reference: Option<&Named>,
    threads: usize,
    cpu_rule: &RunRule,
    gpu_rule: &RunRule,
    work: &Path,
) -> Vec<Row> {
    let exe = driver();
    let inputs_written = write_npys(inputs, &work.join("burn_in"));
    BACKENDS
        .iter()
        .map(|&(runtime, placement, backend)| {
            if !exe.is_file() {
                return Row::failed(
                    runtime,
                    placement,
                    VERSION,
                    format!(
                        "not built: run scripts/build_burn.sh (no driver at {}; or set \
                         TANDEM_BURN_DRIVER)",
                        exe.display()
                    ),
                );
            }
            let rule = if backend == "wgpu" {
                gpu_rule
            } else {
                cpu_rule
            };
            let out_dir = work.join(format!("burn_{backend}_out"));
            let r = inputs_written
                .as_ref()
                .map_err(Clone::clone)
                .and_then(|files| {
                    let mut cmd = Command::new(&exe);
                    cmd.args(["--model-name", model, "--backend", backend])
                        .arg("--out-dir")
                        .arg(&out_dir)
                        .args(["--iters", &rule.min_iters.to_string()])
                        .args(["--secs", &rule.min_secs.to_string()])
                        .args(["--max-secs", &rule.max_secs.to_string()])
                        .args(["--threads", &threads.to_string()]);
                    for (name, path) in files {
                        cmd.arg("--input").arg(format!("{name}={}", path.display()));
                    }
                    let out = cmd
                        .output()
                        .map_err(|e| format!("cannot start {}: {e}", exe.display()))?;
                    row_from_output(
                        runtime,
                        placement,
                        &out.stdout,
                        &out.stderr,
                        reference,
                        rule,
                    )
                });
            r.unwrap_or_else(|e| Row::failed(runtime, placement, VERSION, e))
        })
        .collect()
}

/// The row for one driver run from its stdout (the JSON report) and stderr (shown when there
/// is no report). A report with `error` (model not imported, burn failed) is a failed row
/// carrying that reason; otherwise latency, cold start and the outputs' max abs diff from
/// `reference`.
fn row_from_output(
    runtime: &str,
    placement: &str,
    stdout: &[u8],
    stderr: &[u8],
    reference: Option<&Named>,
    rule: &RunRule,
) -> Result<Row, String> {
    let d: DriverOut = serde_json::from_slice(stdout).map_err(|e| {
        let tail = stderr_tail(&String::from_utf8_lossy(stderr));
        format!("burn-driver printed no report ({e}): {tail}")
    })?;
    if let Some(e) = d.error {
        // burn's errors run over several lines; a row's error is one.
        return Err(e.split_whitespace().collect::<Vec<_>>().join(" "));
    }
    let got = read_outputs(&d.outputs)?;
    let mut row = Row::failed(runtime, placement, VERSION, String::new());
    row.error = None;
    if placement == "gpu" {
        row.adapter = d.device;
        row.notes.push(
            "first run includes burn's shader compilation and autotuning (cold start), which \
             cubecl reads from its on-disk cache (`target/environment` of the outermost Cargo \
             workspace above the working directory) where an earlier run left them"
                .into(),
        );
    }
    match reference {
        Some(want) => match max_abs_diff(&got, want) {
            Ok(x) => row.max_abs_diff = Some(x),
            Err(e) => row.notes.push(format!("outputs not compared: {e}")),
        },
        None => row
            .notes
            .push("no reference outputs to compare with".into()),
    }
    fill_timing(&mut row, d.timing.unwrap_or_default(), rule, 0.0);
    row.notes
        .push("each run uploads the inputs and reads every output back".into());
    Ok(row)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tandem::Tensor;

    const RULE: RunRule = RunRule {
        min_iters: 1,
        min_secs: 0.0,
        max_secs: 1.0,
    };

    #[test]
    fn a_model_burn_did_not_import_is_a_row_with_the_reason() {
        let out =
            br#"{"runtime":"burn","backend":"wgpu","error":"not imported by\n  burn-onnx: Loop"}"#;
        let e = row_from_output("burn-wgpu", "gpu", out, b"", None, &RULE).unwrap_err();
        assert_eq!(e, "not imported by burn-onnx: Loop");
        let e = row_from_output("burn-wgpu", "gpu", b"", b"a\nthread panicked", None, &RULE);
        assert!(e.unwrap_err().contains("thread panicked"));
    }

    #[test]
    fn a_report_becomes_a_row_with_cold_start_latency_and_diff() {
        let dir = std::env::temp_dir().join(format!("burn_row_{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("y.npy");
        std::fs::write(
            &path,
            tandem::npy::to_npy(&Tensor::f32(&[2], vec![1.0, 2.5])),
        )
        .unwrap();
        let out = serde_json::json!({
            "device": "llvmpipe (Vulkan, Cpu)", "load_ms": 10.0, "first_run_ms": 4000.0,
            "samples_ms": [3.0, 1.0, 2.0], "outputs": [{"name": "y", "path": path}],
            "peak_rss_kb": 2048.0,
        });
        let want = vec![("y".to_string(), Tensor::f32(&[2], vec![1.0, 2.0]))];
        let r = row_from_output(
            "burn-wgpu",
            "gpu",
            out.to_string().as_bytes(),
            b"",
            Some(&want),
            &RULE,
        )
        .unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(r.error.is_none());
        assert_eq!(r.max_abs_diff, Some(0.5));
        assert_eq!(r.latency.as_ref().unwrap().p50_ms, 2.0);
        assert_eq!(r.cold.as_ref().unwrap().first_run_ms, 4000.0);
        assert_eq!(r.adapter.as_deref(), Some("llvmpipe (Vulkan, Cpu)"));
        assert_eq!(r.peak_rss_mib, Some(2.0));
    }

    #[test]
    fn quick_mode_leaves_burn_out_unless_the_feature_requires_it() {
        assert!(included(false));
        assert_eq!(included(true), cfg!(feature = "burn"));
    }
}
