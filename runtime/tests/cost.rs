//! Tests of the cost model: fitting, online refinement, persistence and its failure paths, the
//! frozen table, and a short real calibration on the GPU adapter (lavapipe in CI).

use std::path::PathBuf;
use std::time::Duration;
use tandem::cost::{
    calibrate::calibrate, AdapterKey, CalibrationOptions, Coeffs, CostModel, CpuKey, EntryKey,
    FrozenCosts, Line, Links, ProfileError, Sample,
};
use tandem::costs::{Costs, NodeCostQuery};
use tandem::{DType, Device};
use tandem_ops::Work;

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tandem-cost-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d.join("profile.json")
}

fn cpu_key() -> CpuKey {
    CpuKey {
        model: "Test CPU".into(),
        cores: 2,
        simd: "avx2+fma".into(),
        threads: 1,
    }
}

fn adapter(name: &str) -> AdapterKey {
    AdapterKey {
        vendor: 0x10005,
        device: 0,
        name: name.into(),
        backend: "Vulkan".into(),
        driver: "llvmpipe".into(),
        driver_info: "Mesa test".into(),
    }
}

fn query(op: &str, flops: u64, bytes: u64) -> NodeCostQuery<'_> {
    NodeCostQuery {
        op_type: op,
        dtype: DType::F32,
        work: Work {
            flops,
            bytes_read: bytes / 2,
            bytes_written: bytes - bytes / 2,
        },
        dispatches: 1,
        variant: "",
        gpu_pad: 1.0,
        rows: 0.0,
    }
}

/// A model whose MatMul entries follow known lines exactly.
fn synthetic(adapter_key: Option<AdapterKey>) -> (CostModel, Coeffs, Coeffs) {
    let mut m = CostModel::unmeasured(adapter_key, cpu_key());
    let cpu = Coeffs {
        per_flop: 1.0 / 20e9,
        per_byte: 1.0 / 8e9,
        fixed: 3e-6,
    };
    let gpu = Coeffs {
        per_flop: 1.0 / 2e9,
        per_byte: 1.0 / 4e9,
        fixed: 60e-6,
    };
    for (device, c) in [(Device::Cpu, cpu), (Device::Gpu, gpu)] {
        let samples: Vec<Sample> = [16u64, 32, 64, 96, 128, 256]
            .iter()
            .map(|&n| {
                let (flops, bytes) = ((2 * n * n * n) as f64, (12 * n * n) as f64 + 7.0 * n as f64);
                Sample {
                    flops,
                    bytes,
                    seconds: c.time(flops, bytes),
                    rows: 0.0,
                }
            })
            .collect();
        m.add_calibration(
            EntryKey {
                op: "MatMul".into(),
                dtype: DType::F32,
                device,
            },
            &samples,
        );
    }
    m.links = Links {
        upload: Line {
            latency: 11e-6,
            seconds_per_byte: 1e-10,
        },
        download: Line {
            latency: 13e-6,
            seconds_per_byte: 2e-10,
        },
        sync: 77e-6,
        dispatch: 0.0,
    };
    (m, cpu, gpu)
}

fn close(got: f64, want: f64, rel: f64) -> bool {
    (got - want).abs() <= rel * want.abs()
}

