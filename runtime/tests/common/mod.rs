//! Shared helpers of the data-driven integration tests (`conformance.rs`, `models.rs`).
//!
//! Sits between those tests and the files `scripts/setup.sh` generates (ONNX test folders:
//! `model.onnx` + `test_data_set_0/{input,output}_K.pb`) and the public `tandem` API: finding
//! the repository root, loading a test folder, running a session while catching panics, and
//! comparing outputs with a tolerance and exact dtypes and shapes.
#![allow(dead_code)] // each test binary uses its own subset

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use tandem::testing::first_mismatch;
use tandem::{RunReport, Session, SessionOptions, Tensor};

/// The workspace root (the parent of `runtime/`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("runtime/ has a parent")
        .to_path_buf()
}

/// Handle generated data that is not there: a failure under CI (env `CI` set), else a notice.
/// Returns normally only outside CI; the caller then skips.
pub fn data_missing(what: &Path) {
    let msg = format!(
        "{} is missing: run scripts/setup.sh to generate it",
        what.display()
    );
    if std::env::var_os("CI").is_some() {
        panic!("{msg}");
    }
    eprintln!("notice: {msg}; test skipped");
}

/// Named tensors, in file order.
pub type Named = Vec<(String, Tensor)>;

/// The `prefix_K.pb` files of `dir`, in K order.
fn numbered_pbs(dir: &Path, prefix: &str) -> Result<Vec<PathBuf>, String> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
    let mut found: Vec<(usize, PathBuf)> = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(k) = name
            .strip_prefix(prefix)
            .and_then(|r| r.strip_suffix(".pb"))
            .and_then(|k| k.parse::<usize>().ok())
        else {
            continue;
        };
        found.push((k, e.path()));
    }
    found.sort();
    Ok(found.into_iter().map(|(_, p)| p).collect())
}

fn read_pb(path: &Path) -> Result<(String, Tensor), String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    tandem::import::read_tensor_pb(&bytes).map_err(|e| {
        format!(
            "test data {}: {e}",
            path.file_name().unwrap_or_default().to_string_lossy()
        )
    })
}

/// The inputs and expected outputs of an ONNX test folder (`<dir>/test_data_set_0`).
/// Tensors without a name in the file are named after the session's input / output at the
/// same position.
pub fn load_test_data(data_dir: &Path, session: &Session) -> Result<(Named, Named), String> {
    let load = |prefix: &str, declared: Vec<String>| -> Result<Named, String> {
        let mut out = Vec::new();
        for (k, p) in numbered_pbs(data_dir, prefix)?.iter().enumerate() {
            let (mut name, t) = read_pb(p)?;
            if name.is_empty() {
                name = declared.get(k).cloned().unwrap_or_default();
            }
            out.push((name, t));
        }
        Ok(out)
    };
    let ins = load(
        "input_",
        session.inputs().into_iter().map(|i| i.name).collect(),
    )?;
    let outs = load(
        "output_",
        session.outputs().into_iter().map(|o| o.name).collect(),
    )?;
    if outs.is_empty() {
        return Err(format!("no output_K.pb in {}", data_dir.display()));
    }
    Ok((ins, outs))
}

/// The text of a caught panic payload.
pub fn panic_text(p: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-text panic".into()
    }
}

/// `Session::new`, with errors and panics turned into text.
pub fn open_session(model: &Path, options: SessionOptions) -> Result<Session, String> {
    match catch_unwind(AssertUnwindSafe(|| Session::new(model, options))) {
        Ok(Ok(s)) => Ok(s),
        Ok(Err(e)) => Err(format!("load: {e}")),
        Err(p) => Err(format!("load panicked: {}", panic_text(p))),
    }
}

/// One `run_with_report`, with errors and panics turned into text.
pub fn run_once(session: &Session, inputs: &Named) -> Result<(Named, RunReport), String> {
    let args: Vec<(&str, Tensor)> = inputs
        .iter()
        .map(|(n, t)| (n.as_str(), t.clone()))
        .collect();
    match catch_unwind(AssertUnwindSafe(|| session.run_with_report(&args))) {
        Ok(Ok(r)) => Ok(r),
        Ok(Err(e)) => Err(format!("run: {e}")),
        Err(p) => Err(format!("run panicked: {}", panic_text(p))),
    }
}

