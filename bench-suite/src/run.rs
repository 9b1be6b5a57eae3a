//! `tandem-bench run`: every model on every tandem placement and every installed peer, same
//! inputs, same rule; then the terminal table and the JSON, Markdown and HTML reports.
//!
//! Sits between the command line and the runners (`tandem_row`, `peers::*`, `gemm`); writes
//! through `render`.

use crate::interleave::{wait_until_idle, RoundRow, Slices};
use crate::models::{self, ModelCase, Named};
use crate::peers;
use crate::render;
use crate::schema::{Config, ModelResult, Report, Row, SCHEMA};
use crate::stats::{Method, Pause, RunRule};
use crate::tandem_process;
use crate::tandem_row::{self, Variant};
use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use std::path::{Path, PathBuf};
use tandem::cost::keys::AdapterKey;
use tandem::gpu::AdapterDesc;

/// Largest max-abs-diff from onnxruntime that `--quick` (CI) accepts.
pub const QUICK_MAX_DIFF: f64 = 1e-4;

/// Arguments of `tandem-bench run`.
// The doc comments on fields are `--help` text, written for a terminal, not Markdown.
#[allow(rustdoc::invalid_html_tags)]
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Models: names from the manifest or paths to .onnx files (default: every manifest model).
    pub models: Vec<String>,
    /// Folder of manifest.json (default: <repo>/models).
    #[arg(long)]
    pub models_dir: Option<PathBuf>,
    /// tandem placements: cpu, gpu, auto (HEFT with splits), auto-nosplit (HEFT).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "cpu,gpu,auto,auto-nosplit"
    )]
    pub placements: Vec<String>,
    /// Peers: onnxruntime, tract, burn (burn needs scripts/build_burn.sh; docs/bench.md), or
    /// `none` for tandem's rows alone.
    #[arg(long, value_delimiter = ',', default_value = "onnxruntime,tract,burn")]
    pub peers: Vec<String>,
    /// CPU rows: at least this many timed runs...
    #[arg(long, default_value_t = 20)]
    pub iters: usize,
    /// ...and at least this many seconds...
    #[arg(long, default_value_t = 2.0)]
    pub secs: f64,
    /// ...unless a row reaches this cap (seconds) first.
    #[arg(long, default_value_t = 60.0)]
    pub max_secs: f64,
    /// gpu rows (lavapipe is slow): at least this many runs...
    #[arg(long, default_value_t = 3)]
    pub gpu_iters: usize,
    /// ...and seconds...
    #[arg(long, default_value_t = 0.0)]
    pub gpu_secs: f64,
    /// ...capped at this many seconds (also the cap of auto rows).
    #[arg(long, default_value_t = 20.0)]
    pub gpu_max_secs: f64,
    /// CPU threads of tandem and of every CPU peer.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// GPU adapters to measure: `all`, or a part of a name or a backend (`vulkan`, `gl`;
    /// `tandem info` lists them). Default: all in full mode, the one tandem picks in quick
    /// mode. Rows of adapters after the first are labelled `gpu@<backend>`, `auto@<backend>`.
    #[arg(long)]
    pub adapter: Option<String>,
    /// CI mode: magika only (unless models are named), few runs, no GEMM section; fails when a
    /// row does not run or differs from onnxruntime by more than 1e-4.
    #[arg(long)]
    pub quick: bool,
    /// Skip the CPU GEMM comparison.
    #[arg(long)]
    pub no_gemm: bool,
    /// Rows of a model take turns this many times, each turn with its share of the run rule
    /// (iterations, seconds and caps divided), and pool their samples: a host whose speed
    /// drifts over minutes (a shared VM's 2x swings) then slows every row alike, not the row
    /// that ran during the slow minute. Cold start comes from the first turn, where nodes ran
    /// and per-op times from the turn whose breakdown took least. `--quick` takes at most 2.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Within a round, the rows interleave their timed runs in slices of this many seconds (at
    /// least one run each), so that every row samples the host over the same seconds: a shared
    /// VM's speed swings within a second. 0: each row runs its round's share at once, one row
    /// after the other.
    #[arg(long, default_value_t = 0.1)]
    pub slice_secs: f64,
    /// After its timed runs, each row (but tandem's `gpu` ones) makes `--pause-runs` runs a
    /// round, each after this many milliseconds of sleep: the latency of a model run now and
    /// then, where the OS lets idle CPUs sleep or packs woken threads onto busy ones.
    #[arg(long, default_value_t = 50.0)]
    pub pause_ms: f64,
    /// Runs after a pause a round (0: none). `--quick` takes at most 2.
    #[arg(long, default_value_t = 5)]
    pub pause_runs: usize,
    /// Pin tandem's kernel threads and onnxruntime's pool workers one to a CPU (tract's
    /// executor has no affinity); by default both are left to the OS, as they are with a
    /// thread count set.
    #[arg(long)]
    pub pin_threads: bool,
    /// Folder for report.json, report.md, report.html.
    #[arg(long, default_value = "bench-results")]
    pub out: PathBuf,
}