#[test]
fn fit_recovers_known_coefficients_and_fraction_scales_only_the_work() {
    let (mut m, cpu, gpu) = synthetic(None);
    m.links.dispatch = 5e-6;
    // A shape never sampled: 512^3.
    let (flops, bytes) = (2 * 512u64.pow(3), 12 * 512 * 512);
    let q = query("MatMul", flops, bytes);
    // The GPU's kernels are timed alone: each of its dispatches adds the links' 5 us, however
    // few rows it runs.
    for (device, c, host) in [(Device::Cpu, cpu, 0.0), (Device::Gpu, gpu, 5e-6)] {
        let want = c.time(flops as f64, bytes as f64) + host;
        let got = m.node_time(&q, device, 1.0);
        assert!(close(got, want, 1e-6), "{device}: {got} vs {want}");
        let three = NodeCostQuery {
            dispatches: 3,
            ..q.clone()
        };
        let want3 = want + 2.0 * host;
        let got3 = m.node_time(&three, device, 1.0);
        assert!(
            close(got3, want3, 1e-6),
            "{device}: 3 dispatches {got3} vs {want3}"
        );
        let half = m.node_time(&q, device, 0.5);
        let want_half =
            c.per_flop * flops as f64 / 2.0 + c.per_byte * bytes as f64 / 2.0 + c.fixed + host;
        assert!(
            close(half, want_half, 1e-6),
            "{device}: half {half} vs {want_half}"
        );
        assert_eq!(m.node_time(&q, device, 0.0), 0.0);
    }
    assert!(close(
        m.transfer_time(1000, Device::Gpu),
        11e-6 + 1e-7,
        1e-12
    ));
    assert!(close(
        m.transfer_time(1000, Device::Cpu),
        13e-6 + 2e-7,
        1e-12
    ));
    assert_eq!(m.sync_time(), 77e-6);
}

#[test]
fn unmeasured_op_kinds_fall_back_to_family_then_roofline() {
    let (m, _, gpu) = synthetic(None);
    // Gemm is in MatMul's family: answered by the family's pooled fit (= MatMul's line here).
    let q = query("Gemm", 1 << 24, 1 << 16);
    let got = m.node_time(&q, Device::Gpu, 1.0);
    assert!(
        close(got, gpu.time((1 << 24) as f64, (1 << 16) as f64), 1e-6),
        "{got}"
    );
    // Relu has no family fit: the roofline prior answers, launch + max(flops/peak, bytes/bw).
    let q = query("Relu", 1000, 8_000_000);
    let p = m.gpu_prior;
    let want = p.launch + (1000.0 / p.peak_flops).max(8e6 / p.bandwidth);
    assert!(close(m.node_time(&q, Device::Gpu, 1.0), want, 1e-9));
}

#[test]
fn observations_refine_the_entry() {
    let (m, _, gpu) = synthetic(None);
    let q = query("MatMul", 2 * 64 * 64 * 64, 12 * 64 * 64);
    let before = m.node_time(&q, Device::Gpu, 1.0);
    assert!(close(
        before,
        gpu.time(q.work.flops as f64, (12 * 64 * 64) as f64),
        1e-6
    ));
    // The device got 3x slower on every shape: observations at three shapes pull the fit.
    for n in [64u64, 128, 200] {
        let q = query("MatMul", 2 * n * n * n, 12 * n * n);
        let t = 3.0 * gpu.time(q.work.flops as f64, (12 * n * n) as f64);
        for _ in 0..40 {
            m.observe(&q, Device::Gpu, t);
        }
    }
    let after = m.node_time(&q, Device::Gpu, 1.0);
    assert!(after > 1.8 * before, "before {before}, after {after}");
    // An op kind seen only at runtime, at one shape: its fallback rescaled to the observation.
    let q = query("Erf", 1 << 16, 1 << 19);
    m.observe(&q, Device::Cpu, 0.004);
    assert!(close(m.node_time(&q, Device::Cpu, 1.0), 0.004, 1e-9));
    let q2 = query("Erf", 1 << 17, 1 << 20);
    assert!(m.node_time(&q2, Device::Cpu, 1.0) > 0.004);
}

