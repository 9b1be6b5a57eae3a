//! Scheduler simulation on the shipped device profiles (`profiles/*.json`): the profiles parse
//! and cite sources, policies order sanely, and the phone profile's simulated co-execution
//! speedup on a linear layer matches what its own numbers imply (the ideal speedup of two
//! devices working in proportion to their rates), in the plausible 1.3x-2.1x range that Li et
//! al. 2025 measured on a Pixel 5 (1.89x, grid maximum 2.01x). Also the planner's
//! `assume_gpu` flag that makes simulation possible without a device.

use std::path::PathBuf;
use tandem::cost::{CostModel, CpuKey};
use tandem::costs::Costs;
use tandem::plan::{self, Device, Placement, Request, Selector, StepKind};
use tandem::schedule::{Choice, Policy};
use tandem::simulate::{simulate_graph, simulate_layer, Layer, Profile};

fn profiles_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../profiles")
}

fn profile(name: &str) -> Profile {
    Profile::load(&profiles_dir().join(name)).expect("profile parses")
}

const SHIPPED: [&str; 3] = [
    "pixel5_sd765g.json",
    "jetson_agx_orin.json",
    "desktop_rtx3060_pcie4.json",
];

#[test]
fn shipped_profiles_parse_and_cite_sources() {
    let mut found = 0;
    for entry in std::fs::read_dir(profiles_dir()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "json") {
            let p = Profile::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert!(!p.sources.is_empty(), "{}: cite sources", p.name);
            assert!(p
                .sources
                .iter()
                .all(|s| !s.url.is_empty() && !s.title.is_empty()));
            assert!(!p.notes.is_empty(), "{}: say what is estimated", p.name);
            found += 1;
        }
    }
    assert!(found >= 3);
    for name in SHIPPED {
        assert!(
            profile(name).sources.len() >= 3,
            "{name}: cite the published figures"
        );
    }
}

#[test]
fn bad_profiles_are_rejected_with_a_reason() {
    let good = std::fs::read_to_string(profiles_dir().join(SHIPPED[0])).unwrap();
    let bad_family = good.replacen("\"matmul\"", "\"matmull\"", 1);
    let e = Profile::from_json(&bad_family).unwrap_err().to_string();
    assert!(e.contains("matmull"), "{e}");
    let negative = good.replacen("\"gflops\": 55.0", "\"gflops\": -1", 1);
    assert!(Profile::from_json(&negative).is_err());
    assert!(Profile::from_json("{").is_err());
}

#[test]
fn roofline_times_follow_the_profile_numbers() {
    let p = profile("desktop_rtx3060_pcie4.json");
    // 1 GB over 25 GB/s plus 10 us.
    let up = p.transfer_time(1_000_000_000, Device::Gpu);
    assert!((up - (0.04 + 1e-5)).abs() < 1e-12, "{up}");
    assert!((p.sync_time() - 1e-5).abs() < 1e-15);
    // A 1 GFLOP matmul on the CPU: 3 us launch + 1e9 / 650e9 s (compute bound).
    let t = p.cpu.time("MatMul", 1e9, 1e3, 1);
    assert!((t - (3e-6 + 1.0 / 650.0)).abs() < 1e-12, "{t}");
    // Memory bound elementwise op: 1 GB over 40 GB/s * 0.9 efficiency.
    let t = p.cpu.time("Add", 1e6, 1e9, 1);
    assert!((t - (3e-6 + 1.0 / 36.0)).abs() < 1e-12, "{t}");
}

#[test]
fn layer_specs_parse() {
    assert_eq!(
        "matmul:2,3,4".parse::<Layer>().unwrap(),
        Layer::MatMul { m: 2, k: 3, n: 4 }
    );
    assert_eq!(
        "conv:1,8,16,16,4,3".parse::<Layer>().unwrap(),
        Layer::Conv {
            n: 1,
            c: 8,
            h: 16,
            w: 16,
            oc: 4,
            kernel: 3,
            stride: 1,
            pad: 1
        }
    );
    for bad in [
        "matmul:2,3",
        "conv:1,2",
        "lstm:1,2,3",
        "matmul:0,1,1",
        "matmul:a,b,c",
    ] {
        assert!(bad.parse::<Layer>().is_err(), "{bad}");
    }
}

/// Ideal co-execution speedup of two devices with flop rates `a` and `b` on a compute-bound
/// node: together they finish in work / (a + b) instead of work / max(a, b).
fn ideal(p: &Profile, op: &str) -> f64 {
    let c = p.flop_rate(op, Device::Cpu);
    let g = p.flop_rate(op, Device::Gpu);
    (c + g) / c.max(g)
}

#[test]
fn phone_linear_and_conv_speedups_match_the_profile_rates() {
    let p = profile("pixel5_sd765g.json");
    for (spec, op) in [
        ("matmul:256,1024,1024", "MatMul"),
        ("matmul:128,768,3072", "MatMul"),
        ("conv:1,64,56,56,64,3", "Conv"),
    ] {
        let r = simulate_layer(spec.parse().unwrap(), &p).unwrap();
        let want = ideal(&p, op);
        let got = r.speedup();
        // Launch, sync and the join's transfer cost a little: within 15% below the ideal.
        assert!(
            got <= want * 1.0001 && got >= 0.85 * want,
            "{spec}: {got} vs ideal {want}"
        );
        assert!((1.3..=2.1).contains(&got), "{spec}: {got}");
        assert!(
            matches!(r.choice, Choice::Split { .. }),
            "{spec}: {:?}",
            r.choice
        );
        assert!(
            r.vs_grid() >= 0.95,
            "{spec}: chosen vs grid {}",
            r.vs_grid()
        );
    }
}

