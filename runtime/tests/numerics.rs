//! NaN, +Inf, -Inf and -0.0 propagate the same way on the CPU, on the GPU and split across
//! both, and the same way as onnxruntime (or as tandem's documented rule where it decides).
//!
//! Sits between the data `scripts/gen_numerics.py` writes (`conformance-data/numerics/`: one
//! single-op model per case, inputs with specials at known positions, expected outputs from
//! onnxruntime, `index.json` saying how to compare) and `tandem::testing`'s `run_cpu`,
//! `run_gpu` and `run_split`. Every element is compared: NaN exactly where expected, infinities
//! with their sign, finite values within the case's tolerance; data-movement cases compare the
//! bits (NaN payloads, signalling NaNs, denormals, -0.0). Elements whose value ONNX leaves
//! undefined (float -> int casts of NaN/Inf) are listed in `skip` and not compared.
//!
//! Subnormal results are the adapter's: NVIDIA's Vulkan driver flushes f32 subnormals to zero in
//! compute shaders and WGSL cannot ask for them to be kept. A one-multiply probe says whether
//! this adapter keeps them; where it does not, the `*_subnormal` cases run on the CPU only, and
//! the test says so.

mod common;

use std::collections::BTreeSet;
use std::panic::{catch_unwind, AssertUnwindSafe};
use tandem::testing::{const_metas, row_count_of, run_cpu, run_gpu, run_split, FirstOutputs};
use tandem::{Session, SessionOptions, Tensor, TensorMeta};
use tandem_ops::{registry, Attrs, Data, Op};

/// Op types the cases must cover (issue 6, item 5): a case set missing one fails.
const REQUIRED_OPS: &[&str] = &[
    "Relu",
    "Sigmoid",
    "Tanh",
    "Exp",
    "Log",
    "Sqrt",
    "Abs",
    "Neg",
    "Clip",
    "LeakyRelu",
    "Gelu",
    "Erf",
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Pow",
    "Min",
    "Max",
    "Mean",
    "Sum",
    "Equal",
    "Less",
    "Greater",
    "Where",
    "MatMul",
    "Gemm",
    "Conv",
    "ConvTranspose",
    "Softmax",
    "LogSoftmax",
    "LayerNormalization",
    "BatchNormalization",
    "InstanceNormalization",
    "ReduceSum",
    "ReduceMean",
    "ReduceMax",
    "ReduceMin",
    "ReduceProd",
    "ReduceL2",
    "ReduceLogSumExp",
    "MaxPool",
    "AveragePool",
    "GlobalAveragePool",
    "Resize",
    "Gather",
    "Transpose",
    "Concat",
    "Slice",
    "Cast",
];

/// A named way to run the case's op: cpu, gpu or a split.
type Run<'a> = (String, Box<dyn Fn() -> Vec<Tensor> + 'a>);

/// One entry of `index.json`.
struct Case {
    name: String,
    op: String,
    rtol: f64,
    atol: f64,
    bit_exact: bool,
    skip: BTreeSet<usize>,
}

fn load_index(path: &std::path::Path) -> Vec<Case> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let v: serde_json::Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()));
    v.as_array()
        .expect("index.json is a list")
        .iter()
        .map(|c| Case {
            name: c["name"].as_str().expect("name").to_string(),
            op: c["op"].as_str().expect("op").to_string(),
            rtol: c["rtol"].as_f64().expect("rtol"),
            atol: c["atol"].as_f64().expect("atol"),
            bit_exact: c["bit_exact"].as_bool().expect("bit_exact"),
            skip: c["skip"]
                .as_array()
                .expect("skip")
                .iter()
                .map(|i| i.as_u64().expect("skip index") as usize)
                .collect(),
        })
        .collect()
}

/// The raw bits of element `i` (f32 and f64 as IEEE bits, integers and bools as values).
fn bits(t: &Tensor, i: usize) -> u64 {
    match &t.data {
        Data::F32(v) => v[i].to_bits() as u64,
        Data::F64(v) => v[i].to_bits(),
        _ => t.data.get_i64(i) as u64,
    }
}

/// Every element of `got` against `want`: the first differences, as text (empty when equal).
fn differences(got: &Tensor, want: &Tensor, c: &Case) -> Vec<String> {
    if got.dtype() != want.dtype() || got.shape != want.shape {
        return vec![format!(
            "{} {:?} (want {} {:?})",
            got.dtype(),
            got.shape,
            want.dtype(),
            want.shape
        )];
    }
    let mut out = Vec::new();
    for i in (0..want.numel()).filter(|i| !c.skip.contains(i)) {
        let (g, w) = (got.data.get_f64(i), want.data.get_f64(i));
        let bad = if c.bit_exact {
            bits(got, i) != bits(want, i)
        } else if w.is_nan() || g.is_nan() {
            w.is_nan() != g.is_nan()
        } else if w.is_infinite() || g.is_infinite() {
            g != w
        } else {
            (g - w).abs() > c.atol + c.rtol * w.abs()
        };
        if bad {
            out.push(format!(
                "[{i}] got {g:e} ({:#x}) want {w:e} ({:#x})",
                bits(got, i),
                bits(want, i)
            ));
        }
    }
    out
}