/// A shape seen in runs is answered with its own measured time, whatever the runs of other
/// shapes (another model's nodes of the same op kind) taught the rest of the curve; shapes never
/// seen still follow the corrected curve.
#[test]
fn a_shape_seen_in_runs_is_answered_with_its_own_times() {
    let (m, cpu, _) = synthetic(None);
    let curve = |n: u64| cpu.time((2 * n * n * n) as f64, (12 * n * n) as f64);
    let q = |n: u64| query("MatMul", 2 * n * n * n, 12 * n * n);
    // One model's product runs at 1.1x the calibration...
    for t in [1.1, 1.2, 1.1] {
        m.observe(&q(100), Device::Cpu, t * curve(100));
    }
    // ...then another model's eight shapes at 3x, often enough to own the entry's correction.
    for n in [40u64, 60, 80, 120, 140, 160, 180, 220] {
        for _ in 0..4 {
            m.observe(&q(n), Device::Cpu, 3.0 * curve(n));
        }
    }
    let seen = m.node_time(&q(100), Device::Cpu, 1.0);
    assert!(
        close(seen, 1.1 * curve(100), 1e-9),
        "{seen} vs {}",
        curve(100)
    );
    let unseen = m.node_time(&q(300), Device::Cpu, 1.0);
    assert!(unseen > 2.0 * curve(300), "{unseen} vs {}", curve(300));
    // The answer is part of what a saved profile keeps.
    let path = tmp("seen-shapes");
    m.save(&path).unwrap();
    let back = CostModel::load(&path, None, &cpu_key()).unwrap();
    assert!(close(
        back.node_time(&q(100), Device::Cpu, 1.0),
        seen,
        1e-12
    ));
}

#[test]
fn profile_round_trip() {
    let path = tmp("round-trip");
    let (m, _, _) = synthetic(Some(adapter("llvmpipe (LLVM 19, 256 bits)")));
    let q = query("MatMul", 5_000_000, 300_000);
    m.observe(&q, Device::Cpu, 0.0123);
    m.save(&path).unwrap();
    let back = CostModel::load(
        &path,
        Some(&adapter("llvmpipe (LLVM 19, 256 bits)")),
        &cpu_key(),
    )
    .unwrap();
    for device in [Device::Cpu, Device::Gpu] {
        for (f, b) in [(1u64 << 20, 1u64 << 12), (1 << 28, 1 << 22), (10, 10)] {
            let q = query("MatMul", f, b);
            let (x, y) = (
                m.node_time(&q, device, 1.0),
                back.node_time(&q, device, 1.0),
            );
            assert!(close(y, x, 1e-12), "{device}: {x} vs {y}");
            let q = query("Softmax", f, b);
            assert!(close(
                back.node_time(&q, device, 0.3),
                m.node_time(&q, device, 0.3),
                1e-12
            ));
        }
    }
    assert_eq!(back.links, m.links);
    assert_eq!(back.keys(), m.keys());
}

