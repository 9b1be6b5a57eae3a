//! The public session API: typed errors a user can act on, placement control, reports, and
//! the same results on every placement. Models are built here with the importer's protobuf
//! messages.

use prost::Message;
use std::sync::Arc;
use tandem::import::proto::*;
use tandem::report::Ran;
use tandem::testing::{assert_close, gpu};
use tandem::{Device, Error, Placement, Selector, Session, SessionOptions, Tensor};

fn vi(name: &str, elem: i32, dims: &[i64]) -> ValueInfoProto {
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            tensor_type: Some(TypeProtoTensor {
                elem_type: elem,
                shape: Some(TensorShapeProto {
                    dim: dims
                        .iter()
                        .map(|&v| Dimension {
                            dim_value: Some(v),
                            dim_param: None,
                        })
                        .collect(),
                }),
            }),
            ..Default::default()
        }),
    }
}

fn node(op: &str, name: &str, inputs: &[&str], outputs: &[&str]) -> NodeProto {
    NodeProto {
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        name: name.into(),
        op_type: op.into(),
        ..Default::default()
    }
}

fn model(nodes: Vec<NodeProto>, weights: Vec<TensorProto>) -> Vec<u8> {
    model_to(nodes, weights, &[2, 4])
}

/// [`model`] with output `y` of shape `y_dims`.
fn model_to(nodes: Vec<NodeProto>, weights: Vec<TensorProto>, y_dims: &[i64]) -> Vec<u8> {
    model_shaped(nodes, weights, &[2, 8], y_dims)
}

/// A model of input `x` of shape `x_dims` and output `y` of shape `y_dims`.
fn model_shaped(
    nodes: Vec<NodeProto>,
    weights: Vec<TensorProto>,
    x_dims: &[i64],
    y_dims: &[i64],
) -> Vec<u8> {
    ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: 17,
        }],
        graph: Some(GraphProto {
            node: nodes,
            name: "test".into(),
            initializer: weights,
            input: vec![vi("x", data_type::FLOAT, x_dims)],
            output: vec![vi("y", data_type::FLOAT, y_dims)],
            ..Default::default()
        }),
        ..Default::default()
    }
    .encode_to_vec()
}

/// The [8, 4] weight `W` holding `w`.
fn weight(w: &[f32]) -> TensorProto {
    TensorProto {
        dims: vec![8, 4],
        data_type: data_type::FLOAT,
        name: "W".into(),
        raw_data: Some(w.iter().flat_map(|v| v.to_le_bytes()).collect()),
        ..Default::default()
    }
}

/// y = Sigmoid(Relu(x @ W) + 1): four nodes on a [2, 8] input.
fn mlp() -> (Vec<u8>, Vec<f32>) {
    let w: Vec<f32> = (0..32).map(|i| (i as f32 * 0.37).sin()).collect();
    let weight = weight(&w);
    let bytes = model(
        vec![
            node("MatMul", "mm", &["x", "W"], &["h"]),
            node("Relu", "relu", &["h"], &["r"]),
            node("Add", "add", &["r", "one"], &["a"]),
            node("Sigmoid", "sig", &["a"], &["y"]),
        ],
        vec![weight, one()],
    );
    (bytes, w)
}

/// The scalar constant `one`.
fn one() -> TensorProto {
    TensorProto {
        dims: vec![],
        data_type: data_type::FLOAT,
        name: "one".into(),
        float_data: vec![1.0],
        ..Default::default()
    }
}

fn x() -> Tensor {
    Tensor::f32(&[2, 8], (0..16).map(|i| i as f32 / 8.0 - 1.0).collect())
}

/// [`x`] times `k`: another input of the same shape.
fn x_times(k: f32) -> Tensor {
    Tensor::f32(
        &[2, 8],
        x().as_f32().unwrap().iter().map(|v| v * k).collect(),
    )
}

/// The same computation written out by hand.
fn reference(w: &[f32]) -> Tensor {
    reference_for(w, &x())
}

