//! Concurrent use: many threads running many sessions of real models at once, on every
//! placement, all sessions sharing one GPU device; and `Session::run` called from inside rayon
//! worker threads. Every output is compared with onnxruntime's reference (models/, made by
//! scripts/setup.sh). A watchdog fails a test that stops making progress (a deadlock).
//!
//! Sits between the public session API and the real models of `models/manifest.json`. Prints runs
//! completed, wrong results (must be 0), errors (must be 0) and the process's resident memory
//! (VmRSS, and the peak VmHWM) at the start and at the end. Bounded by time: `TANDEM_STRESS_S`
//! seconds of runs (default 30). Run with
//! `cargo test --release -p tandem --test stress -- --nocapture`.

mod common;

use common::*;
use rayon::prelude::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tandem::cost::CostModel;
use tandem::{Placement, Session, SessionOptions};

/// Small real models with onnxruntime references, cheap enough to run hundreds of times.
const MODELS: &[&str] = &["magika", "tiny_llama_prefill", "tiny_llama_decode"];
const THREADS: usize = 8;
const RTOL: f64 = 1e-3;
const ATOL: f64 = 1e-4;
/// A test with no progress for this long has deadlocked.
const STALL: Duration = Duration::from_secs(120);

fn stress_seconds() -> u64 {
    std::env::var("TANDEM_STRESS_S")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30)
}

/// (VmRSS, VmHWM) of this process in MiB.
fn rss_mib() -> (f64, f64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<f64>().ok())
            .map_or(f64::NAN, |kb| kb / 1024.0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// One model on one placement, with its inputs and onnxruntime's outputs.
struct Case {
    label: String,
    session: Session,
    inputs: Named,
    want: Named,
}

/// The cases of `models` x `placements`, or `None` (skip, or a failure under CI) when the models
/// are not there.
fn cases(placements: &[Placement]) -> Option<Vec<Case>> {
    let dir = repo_root().join("models");
    let manifest = dir.join("manifest.json");
    let Ok(text) = std::fs::read_to_string(&manifest) else {
        data_missing(&manifest);
        return None;
    };
    let all: serde_json::Value = serde_json::from_str(&text).expect("manifest.json is JSON");
    let gpu = tandem::testing::gpu();
    let costs = placements.contains(&Placement::Auto).then(|| {
        let loaded = CostModel::load_or_calibrate(Some(&gpu), 0, None, Duration::from_secs(10));
        Arc::new(loaded.model)
    });
    let mut out = Vec::new();
    for name in MODELS {
        let entry = all
            .as_array()
            .and_then(|a| a.iter().find(|m| m["name"] == *name))
            .unwrap_or_else(|| panic!("{name} is not in the manifest"));
        let model = dir.join(entry["path"].as_str().unwrap());
        if !model.is_file() {
            data_missing(&model);
            return None;
        }
        for &placement in placements {
            let mut options = SessionOptions::default()
                .placement(placement)
                .gpu(gpu.clone());
            if let Some(c) = &costs {
                options = options.cost_model(c.clone());
            }
            let session = open_session(&model, options).unwrap();
            let data = dir.join(entry["test_data"].as_str().unwrap());
            let (inputs, want) = load_test_data(&data, &session).unwrap();
            out.push(Case {
                label: format!("{name} {placement:?}"),
                session,
                inputs,
                want,
            });
        }
    }
    Some(out)
}

#[derive(Default)]
struct Tally {
    runs: AtomicUsize,
    wrong: AtomicUsize,
    errors: AtomicUsize,
    first_problems: Mutex<Vec<String>>,
}

impl Tally {
    /// Run `case` once and count the outcome.
    fn run(&self, case: &Case) {
        let outcome = run_once(&case.session, &case.inputs)
            .map(|(got, _)| compare_outputs(&got, &case.want, RTOL, ATOL));
        self.runs.fetch_add(1, Ordering::SeqCst);
        let problem = match outcome {
            Ok(Ok(_)) => return,
            Ok(Err(e)) => {
                self.wrong.fetch_add(1, Ordering::SeqCst);
                format!("{}: wrong result: {}", case.label, one_line(&e, 300))
            }
            Err(e) => {
                self.errors.fetch_add(1, Ordering::SeqCst);
                format!("{}: {}", case.label, one_line(&e, 300))
            }
        };
        let mut p = self.first_problems.lock().unwrap();
        if p.len() < 10 {
            p.push(problem);
        }
    }

    fn check(&self, what: &str) {
        let (runs, wrong, errors) = (
            self.runs.load(Ordering::SeqCst),
            self.wrong.load(Ordering::SeqCst),
            self.errors.load(Ordering::SeqCst),
        );
        println!("{what}: {runs} runs, {wrong} wrong, {errors} errors");
        assert!(
            wrong == 0 && errors == 0,
            "{what}: {wrong} wrong, {errors} errors:\n{}",
            self.first_problems.lock().unwrap().join("\n")
        );
    }
}

/// Wait for `done` while `tally.runs` keeps growing; fail when it stalls for [`STALL`].
fn watch(what: &str, tally: &Tally, mut done: impl FnMut() -> bool) {
    let mut last = (0, Instant::now());
    while !done() {
        std::thread::sleep(Duration::from_millis(200));
        let runs = tally.runs.load(Ordering::SeqCst);
        if runs != last.0 {
            last = (runs, Instant::now());
        } else if last.1.elapsed() > STALL {
            panic!("{what}: no run finished for {STALL:?} after {runs} runs: deadlock");
        }
    }
}

#[test]
fn eight_threads_share_sessions_and_one_gpu_across_models_and_placements() {
    let Some(cases) = cases(&[Placement::Cpu, Placement::Gpu, Placement::Auto]) else {
        return;
    };
    let cases = Arc::new(cases);
    // Warm up: the first run of each case plans and compiles its pipelines.
    let tally = Arc::new(Tally::default());
    for case in cases.iter() {
        tally.run(case);
    }
    tally.check("warm-up");
    let (rss0, hwm0) = rss_mib();
    println!("start: VmRSS {rss0:.0} MiB, VmHWM {hwm0:.0} MiB");
    let tally = Arc::new(Tally::default());
    let deadline = Instant::now() + Duration::from_secs(stress_seconds());
    let halfway = Instant::now() + Duration::from_secs(stress_seconds()) / 2;
    let finished = Arc::new(AtomicUsize::new(0));
    let mut mid = None;
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (cases, tally, finished) = (cases.clone(), tally.clone(), finished.clone());
            std::thread::spawn(move || {
                // Each thread walks the cases from its own offset, so all of them overlap.
                let mut i = t;
                while Instant::now() < deadline {
                    tally.run(&cases[i % cases.len()]);
                    i += 1;
                }
                finished.fetch_add(1, Ordering::SeqCst);
            })
        })
        .collect();
    watch("stress", &tally, || {
        if mid.is_none() && Instant::now() > halfway {
            mid = Some(rss_mib());
        }
        finished.load(Ordering::SeqCst) == THREADS
    });
    for w in workers {
        w.join().expect("a stress thread panicked");
    }
    let (rss1, hwm1) = rss_mib();
    if let Some((rss, hwm)) = mid {
        println!("middle: VmRSS {rss:.0} MiB, VmHWM {hwm:.0} MiB");
    }
    println!(
        "end: VmRSS {rss1:.0} MiB, VmHWM {hwm1:.0} MiB; GPU buffer pool {:.1} MiB",
        tandem::testing::gpu().pooled_bytes() as f64 / (1 << 20) as f64
    );
    let per_case: Vec<String> = cases.iter().map(|c| c.label.clone()).collect();
    println!("cases: {}", per_case.join(", "));
    tally.check(&format!(
        "stress ({THREADS} threads, {} s)",
        stress_seconds()
    ));
}