#[test]
fn one_profile_file_keeps_a_profile_per_adapter_and_thread_count() {
    let path = tmp("shared");
    let q = query("MatMul", 5_000_000, 300_000);
    let learnt = |key: Option<AdapterKey>, seconds: f64| {
        let (m, _, _) = synthetic(key);
        for _ in 0..4 {
            m.observe(&q, Device::Cpu, seconds);
        }
        m
    };
    let (lavapipe, discrete) = (adapter("llvmpipe"), adapter("Some discrete GPU"));
    let two = CpuKey {
        threads: 2,
        ..cpu_key()
    };
    let on_lavapipe = learnt(Some(lavapipe.clone()), 0.010);
    let on_discrete = learnt(Some(discrete.clone()), 0.020);
    let on_two_threads = CostModel::unmeasured(None, two.clone());
    for m in [&on_lavapipe, &on_discrete, &on_two_threads] {
        m.save(&path).unwrap();
    }
    let time = |adapter: &AdapterKey| {
        let m = CostModel::load(&path, Some(adapter), &cpu_key()).unwrap();
        m.node_time(&q, Device::Cpu, 1.0)
    };
    let lavapipe_time = on_lavapipe.node_time(&q, Device::Cpu, 1.0);
    let discrete_time = on_discrete.node_time(&q, Device::Cpu, 1.0);
    assert!(close(time(&lavapipe), lavapipe_time, 1e-9));
    assert!(close(time(&discrete), discrete_time, 1e-9));
    assert!(!close(lavapipe_time, discrete_time, 0.1));
    assert!(CostModel::load(&path, None, &two).is_ok());
    // Saving one adapter's profile again replaces that one and keeps the others.
    let relearnt = learnt(Some(lavapipe.clone()), 0.040);
    relearnt.save(&path).unwrap();
    let relearnt_time = relearnt.node_time(&q, Device::Cpu, 1.0);
    assert!(close(time(&lavapipe), relearnt_time, 1e-9));
    assert!(!close(relearnt_time, lavapipe_time, 0.1));
    assert!(close(time(&discrete), discrete_time, 1e-9));
    let file: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(file["profiles"].as_array().map(Vec::len), Some(3));
    // An adapter the file has no profile for is told what the file holds.
    match CostModel::load(&path, Some(&adapter("Another GPU")), &cpu_key()) {
        Err(ProfileError::Mismatch { what, .. }) => {
            for held in ["llvmpipe", "Some discrete GPU", "no GPU", "2 threads"] {
                assert!(what.contains(held), "{held} in {what}");
            }
            assert!(
                what.ends_with("not Another GPU on Vulkan, Test CPU (avx2+fma), 1 threads"),
                "{what}"
            );
        }
        other => panic!("no profile for this adapter: {other:?}"),
    }
}

#[test]
fn processes_saving_one_profile_keep_each_others_lessons() {
    let path = tmp("two-processes");
    let key = adapter("llvmpipe");
    synthetic(Some(key.clone())).0.save(&path).unwrap();
    let load = || CostModel::load(&path, Some(&key), &cpu_key()).unwrap();
    let (x, y) = (
        query("MatMul", 5_000_000, 300_000),
        query("MatMul", 9_000_000, 500_000),
    );
    // Two processes load the profile, each runs one shape, each saves what it learnt.
    let (a, b) = (load(), load());
    let curve_x = a.node_time(&x, Device::Cpu, 1.0);
    for _ in 0..4 {
        a.observe(&x, Device::Cpu, 0.010);
        b.observe(&y, Device::Cpu, 0.020);
    }
    a.save_learnt(&path).unwrap();
    b.save_learnt(&path).unwrap();
    let back = load();
    assert!(close(back.node_time(&x, Device::Cpu, 1.0), 0.010, 1e-9));
    assert!(close(back.node_time(&y, Device::Cpu, 1.0), 0.020, 1e-9));
    // The later saver took the earlier one's lessons in, as older than its own: with a shape's
    // cap (8) full of its own, the earlier ones go.
    assert!(close(b.node_time(&x, Device::Cpu, 1.0), 0.010, 1e-9));
    let (c, d) = (load(), load());
    for _ in 0..8 {
        c.observe(&x, Device::Cpu, 0.030);
        d.observe(&x, Device::Cpu, 0.040);
    }
    c.save_learnt(&path).unwrap();
    d.save_learnt(&path).unwrap();
    assert!(close(load().node_time(&x, Device::Cpu, 1.0), 0.040, 1e-9));
    // A new calibration's save replaces what runs taught.
    synthetic(Some(key.clone())).0.save(&path).unwrap();
    assert!(close(load().node_time(&x, Device::Cpu, 1.0), curve_x, 1e-9));
}