impl crate::Subcommand for Args {
    fn main(self) -> Result<()> {
        main(self)
    }
}

/// An adapter the gpu/auto rows run on, and the suffix of its rows' placements.
struct Adapter {
    desc: AdapterDesc,
    /// False for the adapter tandem picks itself (its rows let the session open it).
    explicit: bool,
    suffix: String,
}

/// The adapters to measure, the default one first (suffix ""), each checked to open: `want`
/// `all` (the default in full mode) takes every adapter wgpu lists, a name part (or backend,
/// e.g. `gl`) the matching ones, none the one tandem picks. Empty when no row needs a GPU and
/// none opens.
fn choose_adapters(want: Option<&str>, needed: bool, all_by_default: bool) -> Result<Vec<Adapter>> {
    let listed: Vec<AdapterDesc> = tandem::gpu::list_adapters()
        .into_iter()
        .map(|(d, _, _)| d)
        .collect();
    let default = match tandem::gpu::Gpu::new() {
        Ok(g) => Some(g.adapter().clone()),
        Err(e) if needed => bail!("no GPU adapter for the gpu/auto rows: {e}"),
        Err(_) => None,
    };
    let mut chosen: Vec<AdapterDesc> = match want.map(str::to_lowercase) {
        Some(w) if w != "all" => {
            let hits: Vec<AdapterDesc> = listed
                .iter()
                .filter(|d| d.name.to_lowercase().contains(&w) || d.backend.to_lowercase() == w)
                .cloned()
                .collect();
            if hits.is_empty() {
                let names: Vec<String> = listed.iter().map(|d| d.to_string()).collect();
                bail!("no adapter matches `{w}`; adapters: {}", names.join("; "));
            }
            hits
        }
        Some(_) => listed.clone(),
        None if all_by_default => listed.clone(),
        None => default.iter().cloned().collect(),
    };
    // The adapter tandem picks by default leads, so `gpu`/`auto` mean the same as without
    // `--adapter`.
    if let Some(d) = &default {
        if let Some(i) = chosen.iter().position(|c| c == d) {
            let first = chosen.remove(i);
            chosen.insert(0, first);
        }
    }
    let mut out: Vec<Adapter> = Vec::new();
    for d in chosen {
        if let Err(e) = tandem::gpu::Gpu::open_adapter(&d, Default::default()) {
            eprintln!("note: adapter {d} left out: {e}");
            continue;
        }
        let mut suffix = if out.is_empty() {
            String::new()
        } else {
            format!("@{}", d.backend)
        };
        if out.iter().any(|a| a.suffix == suffix) {
            suffix = format!("{suffix}#{}", out.len());
        }
        let explicit = default.as_ref() != Some(&d);
        out.push(Adapter {
            desc: d,
            explicit,
            suffix,
        });
    }
    if needed && out.is_empty() {
        bail!("no GPU adapter opened for the gpu/auto rows");
    }
    Ok(out)
}