/// [`reference`] on another input of the same shape.
fn reference_for(w: &[f32], x: &Tensor) -> Tensor {
    let xv = x.as_f32().unwrap();
    let mut y = vec![0.0f32; 8];
    for r in 0..2 {
        for c in 0..4 {
            let h: f32 = (0..8).map(|k| xv[r * 8 + k] * w[k * 4 + c]).sum();
            y[r * 4 + c] = 1.0 / (1.0 + (-(h.max(0.0) + 1.0)).exp());
        }
    }
    Tensor::f32(&[2, 4], y)
}

#[test]
fn every_placement_gives_the_reference_result() {
    let (bytes, w) = mlp();
    let want = reference(&w);
    for placement in [Placement::Cpu, Placement::Gpu, Placement::Auto] {
        let opts = SessionOptions::default().placement(placement).gpu(gpu());
        let s = Session::new(bytes.as_slice(), opts).unwrap();
        let (outs, report) = s.run_with_report(&[("x", x())]).unwrap();
        assert_eq!(outs[0].0, "y");
        assert_close(&outs[0].1, &want, 1e-5, 1e-6);
        assert_eq!(report.nodes.len(), 4, "{report}");
        if placement == Placement::Gpu {
            assert_eq!(report.count(Device::Gpu), 4, "{report}");
            assert_eq!(
                report.gpu_submits, 1,
                "four consecutive GPU nodes (8 dispatches and clears) go in one submit"
            );
            assert_eq!(report.downloads, 1, "only the output comes back");
        }
        if placement == Placement::Cpu {
            assert_eq!(report.count(Device::Cpu), 4);
            assert_eq!(report.uploads + report.downloads, 0);
        }
    }
}

/// An adapter that runs its shaders on the CPU's cores (lavapipe), beside a CPU pool that uses
/// every core, gets no row splits in `auto`, and the session says why; placement `cpu` says
/// nothing of it. (The thread-count rule itself: `gpu::tests`.)
#[test]
fn auto_does_not_split_across_an_adapter_on_the_same_cores() {
    let (bytes, _) = mlp();
    let g = gpu();
    let cores = std::thread::available_parallelism().unwrap().get();
    let opts = SessionOptions::default()
        .placement(Placement::Auto)
        .gpu(g.clone());
    let s = Session::new(bytes.as_slice(), opts).unwrap();
    // A pool of every core leaves an adapter on the CPU none, whatever its own thread count.
    let shared = g.runs_on_cpu();
    assert_eq!(g.shares_cores_with(cores), shared, "{:?}", g.adapter());
    let warned = s.warnings().iter().any(|w| w.contains("no row splits"));
    if shared {
        assert!(warned, "{:?}", s.warnings());
        assert_eq!(s.policy(), tandem::schedule::Policy::Heft);
        let (_, report) = s.run_with_report(&[("x", x())]).unwrap();
        assert!(
            !report
                .nodes
                .iter()
                .any(|n| matches!(n.ran, Ran::Split { .. })),
            "{report}"
        );
    } else {
        assert!(!warned, "{:?}", s.warnings());
    }
    let cpu = SessionOptions::default().placement(Placement::Cpu).gpu(g);
    let s = Session::new(bytes.as_slice(), cpu).unwrap();
    assert!(!s.warnings().iter().any(|w| w.contains("no row splits")));
}