#[test]
fn concurrent_saves_of_one_profile_lose_no_process_lessons() {
    let path = tmp("concurrent");
    let key = adapter("llvmpipe");
    synthetic(Some(key.clone())).0.save(&path).unwrap();
    let shape = |i: u64| query("MatMul", 1_000_000 * (i + 1), 100_000 * (i + 1));
    std::thread::scope(|s| {
        for i in 0..6u64 {
            let (path, key) = (&path, &key);
            s.spawn(move || {
                let m = CostModel::load(path, Some(key), &cpu_key()).unwrap();
                for _ in 0..3 {
                    m.observe(&shape(i), Device::Cpu, 0.001 * (i + 1) as f64);
                }
                m.save_learnt(path).unwrap();
            });
        }
    });
    let back = CostModel::load(&path, Some(&key), &cpu_key()).unwrap();
    for i in 0..6u64 {
        let t = back.node_time(&shape(i), Device::Cpu, 1.0);
        assert!(close(t, 0.001 * (i + 1) as f64, 1e-9), "shape {i}: {t}");
    }
}

#[test]
fn bad_profiles_are_errors_never_panics() {
    let key = adapter("llvmpipe");
    let path = tmp("bad");
    assert!(matches!(
        CostModel::load(&path, Some(&key), &cpu_key()),
        Err(ProfileError::Missing(_))
    ));
    for junk in ["", "{", "[1,2]", "{\"version\": 1}", "\u{0}\u{1}garbage"] {
        std::fs::write(&path, junk).unwrap();
        let r = CostModel::load(&path, Some(&key), &cpu_key());
        assert!(
            matches!(
                r,
                Err(ProfileError::Corrupt { .. }) | Err(ProfileError::Version { .. })
            ),
            "{junk:?}: {r:?}"
        );
    }
    std::fs::write(&path, "{\"version\": 99, \"whatever\": true}").unwrap();
    assert!(matches!(
        CostModel::load(&path, Some(&key), &cpu_key()),
        Err(ProfileError::Version { found: 99, .. })
    ));
    // A valid profile of another adapter, of no adapter, and of another thread count.
    let (m, _, _) = synthetic(Some(adapter("Some discrete GPU")));
    m.save(&path).unwrap();
    assert!(matches!(
        CostModel::load(&path, Some(&key), &cpu_key()),
        Err(ProfileError::Mismatch { .. })
    ));
    assert!(matches!(
        CostModel::load(&path, None, &cpu_key()),
        Err(ProfileError::Mismatch { .. })
    ));
    let two = CpuKey {
        threads: 2,
        ..cpu_key()
    };
    assert!(matches!(
        CostModel::load(&path, Some(&adapter("Some discrete GPU")), &two),
        Err(ProfileError::Mismatch { .. })
    ));
    // A sample with a negative time is corrupt, not a panic or a negative prediction.
    let text = std::fs::read_to_string(&path).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut v2 = v.clone();
    v2["profiles"][0]["entries"][0]["calibration"][0]["seconds"] = serde_json::json!(-1.0);
    std::fs::write(&path, v2.to_string()).unwrap();
    assert!(matches!(
        CostModel::load(&path, Some(&adapter("Some discrete GPU")), &cpu_key()),
        Err(ProfileError::Corrupt { .. })
    ));
}

#[test]
fn load_or_calibrate_recalibrates_a_corrupt_profile_and_saves_a_good_one() {
    let path = tmp("recalibrate");
    std::fs::write(&path, "{ not json").unwrap();
    let budget = Duration::from_millis(300);
    let loaded = CostModel::load_or_calibrate(None, 1, Some(&path), budget);
    assert_eq!(loaded.path.as_deref(), Some(path.as_path()));
    let (m, warning) = (loaded.model, loaded.warning);
    let w = warning.expect("a corrupt profile is reported");
    assert!(w.contains("corrupt") && w.contains("saved"), "{w}");
    assert!(m.adapter.is_none() && m.cpu.threads == 1);
    let q = query("Relu", 1 << 16, 1 << 19);
    let t = m.node_time(&q, Device::Cpu, 1.0);
    assert!(t.is_finite() && t > 0.0);
    // The rewritten profile loads without a warning.
    let again = CostModel::load_or_calibrate(None, 1, Some(&path), budget);
    assert!(again.warning.is_none(), "{:?}", again.warning);
    let again = again.model;
    // JSON keeps f64 to within an ulp, which the refit may amplify a little.
    assert!(close(again.node_time(&q, Device::Cpu, 1.0), t, 1e-6));
}