fn cases(args: &Args) -> Result<Vec<ModelCase>> {
    let dir = args
        .models_dir
        .clone()
        .unwrap_or_else(|| peers::ort::repo_root().join("models"));
    let wanted: Vec<String> = if args.quick && args.models.is_empty() {
        vec!["magika".into()]
    } else {
        args.models.clone()
    };
    if wanted.is_empty() {
        return models::manifest(&dir);
    }
    let manifest = models::manifest(&dir).unwrap_or_default();
    wanted
        .iter()
        .map(|w| {
            if let Some(c) = manifest.iter().find(|c| c.name == *w) {
                Ok(c.clone())
            } else if Path::new(w).is_file() {
                Ok(models::from_path(Path::new(w)))
            } else {
                bail!(
                    "`{w}` is neither a model of {}/manifest.json nor a file",
                    dir.display()
                )
            }
        })
        .collect()
}

/// A line above the progress bar, or on stderr when the bar is hidden (not a terminal: CI
/// logs still get one line per row).
fn say(pb: &ProgressBar, line: String) {
    if pb.is_hidden() {
        eprintln!("{line}");
    } else {
        pb.println(line);
    }
}

/// tandem's rows of one model: every placement on the first adapter, then the GPU-using
/// placements on each further adapter.
fn targets<'a>(variants: &[Variant], adapters: &'a [Adapter]) -> Vec<tandem_row::Target<'a>> {
    let on = |v: Variant, a: Option<&'a Adapter>| tandem_row::Target {
        variant: v,
        adapter: a.filter(|a| a.explicit).map(|a| &a.desc),
        suffix: a.map_or("", |a| a.suffix.as_str()),
    };
    let mut out: Vec<_> = variants.iter().map(|&v| on(v, adapters.first())).collect();
    for a in adapters.iter().skip(1) {
        out.extend(
            variants
                .iter()
                .filter(|v| v.uses_gpu())
                .map(|&v| on(v, Some(a))),
        );
    }
    out
}

