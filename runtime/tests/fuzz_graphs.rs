//! Structure-aware fuzzing as a plain test: `tandem::fuzzgen` builds a random model per seed
//! over a fixed range of seeds; each is loaded, planned and run with placements cpu, gpu and
//! auto. Every run must end in outputs or a typed error (a panic names its seed), valid models
//! must run on the CPU, and where the CPU and another placement both run, their outputs must
//! agree. The `generated_graph` fuzz target (runtime/fuzz) explores the same space with
//! coverage guidance; crashes it finds become seeds or tests here.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tandem::cost::{AdapterKey, CostModel, CpuKey};
use tandem::fuzzgen::{from_seed, run_everywhere};
use tandem::testing::gpu;
use tandem::Placement;

/// Seeds run by [`generated_models_never_panic_and_agree_across_placements`]: `0..2000`, or
/// `0..N` with `TANDEM_FUZZ_SEEDS=N` for a longer run.
fn seeds() -> std::ops::Range<u64> {
    let n = std::env::var("TANDEM_FUZZ_SEEDS").map_or(2000, |s| s.parse().expect("a count"));
    0..n
}

#[test]
fn generated_models_never_panic_and_agree_across_placements() {
    let gpu = gpu();
    let costs = Arc::new(CostModel::unmeasured(
        Some(AdapterKey::from_desc(gpu.adapter())),
        CpuKey::detect(1),
    ));
    let (mut nodes, mut ran, mut compared, mut refused) = (0, 0, 0, 0);
    let mut problems = Vec::new();
    let seeds = seeds();
    // A watchdog names a seed that runs for more than 10 s (a hang otherwise names nothing).
    static CURRENT: AtomicU64 = AtomicU64::new(u64::MAX);
    std::thread::spawn(|| {
        let mut last = u64::MAX;
        loop {
            std::thread::sleep(std::time::Duration::from_secs(10));
            let now = CURRENT.load(Ordering::Relaxed);
            if now == last && now != u64::MAX {
                eprintln!("fuzz_graphs: seed {now} has been running for more than 10 s");
            }
            last = now;
        }
    });
    for seed in seeds.clone() {
        CURRENT.store(seed, Ordering::Relaxed);
        let g = from_seed(seed);
        nodes += g.model.graph.as_ref().map_or(0, |g| g.node.len());
        let started = std::time::Instant::now();
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            run_everywhere(&g, Some(gpu.clone()), Some(costs.clone()))
        }));
        if started.elapsed().as_secs() >= 2 {
            eprintln!("fuzz_graphs: seed {seed} took {:?}", started.elapsed());
        }
        let outcome = match outcome {
            Ok(o) => o,
            Err(p) => {
                let msg = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                problems.push(format!("seed {seed}: PANIC {msg}"));
                continue;
            }
        };
        for (p, r) in &outcome.runs {
            match r {
                Ok(_) => ran += 1,
                Err(_) if g.hostile => refused += 1,
                Err(e) if *p == Placement::Cpu => {
                    problems.push(format!("seed {seed}: valid model fails on the CPU: {e}"))
                }
                Err(e) => problems.push(format!("seed {seed}: fails on {p:?}: {e}")),
            }
        }
        compared += outcome.compared;
        for m in outcome.mismatches {
            problems.push(format!("seed {seed}: {m}"));
        }
    }
    println!(
        "fuzz_graphs: {} models ({nodes} nodes): {ran} runs, {refused} hostile refusals, \
         {compared} outputs compared with the CPU",
        seeds.end
    );
    assert!(
        problems.is_empty(),
        "{} problems:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

/// Prints the model of one seed (or of the fuzz input in `FUZZ_FILE`, e.g. a crash artifact of
/// the `generated_graph` target) and what each placement did:
/// `FUZZ_SEED=N cargo test --release -p tandem --test fuzz_graphs -- --ignored --nocapture`.
#[test]
#[ignore]
fn show_seed() {
    let g = match std::env::var("FUZZ_FILE") {
        Ok(f) => tandem::fuzzgen::from_bytes(&std::fs::read(f).expect("FUZZ_FILE")),
        Err(_) => from_seed(std::env::var("FUZZ_SEED").map_or(0, |s| s.parse().expect("seed"))),
    };
    let graph = g.model.graph.as_ref().expect("a graph");
    println!("opset {:?}, hostile {}", g.model.opset_import, g.hostile);
    for (name, t) in &g.inputs {
        println!("input {name}: {t:?} {:?}", t.to_f64_vec());
    }
    for t in &graph.initializer {
        let t = tandem::import::read_tensor_pb(&prost::Message::encode_to_vec(t)).unwrap();
        println!("init {}: {:?} {:?}", t.0, t.1, t.1.to_f64_vec());
    }
    for n in &graph.node {
        let attrs: Vec<String> = n
            .attribute
            .iter()
            .map(|a| format!("{}={:?}{:?}{:?}{:?}", a.name, a.i, a.f, a.ints, a.s))
            .collect();
        println!("{} {:?} -> {:?} {attrs:?}", n.op_type, n.input, n.output);
    }
    let gpu = gpu();
    let outcome = run_everywhere(&g, Some(gpu), None);
    for (p, r) in &outcome.runs {
        match r {
            Ok(outs) => {
                for (n, t) in outs {
                    println!("{p:?} {n}: {t:?} {:?}", t.to_f64_vec());
                }
            }
            Err(e) => println!("{p:?}: {e}"),
        }
    }
    println!("mismatches: {:?}", outcome.mismatches);
}

/// Inputs the `generated_graph` fuzz target crashed on (runtime/fuzz/regressions/), replayed
/// as it replays them: no panic or abort, no disagreement with the CPU, valid models run.
/// - lrn-nan-*: LRN over a channel window holding a NaN gave inf on the GPU (`pow` of a NaN
///   base is 0 on lavapipe) where the CPU and onnxruntime give NaN.
/// - gen-*: the generator shaped a MatMul weight after the last dim of a value with no
///   elements (`[0, i32::MAX]`): a 32 GB allocation (abort) or > 2 GB RSS.
/// - reduceprod-overflow-order: a ReduceProd of 45 cubic-resized values overflowed in the CPU's
///   lanes (NaN = inf * 0) but not on the GPU (0): order-dependent, now not compared.
/// - cast-inf-to-int8: Cast of inf (ReduceMin of nothing) to int8 gave -1 on the CPU and -128
///   on the GPU: undefined in ONNX, so Cast outputs are not compared.
/// - gen-oom-conv-huge-stride: a depthwise Conv with stride 2^31 (SAME_LOWER, one output)
///   made the CPU's plane path allocate a phase plane per stride step: > 2 GB RSS.
/// - maxpool-empty-window-sum-overflow: a dilated SAME MaxPool whose windows held only padding
///   gave -f32::MAX, and a ConvTranspose summing three such channels overflowed at a point that
///   depends on the order (-inf on the CPU, NaN on the GPU): values that may be +-f32::MAX now
///   make any non-exact op reading them unstable (`fuzzgen`, found by CI's fuzzing).
/// - slow-*: hostile Resize/Pad outputs of 16-80 MB ran 12-30 s (lavapipe); the fuzz cap
///   (`fuzzgen::MAX_HOST_MEMORY`, 8 MiB) now refuses them: every run must be that typed error.
#[test]
fn fuzz_regressions_replay() {
    let gpu = gpu();
    let costs = Arc::new(CostModel::unmeasured(
        Some(AdapterKey::from_desc(gpu.adapter())),
        CpuKey::detect(1),
    ));
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/fuzz/regressions");
    let mut files: Vec<_> = std::fs::read_dir(dir).expect("regressions").collect();
    files.sort_by_key(|f| f.as_ref().map(|f| f.path()).ok());
    assert!(files.len() >= 5, "regression inputs missing from {dir}");
    for f in files {
        let path = f.expect("dir entry").path();
        let g = tandem::fuzzgen::from_bytes(&std::fs::read(&path).expect("input"));
        let outcome = run_everywhere(&g, Some(gpu.clone()), Some(costs.clone()));
        assert!(
            outcome.mismatches.is_empty(),
            "{path:?}: {:?}",
            outcome.mismatches
        );
        if let (false, Some((_, Err(e)))) = (g.hostile, outcome.runs.first()) {
            panic!("{path:?}: a valid model fails on the CPU: {e}");
        }
        if path.to_string_lossy().contains("/slow-") {
            for (p, r) in &outcome.runs {
                let e = r.as_ref().err().map(|e| e.to_string()).unwrap_or_default();
                assert!(e.contains("host memory limit"), "{path:?} {p:?}: {e}");
            }
        }
    }
}
