//! ONNX backend node tests, enabled line by line in `conformance/manifest.txt`.
//!
//! Sits between the test folders `scripts/setup.sh` generates (`conformance-data/node/<test>/`,
//! described by `conformance-data/index.json`) and the public session API. Every enabled test
//! runs with placement cpu, and with placement gpu unless its line says `cpu-only`; on the gpu a
//! node that fell back to the CPU is a failure. `discover_conformance` (ignored) runs every
//! test whose ops tandem implements and writes `conformance/discovered.txt`, the raw material
//! for the manifest. See `conformance/README.md`.

mod common;

use common::*;
use std::collections::{BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tandem::{Device, Placement, SessionOptions};

const DEFAULT_RTOL: f64 = 1e-3;
const DEFAULT_ATOL: f64 = 1e-5;

/// One enabled test: `test_name [cpu-only] [rtol=X] [atol=Y]`.
#[derive(Debug, Clone)]
struct Entry {
    name: String,
    cpu_only: bool,
    rtol: f64,
    atol: f64,
}

fn node_dir() -> PathBuf {
    repo_root().join("conformance-data/node")
}

/// Parse the manifest; a malformed line is a harness bug and panics with its line number.
fn parse_manifest(text: &str) -> Vec<Entry> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for (k, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let mut words = line.split_whitespace();
        let name = words.next().unwrap().to_string();
        let mut e = Entry {
            name: name.clone(),
            cpu_only: false,
            rtol: DEFAULT_RTOL,
            atol: DEFAULT_ATOL,
        };
        for w in words {
            let num = |v: &str| {
                v.parse::<f64>()
                    .unwrap_or_else(|_| panic!("manifest.txt:{}: bad number in `{w}`", k + 1))
            };
            if w == "cpu-only" {
                e.cpu_only = true;
            } else if let Some(v) = w.strip_prefix("rtol=") {
                e.rtol = num(v);
            } else if let Some(v) = w.strip_prefix("atol=") {
                e.atol = num(v);
            } else {
                panic!("manifest.txt:{}: unknown word `{w}`", k + 1);
            }
        }
        assert!(
            seen.insert(name.clone()),
            "manifest.txt:{}: `{name}` listed twice",
            k + 1
        );
        out.push(e);
    }
    out
}

