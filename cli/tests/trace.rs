//! `tandem run --runs N --trace FILE` on a real model: the trace is one run's timeline, so the
//! CPU lane's events follow each other (the CPU steps of a run run one after another).

use std::path::Path;
use std::process::Command;

#[test]
fn a_trace_of_many_runs_is_the_last_runs_timeline() {
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/magika/model.onnx");
    assert!(
        model.exists(),
        "{} is missing: run scripts/setup.sh",
        model.display()
    );
    let file = std::env::temp_dir().join(format!("tandem-trace-{}.json", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_tandem"))
        .arg("run")
        .arg(&model)
        .args(["--placement", "cpu", "--runs", "9", "--trace"])
        .arg(&file)
        .output()
        .expect("tandem run runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&file).expect("the trace is written");
    let _ = std::fs::remove_file(&file);
    let trace: serde_json::Value = serde_json::from_str(&text).expect("the trace is JSON");
    let mut cpu: Vec<(f64, f64, String)> = trace["traceEvents"]
        .as_array()
        .expect("a list of events")
        .iter()
        .filter(|e| e["ph"] == "X" && e["tid"] == 1)
        .map(|e| {
            let num = |k: &str| e[k].as_f64().expect("a number");
            (num("ts"), num("dur"), e["name"].to_string())
        })
        .collect();
    assert!(cpu.len() > 5, "magika's nodes on the CPU lane: {text}");
    cpu.sort_by(|a, b| a.0.total_cmp(&b.0));
    for pair in cpu.windows(2) {
        let ((ts, dur, name), (next, _, next_name)) = (&pair[0], &pair[1]);
        // The file rounds to a nanosecond.
        assert!(
            ts + dur <= next + 0.002,
            "{name} ends at {:.3} us, after {next_name} starts at {next:.3} us",
            ts + dur
        );
    }
}