#[test]
fn frozen_costs_are_a_plain_table() {
    let f = FrozenCosts::new().with_op(
        "Conv",
        Device::Gpu,
        Coeffs {
            per_flop: 1e-12,
            per_byte: 0.0,
            fixed: 1e-3,
        },
    );
    let q = query("Conv", 1_000_000_000, 0);
    assert!(close(f.node_time(&q, Device::Gpu, 1.0), 1e-3 + 1e-3, 1e-12));
    assert!(close(
        f.node_time(&q, Device::Gpu, 0.5),
        1e-3 + 0.5e-3,
        1e-12
    ));
    // Default CPU line: 1e-10 s/flop and s/byte, 1 us fixed.
    let q = query("Add", 1000, 3000);
    assert!(close(
        f.node_time(&q, Device::Cpu, 1.0),
        1e-7 + 3e-7 + 1e-6,
        1e-12
    ));
    assert!(close(
        f.transfer_time(1_000_000, Device::Gpu),
        1e-5 + 1e-4,
        1e-12
    ));
    assert_eq!(f.sync_time(), 5e-5);
}

/// Calibrate for ~5 s on the real adapter (lavapipe: one core, the CPU pool the other) and check
/// the model knows lavapipe is much slower than the CPU for a 512x512x512 MatMul (measured on
/// this kind of machine: 10-30x; the assertion only asks for 2x), and that the CPU got a
/// second pass.
#[test]
fn short_real_calibration_sees_lavapipe_slower_than_the_cpu_for_matmul() {
    // Must be set before the adapter is created (lavapipe reads it at device creation).
    std::env::set_var("LP_NUM_THREADS", "1");
    let gpu = tandem::gpu::Gpu::new().expect("a GPU adapter (install mesa-vulkan-drivers)");
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let opts = CalibrationOptions {
        budget: Duration::from_secs(5),
        ops: Some(vec!["MatMul".into(), "Add".into(), "Relu".into()]),
        ..Default::default()
    };
    let mut calls = 0;
    let (m, report) = pool.install(|| calibrate(Some(&gpu), &opts, &mut |_| calls += 1));
    println!("{report}");
    assert!(calls > 0 && report.samples > 0);
    assert!(
        report.elapsed < Duration::from_secs(15),
        "{:?}",
        report.elapsed
    );
    assert!(report.gpu_error.is_none(), "{:?}", report.gpu_error);
    // lavapipe's first pass leaves the CPU time for more: most held-out CPU points are measured
    // in two passes or more.
    let cpu_held_out: usize = (report.held_out.iter())
        .filter(|h| h.device == Device::Cpu)
        .map(|h| h.count)
        .sum();
    assert!(
        report.repeated * 2 >= cpu_held_out && cpu_held_out > 0,
        "{} of {cpu_held_out} held-out points measured twice",
        report.repeated
    );
    let mm = tandem_ops::registry::build("MatMul", &tandem_ops::Attrs::new(13)).unwrap();
    let a = tandem_ops::TensorMeta::new(DType::F32, vec![512, 512]);
    let outs = mm.infer(&[&a, &a]).unwrap();
    let q = NodeCostQuery {
        op_type: "MatMul",
        dtype: DType::F32,
        work: mm.work(&[&a, &a], &outs),
        dispatches: 1,
        variant: "",
        gpu_pad: tandem::costs::gpu_padding("MatMul", &outs),
        rows: 512.0,
    };
    let (cpu, gpu_t) = (
        m.node_time(&q, Device::Cpu, 1.0),
        m.node_time(&q, Device::Gpu, 1.0),
    );
    println!(
        "512^3 MatMul predicted: cpu {:.2} ms, gpu {:.2} ms",
        cpu * 1e3,
        gpu_t * 1e3
    );
    assert!(gpu_t > 2.0 * cpu, "cpu {cpu}, gpu {gpu_t}");
    assert!(m.sync_time() > 0.0 && m.transfer_time(1 << 20, Device::Gpu) > 0.0);
    // Recording a dispatch takes the host some time on any adapter.
    assert!(m.links.dispatch > 0.0, "{:?}", m.links);
}