/// Everything measured on one model: its rows under the CPU and GPU rules, in `rounds`, as
/// `method` says.
#[allow(clippy::too_many_arguments)]
fn bench_model(
    case: &ModelCase,
    variants: &[Variant],
    adapters: &[Adapter],
    peers_on: &[String],
    (cpu_rule, gpu_rule, rounds): (&RunRule, &RunRule, usize),
    method: &Method,
    work: &Path,
    pb: &ProgressBar,
) -> Result<ModelResult> {
    let graph = tandem::import::import_file(&case.path)
        .with_context(|| format!("{}: reading the model", case.name))?;
    let (inputs, stored) = models::inputs(case, &graph)?;
    drop(graph);
    let mut result = ModelResult {
        name: case.name.clone(),
        path: case.path.display().to_string(),
        inputs: models::describe(&inputs),
        reference: if stored.is_some() {
            "test_data".into()
        } else {
            "onnxruntime".into()
        },
        rows: Vec::new(),
        core_round_trip_ns: Vec::new(),
    };
    let mut reference: Option<Named> = stored;
    let ticker = |label: String| {
        let pb = pb.clone();
        move |n: usize| pb.set_message(format!("{label}: {n} runs"))
    };
    // Each round runs every row with its share of the rule, the rows' timed runs interleaved;
    // later rounds' rows pool into the first's (same order).
    let mut tandem_files = None;
    for round in 0..rounds {
        let (cpu_share, gpu_share) = (cpu_rule.share(rounds), gpu_rule.share(rounds));
        let tag = match rounds {
            1 => String::new(),
            n => format!(" (round {}/{n})", round + 1),
        };
        result
            .core_round_trip_ns
            .extend(crate::machine::core_round_trip_ns());
        // Each row with the whole rule it runs a share of (its samples pool under that): started
        // one after the other (cold starts alone, each followed by a wait until its threads are
        // idle), then their timed runs interleaved, then each finished (outputs, profiles,
        // reports) alone.
        let mut started: Vec<(Box<dyn RoundRow>, RunRule)> = Vec::new();
        let mut start = |row: Box<dyn RoundRow>, whole: RunRule| {
            if let Some(pid) = row.process() {
                wait_until_idle(pid);
            }
            started.push((row, whole));
        };
        if peers_on.iter().any(|p| p == "onnxruntime") {
            let label = format!("{} onnxruntime{tag}", case.name);
            pb.set_message(label.clone());
            let ort = peers::ort::start(
                &case.path,
                &inputs,
                reference.as_ref(),
                &cpu_share,
                method,
                work,
                Box::new(ticker(label)),
            );
            if let (None, (_, Some(outs))) = (&reference, &ort) {
                reference = Some(outs.clone());
            }
            start(ort.0, *cpu_rule);
        }
        if peers_on.iter().any(|p| p == "tract") {
            let label = format!("{} tract{tag}", case.name);
            pb.set_message(label.clone());
            let tract = peers::tract::start(
                &case.path,
                &inputs,
                reference.as_ref(),
                &cpu_share,
                method,
                Box::new(ticker(label)),
            );
            start(tract, *cpu_rule);
        }
        for target in targets(variants, adapters) {
            let rule = |cpu: &RunRule, gpu: &RunRule| match target.variant {
                Variant::Cpu => *cpu,
                Variant::Gpu => *gpu,
                Variant::Auto | Variant::AutoNoSplit => cpu.capped(gpu.max_secs),
            };
            let label = format!("{} tandem {}{tag}", case.name, target.placement());
            pb.set_message(label.clone());
            let files = tandem_files.get_or_insert_with(|| {
                tandem_process::RowFiles::write(&inputs, reference.as_ref(), work)
            });
            let method = match makes_runs_after_a_pause("tandem", &target.placement()) {
                true => method,
                false => &Method {
                    pause: Pause {
                        runs: 0,
                        ..method.pause
                    },
                    ..*method
                },
            };
            let tandem = tandem_process::start(
                &case.path,
                files.as_ref(),
                target,
                &rule(&cpu_share, &gpu_share),
                method,
                Box::new(ticker(label)),
            );
            start(tandem, rule(cpu_rule, gpu_rule));
        }
        let mut slices: Vec<&mut dyn Slices> = started
            .iter_mut()
            .map(|(s, _)| s.as_mut() as &mut dyn Slices)
            .collect();
        let ended = crate::interleave::interleave(&mut slices);
        let mut rows: Vec<(Row, RunRule)> = started
            .into_iter()
            .zip(ended)
            .map(|((s, whole), end)| (s.finish(end), whole))
            .collect();
        if peers_on.iter().any(|p| p == "burn") {
            let burn = peers::burn::bench(
                &case.name,
                &inputs,
                reference.as_ref(),
                method.threads,
                &cpu_share,
                &gpu_share,
                work,
            );
            rows.extend(burn.into_iter().map(|row| {
                let whole = if row.placement == "cpu" {
                    *cpu_rule
                } else {
                    *gpu_rule
                };
                (row, whole)
            }));
        }
        if round == 0 {
            result.rows = rows.into_iter().map(|(row, _)| row).collect();
            continue;
        }
        for (first, (later, whole)) in result.rows.iter_mut().zip(rows) {
            first.pool(later, round, &whole);
        }
    }
    for row in &result.rows {
        let l = row.latency.as_ref();
        say(
            pb,
            format!(
                "{:<20} {:<26} {}",
                case.name,
                row.label(),
                match (&row.error, l) {
                    (Some(e), _) => format!("FAILED: {}", e.chars().take(160).collect::<String>()),
                    (None, Some(l)) => format!(
                        "p50 {:.2} ms over {} runs, max|diff| {}",
                        l.p50_ms,
                        l.iterations,
                        row.max_abs_diff.map_or("-".into(), |d| format!("{d:.1e}"))
                    ),
                    _ => "no timing".into(),
                }
            ),
        );
        pb.inc(1);
    }
    Ok(result)
}