/// A long stretch of GPU steps goes to the GPU in several batches (`Batch::is_full`), so that
/// the GPU starts while the host records the rest; the report's GPU lane places each batch after
/// the one before it, since the queue runs them in turn.
#[test]
fn a_long_stretch_of_gpu_steps_is_submitted_in_full_batches() {
    const STEPS: usize = 24;
    let dims = [256i64, 1024];
    let nodes = (0..STEPS)
        .map(|i| {
            let from = if i == 0 {
                "x".to_string()
            } else {
                format!("a{i}")
            };
            let to = if i == STEPS - 1 {
                "y".to_string()
            } else {
                format!("a{}", i + 1)
            };
            node("Add", &format!("add{i}"), &[&from, "one"], &[&to])
        })
        .collect();
    let bytes = model_shaped(nodes, vec![one()], &dims, &dims);
    let opts = SessionOptions::default()
        .placement(Placement::Gpu)
        .gpu(gpu())
        .fuse(false);
    let s = Session::new(bytes.as_slice(), opts).unwrap();
    let n = 256 * 1024;
    let x = Tensor::f32(&[256, 1024], (0..n).map(|i| (i % 97) as f32).collect());
    let want = Tensor::f32(
        &[256, 1024],
        (0..n).map(|i| (i % 97) as f32 + STEPS as f32).collect(),
    );
    for _ in 0..2 {
        let (outs, report) = s.run_with_report(&[("x", x.clone())]).unwrap();
        assert_close(&outs[0].1, &want, 0.0, 1e-6);
        // Each step records a clear of its output and one dispatch.
        let steps_per_batch = tandem::gpu::entries_per_submit().div_ceil(2);
        assert_eq!(
            report.gpu_submits,
            STEPS.div_ceil(steps_per_batch),
            "{report}"
        );
        let lane: Vec<_> = report
            .nodes
            .iter()
            .filter(|n| n.ran == Ran::On(Device::Gpu))
            .collect();
        assert_eq!(lane.len(), STEPS, "{report}");
        for pair in lane.windows(2) {
            let end = pair[0].start + pair[0].time;
            assert!(
                pair[1].start + std::time::Duration::from_micros(1) >= end,
                "{} starts at {:?}, before {} ends at {:?}\n{report}",
                pair[1].name,
                pair[1].start,
                pair[0].name,
                end
            );
        }
    }
}

/// Nodes are timed only when the run asks: a report's GPU nodes carry their kernel times
/// (timestamp queries) and its CPU nodes theirs; an executor run without `node_times` records
/// no queries, reads no clock per step, and reports 0 for both.
#[test]
fn nodes_are_timed_only_when_the_run_asks() {
    let (bytes, _) = mlp();
    let gpu = gpu();
    assert!(gpu.has_timestamps(), "lavapipe has timestamp queries");
    for (placement, device) in [(Placement::Gpu, Device::Gpu), (Placement::Cpu, Device::Cpu)] {
        let opts = SessionOptions::default()
            .placement(placement)
            .gpu(gpu.clone());
        let s = Session::new(bytes.as_slice(), opts).unwrap();
        let (_, report) = s.run_with_report(&[("x", x())]).unwrap();
        let on = |r: &tandem::report::RunReport| -> Vec<std::time::Duration> {
            (r.nodes.iter())
                .filter(|n| n.ran == Ran::On(device))
                .map(|n| n.time)
                .collect()
        };
        let timed = on(&report);
        assert_eq!(timed.len(), 4, "{report}");
        assert!(timed.iter().all(|t| !t.is_zero()), "{report}");
        let plan = s.plan(&[("x", x())]).unwrap();
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        let constants = tandem::exec::GpuConstants::default();
        for node_times in [false, true] {
            let cx = tandem::exec::Context {
                graph: s.graph(),
                plan: &plan,
                gpu: Some(&gpu),
                pool: &pool,
                constants: &constants,
                node_times,
            };
            let (outs, report) = tandem::exec::execute(&cx, vec![x()]).unwrap();
            assert_close(&outs[0], &reference(&mlp().1), 1e-5, 1e-6);
            let times = on(&report);
            assert_eq!(times.len(), 4, "{report}");
            assert!(
                times.iter().all(|t| t.is_zero() != node_times),
                "{device:?} node_times {node_times}: {report}"
            );
            assert!(!report.total.is_zero(), "{report}");
        }
    }
}

/// A session keeps its runs' host buffers for the next run (exec/host_buffers.rs): runs on
/// other inputs, in turn, must each give their own result, on every placement.
#[test]
fn later_runs_reusing_host_buffers_give_their_own_results() {
    let (bytes, w) = mlp();
    let inputs: Vec<Tensor> = [1.0f32, -2.0, 0.5, 1.0].map(x_times).to_vec();
    for placement in [Placement::Cpu, Placement::Gpu, Placement::Auto] {
        let opts = SessionOptions::default().placement(placement).gpu(gpu());
        let s = Session::new(bytes.as_slice(), opts).unwrap();
        for x in &inputs {
            let outs = s.run(&[("x", x.clone())]).unwrap();
            assert_close(&outs[0].1, &reference_for(&w, x), 1e-5, 1e-6);
        }
    }
}