/// `observe_report` maps report entries to plan steps by node name, learns whole nodes and both
/// parts of a split node, and ignores views and GPU times without timestamps.
#[test]
fn observe_report_learns_from_a_run() {
    use tandem::graph::{Graph, Node, Value};
    use tandem::plan::{build, Placement, Request};
    use tandem::report::{NodeReport, Ran, RunReport};
    use tandem::schedule::Policy;
    use tandem_ops::{Attrs, TensorMeta};

    let value = |name: &str| Value {
        name: name.into(),
        dtype: Some(DType::F32),
        shape: None,
        constant: None,
    };
    let graph = Graph {
        values: vec![value("a"), value("b"), value("y")],
        nodes: vec![Node {
            name: "mm".into(),
            op_type: "MatMul".into(),
            domain: String::new(),
            opset: 13,
            inputs: vec![Some(0), Some(1)],
            outputs: vec![2],
            op: tandem_ops::registry::build("MatMul", &Attrs::new(13)).unwrap(),
            attributes: None,
        }],
        inputs: vec![0, 1],
        outputs: vec![2],
    };
    let metas = [
        TensorMeta::new(DType::F32, vec![64, 32]),
        TensorMeta::new(DType::F32, vec![32, 16]),
    ];
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let request = Request {
        placement: Placement::Cpu,
        overrides: &[],
        costs: None,
        policy: Policy::Heft,
        assume_gpu: false,
    };
    let plan = build(&graph, &metas, &request, None, &pool).unwrap();
    let entry = |ran: Ran, ms: u64, gpu_ms: Option<u64>| NodeReport {
        name: "mm".into(),
        start: Duration::ZERO,
        op_type: "MatMul".into(),
        ran,
        time: Duration::from_millis(ms),
        gpu_time: gpu_ms.map(Duration::from_millis),
        fallback: None,
    };
    let q = query(
        "MatMul",
        2 * 64 * 32 * 16,
        4 * (64 * 32 + 32 * 16 + 64 * 16),
    );
    // The 64x16 output is one 64x64 GPU tile: the GPU launches 4x the useful work.
    let q = NodeCostQuery { gpu_pad: 4.0, ..q };
    assert_eq!(
        tandem::costs::gpu_padding("MatMul", &[TensorMeta::new(DType::F32, vec![64, 16])]),
        4.0
    );

    let mut m = CostModel::unmeasured(None, cpu_key());
    let report = RunReport {
        nodes: vec![entry(Ran::On(Device::Cpu), 5, None)],
        ..Default::default()
    };
    assert_eq!(m.observe_report(&graph, &plan, &report), 1);
    assert!(close(m.node_time(&q, Device::Cpu, 1.0), 5e-3, 1e-9));

    // A split run: CPU rows 0..16 of 64 in 2 ms, GPU rows 16..64 in 30 ms. Without timestamps
    // only the CPU part is learnt.
    let split = RunReport {
        nodes: vec![entry(Ran::Split { cut: 16, rows: 64 }, 2, Some(30))],
        ..Default::default()
    };
    m.gpu_timestamps = false;
    assert_eq!(m.observe_report(&graph, &plan, &split), 1);
    m.gpu_timestamps = true;
    let fresh = {
        let mut f = CostModel::unmeasured(None, cpu_key());
        f.gpu_timestamps = true;
        f
    };
    assert_eq!(fresh.observe_report(&graph, &plan, &split), 2);
    assert!(close(fresh.node_time(&q, Device::Cpu, 0.25), 2e-3, 1e-9));
    assert!(close(fresh.node_time(&q, Device::Gpu, 0.75), 30e-3, 1e-9));
    // Entries of other nodes, views and folded nodes teach nothing.
    let other = RunReport {
        nodes: vec![
            NodeReport {
                name: "nope".into(),
                ..entry(Ran::On(Device::Cpu), 1, None)
            },
            entry(Ran::View, 1, None),
            entry(Ran::Folded, 1, None),
        ],
        ..Default::default()
    };
    assert_eq!(m.observe_report(&graph, &plan, &other), 0);
}

