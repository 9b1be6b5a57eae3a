//! Split == unsplit, for every splittable op: each enabled single-node ONNX conformance test is
//! run with rows `0..cut` on the CPU and `cut..` on the GPU (the real adapter), at several cuts,
//! and must match the test's expected outputs within its tolerance.

mod common;

use std::panic::{catch_unwind, AssertUnwindSafe};
use tandem::testing::{const_metas, run_split};
use tandem::{Session, SessionOptions, Tensor, TensorMeta};
use tandem_ops::shape::row_count;

struct Line {
    name: String,
    rtol: f64,
    atol: f64,
}

fn enabled_gpu_tests(manifest: &str) -> Vec<Line> {
    manifest
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            let name = words.next()?.to_string();
            let (mut rtol, mut atol, mut cpu_only) = (1e-3, 1e-5, false);
            for w in words {
                match w.split_once('=') {
                    Some(("rtol", v)) => rtol = v.parse().ok()?,
                    Some(("atol", v)) => atol = v.parse().ok()?,
                    _ if w == "cpu-only" => cpu_only = true,
                    _ => {}
                }
            }
            (!cpu_only).then_some(Line { name, rtol, atol })
        })
        .collect()
}

#[test]
fn split_runs_equal_expected_outputs_for_every_splittable_op() {
    let root = common::repo_root();
    let data = root.join("conformance-data/node");
    if !data.exists() {
        common::data_missing(&data);
        return;
    }
    let manifest = std::fs::read_to_string(root.join("conformance/manifest.txt"))
        .expect("conformance/manifest.txt");
    let mut failures = Vec::new();
    let mut split_ops = std::collections::BTreeSet::new();
    let mut cases = 0;
    for line in enabled_gpu_tests(&manifest) {
        let dir = data.join(&line.name);
        let Ok(session) = Session::new(
            dir.join("model.onnx").as_path(),
            SessionOptions::default().placement(tandem::Placement::Cpu),
        ) else {
            continue;
        };
        let graph = session.graph();
        if graph.nodes.len() != 1 || graph.nodes[0].outputs.len() != 1 {
            continue;
        }
        let Ok((inputs, expected)) = common::load_test_data(&dir.join("test_data_set_0"), &session)
        else {
            continue;
        };
        let node = &graph.nodes[0];
        let ins: Vec<Tensor> = node
            .inputs
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
            .collect();
        let metas: Vec<TensorMeta> = const_metas(&ins);
        let refs: Vec<&TensorMeta> = metas.iter().collect();
        let Ok(outs) = node.op.infer(&refs) else {
            continue;
        };
        // The helpers below compute every output the op infers; a node asking for fewer (MaxPool
        // without Indices) is covered by its op's own GPU tests instead.
        if outs.len() != node.outputs.len() {
            continue;
        }
        let Some(axis) = node.op.split_axis(&refs, &outs) else {
            continue;
        };
        let rows = row_count(&outs[0].shape, Some(axis));
        if rows < 2 {
            continue;
        }
        split_ops.insert(node.op_type.clone());
        let mut cuts = vec![1, rows / 2, rows - 1, rows / 3 + 1];
        cuts.sort();
        cuts.dedup();
        for cut in cuts.into_iter().filter(|&c| c > 0 && c < rows) {
            cases += 1;
            let got = catch_unwind(AssertUnwindSafe(|| run_split(node.op.as_ref(), &ins, cut)));
            match got {
                Err(p) => failures.push(format!(
                    "{} cut {cut}/{rows}: {}",
                    line.name,
                    common::panic_text(p)
                )),
                Ok(got) => {
                    if let Err(e) = common::compare(&got[0], &expected[0].1, line.rtol, line.atol) {
                        failures.push(format!("{} cut {cut}/{rows}: {e}", line.name));
                    }
                }
            }
        }
    }
    println!(
        "split equivalence: {cases} split runs over {} op types: {}",
        split_ops.len(),
        split_ops.iter().cloned().collect::<Vec<_>>().join(" ")
    );
    assert!(
        failures.is_empty(),
        "{} split runs differ from the expected outputs:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(
        split_ops.len() >= 30,
        "only {} op types were split; splitting is not exercised",
        split_ops.len()
    );
}
