//! The models a run measures and their inputs and reference outputs.
//!
//! Sits between the files `scripts/fetch_models.py` makes (`models/manifest.json`,
//! `<name>/model.onnx`, `<name>/test_data_set_0/{input,output}_K.pb` with onnxruntime's
//! outputs; see docs/models.md), any `.onnx` a user passes (inputs then follow `tandem run`'s
//! documented defaults, and the reference is this run's onnxruntime output), and the runners.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use tandem::graph::{Dim, Graph};
use tandem::{DType, Tensor};

/// `tandem run`'s documented input defaults, shared with the CLI rather than written twice.
#[path = "../../cli/src/inputs.rs"]
#[allow(dead_code)]
mod cli_inputs;

/// Tensors by name, in the model's order.
pub type Named = Vec<(String, Tensor)>;

/// One model to benchmark.
#[derive(Debug, Clone)]
pub struct ModelCase {
    pub name: String,
    pub path: PathBuf,
    /// ONNX test folder with inputs and onnxruntime's outputs, when there is one.
    pub test_data: Option<PathBuf>,
}

/// Every model of `manifest.json` in `dir` (benchmark-only ones included), in manifest order.
pub fn manifest(dir: &Path) -> Result<Vec<ModelCase>> {
    let path = dir.join("manifest.json");
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "{}: run scripts/setup.sh to fetch the models",
            path.display()
        )
    })?;
    let all: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
    let Some(list) = all.as_array() else {
        bail!("{} is not a list", path.display());
    };
    list.iter()
        .map(|m| {
            let field = |k: &str| {
                m[k].as_str()
                    .with_context(|| format!("{}: an entry has no `{k}`", path.display()))
            };
            Ok(ModelCase {
                name: field("name")?.to_string(),
                path: dir.join(field("path")?),
                test_data: m["test_data"].as_str().map(|t| dir.join(t)),
            })
        })
        .collect()
}

/// A model given by path: named after its file (or its folder when the file is `model.onnx`).
pub fn from_path(path: &Path) -> ModelCase {
    let stem = path.file_stem().unwrap_or_default().to_string_lossy();
    let name = if stem == "model" {
        path.parent()
            .and_then(|p| p.file_name())
            .map_or(stem.to_string(), |n| n.to_string_lossy().into_owned())
    } else {
        stem.to_string()
    };
    let data = path.with_file_name("test_data_set_0");
    ModelCase {
        name,
        path: path.to_path_buf(),
        test_data: data.is_dir().then_some(data),
    }
}

/// The `prefix_K.pb` tensors of `dir` in K order; unnamed ones take `declared[K]`.
fn read_pbs(dir: &Path, prefix: &str, declared: &[String]) -> Result<Named> {
    let mut found: Vec<(usize, PathBuf)> = Vec::new();
    for e in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let p = e?.path();
        let name = p
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        if let Some(k) = name
            .strip_prefix(prefix)
            .and_then(|r| r.strip_suffix(".pb"))
            .and_then(|k| k.parse().ok())
        {
            found.push((k, p));
        }
    }
    found.sort();
    found
        .into_iter()
        .map(|(k, p)| {
            let bytes = std::fs::read(&p).with_context(|| format!("reading {}", p.display()))?;
            let (mut name, t) = tandem::import::read_tensor_pb(&bytes)
                .with_context(|| format!("test data {}", p.display()))?;
            if name.is_empty() {
                name = declared.get(k).cloned().unwrap_or_default();
            }
            Ok((name, t))
        })
        .collect()
}

fn names(graph: &Graph, ids: &[usize]) -> Vec<String> {
    ids.iter().map(|&v| graph.values[v].name.clone()).collect()
}

/// The inputs of `case`, and the reference outputs when its test folder has them.
pub fn inputs(case: &ModelCase, graph: &Graph) -> Result<(Named, Option<Named>)> {
    if let Some(dir) = &case.test_data {
        let ins = read_pbs(dir, "input_", &names(graph, &graph.inputs))?;
        let outs = read_pbs(dir, "output_", &names(graph, &graph.outputs))?;
        return Ok((ins, (!outs.is_empty()).then_some(outs)));
    }
    let mut ins = Vec::new();
    for &v in &graph.inputs {
        let val = &graph.values[v];
        let Some(dims) = &val.shape else {
            bail!(
                "input `{}` declares no shape: cannot make a default",
                val.name
            );
        };
        let shape: Vec<usize> = dims
            .iter()
            .map(|d| match d {
                Dim::Fixed(n) => *n,
                Dim::Symbolic(_) => 1,
            })
            .collect();
        let dtype = val.dtype.unwrap_or(DType::F32);
        ins.push((
            val.name.clone(),
            cli_inputs::default_tensor(&val.name, dtype, &shape),
        ));
    }
    Ok((ins, None))
}