#[test]
fn splits_match_the_grid_search_on_every_profile() {
    for name in SHIPPED {
        let p = profile(name);
        for spec in [
            "matmul:256,1024,1024",
            "conv:1,32,64,64,32,3",
            "matmul:8,64,64",
        ] {
            let r = simulate_layer(spec.parse().unwrap(), &p).unwrap();
            assert!(r.vs_grid() >= 0.95, "{name} {spec}: {}", r.vs_grid());
            assert!(r.chosen <= r.cpu.min(r.gpu) * (1.0 + 1e-9), "{name} {spec}");
        }
    }
}

/// A discrete GPU 12x faster than its CPU on matmul gains less than 10% from splitting (the
/// CPU's share is at most 1/13 of the rows); the balanced phone gains far more.
#[test]
fn policy_ordering_is_sane_on_every_profile() {
    let (graph, metas) = "matmul:512,1024,1024"
        .parse::<Layer>()
        .unwrap()
        .graph()
        .unwrap();
    for name in SHIPPED {
        let p = profile(name);
        let r = simulate_graph(&graph, &metas, &p).unwrap();
        let get = |pol: Policy| r.iter().find(|x| x.policy == pol).unwrap();
        let single = get(Policy::CpuOnly)
            .predicted
            .min(get(Policy::GpuOnly).predicted);
        assert!(
            get(Policy::Heft).predicted <= single * (1.0 + 1e-9),
            "{name}"
        );
        assert!(get(Policy::HeftSplit).predicted <= get(Policy::Heft).predicted * (1.0 + 1e-9));
        assert_eq!(get(Policy::CpuOnly).cpu_nodes, 1);
        assert_eq!(
            get(Policy::GpuOnly).gpu_nodes,
            1,
            "{name}: assume_gpu lets it run"
        );
        let gain = single / get(Policy::HeftSplit).predicted;
        let bound = ideal(&p, "MatMul");
        assert!(gain <= bound * 1.0001, "{name}: {gain} > {bound}");
    }
    let desktop = profile("desktop_rtx3060_pcie4.json");
    assert!(ideal(&desktop, "MatMul") < 1.1);
    let phone = profile("pixel5_sd765g.json");
    assert!(ideal(&phone, "MatMul") > 1.8);
}

/// Without a GPU the planner refuses every node for the GPU, unless `assume_gpu` is set; an
/// override still wins.
#[test]
fn assume_gpu_plans_gpu_kernels_without_a_device() {
    let (graph, metas) = "matmul:64,64,64".parse::<Layer>().unwrap().graph().unwrap();
    let p = profile("desktop_rtx3060_pcie4.json");
    let pool = rayon_pool();
    let mut request = Request {
        placement: Placement::Auto,
        overrides: &[],
        costs: Some(&p),
        policy: Policy::Heft,
        assume_gpu: false,
    };
    let plan = plan::build(&graph, &metas, &request, None, &pool).unwrap();
    let why = plan.steps[0].explain.as_ref().unwrap();
    assert_eq!(why.gpu, None);
    assert!(why.why.contains("no GPU adapter"), "{}", why.why);
    request.assume_gpu = true;
    request.policy = Policy::GpuOnly;
    let plan = plan::build(&graph, &metas, &request, None, &pool).unwrap();
    assert!(matches!(
        plan.steps[0].kind,
        StepKind::Whole {
            device: Device::Gpu,
            ..
        }
    ));
    let overrides = [(Selector::OpType("MatMul".into()), Device::Cpu)];
    request.overrides = &overrides;
    let plan = plan::build(&graph, &metas, &request, None, &pool).unwrap();
    assert!(matches!(
        plan.steps[0].kind,
        StepKind::Whole {
            device: Device::Cpu,
            ..
        }
    ));
}

fn rayon_pool() -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap()
}

/// An unmeasured cost model answers with its roofline priors alone, so its exported profile
/// has efficiency 1 everywhere and the same rates.
#[test]
fn exported_cost_model_profile_round_trips() {
    let cpu = CpuKey {
        model: "test cpu".into(),
        cores: 4,
        simd: "none".into(),
        threads: 4,
    };
    let model = CostModel::unmeasured(None, cpu);
    let p = Profile::from_cost_model(&model, "unmeasured");
    assert!((p.cpu.gflops - model.cpu_prior.peak_flops / 1e9).abs() < 1e-9);
    for (fam, e) in p.cpu.efficiency.iter().chain(&p.gpu.efficiency) {
        assert!((e - 1.0).abs() < 1e-6, "{fam}: {e}");
    }
    let text = serde_json::to_string(&p).unwrap();
    assert_eq!(Profile::from_json(&text).unwrap(), p);
}