/// Names of the node tests whose op types are all implemented and whose values are plain
/// tensors (from `conformance-data/index.json`), sorted.
fn available_tests() -> Vec<String> {
    let path = repo_root().join("conformance-data/index.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let index: serde_json::Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()));
    let supported: HashSet<&str> = tandem::supported_ops().into_iter().collect();
    let mut names: BTreeSet<String> = BTreeSet::new();
    for t in index.as_array().expect("index.json is a list") {
        let ops = t["ops"].as_array().map(|a| a.as_slice()).unwrap_or(&[]);
        let implemented = !ops.is_empty()
            && ops
                .iter()
                .all(|o| o.as_str().is_some_and(|o| supported.contains(o)));
        if t["kind"] == "node" && t["tensor_only"] == true && implemented {
            names.insert(t["name"].as_str().unwrap_or_default().to_string());
        }
    }
    names.into_iter().collect()
}

fn options(placement: Placement) -> SessionOptions {
    // One CPU thread per session: the sweep runs tests in parallel instead.
    let o = SessionOptions::default()
        .placement(placement)
        .cpu_threads(1);
    if placement == Placement::Gpu {
        o.gpu(tandem::testing::gpu())
    } else {
        o
    }
}

/// Run one test folder on one placement; on the gpu a node that fell back to the CPU fails,
/// and so does a run where no node ran on the GPU.
/// Returns how many nodes ran on the GPU.
fn check(dir: &Path, placement: Placement, e: &Entry) -> Result<usize, String> {
    let session = open_session(&dir.join("model.onnx"), options(placement))?;
    let (inputs, want) = load_test_data(&dir.join("test_data_set_0"), &session)?;
    let (got, report) = run_once(&session, &inputs)?;
    compare_outputs(&got, &want, e.rtol, e.atol)?;
    if placement == Placement::Gpu {
        let fb = fallbacks(&report);
        if !fb.is_empty() {
            return Err(format!("fell back to cpu: {}", fb.join("; ")));
        }
        if report.count(Device::Gpu) == 0 {
            // Everything was folded at plan time (or was a view): the GPU was not tested.
            return Err("no node ran on the gpu (all folded at plan time or views)".into());
        }
    }
    Ok(report.count(Device::Gpu))
}

/// The outcome of one test on both placements (`gpu` is `None` when not run).
struct Outcome {
    name: String,
    cpu: Result<usize, String>,
    gpu: Option<Result<usize, String>>,
    time: Duration,
}

fn run_entry(e: &Entry, with_gpu: bool) -> Outcome {
    let dir = node_dir().join(&e.name);
    let start = Instant::now();
    let cpu = if dir.is_dir() {
        check(&dir, Placement::Cpu, e)
    } else {
        Err(format!("no folder {}", dir.display()))
    };
    let gpu = with_gpu.then(|| check(&dir, Placement::Gpu, e));
    Outcome {
        name: e.name.clone(),
        cpu,
        gpu,
        time: start.elapsed(),
    }
}

/// Run `entries` in parallel with panic messages silenced (they are reported per test).
fn run_all(entries: &[Entry], with_gpu: impl Fn(&Entry) -> bool + Sync) -> Vec<Outcome> {
    if entries.iter().any(&with_gpu) {
        tandem::testing::gpu(); // open the shared adapter once, before the threads race for it
    }
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    // Plain threads, not rayon's pool: a rayon worker blocked in a session's `pool.install`
    // runs other queued tests on its own stack while it waits, nesting them until it overflows.
    let next = std::sync::atomic::AtomicUsize::new(0);
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let mut out: Vec<(usize, Outcome)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(e) = entries.get(i) else { break };
                        done.push((i, run_entry(e, with_gpu(e))));
                    }
                    done
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("a conformance worker thread"))
            .collect()
    });
    std::panic::set_hook(previous);
    out.sort_by_key(|(i, _)| *i);
    out.into_iter().map(|(_, o)| o).collect()
}

/// `false` (after a notice, or a panic under CI) when the generated data is absent.
fn data_present() -> bool {
    let d = node_dir();
    if !d.is_dir() {
        data_missing(&d);
        return false;
    }
    true
}

#[test]
fn enabled_conformance_tests_pass() {
    if !data_present() {
        return;
    }
    let manifest = repo_root().join("conformance/manifest.txt");
    let text = std::fs::read_to_string(&manifest)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", manifest.display()));
    let entries = parse_manifest(&text);
    let available = available_tests().len();
    let start = Instant::now();
    // cpu-only tests run on the gpu too, only to point out the lines that could lose the flag.
    let outcomes = run_all(&entries, |_| true);

    let mut failures = Vec::new();
    let mut now_pass_on_gpu = Vec::new();
    let (mut cpu_ok, mut gpu_ok, mut gpu_nodes) = (0, 0, 0);
    for (o, e) in outcomes.iter().zip(&entries) {
        match &o.cpu {
            Ok(_) => cpu_ok += 1,
            Err(why) => failures.push(format!("{} cpu: {}", o.name, one_line(why, 300))),
        }
        match (&o.gpu, e.cpu_only) {
            (Some(Ok(_)), true) => now_pass_on_gpu.push(o.name.as_str()),
            (Some(Ok(n)), false) => {
                gpu_ok += 1;
                gpu_nodes += n;
            }
            (Some(Err(why)), false) => {
                failures.push(format!("{} gpu: {}", o.name, one_line(why, 300)))
            }
            _ => {}
        }
    }
    if !now_pass_on_gpu.is_empty() {
        println!(
            "note: {} cpu-only tests now pass on the gpu (drop the flag): {}",
            now_pass_on_gpu.len(),
            now_pass_on_gpu.join(" ")
        );
    }
    println!(
        "conformance: {available} available for implemented ops, {} enabled, {cpu_ok} passed on cpu, {gpu_ok} passed on gpu ({} gpu-enabled, {gpu_nodes} nodes ran on the gpu) in {:.1} s",
        entries.len(),
        entries.iter().filter(|e| !e.cpu_only).count(),
        start.elapsed().as_secs_f64()
    );
    if !failures.is_empty() {
        panic!(
            "{} conformance failures:\n{}",
            failures.len(),
            failures.join("\n")
        );
    }
}