/// The node's op and its input tensors (test data for graph inputs, initializers for the rest).
fn op_and_inputs<'s>(
    session: &'s Session,
    inputs: &common::Named,
) -> (FirstOutputs<&'s (dyn Op + 'static)>, Vec<Tensor>) {
    let graph = session.graph();
    assert_eq!(graph.nodes.len(), 1, "a numerics case is one node");
    let node = &graph.nodes[0];
    let ins = common::node_inputs(graph, node, inputs);
    (FirstOutputs(node.op.as_ref(), node.outputs.len()), ins)
}

/// Whether the adapter keeps f32 subnormals: 2^-140 * 1 on the GPU, compared with the CPU.
fn gpu_keeps_subnormals() -> bool {
    let mul = registry::build("Mul", &Attrs::new(14)).expect("Mul");
    let tiny = f32::from_bits(0x0000_0200); // 2^-140
    let ins = [Tensor::f32(&[1], vec![tiny]), Tensor::f32(&[1], vec![1.0])];
    let got = run_gpu(mul.as_ref(), &ins);
    match &got[0].data {
        Data::F32(v) => v[0].to_bits() == tiny.to_bits(),
        other => panic!("Mul gave {other:?}"),
    }
}

/// Run one case on every placement (the CPU alone for a subnormal case where the adapter
/// flushes them); the problems found, one line each.
fn check_case(dir: &std::path::Path, c: &Case, gpu_subnormals: bool) -> Vec<String> {
    let session = match common::open_session(
        &dir.join("model.onnx"),
        SessionOptions::default().placement(tandem::Placement::Cpu),
    ) {
        Ok(s) => s,
        Err(e) => return vec![format!("{}: {e}", c.name)],
    };
    let (inputs, want) = common::load_test_data(&dir.join("test_data_set_0"), &session)
        .unwrap_or_else(|e| panic!("{}: {e}", c.name));
    let (op, ins) = op_and_inputs(&session, &inputs);
    let op: &dyn Op = &op;
    let mut runs: Vec<Run> = vec![("cpu".into(), Box::new(|| run_cpu(op, &ins)))];
    let cpu_only = c.name.contains("subnormal") && !gpu_subnormals;
    if !cpu_only {
        runs.push(("gpu".into(), Box::new(|| run_gpu(op, &ins))));
    }
    let rows = row_count_of(op, &ins);
    let metas: Vec<TensorMeta> = const_metas(&ins);
    let refs: Vec<&TensorMeta> = metas.iter().collect();
    let outs = op.infer(&refs).expect("infer");
    if op.split_axis(&refs, &outs).is_some() && rows >= 2 && !cpu_only {
        let mut cuts = vec![1, rows / 2, rows - 1];
        cuts.dedup();
        for cut in cuts {
            let ins = &ins;
            runs.push((
                format!("split {cut}/{rows}"),
                Box::new(move || run_split(op, ins, cut)),
            ));
        }
    }
    let mut problems = Vec::new();
    for (place, run) in &runs {
        let got = match catch_unwind(AssertUnwindSafe(run)) {
            Ok(g) => g,
            Err(p) => {
                problems.push(format!("{} {place}: {}", c.name, common::panic_text(p)));
                continue;
            }
        };
        // A split joins output 0 only; the other outputs are checked on cpu and gpu.
        let n = if place.starts_with("split") {
            1
        } else {
            want.len()
        };
        for (k, (_, w)) in want.iter().enumerate().take(n) {
            let d = differences(&got[k], w, c);
            if !d.is_empty() {
                problems.push(format!(
                    "{} ({}) {place} output {k}: {} differ: {}",
                    c.name,
                    c.op,
                    d.len(),
                    d.iter().take(4).cloned().collect::<Vec<_>>().join(", ")
                ));
            }
        }
    }
    problems
}

#[test]
fn nan_and_inf_propagate_alike_on_cpu_gpu_and_splits() {
    let root = common::repo_root().join("conformance-data/numerics");
    let index = root.join("index.json");
    if !index.is_file() {
        common::data_missing(&index);
        return;
    }
    let cases = load_index(&index);
    let covered: BTreeSet<&str> = cases.iter().map(|c| c.op.as_str()).collect();
    let missing: Vec<&&str> = REQUIRED_OPS
        .iter()
        .filter(|o| !covered.contains(**o))
        .collect();
    assert!(missing.is_empty(), "no numerics case for {missing:?}");
    let gpu = tandem::testing::gpu();
    let subnormals = gpu_keeps_subnormals();
    // lavapipe (CI's adapter) keeps them: there the probe must not excuse anything.
    assert!(
        subnormals || gpu.adapter().device_type != "Cpu",
        "{} flushes subnormals",
        gpu.adapter().name
    );
    if !subnormals {
        println!(
            "numerics: {} flushes f32 subnormals to zero: the subnormal cases run on the CPU only",
            gpu.adapter().name
        );
    }
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let problems: Vec<String> = cases
        .iter()
        .flat_map(|c| check_case(&root.join(&c.name), c, subnormals))
        .collect();
    std::panic::set_hook(previous);
    println!(
        "numerics: {} cases over {} op types, {} problems",
        cases.len(),
        covered.len(),
        problems.len()
    );
    assert!(
        problems.is_empty(),
        "{} NaN/Inf disagreements:\n{}",
        problems.len(),
        problems.join("\n")
    );
}
