//! `tandem-bench run`: every model on every tandem placement and every installed peer, same
//! inputs, same rule; then the terminal table and the JSON, Markdown and HTML reports.
//!
//! Sits between the command line and the runners (`tandem_row`, `peers::*`, `gemm`); writes
//! through `render`.

use crate::models::{self, ModelCase, Named};
use crate::peers;
use crate::render;
use crate::schema::{Config, ModelResult, Report, Row, SCHEMA};
use crate::stats::RunRule;
use crate::tandem_row::{self, Variant};
use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use std::path::{Path, PathBuf};
use tandem::cost::keys::AdapterKey;

/// Largest max-abs-diff from onnxruntime that `--quick` (CI) accepts.
pub const QUICK_MAX_DIFF: f64 = 1e-4;

/// Arguments of `tandem-bench run`.
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
    /// Peers: onnxruntime, tract, burn (burn needs scripts/build_burn.sh; docs/bench.md).
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
    /// GPU adapter to use, by a part of its name (`tandem info` lists them); default: the one
    /// tandem picks.
    #[arg(long)]
    pub adapter: Option<String>,
    /// CI mode: magika only (unless models are named), few runs, no GEMM section; fails when a
    /// row does not run or differs from onnxruntime by more than 1e-4.
    #[arg(long)]
    pub quick: bool,
    /// Skip the CPU GEMM comparison.
    #[arg(long)]
    pub no_gemm: bool,
    /// Folder for report.json, report.md, report.html.
    #[arg(long, default_value = "bench-results")]
    pub out: PathBuf,
}

impl crate::Subcommand for Args {
    fn main(self) -> Result<()> {
        main(self)
    }
}

/// Open the chosen adapter's backend and check the adapter is the one asked for; returns its
/// key (`None` when the machine has no adapter and no gpu row is asked for).
fn choose_adapter(want: Option<&str>, needed: bool) -> Result<Option<AdapterKey>> {
    if let Some(w) = want {
        let all = tandem::gpu::list_adapters();
        let Some((d, _, _)) = all
            .iter()
            .find(|(d, _, _)| d.name.to_lowercase().contains(&w.to_lowercase()))
        else {
            let names: Vec<String> = all.iter().map(|(d, _, _)| d.to_string()).collect();
            bail!("no adapter matches `{w}`; adapters: {}", names.join("; "));
        };
        // Gpu::new honours WGPU_BACKEND; set before any other thread exists.
        std::env::set_var("WGPU_BACKEND", d.backend.to_lowercase());
    }
    match tandem::gpu::Gpu::new() {
        Ok(g) => {
            let d = g.adapter();
            if let Some(w) = want {
                if !d.name.to_lowercase().contains(&w.to_lowercase()) {
                    bail!("asked for adapter `{w}` but tandem opened {d} (same backend)");
                }
            }
            Ok(Some(AdapterKey::from_desc(d)))
        }
        Err(e) if needed => bail!("no GPU adapter for the gpu/auto rows: {e}"),
        Err(_) => Ok(None),
    }
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

/// Everything measured on one model.
#[allow(clippy::too_many_arguments)]
fn bench_model(
    case: &ModelCase,
    variants: &[Variant],
    peers_on: &[String],
    cpu_rule: &RunRule,
    gpu_rule: &RunRule,
    threads: usize,
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
    };
    let mut reference: Option<Named> = stored;
    let finish = |row: Row, result: &mut ModelResult| {
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
        result.rows.push(row);
    };
    let ticker = |label: String| {
        let pb = pb.clone();
        move |n: usize| pb.set_message(format!("{label}: {n} runs"))
    };
    if peers_on.iter().any(|p| p == "onnxruntime") {
        pb.set_message(format!("{} onnxruntime", case.name));
        let (row, outs) = peers::ort::bench(
            &case.path,
            &inputs,
            reference.as_ref(),
            threads,
            cpu_rule,
            work,
        );
        if reference.is_none() {
            reference = outs;
        }
        finish(row, &mut result);
    }
    if peers_on.iter().any(|p| p == "tract") {
        let mut tick = ticker(format!("{} tract", case.name));
        let (row, _) = peers::tract::bench(
            &case.path,
            &inputs,
            reference.as_ref(),
            threads,
            cpu_rule,
            &mut tick,
        );
        finish(row, &mut result);
    }
    for &v in variants {
        let rule = match v {
            Variant::Cpu => *cpu_rule,
            Variant::Gpu => *gpu_rule,
            Variant::Auto | Variant::AutoNoSplit => cpu_rule.capped(gpu_rule.max_secs),
        };
        let mut tick = ticker(format!("{} tandem {}", case.name, v.name()));
        tick(0);
        let row = tandem_row::bench(
            &case.path,
            &inputs,
            reference.as_ref(),
            v,
            threads,
            &rule,
            &mut tick,
        );
        finish(row, &mut result);
    }
    if peers_on.iter().any(|p| p == "burn") {
        for row in peers::burn::bench(
            &case.name,
            &inputs,
            reference.as_ref(),
            threads,
            cpu_rule,
            gpu_rule,
            work,
        ) {
            finish(row, &mut result);
        }
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
    }
    let variants: Vec<Variant> = args
        .placements
        .iter()
        .map(|p| {
            Variant::parse(p)
                .with_context(|| format!("unknown placement `{p}` (cpu, gpu, auto, auto-nosplit)"))
        })
        .collect::<Result<_>>()?;
    for p in &args.peers {
        if !["onnxruntime", "tract", "burn"].contains(&p.as_str()) {
            bail!("unknown peer `{p}` (onnxruntime, tract, burn)");
        }
    }
    if args.peers.iter().any(|p| p == "burn") && !peers::burn::included(args.quick) {
        eprintln!("note: quick mode leaves burn out (build with `--features burn` to require it)");
        args.peers.retain(|p| p != "burn");
    }
    let adapter = choose_adapter(
        args.adapter.as_deref(),
        variants.iter().any(|v| v.uses_gpu()),
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
    let started_unix_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut report = Report {
        schema: SCHEMA.into(),
        started_unix_s,
        machine: crate::machine::describe(adapter),
        config: Config {
            cpu_rule,
            gpu_rule,
            threads: args.threads,
            quick: args.quick,
        },
        models: Vec::new(),
        gemm: None,
    };
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let work = args.out.join("work");
    let peers_per_model = args.peers.iter().filter(|p| *p != "burn").count()
        + if args.peers.iter().any(|p| p == "burn") {
            2
        } else {
            0
        };
    let pb = ProgressBar::new((cases.len() * (variants.len() + peers_per_model)) as u64);
    pb.set_style(
        ProgressStyle::with_template("[{elapsed_precise}] {bar:30} {pos}/{len} rows  {msg}")
            .expect("a valid template"),
    );
    for case in &cases {
        let m = bench_model(
            case,
            &variants,
            &args.peers,
            &cpu_rule,
            &gpu_rule,
            args.threads,
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