#[test]
fn a_profile_of_other_cpu_kernels_is_stale_and_recalibrated() {
    let path = tmp("cpu-kernels");
    // This machine's CPU key, so that only the kernels' hash differs.
    let here = CpuKey::detect(1);
    CostModel::unmeasured(None, here.clone())
        .save(&path)
        .unwrap();
    assert!(CostModel::load(&path, None, &here).is_ok());
    // The same profile, as if measured before a CPU kernel changed.
    let text = std::fs::read_to_string(&path).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        v["profiles"][0]["cpu_kernels_hash"].as_str(),
        Some(tandem::cost::keys::cpu_kernels_hash())
    );
    v["profiles"][0]["cpu_kernels_hash"] = serde_json::json!("0000000000000000");
    std::fs::write(&path, v.to_string()).unwrap();
    match CostModel::load(&path, None, &here) {
        Err(ProfileError::Mismatch { what, .. }) => assert!(what.contains("CPU kernels"), "{what}"),
        other => panic!("a stale profile must not load: {other:?}"),
    }
    let tandem::cost::LoadedProfile {
        model: fresh,
        warning,
        ..
    } = CostModel::load_or_calibrate(None, 1, Some(&path), Duration::from_millis(300));
    let w = warning.expect("a stale profile is reported");
    assert!(w.contains("CPU kernels") && w.contains("calibrated"), "{w}");
    assert_eq!(fresh.cpu_kernels, tandem::cost::keys::cpu_kernels_hash());
    // The profile written by the recalibration is current.
    let saved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(
        saved["profiles"][0]["cpu_kernels_hash"].as_str(),
        Some(tandem::cost::keys::cpu_kernels_hash())
    );
}

/// A saved profile keeps each entry's curve shape, and a loaded entry is fitted with it rather
/// than choosing again by cross-validation (which took an `auto` session 2.2 s once runs had
/// filled the entries): a shape written into the file by hand is the one the curve takes.
#[test]
fn a_saved_curve_shape_is_the_one_a_loaded_profile_fits() {
    let path = tmp("shapes");
    let (m, _, _) = synthetic(None);
    m.save(&path).unwrap();
    let mut file: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let entries = file["profiles"][0]["entries"].as_array_mut().unwrap();
    let matmul = (entries.iter_mut())
        .find(|e| e["op"] == "MatMul" && e["device"] == "cpu")
        .expect("the CPU MatMul entry");
    // The synthetic samples lie on a straight line: the shape chosen and saved is the plain one.
    assert_eq!(matmul["shape"]["spill_at"], serde_json::Value::Null);
    assert_eq!(matmul["shape"]["whole"], false);
    matmul["shape"] = serde_json::json!({"spill_at": 100000.0, "whole": true, "rows": false});
    std::fs::write(&path, serde_json::to_vec(&file).unwrap()).unwrap();
    let back = CostModel::load(&path, None, &cpu_key()).unwrap();
    let key = EntryKey {
        op: "MatMul".into(),
        dtype: DType::F32,
        device: Device::Cpu,
    };
    let curve = back.curve(&key).expect("a fitted curve");
    assert_eq!((curve.spill_at, curve.spill_whole), (100000.0, true));
    assert_eq!(m.curve(&key).unwrap().spill_at, 0.0);
}
