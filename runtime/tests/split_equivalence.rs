//! Split == unsplit, for every splittable op: each enabled single-node ONNX conformance test is
//! run with rows `0..cut` on the CPU and `cut..` on the GPU (the real adapter), at several cuts,
//! and must match the test's expected outputs within its tolerance.

mod common;

use std::panic::{catch_unwind, AssertUnwindSafe};
use tandem::exec::{execute, Context, GpuConstants};
use tandem::graph::{Graph, Node, Value};
use tandem::plan::{build, Placement, Plan, Request, StepKind};
use tandem::schedule::Policy;
use tandem::testing::{const_metas, run_split};
use tandem::{DType, Session, SessionOptions, Tensor, TensorMeta};
use tandem_ops::shape::row_count;
use tandem_ops::{AttrValue, Attrs};

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
        let ins = common::node_inputs(graph, node, &inputs);
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

/// An f32 value of a hand-built graph.
fn f32_value(name: &str) -> Value {
    Value {
        name: name.into(),
        dtype: Some(DType::F32),
        shape: None,
        constant: None,
    }
}

/// A node of a hand-built graph (opset 13), named after its op type.
fn node(op_type: &str, attrs: Attrs, inputs: &[usize], out: usize) -> Node {
    Node {
        name: op_type.to_lowercase(),
        op_type: op_type.into(),
        domain: String::new(),
        opset: 13,
        inputs: inputs.iter().map(|&i| Some(i)).collect(),
        outputs: vec![out],
        op: tandem_ops::registry::build(op_type, &attrs).expect("registered op"),
        attributes: None,
    }
}

/// The plan of `graph` with every node whole on the GPU (then edited by the tests).
fn gpu_plan(graph: &Graph, inputs: &[Tensor], gpu: &tandem::gpu::Gpu) -> Plan {
    let metas: Vec<TensorMeta> = inputs.iter().map(|t| t.meta()).collect();
    let request = Request {
        placement: Placement::Gpu,
        overrides: &[],
        costs: None,
        policy: Policy::HeftSplit,
        assume_gpu: false,
    };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    build(graph, &metas, &request, Some(gpu), &pool).expect("plan")
}

/// Step `s` of `plan` split at output row `cut`, its `chained` inputs read in their halves.
fn split_step(graph: &Graph, plan: &mut Plan, s: usize, cut: usize, chained: Vec<usize>) {
    let step = &mut plan.steps[s];
    let op = &graph.nodes[step.node].op;
    let ins: Vec<&TensorMeta> = step.inputs.iter().collect();
    let rows = step.rows.end;
    step.kind = StepKind::Split {
        cut,
        row_len: step.outputs[0].numel() / rows,
        kernels: op.gpu(&ins, &step.outputs, cut..rows).expect("gpu kernels"),
    };
    step.chained = chained;
}

/// Run `plan` on the CPU (one thread) and the real adapter.
fn run_plan(graph: &Graph, plan: &Plan, inputs: &[Tensor]) -> (Vec<Tensor>, tandem::RunReport) {
    let gpu = tandem::testing::gpu();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let constants = GpuConstants::default();
    let cx = Context {
        graph,
        plan,
        gpu: Some(gpu.as_ref()),
        pool: &pool,
        constants: &constants,
        node_times: true,
    };
    execute(&cx, inputs.to_vec()).expect("run")
}

