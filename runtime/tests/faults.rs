//! GPU faults on the real adapter (lavapipe here): out of memory (injected, and a real capped
//! device), pipeline creation failure, tensors and dispatches over the adapter's limits, a batch
//! that fails validation mid-run, and a device lost mid-run, after which the session opens a new
//! device. Each run must finish with the result of a hand-written reference, report the fault
//! (visible in `Display`) and never hang (a watchdog fails the test). Also the resource bounds
//! `max_gpu_memory` (plan-time CPU placement) and `max_host_memory` (typed error).

use prost::Message;
use std::sync::Arc;
use std::time::Duration;
use tandem::gpu::{Fault, Gpu, GpuOptions};
use tandem::import::proto::*;
use tandem::report::{FaultKind, Ran};
use tandem::testing::assert_close;
use tandem::{Device, Error, Placement, RunReport, Selector, Session, SessionOptions, Tensor};

/// Fail (instead of hanging) when `f` takes longer than this.
const WATCHDOG: Duration = Duration::from_secs(180);

fn with_watchdog<T: Send + 'static>(name: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    let worker = std::thread::spawn(move || {
        let r = f();
        let _ = tx.send(());
        r
    });
    match rx.recv_timeout(WATCHDOG) {
        Ok(()) => worker.join().unwrap(),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => match worker.join() {
            Ok(r) => r,
            Err(panic) => std::panic::resume_unwind(panic),
        },
        Err(_) => panic!("{name}: no result after {WATCHDOG:?}: a hang"),
    }
}

/// A device of our own: faults injected here must not reach other tests' shared GPU.
fn own_gpu(options: GpuOptions) -> Arc<Gpu> {
    Arc::new(Gpu::with_options(options).unwrap_or_else(|e| {
        panic!("no GPU adapter ({e}); install lavapipe: apt-get install mesa-vulkan-drivers")
    }))
}