/// Max `|got - want|` over the elements; NaN against NaN and equal infinities count 0, any
/// other pairing with a NaN or an infinity counts infinite.
pub fn max_abs_err(got: &Tensor, want: &Tensor) -> f64 {
    (0..got.numel().min(want.numel()))
        .map(|i| {
            let (g, w) = (got.data.get_f64(i), want.data.get_f64(i));
            if g == w || (g.is_nan() && w.is_nan()) {
                0.0
            } else {
                let d = (g - w).abs();
                if d.is_nan() {
                    f64::INFINITY
                } else {
                    d
                }
            }
        })
        .fold(0.0, f64::max)
}

/// Compare one tensor: dtype and shape exactly, elements by `|got-want| <= atol + rtol*|want|`
/// (NaN equals NaN). Returns the max abs difference when close, else what differs.
pub fn compare(got: &Tensor, want: &Tensor, rtol: f64, atol: f64) -> Result<f64, String> {
    if got.dtype() != want.dtype() {
        return Err(format!("dtype {} (want {})", got.dtype(), want.dtype()));
    }
    if got.shape != want.shape {
        return Err(format!("shape {:?} (want {:?})", got.shape, want.shape));
    }
    let err = max_abs_err(got, want);
    match first_mismatch(got, want, rtol, atol) {
        None => Ok(err),
        Some((i, g, w)) => Err(format!(
            "element {i} of {:?}: got {g}, want {w} (max abs err {err:.3e}, rtol {rtol}, atol {atol})",
            want.shape
        )),
    }
}

/// Compare the outputs of a run with the expected ones, matched by name (by position when
/// the names differ). Returns the max abs difference over all outputs, or the first problem.
pub fn compare_outputs(got: &Named, want: &Named, rtol: f64, atol: f64) -> Result<f64, String> {
    if got.len() != want.len() {
        return Err(format!("{} outputs (want {})", got.len(), want.len()));
    }
    let mut worst = 0.0f64;
    for (k, (name, w)) in want.iter().enumerate() {
        let g = got.iter().find(|(n, _)| n == name).unwrap_or(&got[k]);
        let e = compare(&g.1, w, rtol, atol).map_err(|e| format!("output `{name}`: {e}"))?;
        worst = worst.max(e);
    }
    Ok(worst)
}

/// Per-output max abs differences (`None` where dtype or shape differ), for reports.
pub fn output_errors(got: &Named, want: &Named) -> Vec<(String, Option<f64>)> {
    want.iter()
        .enumerate()
        .map(|(k, (name, w))| {
            let g = got.iter().find(|(n, _)| n == name).or(got.get(k));
            let e = g.and_then(|(_, g)| {
                (g.dtype() == w.dtype() && g.shape == w.shape).then(|| max_abs_err(g, w))
            });
            (name.clone(), e)
        })
        .collect()
}

/// The GPU fallbacks of a run, one text per node: `node (op): reason`.
pub fn fallbacks(report: &RunReport) -> Vec<String> {
    report
        .fallbacks()
        .map(|n| {
            format!(
                "{} ({}): {}",
                n.name,
                n.op_type,
                n.fallback.as_deref().unwrap_or("")
            )
        })
        .collect()
}

/// One line of text, at most `max` characters (for failure lists).
pub fn one_line(s: &str, max: usize) -> String {
    let flat: String = s.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() > max {
        let cut: String = flat.chars().take(max).collect();
        format!("{cut}...")
    } else {
        flat
    }
}

/// The input tensors of `node`, in order: its initializers, the test data for graph inputs, and
/// an empty f32 tensor for an omitted optional input.
pub fn node_inputs(
    graph: &tandem::graph::Graph,
    node: &tandem::graph::Node,
    inputs: &Named,
) -> Vec<Tensor> {
    node.inputs
        .iter()
        .map(|i| match i {
            None => Tensor::f32(&[0], vec![]),
            Some(v) => match &graph.values[*v].constant {
                Some(c) => (**c).clone(),
                None => inputs
                    .iter()
                    .find(|(n, _)| *n == graph.values[*v].name)
                    .map(|(_, t)| t.clone())
                    .expect("every graph input has test data"),
            },
        })
        .collect()
}