/// `tandem-bench run`.
pub fn main(mut args: Args) -> Result<()> {
    if args.quick {
        args.iters = args.iters.min(5);
        args.secs = 0.0;
        args.max_secs = args.max_secs.min(10.0);
        args.gpu_iters = args.gpu_iters.min(2);
        args.gpu_max_secs = args.gpu_max_secs.min(10.0);
        args.no_gemm = true;
        args.rounds = args.rounds.min(2);
        args.pause_runs = args.pause_runs.min(2);
    }
    if args.rounds == 0 {
        bail!("--rounds must be at least 1");
    }
    if args.slice_secs.is_nan() || args.slice_secs < 0.0 {
        bail!("--slice-secs must be 0 or more seconds");
    }
    if args.pause_ms.is_nan() || args.pause_ms < 0.0 {
        bail!("--pause-ms must be 0 or more milliseconds");
    }
    let variants: Vec<Variant> = args
        .placements
        .iter()
        .map(|p| {
            Variant::parse(p)
                .with_context(|| format!("unknown placement `{p}` (cpu, gpu, auto, auto-nosplit)"))
        })
        .collect::<Result<_>>()?;
    args.peers = peers_named(&args.peers)?;
    if args.peers.iter().any(|p| p == "burn") && !peers::burn::included(args.quick) {
        eprintln!("note: quick mode leaves burn out (build with `--features burn` to require it)");
        args.peers.retain(|p| p != "burn");
    }
    let adapters = choose_adapters(
        args.adapter.as_deref(),
        variants.iter().any(|v| v.uses_gpu()),
        !args.quick,
    )?;
    let cases = cases(&args)?;
    let cpu_rule = RunRule {
        min_iters: args.iters,
        min_secs: args.secs,
        max_secs: args.max_secs,
    };
    let gpu_rule = RunRule {
        min_iters: args.gpu_iters,
        min_secs: args.gpu_secs,
        max_secs: args.gpu_max_secs,
    };
    let pause = Pause {
        ms: args.pause_ms,
        runs: args.pause_runs,
    };
    let started_unix_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut report = Report {
        schema: SCHEMA.into(),
        started_unix_s,
        machine: crate::machine::describe(
            adapters
                .iter()
                .map(|a| AdapterKey::from_desc(&a.desc))
                .collect(),
        ),
        config: Config {
            cpu_rule,
            gpu_rule,
            threads: args.threads,
            quick: args.quick,
            rounds: args.rounds,
            slice_secs: args.slice_secs,
            pause: Some(pause),
            pin_threads: args.pin_threads,
        },
        models: Vec::new(),
        gemm: None,
    };
    let method = Method::of(&report.config);
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let work = args.out.join("work");
    let peers_per_model = args.peers.iter().filter(|p| *p != "burn").count()
        + if args.peers.iter().any(|p| p == "burn") {
            2
        } else {
            0
        };
    let rows_per_model = targets(&variants, &adapters).len() + peers_per_model;
    let pb = ProgressBar::new((cases.len() * rows_per_model) as u64);
    pb.set_style(
        ProgressStyle::with_template("[{elapsed_precise}] {bar:30} {pos}/{len} rows  {msg}")
            .expect("a valid template"),
    );
    for case in &cases {
        let m = bench_model(
            case,
            &variants,
            &adapters,
            &args.peers,
            (&cpu_rule, &gpu_rule, args.rounds),
            &method,
            &work.join(&case.name),
            &pb,
        );
        match m {
            Ok(m) => report.models.push(m),
            Err(e) => say(&pb, format!("{}: skipped: {e:#}", case.name)),
        }
    }
    if !args.no_gemm {
        pb.set_message("CPU GEMM 1024^3");
        report.gemm = Some(crate::gemm::measure(1024, args.threads, 2.0));
    }
    pb.finish_and_clear();
    report.machine.load_average_end = crate::machine::load_average();
    let _ = std::fs::remove_dir_all(&work);
    let json = serde_json::to_string_pretty(&report)?;
    std::fs::write(args.out.join("report.json"), json)?;
    std::fs::write(args.out.join("report.md"), render::markdown(&report))?;
    std::fs::write(args.out.join("report.html"), render::html::page(&report))?;
    print!("{}", render::terminal(&report));
    println!(
        "\nreports: {0}/report.json, {0}/report.md, {0}/report.html",
        args.out.display()
    );
    if args.quick {
        // CI: a row that does not run, or runs wrong, fails the suite so it cannot rot.
        let bad: Vec<String> = report
            .models
            .iter()
            .flat_map(|m| m.rows.iter().map(move |r| (m, r)))
            .filter_map(|(m, r)| match (&r.error, r.max_abs_diff) {
                (Some(e), _) => Some(format!("{} {}: {e}", m.name, r.label())),
                (None, Some(d)) if d.is_nan() || d > QUICK_MAX_DIFF => Some(format!(
                    "{} {}: max abs diff {d:e} > {QUICK_MAX_DIFF:e}",
                    m.name,
                    r.label()
                )),
                // Per-op times are what "where tandem misses" and the breakdown plot show.
                _ if r.op_times.is_empty() && r.runtime == "onnxruntime" => Some(format!(
                    "{} {}: no per-op times (onnxruntime's profiler)",
                    m.name,
                    r.label()
                )),
                _ if pause.is_on()
                    && r.after_pause.as_ref().map(|p| p.samples_ms.len())
                        != makes_runs_after_a_pause(&r.runtime, &r.placement)
                            .then_some(pause.runs * args.rounds) =>
                {
                    Some(format!(
                        "{} {}: runs after a pause {:?}, {} a round asked for",
                        m.name,
                        r.label(),
                        r.after_pause.as_ref().map(|p| &p.samples_ms),
                        pause.runs
                    ))
                }
                _ => None,
            })
            .collect();
        if !bad.is_empty() {
            bail!(
                "quick mode: {} row(s) failed:\n{}",
                bad.len(),
                bad.join("\n")
            );
        }
    }
    Ok(())
}