thread_local! {
    /// `Session::run` calls active on this thread (nested ones included).
    static DEPTH: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

#[test]
fn runs_from_inside_rayon_workers_neither_nest_nor_deadlock() {
    let Some(cases) = cases(&[Placement::Cpu, Placement::Gpu]) else {
        return;
    };
    // A caller's own 2-thread pool, as an app using rayon has.
    let outer = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    let tally = Tally::default();
    let deepest = AtomicUsize::new(0);
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            outer.install(|| {
                (0..96).into_par_iter().for_each(|i| {
                    let depth = DEPTH.with(|d| {
                        d.set(d.get() + 1);
                        d.get()
                    });
                    deepest.fetch_max(depth, Ordering::SeqCst);
                    // Mostly CPU cases: those install kernels into the session's pool.
                    let case = &cases[if i % 8 == 7 { 1 } else { 0 } + 2 * (i % MODELS.len())];
                    tally.run(case);
                    DEPTH.with(|d| d.set(d.get() - 1));
                });
            });
            done.store(true, Ordering::SeqCst);
        });
        watch("rayon callers", &tally, || done.load(Ordering::SeqCst));
    });
    let deepest = deepest.load(Ordering::SeqCst);
    println!("deepest nesting of Session::run on one rayon worker: {deepest}");
    tally.check("runs from rayon workers");
    // A worker blocked in a cross-pool install runs other queued runs on its stack: nesting
    // grows with the number of queued runs. Kernels run on the caller's pool instead.
    assert!(
        deepest <= 2,
        "Session::run nested {deepest} deep on one rayon worker"
    );
}