/// `name dtype [shape]` of each tensor.
pub fn describe(named: &Named) -> Vec<String> {
    named
        .iter()
        .map(|(n, t)| format!("{n} {} {:?}", t.dtype(), t.shape))
        .collect()
}

/// Max |got - want| over all outputs, matched by name (by position when names differ).
/// Errors when an output is missing or its element count differs; dtypes may differ (a peer
/// may return int32 where the model says int64) as long as the values compare.
pub fn max_abs_diff(got: &Named, want: &Named) -> Result<f64> {
    let mut worst = 0.0f64;
    for (k, (name, w)) in want.iter().enumerate() {
        let Some((_, g)) = got.iter().find(|(n, _)| n == name).or(got.get(k)) else {
            bail!("output `{name}` is missing");
        };
        if g.numel() != w.numel() {
            bail!(
                "output `{name}`: shape {:?}, reference {:?}",
                g.shape,
                w.shape
            );
        }
        worst = worst.max(tandem::testing::max_abs_diff(g, w));
    }
    Ok(worst)
}

/// `name` as a file name (characters outside `[A-Za-z0-9._-]` become `_`).
fn file_safe(name: &str) -> String {
    name.chars()
        .map(|c| match c.is_ascii_alphanumeric() || "._-".contains(c) {
            true => c,
            false => '_',
        })
        .collect()
}

/// Each tensor of `named` as `<k>_<name>.npy` in `dir` (made if missing), with its name: how
/// inputs and references reach a child process (onnxruntime's driver, tandem's rows).
pub fn write_npys(named: &Named, dir: &Path) -> Result<Vec<(String, PathBuf)>, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    named
        .iter()
        .enumerate()
        .map(|(k, (name, t))| {
            let p = dir.join(format!("{k}_{}.npy", file_safe(name)));
            std::fs::write(&p, tandem::npy::to_npy(t))
                .map_err(|e| format!("{}: {e}", p.display()))?;
            Ok((name.clone(), p))
        })
        .collect()
}

/// The last three lines of a child process's stderr, joined by ` | `: why it failed, on one
/// line of a row's error.
pub fn stderr_tail(stderr: &str) -> String {
    let last: Vec<&str> = stderr.lines().rev().take(3).collect();
    last.into_iter().rev().collect::<Vec<_>>().join(" | ")
}

/// The tensors [`write_npys`] wrote (or a child process did), by name.
pub fn read_npys(files: &[(String, PathBuf)]) -> Result<Named, String> {
    files
        .iter()
        .map(|(name, p)| {
            let bytes = std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()))?;
            let t = tandem::npy::from_npy(&bytes).map_err(|e| format!("`{name}`: {e}"))?;
            Ok((name.clone(), t))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_abs_diff_matches_by_name_and_checks_sizes() {
        let want = vec![
            ("a".to_string(), Tensor::f32(&[2], vec![1.0, 2.0])),
            ("b".to_string(), Tensor::f32(&[1], vec![5.0])),
        ];
        let got = vec![
            ("b".to_string(), Tensor::f32(&[1], vec![5.5])),
            ("a".to_string(), Tensor::f32(&[2], vec![1.0, 1.75])),
        ];
        assert_eq!(max_abs_diff(&got, &want).unwrap(), 0.5);
        let short = vec![("a".to_string(), Tensor::f32(&[1], vec![1.0]))];
        assert!(max_abs_diff(&short, &want).is_err());
    }

    #[test]
    fn a_model_file_is_named_after_its_folder() {
        assert_eq!(from_path(Path::new("/m/magika/model.onnx")).name, "magika");
        assert_eq!(from_path(Path::new("/m/mm1024.onnx")).name, "mm1024");
    }
}