/// Whether a row makes runs after a pause: all but tandem's gpu rows (lavapipe's runs of the
/// larger models take seconds) and burn's (its driver makes none).
fn makes_runs_after_a_pause(runtime: &str, placement: &str) -> bool {
    !(runtime.starts_with("burn") || runtime == "tandem" && placement.starts_with("gpu"))
}

/// The peers `--peers` names: each of onnxruntime, tract and burn, or `none` alone (no peer).
fn peers_named(names: &[String]) -> Result<Vec<String>> {
    if names == ["none"] {
        return Ok(Vec::new());
    }
    for p in names {
        if !["onnxruntime", "tract", "burn"].contains(&p.as_str()) {
            bail!("unknown peer `{p}` (onnxruntime, tract, burn, or none alone)");
        }
    }
    Ok(names.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn adapter(backend: &str, explicit: bool, suffix: &str) -> Adapter {
        Adapter {
            desc: AdapterDesc {
                name: "llvmpipe".into(),
                vendor: 0x10005,
                device: 0,
                backend: backend.into(),
                device_type: "Cpu".into(),
                driver: "llvmpipe".into(),
                driver_info: String::new(),
            },
            explicit,
            suffix: suffix.into(),
        }
    }

    #[test]
    fn further_adapters_get_only_the_gpu_placements_with_a_suffix() {
        let adapters = [adapter("Vulkan", false, ""), adapter("Gl", true, "@Gl")];
        let variants = [Variant::Cpu, Variant::Gpu, Variant::Auto];
        let t = targets(&variants, &adapters);
        let labels: Vec<String> = t.iter().map(|t| t.placement()).collect();
        assert_eq!(labels, ["cpu", "gpu", "auto", "gpu@Gl", "auto@Gl"]);
        // The default adapter's rows let the session open it; further ones name theirs.
        assert!(t[..3].iter().all(|t| t.adapter.is_none()));
        assert!(t[3..]
            .iter()
            .all(|t| t.adapter.is_some_and(|d| d.backend == "Gl")));
        // No adapter: every placement, no suffix.
        let none = targets(&variants, &[]);
        assert_eq!(none.len(), 3);
        assert!(none.iter().all(|t| t.suffix.is_empty()));
    }

    #[test]
    fn peers_are_known_names_or_none_alone() {
        let named = |v: &[&str]| peers_named(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(named(&["none"]).unwrap(), Vec::<String>::new());
        assert_eq!(
            named(&["tract", "onnxruntime"]).unwrap(),
            ["tract", "onnxruntime"]
        );
        let err = named(&["onnxruntime", "none"]).unwrap_err().to_string();
        assert!(err.contains("`none`"), "{err}");
        assert!(named(&["ort"]).unwrap_err().to_string().contains("`ort`"));
    }
}