/// Relu(x) -> Add(_, y) -> Softmax(axis -1) on [6, 40], every node split at the same fraction
/// (Softmax rows 0..k on the CPU, elementwise rows 0..40k), run by the executor on the CPU and
/// the real adapter. Chained, the values between the nodes stay in their halves: the only
/// transfers are the uploads of x and y and the final join. Both ways equal a naive loop.
#[test]
fn chained_splits_equal_a_naive_loop_with_no_joins_inside() {
    let (n, d) = (6usize, 40usize);
    let graph = Graph {
        values: ["x", "y", "r", "a", "o"].map(f32_value).to_vec(),
        nodes: vec![
            node("Relu", Attrs::new(13), &[0], 2),
            node("Add", Attrs::new(13), &[2, 1], 3),
            node(
                "Softmax",
                Attrs::new(13).with("axis", AttrValue::Int(-1)),
                &[3],
                4,
            ),
        ],
        inputs: vec![0, 1],
        outputs: vec![4],
    };
    let xs: Vec<f32> = (0..n * d)
        .map(|i| ((i * 37 % 23) as f32 - 11.0) / 4.0)
        .collect();
    let ys: Vec<f32> = (0..n * d)
        .map(|i| ((i * 11 % 17) as f32 - 8.0) / 8.0)
        .collect();
    let mut want = vec![0f32; n * d];
    for r in 0..n {
        let a: Vec<f32> = (0..d)
            .map(|c| xs[r * d + c].max(0.0) + ys[r * d + c])
            .collect();
        let m = a.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let sum: f32 = a.iter().map(|v| (v - m).exp()).sum();
        for c in 0..d {
            want[r * d + c] = (a[c] - m).exp() / sum;
        }
    }
    let want = Tensor::f32(&[n, d], want);
    let inputs = vec![Tensor::f32(&[n, d], xs), Tensor::f32(&[n, d], ys)];
    let whole = gpu_plan(&graph, &inputs, &tandem::testing::gpu());
    assert_eq!(whole.steps.len(), 3);
    for k in [1, 3, 5] {
        for chain in [true, false] {
            let mut plan = whole.clone();
            for s in 0..plan.steps.len() {
                let step = &plan.steps[s];
                let ins: Vec<&TensorMeta> = step.inputs.iter().collect();
                let chained = if chain {
                    graph.nodes[step.node].op.row_local(&ins, &step.outputs)
                } else {
                    Vec::new()
                };
                if chain && s > 0 {
                    assert!(chained.contains(&0), "the chain reads its first input");
                }
                let cut = k * step.rows.end / n;
                split_step(&graph, &mut plan, s, cut, chained);
            }
            let (outs, report) = run_plan(&graph, &plan, &inputs);
            tandem::testing::assert_close(&outs[0], &want, 1e-5, 1e-6);
            let to_cpu = report
                .transfers
                .iter()
                .filter(|t| t.to == tandem::Device::Cpu)
                .count();
            if chain {
                assert_eq!((report.uploads, report.downloads), (2, 1), "cut {k}/{n}");
                assert_eq!(to_cpu, 1, "only the final join downloads (cut {k}/{n})");
            } else {
                // Each split is joined before the next reads it: a download per node and an
                // upload of each joined host half.
                assert_eq!((report.uploads, report.downloads), (4, 3), "cut {k}/{n}");
            }
        }
    }
}

/// A split value read twice by one node: Relu(x) split at row `k`, then MatMul(r, r) split at
/// the same row with only A chained (B must be joined, not read as its halves), then Mul(r, r)
/// whole on the CPU (its join once served the second read the GPU half alone: a wrong magika
/// result under stress). Both equal a naive loop.
#[test]
fn a_split_value_read_twice_by_one_node_is_joined_once() {
    let n = 8usize;
    let graph = Graph {
        values: ["x", "r", "sq", "mm"].map(f32_value).to_vec(),
        nodes: vec![
            node("Relu", Attrs::new(13), &[0], 1),
            node("MatMul", Attrs::new(13), &[1, 1], 3),
            node("Mul", Attrs::new(13), &[1, 1], 2),
        ],
        inputs: vec![0],
        outputs: vec![2, 3],
    };
    let xs: Vec<f32> = (0..n * n)
        .map(|i| ((i * 37 % 23) as f32 - 9.0) / 4.0)
        .collect();
    let r: Vec<f32> = xs.iter().map(|v| v.max(0.0)).collect();
    let sq: Vec<f32> = r.iter().map(|v| v * v).collect();
    let mut mm = vec![0f32; n * n];
    for i in 0..n {
        for j in 0..n {
            mm[i * n + j] = (0..n).map(|k| r[i * n + k] * r[k * n + j]).sum();
        }
    }
    let inputs = vec![Tensor::f32(&[n, n], xs)];
    let whole = gpu_plan(&graph, &inputs, &tandem::testing::gpu());
    for k in [1, n / 2, n - 1] {
        let mut plan = whole.clone();
        let step_of = |node: usize| plan.steps.iter().position(|s| s.node == node).unwrap();
        let (relu, matmul, mul) = (step_of(0), step_of(1), step_of(2));
        assert!(relu < matmul && matmul < mul, "steps in node order");
        // Relu's rows may be elements: cut it at the same fraction.
        let relu_cut = k * plan.steps[relu].rows.end / n;
        split_step(&graph, &mut plan, relu, relu_cut, Vec::new());
        split_step(&graph, &mut plan, matmul, k, vec![0]);
        plan.steps[mul].kind = StepKind::Whole {
            device: tandem::Device::Cpu,
            kernels: Vec::new(),
        };
        let (outs, _) = run_plan(&graph, &plan, &inputs);
        tandem::testing::assert_close(&outs[0], &Tensor::f32(&[n, n], sq.clone()), 1e-5, 1e-6);
        tandem::testing::assert_close(&outs[1], &Tensor::f32(&[n, n], mm.clone()), 1e-4, 1e-5);
    }
}