fn vi(name: &str, dims: &[usize]) -> ValueInfoProto {
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            tensor_type: Some(TypeProtoTensor {
                elem_type: data_type::FLOAT,
                shape: Some(TensorShapeProto {
                    dim: dims
                        .iter()
                        .map(|&v| Dimension {
                            dim_value: Some(v as i64),
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

/// y = Sigmoid(Relu(x @ W) + 1) for x `[m, k]`, W `[k, n]`: nodes mm, relu, add, sig.
struct Mlp {
    bytes: Vec<u8>,
    x: Tensor,
    want: Tensor,
}

fn mlp(m: usize, k: usize, n: usize) -> Mlp {
    let w: Vec<f32> = (0..k * n).map(|i| (i as f32 * 0.37).sin() * 0.2).collect();
    let xv: Vec<f32> = (0..m * k).map(|i| (i % 17) as f32 / 8.0 - 1.0).collect();
    let weight = TensorProto {
        dims: vec![k as i64, n as i64],
        data_type: data_type::FLOAT,
        name: "W".into(),
        raw_data: Some(w.iter().flat_map(|v| v.to_le_bytes()).collect()),
        ..Default::default()
    };
    let one = TensorProto {
        dims: vec![],
        data_type: data_type::FLOAT,
        name: "one".into(),
        float_data: vec![1.0],
        ..Default::default()
    };
    let bytes = ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: 17,
        }],
        graph: Some(GraphProto {
            node: vec![
                node("MatMul", "mm", &["x", "W"], &["h"]),
                node("Relu", "relu", &["h"], &["r"]),
                node("Add", "add", &["r", "one"], &["a"]),
                node("Sigmoid", "sig", &["a"], &["y"]),
            ],
            name: "mlp".into(),
            initializer: vec![weight, one],
            input: vec![vi("x", &[m, k])],
            output: vec![vi("y", &[m, n])],
            ..Default::default()
        }),
        ..Default::default()
    }
    .encode_to_vec();
    // The reference, written out by hand.
    let mut want = vec![0.0f32; m * n];
    for r in 0..m {
        for c in 0..n {
            let h: f32 = (0..k).map(|i| xv[r * k + i] * w[i * n + c]).sum();
            want[r * n + c] = 1.0 / (1.0 + (-(h.max(0.0) + 1.0)).exp());
        }
    }
    Mlp {
        bytes,
        x: Tensor::f32(&[m, k], xv),
        want: Tensor::f32(&[m, n], want),
    }
}

fn session(model: &Mlp, options: SessionOptions) -> Session {
    Session::new(model.bytes.as_slice(), options).unwrap()
}

/// One run: the output must match the reference; returns the report.
fn run_checked(s: &Session, model: &Mlp) -> RunReport {
    let (outs, report) = s
        .run_with_report(&[("x", model.x.clone())])
        .unwrap_or_else(|e| panic!("the run must survive the fault: {e}"));
    assert_close(&outs[0].1, &model.want, 1e-4, 1e-5);
    report
}

fn ran(report: &RunReport, name: &str) -> Ran {
    report
        .nodes
        .iter()
        .find(|n| &*n.name == name)
        .unwrap_or_else(|| panic!("no node {name} in\n{report}"))
        .ran
}

fn fallback<'r>(report: &'r RunReport, name: &str) -> Option<&'r str> {
    report
        .nodes
        .iter()
        .find(|n| &*n.name == name)
        .and_then(|n| n.fallback.as_deref())
}

fn gpu_session(model: &Mlp, gpu: &Arc<Gpu>) -> Session {
    session(
        model,
        SessionOptions::default()
            .placement(Placement::Gpu)
            .gpu(gpu.clone()),
    )
}

#[test]
fn injected_out_of_memory_runs_that_node_on_the_cpu() {
    with_watchdog("oom", || {
        let model = mlp(4, 16, 8);
        let gpu = own_gpu(GpuOptions::default());
        let s = gpu_session(&model, &gpu);
        gpu.inject(Fault::OutOfMemory(1));
        let report = run_checked(&s, &model);
        assert_eq!(ran(&report, "mm"), Ran::On(Device::Cpu), "{report}");
        assert!(fallback(&report, "mm").is_some_and(|r| r.contains("out of memory")));
        assert_eq!(report.faults.len(), 1, "{report}");
        assert_eq!(report.faults[0].kind, FaultKind::OutOfMemory);
        assert_eq!(report.faults[0].node.as_deref(), Some("mm"));
        assert!(report
            .to_string()
            .contains("gpu fault (out of memory) at node `mm`"));
        // The other nodes stayed on the GPU, and the next run is whole on the GPU.
        assert_eq!(report.count(Device::Gpu), 3, "{report}");
        let again = run_checked(&s, &model);
        assert_eq!(again.count(Device::Gpu), 4, "{again}");
        assert!(again.faults.is_empty());
    });
}

#[test]
fn a_capped_device_runs_what_does_not_fit_on_the_cpu() {
    with_watchdog("capped device", || {
        let model = mlp(64, 128, 128);
        let cap = 120_000;
        let gpu = own_gpu(GpuOptions {
            max_memory: Some(cap),
            ..GpuOptions::default()
        });
        let s = gpu_session(&model, &gpu);
        let report = run_checked(&s, &model);
        println!("{report}");
        assert!(
            report
                .faults
                .iter()
                .any(|f| f.kind == FaultKind::OutOfMemory),
            "{report}"
        );
        assert!(report.count(Device::Cpu) > 0, "{report}");
        assert!(gpu.tensor_bytes() <= cap, "{} > {cap}", gpu.tensor_bytes());
        run_checked(&s, &model);
        assert!(gpu.tensor_bytes() <= cap, "{} > {cap}", gpu.tensor_bytes());
    });
}

#[test]
fn a_pipeline_that_fails_to_build_runs_its_node_on_the_cpu() {
    with_watchdog("pipeline", || {
        let model = mlp(4, 16, 8);
        let gpu = own_gpu(GpuOptions::default());
        let s = gpu_session(&model, &gpu);
        gpu.inject(Fault::PipelineCreation(1));
        let report = run_checked(&s, &model);
        assert_eq!(ran(&report, "mm"), Ran::On(Device::Cpu), "{report}");
        assert_eq!(report.faults.len(), 1, "{report}");
        assert_eq!(report.faults[0].kind, FaultKind::PipelineCreation);
        assert!(report.to_string().contains("pipeline creation failed"));
        assert_eq!(run_checked(&s, &model).count(Device::Gpu), 4);
    });
}

#[test]
fn tensors_and_dispatches_over_the_adapter_limits_run_on_the_cpu() {
    with_watchdog("limits", || {
        let model = mlp(16, 64, 32);
        // A binding limit below the input (16x64 f32 = 4 KiB), above the output (2 KiB).
        let small = own_gpu(GpuOptions {
            max_binding_bytes: Some(3000),
            ..GpuOptions::default()
        });
        let report = run_checked(&gpu_session(&model, &small), &model);
        println!("{report}");
        assert_eq!(ran(&report, "mm"), Ran::On(Device::Cpu), "{report}");
        assert!(
            fallback(&report, "mm").is_some_and(|r| r.contains("storage binding limit")),
            "{report}"
        );
        assert_eq!(ran(&report, "sig"), Ran::On(Device::Gpu), "{report}");
        // At most one workgroup per dimension: nothing of this size can be dispatched.
        let narrow = own_gpu(GpuOptions {
            max_workgroups_per_dimension: Some(1),
            ..GpuOptions::default()
        });
        let report = run_checked(&gpu_session(&model, &narrow), &model);
        println!("{report}");
        assert!(
            report
                .fallbacks()
                .any(|n| n.fallback.as_deref().unwrap().contains("workgroups")),
            "{report}"
        );
        assert!(report.to_string().contains("not on gpu"));
    });
}

#[test]
fn a_batch_failing_validation_is_recomputed_on_the_cpu_keeping_cpu_results() {
    with_watchdog("invalid batch", || {
        let model = mlp(8, 16, 8);
        let gpu = own_gpu(GpuOptions::default());
        // mm on the GPU, relu on the CPU (reads mm's result), add and sig on the GPU.
        let s = session(
            &model,
            SessionOptions::default()
                .placement(Placement::Gpu)
                .gpu(gpu.clone())
                .force(Selector::NodeName("relu".into()), Device::Cpu),
        );
        // The first batch ([mm]) fails validation when relu's turn submits it.
        gpu.inject(Fault::InvalidBatch { at_submit: 0 });
        let report = run_checked(&s, &model);
        println!("{report}");
        assert_eq!(report.faults.len(), 1, "{report}");
        assert_eq!(report.faults[0].node.as_deref(), Some("relu"));
        assert_eq!(ran(&report, "mm"), Ran::On(Device::Cpu), "{report}");
        assert!(fallback(&report, "mm").is_some_and(|r| r.contains("recomputed")));
        assert_eq!(ran(&report, "relu"), Ran::On(Device::Cpu));
        // The GPU stays off for the rest of the run; the device was not lost.
        assert_eq!(report.count(Device::Gpu), 0, "{report}");
        assert!(!gpu.is_lost());
        let again = run_checked(&s, &model);
        assert_eq!(again.count(Device::Gpu), 3, "{again}");
        assert!(again.faults.is_empty(), "{again}");
    });
}

#[test]
fn a_device_lost_mid_run_finishes_on_the_cpu_and_the_next_run_opens_a_new_device() {
    with_watchdog("device lost", || {
        let model = mlp(8, 16, 8);
        let gpu = own_gpu(GpuOptions::default());
        let s = session(
            &model,
            SessionOptions::default()
                .placement(Placement::Gpu)
                .gpu(gpu.clone())
                .force(Selector::NodeName("relu".into()), Device::Cpu),
        );
        let other = gpu_session(&model, &gpu);
        run_checked(&s, &model);
        // Batch 0 is [mm]; batch 1 ([add, sig]) is in flight when the device goes.
        gpu.inject(Fault::DeviceLost { at_submit: 1 });
        let report = run_checked(&s, &model);
        println!("{report}");
        assert!(gpu.is_lost());
        assert_eq!(report.faults.len(), 1, "{report}");
        assert_eq!(report.faults[0].kind, FaultKind::DeviceLost);
        assert!(report.to_string().contains("gpu fault (device lost)"));
        // mm's result had reached the host and relu ran on the CPU: neither is redone.
        assert_eq!(ran(&report, "mm"), Ran::On(Device::Gpu), "{report}");
        assert_eq!(fallback(&report, "relu"), None, "{report}");
        for n in ["add", "sig"] {
            assert_eq!(ran(&report, n), Ran::On(Device::Cpu), "{report}");
            assert!(fallback(&report, n).is_some_and(|r| r.contains("recomputed")));
        }
        // The next run opens a new device, uploads the constants again and runs on it.
        let next = run_checked(&s, &model);
        println!("{next}");
        let new = s.gpu().expect("a GPU");
        assert!(!Arc::ptr_eq(&new, &gpu) && !new.is_lost());
        assert_eq!(next.faults.len(), 1, "{next}");
        assert!(next.faults[0].action.contains("opened a new device"));
        assert_eq!(next.count(Device::Gpu), 3, "{next}");
        assert!(
            next.uploads >= 2,
            "W and `one` go to the new device: {next}"
        );
        let after = run_checked(&s, &model);
        assert!(after.faults.is_empty() && after.count(Device::Gpu) == 3);
        // A session that shared the lost device moves to the same new one.
        assert_eq!(run_checked(&other, &model).count(Device::Gpu), 4);
        assert!(Arc::ptr_eq(&other.gpu().unwrap(), &new));
    });
}

#[test]
fn a_device_destroyed_between_runs_is_replaced() {
    with_watchdog("destroyed", || {
        let model = mlp(4, 16, 8);
        let gpu = own_gpu(GpuOptions::default());
        let s = gpu_session(&model, &gpu);
        run_checked(&s, &model);
        gpu.destroy_for_test();
        let report = run_checked(&s, &model);
        assert_eq!(report.faults.len(), 1, "{report}");
        assert_eq!(report.faults[0].kind, FaultKind::DeviceLost);
        assert_eq!(report.count(Device::Gpu), 4, "{report}");
    });
}

#[test]
fn max_gpu_memory_places_what_does_not_fit_on_the_cpu_with_the_reason() {
    with_watchdog("gpu cap", || {
        let model = mlp(64, 128, 128);
        let gpu = own_gpu(GpuOptions::default());
        // GPU bytes by hand: x 32768, W 65536, h/r/a/y 32768 each, `one` 16 (the pool's
        // smallest buffer); a buffer past its last reader is held until the host next waits.
        // mm: x+W+h = 131072 fits 131080. relu: x (held) + W + h + r = 163840 does not: CPU,
        // and its read of h waits for the GPU, freeing x and h. add: W + r + one + a = 131088
        // does not: CPU. sig: W + a + y = 131072 fits.
        let cap = 131_080;
        let s = session(
            &model,
            SessionOptions::default()
                .placement(Placement::Gpu)
                .gpu(gpu.clone())
                .max_gpu_memory(cap),
        );
        let report = run_checked(&s, &model);
        println!("{report}");
        for (n, d) in [
            ("mm", Device::Gpu),
            ("relu", Device::Cpu),
            ("add", Device::Cpu),
            ("sig", Device::Gpu),
        ] {
            assert_eq!(ran(&report, n), Ran::On(d), "{n}: {report}");
        }
        for n in ["relu", "add"] {
            assert!(
                fallback(&report, n).is_some_and(|r| r.contains("GPU memory cap")),
                "{report}"
            );
        }
        assert!(report.to_string().contains("GPU memory cap"));
        assert!(report.faults.is_empty(), "planned, not a fault: {report}");
        // Nothing fits in 1 KiB: every node on the CPU, each with the reason.
        let none = session(
            &model,
            SessionOptions::default()
                .placement(Placement::Gpu)
                .gpu(gpu.clone())
                .max_gpu_memory(1024),
        );
        let report = run_checked(&none, &model);
        assert_eq!(report.count(Device::Cpu), 4, "{report}");
        assert_eq!(report.fallbacks().count(), 4, "{report}");
    });
}

#[test]
fn max_gpu_memory_caps_a_device_the_session_opens() {
    with_watchdog("session cap", || {
        // The plan of the test above, on a device the session opens and caps at 131080 bytes
        // of tensors (uniforms and readback staging are not counted).
        let model = mlp(64, 128, 128);
        let cap = 131_080;
        let s = session(
            &model,
            SessionOptions::default()
                .placement(Placement::Gpu)
                .max_gpu_memory(cap),
        );
        let gpu = s.gpu().unwrap();
        assert_eq!(gpu.options().max_memory, Some(cap));
        for _ in 0..3 {
            let report = run_checked(&s, &model);
            println!("{report}");
            // The executor holds what the planner counted: nothing fails at run time.
            assert!(report.faults.is_empty(), "{report}");
            assert_eq!(report.count(Device::Gpu), 2, "{report}");
            assert!(gpu.tensor_bytes() <= cap, "{} > {cap}", gpu.tensor_bytes());
        }
    });
}

#[test]
fn max_host_memory_refuses_a_run_before_allocating() {
    // x [2, 8] 64 B; constants W [8, 4] 128 B + one 4 B; intermediates h, r, a, y of 32 B each,
    // at most two alive at once (h+r, r+a, a+y): 64 B. Total 260 B.
    let model = mlp(2, 8, 4);
    let run = |cap: u64| {
        session(
            &model,
            SessionOptions::default()
                .placement(Placement::Cpu)
                .max_host_memory(cap),
        )
        .run(&[("x", model.x.clone())])
    };
    match run(259) {
        Err(Error::ResourceLimit {
            resource,
            needed,
            limit,
            ..
        }) => {
            assert_eq!((resource, needed, limit), ("host memory", 260, 259));
        }
        other => panic!("expected a host memory limit error, got {other:?}"),
    }
    let outs = run(260).expect("260 bytes are enough");
    assert_close(&outs[0].1, &model.want, 1e-5, 1e-6);
}

mod common;

/// Real models on the GPU with a few op types forced to the CPU (onnxruntime's outputs as the
/// reference): the device is lost, or a batch fails validation, at the first, a middle and the
/// last batch of a run; each run must still match, and the run after a loss uses a new device.
#[test]
fn real_models_survive_faults_at_every_stage_of_a_run() {
    use common::*;
    with_watchdog("real models", || {
        let dir = repo_root().join("models");
        for name in ["tiny_llama_prefill", "magika"] {
            let model = dir.join(name).join("model.onnx");
            if !model.is_file() {
                data_missing(&model);
                return;
            }
            let gpu = own_gpu(GpuOptions::default());
            // Some op types on the CPU, so that a run is several batches with joins between.
            let mut options = SessionOptions::default().placement(Placement::Gpu).gpu(gpu);
            for op in ["Softmax", "Sqrt", "Tanh"] {
                options = options.force(Selector::OpType(op.into()), Device::Cpu);
            }
            let s = open_session(&model, options).unwrap();
            let (inputs, want) =
                load_test_data(&dir.join(name).join("test_data_set_0"), &s).unwrap();
            let check = |what: &str| {
                let (got, report) = run_once(&s, &inputs).unwrap();
                if let Err(e) = compare_outputs(&got, &want, 1e-3, 1e-4) {
                    panic!("{name} {what}: {e}\n{report}");
                }
                report
            };
            let submits = check("clean").gpu_submits;
            assert!(submits > 0);
            for at in [0, submits / 2, submits - 1] {
                for fault in [
                    Fault::DeviceLost { at_submit: at },
                    Fault::InvalidBatch { at_submit: at },
                ] {
                    // After a loss, the device the next run will use is the replacement.
                    let current = s.gpu().unwrap().replacement().unwrap();
                    current.inject(fault);
                    let report = check(&format!("{fault:?}"));
                    let last = report.faults.last().expect("the fault is reported");
                    let lost = matches!(fault, Fault::DeviceLost { .. });
                    assert_eq!(last.kind == FaultKind::DeviceLost, lost, "{report}");
                    let count = |what: &str| {
                        report
                            .fallbacks()
                            .filter(|n| n.fallback.as_deref().unwrap().contains(what))
                            .count()
                    };
                    println!(
                        "{name} {fault:?} of {submits} batches: {} finished nodes recomputed, \
                         {} later nodes on the CPU, {} on the GPU",
                        count("recomputed"),
                        count("GPU is off"),
                        report.count(Device::Gpu)
                    );
                }
            }
            let after = check("after the faults");
            assert!(after.count(Device::Gpu) > 0, "{after}");
        }
    });
}