/// Inputs shared as `Arc<Tensor>` (`Session::run_owned`) are read in place: runs that keep
/// their host buffers for the next run (and an input given by value among them) must leave
/// the caller's tensor as it was and hold no reference to it after the run.
#[test]
fn inputs_shared_with_the_caller_are_left_as_they_were() {
    let (bytes, w) = mlp();
    for placement in [Placement::Cpu, Placement::Gpu, Placement::Auto] {
        let opts = SessionOptions::default().placement(placement).gpu(gpu());
        let s = Session::new(bytes.as_slice(), opts).unwrap();
        for k in [1.0f32, -2.0, 0.5] {
            let x = Arc::new(x_times(k));
            for _ in 0..3 {
                let outs = s.run_owned(vec![("x", x.clone())]).unwrap();
                assert_close(&outs[0].1, &reference_for(&w, &x), 1e-5, 1e-6);
                // A run on another input, given by value, in between.
                s.run_owned(vec![("x", x_times(3.0))]).unwrap();
            }
            assert_eq!(
                x.as_f32().unwrap(),
                x_times(k).as_f32().unwrap(),
                "{placement:?}"
            );
            assert_eq!(Arc::strong_count(&x), 1, "the run let go of the input");
        }
    }
}

/// A view (Reshape) hands its source's data on without a copy when it reads it for the last
/// time (exec.rs `Run::view`): a source that a later node still reads, or a model input, must
/// stay readable. y = (r + Reshape(Reshape(r))) @ W with r = Relu(x), then two more Reshapes
/// of the sum (each the last reader of its source), on every placement and over several runs.
#[test]
fn views_move_only_sources_nobody_reads_later() {
    let (_, w) = mlp();
    let shape = |name: &str, dims: &[i64]| TensorProto {
        dims: vec![dims.len() as i64],
        data_type: data_type::INT64,
        name: name.into(),
        int64_data: dims.to_vec(),
        ..Default::default()
    };
    let bytes = model(
        vec![
            node("Reshape", "x_square", &["x", "s44"], &["xs"]),
            node("Relu", "relu", &["xs"], &["rs"]),
            node("Reshape", "r_rows", &["rs", "s28"], &["r"]),
            node("Reshape", "r_square", &["r", "s44"], &["v"]),
            node("Reshape", "r_again", &["v", "s28"], &["v2"]),
            node("Add", "add", &["v2", "r"], &["a"]),
            node("Reshape", "flat", &["a", "s16"], &["f"]),
            node("Reshape", "rows", &["f", "s28"], &["b"]),
            node("MatMul", "mm", &["b", "W"], &["y"]),
        ],
        vec![
            weight(&w),
            shape("s44", &[4, 4]),
            shape("s28", &[2, 8]),
            shape("s16", &[16]),
        ],
    );
    for placement in [Placement::Cpu, Placement::Gpu, Placement::Auto] {
        let opts = SessionOptions::default().placement(placement).gpu(gpu());
        let s = Session::new(bytes.as_slice(), opts).unwrap();
        for k in [1.0f32, -2.0, 0.5] {
            let x = x_times(k);
            let xv = x.as_f32().unwrap();
            let mut want = vec![0.0f32; 8];
            for r in 0..2 {
                for c in 0..4 {
                    want[r * 4 + c] = (0..8)
                        .map(|i| 2.0 * xv[r * 8 + i].max(0.0) * w[i * 4 + c])
                        .sum();
                }
            }
            let outs = s.run(&[("x", x.clone())]).unwrap();
            assert_close(&outs[0].1, &Tensor::f32(&[2, 4], want), 1e-5, 1e-6);
        }
    }
}