/// Run every available test on cpu and gpu; write `conformance/discovered.txt`.
/// `cargo test --release -p tandem --test conformance -- --ignored --nocapture discover`
#[test]
#[ignore]
fn discover_conformance() {
    if !data_present() {
        return;
    }
    let names = available_tests();
    let entries: Vec<Entry> = names
        .iter()
        .map(|n| Entry {
            name: n.clone(),
            cpu_only: false,
            rtol: DEFAULT_RTOL,
            atol: DEFAULT_ATOL,
        })
        .collect();
    let start = Instant::now();
    let outcomes = run_all(&entries, |_| true);

    let mut text = String::from(
        "## Written by `cargo test --release -p tandem --test conformance -- --ignored discover_conformance`.\n\
         ## Every node test whose ops tandem implements, at the default tolerances (rtol 1e-3, atol 1e-5):\n\
         ## a passing test is a manifest line (`cpu-only` when only the CPU passed, the GPU's first\n\
         ## failure in the comment above it); a failing test is a `# FAIL` comment with its first failure.\n",
    );
    let (mut cpu_ok, mut gpu_ok) = (0, 0);
    for o in &outcomes {
        let gpu = o.gpu.as_ref().expect("discovery runs the gpu");
        cpu_ok += o.cpu.is_ok() as usize;
        gpu_ok += gpu.is_ok() as usize;
        match (&o.cpu, gpu) {
            (Ok(_), Ok(_)) => text += &format!("{}\n", o.name),
            (Ok(_), Err(g)) => {
                text += &format!("# gpu: {}\n{} cpu-only\n", one_line(g, 400), o.name)
            }
            (Err(c), _) => text += &format!("# FAIL {} cpu: {}\n", o.name, one_line(c, 400)),
        }
    }
    let mut slow: Vec<&Outcome> = outcomes.iter().collect();
    slow.sort_by_key(|o| std::cmp::Reverse(o.time));
    let slowest: Vec<String> = slow
        .iter()
        .take(8)
        .map(|o| format!("{} {:.1}s", o.name, o.time.as_secs_f64()))
        .collect();
    let summary = format!(
        "discovered: {} available, {cpu_ok} pass on cpu, {gpu_ok} pass on gpu, in {:.1} s; slowest: {}",
        entries.len(),
        start.elapsed().as_secs_f64(),
        slowest.join(", ")
    );
    text += &format!("## {summary}\n");
    let out = repo_root().join("conformance/discovered.txt");
    std::fs::write(&out, text).unwrap_or_else(|e| panic!("cannot write {}: {e}", out.display()));
    println!("{summary}\nwrote {}", out.display());
}

#[test]
fn manifest_parser_reads_flags_and_comments() {
    let m = parse_manifest("# c\ntest_a\n\ntest_b cpu-only rtol=0.01 # why\ntest_c atol=1e-4\n");
    assert_eq!(m.len(), 3);
    assert!(!m[0].cpu_only && m[0].rtol == DEFAULT_RTOL && m[0].atol == DEFAULT_ATOL);
    assert!(m[1].cpu_only && m[1].rtol == 0.01);
    assert!(!m[2].cpu_only && m[2].atol == 1e-4);
}