#[test]
fn overrides_by_node_name_and_op_type_win_over_the_placement() {
    let (bytes, w) = mlp();
    let opts = SessionOptions::default()
        .placement(Placement::Gpu)
        .gpu(gpu())
        .force(Selector::OpType("Relu".into()), Device::Cpu)
        .force(Selector::NodeName("sig".into()), Device::Cpu);
    let s = Session::new(bytes.as_slice(), opts).unwrap();
    let (outs, report) = s.run_with_report(&[("x", x())]).unwrap();
    assert_close(&outs[0].1, &reference(&w), 1e-5, 1e-6);
    let ran: Vec<(String, Ran)> = report
        .nodes
        .iter()
        .map(|n| (n.name.to_string(), n.ran))
        .collect();
    assert_eq!(
        ran,
        vec![
            ("mm".into(), Ran::On(Device::Gpu)),
            ("relu".into(), Ran::On(Device::Cpu)),
            ("add".into(), Ran::On(Device::Gpu)),
            ("sig".into(), Ran::On(Device::Cpu)),
        ]
    );
    assert!(
        report.fallbacks().next().is_none(),
        "forced placements are not fallbacks"
    );
}

#[test]
fn input_errors_name_the_input_and_the_reason() {
    let (bytes, _) = mlp();
    let s = Session::new(
        bytes.as_slice(),
        SessionOptions::default().placement(Placement::Cpu),
    )
    .unwrap();
    match s.run(&[]) {
        Err(Error::MissingInput { name, .. }) => assert_eq!(name, "x"),
        other => panic!("expected MissingInput, got {other:?}"),
    }
    match s.run(&[("x", x()), ("z", x())]) {
        Err(Error::Input { name, reason }) => {
            assert_eq!(name, "z");
            assert!(reason.contains("no such input"), "{reason}");
        }
        other => panic!("expected Input error, got {other:?}"),
    }
    match s.run(&[("x", Tensor::i64(&[2, 8], vec![0; 16]))]) {
        Err(Error::Input { reason, .. }) => assert!(reason.contains("dtype f32"), "{reason}"),
        other => panic!("expected a dtype error, got {other:?}"),
    }
    match s.run(&[("x", Tensor::f32(&[2, 7], vec![0.0; 14]))]) {
        Err(Error::Input { reason, .. }) => assert!(reason.contains("[2, 8]"), "{reason}"),
        other => panic!("expected a shape error, got {other:?}"),
    }
}

#[test]
fn an_unsupported_op_names_the_node_the_op_and_the_opset() {
    let bytes = model(vec![node("FancyOp", "my_node", &["x"], &["y"])], vec![]);
    match Session::new(
        bytes.as_slice(),
        SessionOptions::default().placement(Placement::Cpu),
    ) {
        Err(e @ Error::Node { .. }) => {
            let text = e.to_string();
            for part in [
                "my_node",
                "FancyOp",
                "opset 17",
                "not implemented",
                "MatMul",
            ] {
                assert!(text.contains(part), "`{part}` missing from: {text}");
            }
        }
        Err(e) => panic!("expected a node error, got {e}"),
        Ok(_) => panic!("an unknown op must not load"),
    }
}

#[test]
fn unreadable_and_malformed_files_are_errors() {
    let missing = Session::new(
        std::path::Path::new("/no/such/model.onnx"),
        SessionOptions::default(),
    );
    assert!(matches!(missing, Err(Error::Io { .. })));
    let garbage = Session::new(
        &b"\x08\x01\x12garbage"[..],
        SessionOptions::default().placement(Placement::Cpu),
    );
    assert!(
        matches!(garbage, Err(Error::InvalidModel(_))),
        "{:?}",
        garbage.err()
    );
}

#[test]
fn sessions_are_shared_across_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Session>();
    let (bytes, w) = mlp();
    let want = reference(&w);
    let s = Arc::new(
        Session::new(
            bytes.as_slice(),
            SessionOptions::default()
                .placement(Placement::Gpu)
                .gpu(gpu()),
        )
        .unwrap(),
    );
    std::thread::scope(|scope| {
        for _ in 0..4 {
            let s = s.clone();
            let want = want.clone();
            scope.spawn(move || {
                for _ in 0..5 {
                    let outs = s.run(&[("x", x())]).unwrap();
                    assert_close(&outs[0].1, &want, 1e-5, 1e-6);
                }
            });
        }
    });
}

#[test]
fn the_cpu_thread_count_is_configurable() {
    let (bytes, _) = mlp();
    let s = Session::new(
        bytes.as_slice(),
        SessionOptions::default()
            .placement(Placement::Cpu)
            .cpu_threads(1),
    )
    .unwrap();
    assert_eq!(s.cpu_threads(), 1);
}

/// Kernel threads asked to be pinned are, one to a CPU (the default leaves them to the OS),
/// and the result is the same either way.
#[test]
fn kernel_threads_are_pinned_when_asked() {
    let (bytes, w) = mlp();
    let session = |opts: SessionOptions| {
        let s = Session::new(bytes.as_slice(), opts.placement(Placement::Cpu)).unwrap();
        let y = s.run(&[("x", x())]).unwrap().remove(0).1;
        assert_close(&y, &reference(&w), 1e-5, 1e-6);
        s
    };
    let default = session(SessionOptions::default().cpu_threads(2));
    assert!(
        default.pinned_cpus().is_empty(),
        "{:?}",
        default.pinned_cpus()
    );
    let pinned = session(SessionOptions::default().pin_threads(true));
    if cfg!(target_os = "linux") {
        let mut cpus = pinned.pinned_cpus().to_vec();
        assert_eq!(cpus.len(), pinned.cpu_threads());
        let cores = std::thread::available_parallelism().unwrap().get();
        cpus.sort();
        cpus.dedup();
        assert_eq!(cpus.len(), cores.min(pinned.cpu_threads()), "one CPU each");
        assert!(pinned.warnings().is_empty(), "{:?}", pinned.warnings());
    }
}

/// An `auto` plan that keeps every node on the CPU executes exactly like placement `cpu`: the
/// same steps in the graph's order. On a graph with a long and a short branch the scheduler's
/// upward-rank order would run the long branch first (b1, b2, then a).
#[test]
fn an_all_cpu_auto_plan_runs_in_the_cpu_plans_order() {
    use tandem::plan::{self, Request};
    let bytes = model_to(
        vec![
            node("Relu", "a", &["x"], &["ya"]),
            node("Neg", "b1", &["x"], &["y1"]),
            node("Neg", "b2", &["y1"], &["y2"]),
            node("Neg", "b3", &["y2"], &["y3"]),
            node("Add", "add", &["ya", "y3"], &["y"]),
        ],
        vec![],
        &[2, 8],
    );
    let graph = tandem::import::import_bytes(&bytes, None).unwrap();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let costs = tandem::cost::FrozenCosts::new();
    let order = |placement: Placement| {
        let request = Request {
            placement,
            overrides: &[],
            costs: Some(&costs),
            policy: tandem::schedule::Policy::HeftSplit,
            assume_gpu: false,
        };
        // No GPU: every node of the auto plan lands on the CPU.
        let p = plan::build(&graph, &[x().meta()], &request, None, &pool).unwrap();
        (p.steps.iter())
            .map(|s| graph.nodes[s.node].name.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(order(Placement::Cpu), ["a", "b1", "b2", "b3", "add"]);
    assert_eq!(order(Placement::Auto), order(Placement::Cpu));
}

/// A CPU Concat takes over its input 0's buffer and appends the others where that input is
/// read there last (exec/append.rs): chains of such Concats (densenet's dense blocks) must
/// give the plain Concat's result, and an input 0 that a later node still reads, or that
/// the Concat reads twice, must stay as it was. On every placement, over several runs (so
/// buffers kept between runs are appended to as well). On the CPU the plan gives room to
/// exactly the four inputs that may be appended to.
#[test]
fn concats_append_only_to_inputs_nobody_reads_later() {
    let axis0 = |mut n: NodeProto| {
        n.attribute.push(AttributeProto {
            name: "axis".into(),
            i: Some(0),
            r#type: attribute_type::INT,
            ..Default::default()
        });
        n
    };
    let bytes = model_to(
        vec![
            node("Relu", "relu", &["x"], &["r"]),
            axis0(node("Concat", "c1", &["r", "x"], &["c1"])),
            node("Neg", "neg", &["c1"], &["n"]),
            axis0(node("Concat", "c2", &["c1", "n"], &["c2"])),
            node("Abs", "abs", &["x"], &["a"]),
            axis0(node("Concat", "c3", &["a", "c2"], &["c3"])),
            axis0(node("Concat", "e", &["c3", "a", "x"], &["e"])),
            node("Sigmoid", "sig", &["x"], &["s"]),
            axis0(node("Concat", "g", &["s", "s"], &["g"])),
            axis0(node("Concat", "y", &["e", "g"], &["y"])),
        ],
        vec![],
        &[18, 8],
    );
    for placement in [Placement::Cpu, Placement::Gpu, Placement::Auto] {
        let opts = SessionOptions::default().placement(placement).gpu(gpu());
        let s = Session::new(bytes.as_slice(), opts).unwrap();
        if placement == Placement::Cpu {
            let plan = s.plan(&[("x", x())]).unwrap();
            // r, c1 and c3 (each appended to, c1 and c3 passing on e's and y's room) and e;
            // not a (read again by e) nor s (read twice by g).
            assert_eq!(plan.room.iter().filter(|&&r| r > 0).count(), 4);
            assert_eq!(plan.room.iter().max(), Some(&(18 * 8)));
        }
        for k in [1.0f32, -2.0, 0.5] {
            let x = x_times(k);
            let xv = x.as_f32().unwrap();
            let map = |f: fn(f32) -> f32| xv.iter().map(|&v| f(v)).collect::<Vec<f32>>();
            let c1 = [map(|v| v.max(0.0)), xv.to_vec()].concat();
            let c2 = [c1.clone(), c1.iter().map(|v| -v).collect()].concat();
            let (a, sig) = (map(f32::abs), map(|v| 1.0 / (1.0 + (-v).exp())));
            let want = [a.clone(), c2, a, xv.to_vec(), sig.clone(), sig].concat();
            let outs = s.run(&[("x", x.clone())]).unwrap();
            assert_close(&outs[0].1, &Tensor::f32(&[18, 8], want), 1e-6, 1e-6);
        }
    }
}

/// y = x [64, 256] @ W [256, 256] (16.8 MFLOP) and an x.
fn product_64x256x256() -> (Vec<u8>, Tensor) {
    let w: Vec<f32> = (0..256 * 256).map(|i| (i % 7) as f32 * 0.01).collect();
    let wt = TensorProto {
        dims: vec![256, 256],
        data_type: data_type::FLOAT,
        name: "W".into(),
        raw_data: Some(w.iter().flat_map(|v| v.to_le_bytes()).collect()),
        ..Default::default()
    };
    let bytes = model_shaped(
        vec![node("MatMul", "mm", &["x", "W"], &["y"])],
        vec![wt],
        &[64, 256],
        &[64, 256],
    );
    let x = Tensor::f32(&[64, 256], (0..64 * 256).map(|i| (i % 5) as f32).collect());
    (bytes, x)
}

/// `Session::save_cost_profile` writes what the runs taught to the profile the session loaded,
/// and the next session's first plan predicts from it; sessions with nothing to save write
/// nothing.
#[test]
fn a_saved_cost_profile_carries_what_the_runs_taught_to_the_next_session() {
    let dir = std::env::temp_dir().join(format!("tandem-learnt-{}", std::process::id()));
    let path = dir.join("profile.json");
    let (bytes, x) = product_64x256x256();
    let g = gpu();
    // A profile that believes the product takes 168 ms on the CPU, as one calibrated while the
    // machine was busy might.
    tandem::testing::matmul_believed(&g, 1, 1e-8, 1e-6)
        .save(&path)
        .unwrap();
    let opts = SessionOptions::default()
        .placement(Placement::Auto)
        .cpu_threads(1)
        .gpu(g.clone())
        .cost_profile(&path);
    let inputs = [("x", x)];
    let s = Session::new(bytes.as_slice(), opts.clone()).unwrap();
    let loaded = !s.warnings().iter().any(|w| w.starts_with("cost profile"));
    assert!(loaded, "the profile loads as saved: {:?}", s.warnings());
    let believed = s.plan(&inputs).unwrap().predicted.unwrap();
    assert!(believed > 0.1, "believed 168 ms, predicted {believed} s");
    for _ in 0..tandem::session::WARM_UP_RUNS + 1 {
        s.run(&inputs).unwrap();
    }
    let learnt = s.plan_now(&inputs).unwrap().predicted.unwrap();
    let saved = s.save_cost_profile().unwrap();
    assert_eq!(saved.as_deref(), Some(path.as_path()));
    drop(s);
    let next = Session::new(bytes.as_slice(), opts).unwrap();
    let first = next.plan(&inputs).unwrap().predicted.unwrap();
    assert!(
        first < believed / 4.0,
        "the profile believed {believed} s; the next session's first plan predicts {first} s"
    );
    // Saving and loading lose nothing: the next session predicts what this one had learnt.
    assert!(
        (first - learnt).abs() <= 1e-9 * learnt,
        "learnt {learnt} s, the next session predicts {first} s"
    );
    // A session whose runs taught nothing (a plan's warm-up runs do not) leaves the file alone.
    let before = std::fs::read(&path).unwrap();
    for _ in 0..tandem::session::WARM_UP_RUNS {
        next.run(&inputs).unwrap();
    }
    assert_eq!(next.save_cost_profile().unwrap(), None);
    assert!(std::fs::read(&path).unwrap() == before);
    // Sessions whose cost model is not from a profile file have nothing to save.
    let given = SessionOptions::default()
        .placement(Placement::Auto)
        .cpu_threads(1)
        .gpu(g.clone())
        .cost_model(Arc::new(tandem::testing::matmul_believed(
            &g, 1, 1e-8, 1e-6,
        )));
    let cpu = SessionOptions::default().placement(Placement::Cpu);
    for o in [given, cpu] {
        let s = Session::new(bytes.as_slice(), o).unwrap();
        s.run(&inputs).unwrap();
        assert_eq!(s.save_cost_profile().unwrap(), None);
    }
    std::fs::remove_dir_all(dir).unwrap();
}

/// `plan_now` plans with what the session has learnt, leaving the plan in use in place: a cost
/// model that believes the CPU does 0.1 GFLOP/s (and the GPU 1 MFLOP/s) predicts y = x [64,
/// 256] @ W [256, 256] at 168 ms on the CPU; after the warm-up runs (which teach nothing) and
/// one more, all taking a small part of that (any CPU does 16.8 MFLOP far faster), fewer
/// misses than a re-plan needs, the plan in use still predicts 168 ms and the plan now a small
/// part of it.
#[test]
fn plan_now_predicts_from_what_the_runs_taught() {
    let (bytes, x) = product_64x256x256();
    let g = gpu();
    let believed = tandem::testing::matmul_believed(&g, 1, 1e-8, 1e-6);
    let opts = SessionOptions::default()
        .placement(Placement::Auto)
        .cpu_threads(1)
        .gpu(g)
        .cost_model(Arc::new(believed));
    let s = Session::new(bytes.as_slice(), opts).unwrap();
    let inputs = [("x", x)];
    let first = s.plan(&inputs).unwrap();
    let predicted = first.predicted.expect("auto plans predict");
    assert!(predicted > 0.1, "believed 168 ms, predicted {predicted} s");
    let now = s.plan_now(&inputs).unwrap();
    assert_eq!(now.predicted, Some(predicted), "nothing learnt yet");
    // The warm-up runs pay first-touch costs (fresh buffers, cold caches): they teach nothing.
    let mut took = 0.0f64;
    for _ in 0..tandem::session::WARM_UP_RUNS {
        let (_, report) = s.run_with_report(&inputs).unwrap();
        took = took.max(report.total.as_secs_f64());
    }
    assert_eq!(s.plan_now(&inputs).unwrap().predicted, Some(predicted));
    let (_, report) = s.run_with_report(&inputs).unwrap();
    took = took.max(report.total.as_secs_f64());
    assert_eq!(s.plan(&inputs).unwrap().predicted, Some(predicted));
    let learnt = s.plan_now(&inputs).unwrap().predicted.unwrap();
    assert!(
        learnt < predicted / 4.0 && took < predicted / 4.0,
        "first {predicted} s, now {learnt} s, runs up to {took} s"
    );
    // The plan in use is the session's own business: asking leaves it cached.
    let cached = s.plan(&inputs).unwrap();
    s.plan_now(&inputs).unwrap();
    assert!(Arc::ptr_eq(&cached, &s.plan(&inputs).unwrap()));
}
