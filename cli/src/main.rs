//! The `tandem` command line: adapter and CPU info, the supported ops, running a model, and (with
//! no arguments) the demo on the embedded default model.
//!
//! Sits between a user's shell and the `tandem` library; holds no runtime logic of its own.

// The doc comments on arguments are `--help` text, written for a terminal, not Markdown.
#![allow(rustdoc::broken_intra_doc_links, rustdoc::invalid_html_tags)]

/// mimalloc, not glibc malloc: the runtime allocates small shape vectors in every node and frees
/// tensors on other threads than made them; glibc cost the tiny Llama decode step about 12 % of
/// its time and page-faulted on every convnet run (docs/bench.md, "mimalloc"). A program that
/// embeds `tandem` chooses its own allocator.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod calibrate;
mod demo;
mod inputs;
mod simulate;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use tandem::{Device, Placement, Selector, Session, SessionOptions};

#[derive(Parser)]
#[command(
    name = "tandem",
    version,
    about = "Run ONNX models on the CPU and the GPU together"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// GPU adapters (name, backend, type, driver, limits, features) and the CPU (model, cores, SIMD).
    Info,
    /// The ONNX op types tandem implements, one per line.
    Ops,
    /// Run a model once (or --runs times) and print or save its outputs.
    Run(RunArgs),
    /// The demo: classify a few embedded files' contents with the magika model.
    Demo(demo::DemoArgs),
    /// Measure this machine's CPU and GPU, fit the cost model and save its profile.
    Calibrate(calibrate::CalibrateArgs),
    /// Predicted latency per scheduling policy on simulated hardware (profiles/*.json).
    Simulate(simulate::SimulateArgs),
}

#[derive(clap::Args)]
struct RunArgs {
    /// The .onnx model.
    model: PathBuf,
    /// An input as NAME=FILE.npy (repeatable). Inputs not given are filled by default: floats
    /// with a fixed pseudo-random sequence in [0, 1), integers with 0 (1 when the name contains
    /// "mask"), bools with true; symbolic dimensions are 1 unless set with --dim.
    #[arg(long = "input", value_name = "NAME=FILE.npy")]
    inputs: Vec<String>,
    /// Value of a symbolic input dimension for default inputs, as NAME=N (repeatable).
    #[arg(long = "dim", value_name = "NAME=N")]
    dims: Vec<String>,
    /// Write one <output name>.npy per model output into DIR (characters outside [A-Za-z0-9._-]
    /// in the name become `_`).
    #[arg(long, value_name = "DIR")]
    output: Option<PathBuf>,
    /// Where nodes run: auto (the scheduler decides per node: CPU, GPU or split), cpu or gpu.
    #[arg(long, default_value = "auto")]
    placement: String,
    /// Force nodes onto a device, by node name or op type: NAME=cpu|gpu (repeatable).
    #[arg(long = "force", value_name = "NODE_OR_OP=DEVICE")]
    force: Vec<String>,
    /// CPU threads for kernels (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Pin the kernel threads one to a CPU (Linux, Android) for the session's life. Unpinned,
    /// they are kept on CPUs of their own only through a run that follows a pause (see
    /// --idle-ms), where an OS that packs woken threads onto busy CPUs would run it on one.
    #[arg(long)]
    pin_threads: bool,
    /// Wait this many milliseconds before each timed run (the warm-up excepted): the latency of
    /// a model run now and then, after the CPUs idled, rather than back to back.
    #[arg(long, default_value_t = 0, value_name = "MS")]
    idle_ms: u64,
    /// Print per node where it ran and its time (with --runs: its median over the runs). GPU
    /// nodes are then timed by timestamp queries in every run, which slows runs of many short
    /// GPU kernels; without --report (or --trace) only the runs the cost model learns from are.
    #[arg(long)]
    report: bool,
    /// Print per node the predicted time on CPU, on GPU and split, the choice and why.
    #[arg(long)]
    explain: bool,
    /// Write a Chrome trace of the last run (CPU, GPU and transfer lanes) to this file; open it
    /// in Perfetto or chrome://tracing.
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// Run this many times and print the median latency; above 1, after one more run as a
    /// warm-up (it plans and compiles the GPU pipelines), whose time is printed apart.
    #[arg(long, default_value_t = 1)]
    runs: usize,
    /// Keep BatchNormalization and activations after Convs as separate nodes (by default they
    /// are fused into the Conv at load time), and nodes that repeat an earlier one's work.
    #[arg(long)]
    no_fuse: bool,
    /// auto's cost profile: read from this file (calibrated into it if it holds none for this
    /// adapter and CPU), and what the runs taught saved back to it, beside the file's profiles
    /// of other adapters and CPUs. Default: $TANDEM_PROFILE, else one per adapter and CPU in the
    /// cache directory.
    #[arg(long, value_name = "FILE")]
    profile: Option<PathBuf>,
}

fn main() {
    tandem::gpu::quiet_wayland_probe();
    let cli = Cli::parse();
    let result = match cli.command {
        None => demo::run(&demo::DemoArgs::default()),
        Some(Command::Demo(a)) => demo::run(&a),
        Some(Command::Info) => info(),
        Some(Command::Ops) => {
            for op in tandem_ops_list() {
                println!("{op}");
            }
            Ok(())
        }
        Some(Command::Run(a)) => run(&a),
        Some(Command::Calibrate(a)) => calibrate::run(&a),
        Some(Command::Simulate(a)) => simulate::run(&a),
    };
    if let Err(e) = result {
        eprintln!("error: {}", error_chain(&e));
        std::process::exit(1);
    }
}

/// The error and its causes, skipping a cause whose text its parent already contains.
fn error_chain(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if !out.contains(&text) {
            if !out.is_empty() {
                out.push_str(": ");
            }
            out.push_str(&text);
        }
    }
    out
}

fn tandem_ops_list() -> Vec<&'static str> {
    tandem::supported_ops()
}

fn info() -> Result<()> {
    let cpu = tandem::cpu_info::CpuInfo::detect();
    println!("CPU: {} ({} cores, {})", cpu.model, cpu.cores, cpu.simd);
    let adapters = tandem::gpu::list_adapters();
    if adapters.is_empty() {
        println!("GPU: no adapter found (install a Vulkan driver, e.g. mesa-vulkan-drivers)");
    }
    for (desc, limits, features) in adapters {
        println!("GPU: {desc}");
        println!(
            "  vendor 0x{:04x} device 0x{:04x}; max storage binding {} B, max uniform binding \
             {} B x {} a stage, max buffer {} B, workgroups/dim {}, invocations/workgroup {}, \
             workgroup storage {} B",
            desc.vendor,
            desc.device,
            limits.max_storage_buffer_binding_size,
            limits.max_uniform_buffer_binding_size,
            limits.max_uniform_buffers_per_shader_stage,
            limits.max_buffer_size,
            limits.max_compute_workgroups_per_dimension,
            limits.max_compute_invocations_per_workgroup,
            limits.max_compute_workgroup_storage_size
        );
        println!("  features: {features:?}");
    }
    Ok(())
}

/// Parse `--force` and `--placement` into session options.
fn session_options(
    placement: &str,
    force: &[String],
    threads: Option<usize>,
) -> Result<SessionOptions> {
    let mut opts = SessionOptions::default().placement(placement.parse::<Placement>()?);
    for f in force {
        let (sel, dev) = f
            .rsplit_once('=')
            .with_context(|| format!("--force {f}: expected NODE_OR_OP=cpu|gpu"))?;
        let device = match dev {
            "cpu" => Device::Cpu,
            "gpu" => Device::Gpu,
            _ => bail!("--force {f}: device must be cpu or gpu"),
        };
        let selector = if tandem::supported_ops().contains(&sel) {
            Selector::OpType(sel.to_string())
        } else {
            Selector::NodeName(sel.to_string())
        };
        opts = opts.force(selector, device);
    }
    if let Some(t) = threads {
        opts = opts.cpu_threads(t);
    }
    Ok(opts)
}

fn run(a: &RunArgs) -> Result<()> {
    let mut opts = session_options(&a.placement, &a.force, a.threads)?
        .fuse(!a.no_fuse)
        .pin_threads(a.pin_threads);
    if let Some(p) = &a.profile {
        opts = opts.cost_profile(p);
    }
    let session = Session::new(a.model.as_path(), opts)?;
    for w in session.warnings() {
        eprintln!("note: {w}");
    }
    let given = inputs::load(&session, &a.inputs, &a.dims)?;
    if a.explain {
        let named: Vec<(&str, tandem::Tensor)> =
            given.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
        explain(&session, &named)?;
    }
    // Shared with every run, which reads them in place: `Session::run` copies them each time,
    // into fresh pages (a lone 64 x 111 x 111 MaxPool's 3.2 MB input: 0.33-0.43 ms a run,
    // 0.12-0.16 shared).
    let given: Vec<(String, Arc<tandem::Tensor>)> =
        (given.into_iter()).map(|(n, t)| (n, Arc::new(t))).collect();
    let named = || -> Vec<(&str, Arc<tandem::Tensor>)> {
        given.iter().map(|(n, t)| (n.as_str(), t.clone())).collect()
    };
    let mut times = Vec::new();
    let mut node_times: HashMap<std::sync::Arc<str>, Vec<std::time::Duration>> = HashMap::new();
    let mut last = None;
    // Without --report or --trace the timed runs are `Session::run`'s, whose GPU nodes are not
    // timed (timestamp queries slow runs of many short GPU kernels); the fallback notice below
    // then reads the warm-up run's report.
    let reporting = a.report || a.trace.is_some() || a.runs <= 1;
    if a.runs > 1 {
        let (outs, report) = session.run_with_report_owned(named())?;
        let ms = report.total.as_secs_f64() * 1e3;
        println!("warm-up run (plans, compiles pipelines): {ms:.3} ms");
        last = Some((outs, report));
    }
    let idle = std::time::Duration::from_millis(a.idle_ms);
    for _ in 0..a.runs.max(1) {
        std::thread::sleep(idle);
        if !reporting {
            let began = std::time::Instant::now();
            let outs = session.run_owned(named())?;
            times.push(began.elapsed());
            last = last.map(|(_, report)| (outs, report));
            continue;
        }
        let (outs, report) = session.run_with_report_owned(named())?;
        times.push(report.total);
        for n in &report.nodes {
            node_times.entry(n.name.clone()).or_default().push(n.time);
        }
        last = Some((outs, report));
    }
    let (outs, last_run) = last.expect("at least one run");
    // Printed: each node's median over the runs it ran in (one run's per-node times are mostly
    // noise). The trace keeps the last run as it ran: medians placed at that run's start times
    // overlapped each other on the CPU lane.
    let mut report = last_run.clone();
    for n in &mut report.nodes {
        if let Some(t) = node_times.get_mut(&n.name) {
            t.sort();
            n.time = t[t.len() / 2];
        }
    }
    for (name, t) in &outs {
        println!("{name}: {} {:?} {}", t.dtype(), t.shape, inputs::summary(t));
    }
    if a.runs > 1 {
        times.sort();
        let after = match a.idle_ms {
            0 => String::new(),
            ms => format!(", each after {ms} ms idle"),
        };
        println!(
            "median latency over {} runs{after}: {:.3} ms",
            a.runs,
            times[times.len() / 2].as_secs_f64() * 1e3
        );
    }
    if a.report {
        println!("{}", threads_line(&session));
        println!("{report}");
    } else if report.fallbacks().count() > 0 {
        println!(
            "{} nodes could not run where asked (see --report):",
            report.fallbacks().count()
        );
        for n in report.fallbacks().take(5) {
            println!(
                "  {} ({}): {}",
                n.name,
                n.op_type,
                n.fallback.as_deref().unwrap_or("")
            );
        }
    }
    match session.save_cost_profile() {
        Ok(Some(file)) => println!(
            "cost profile: what the runs taught saved to {}",
            file.display()
        ),
        Ok(None) => {}
        Err(e) => eprintln!("note: what the runs taught is not saved: {e}"),
    }
    if let Some(file) = &a.trace {
        std::fs::write(file, tandem::trace::chrome_trace(&last_run))
            .with_context(|| format!("writing {}", file.display()))?;
        println!("trace written to {}", file.display());
    }
    if let Some(dir) = &a.output {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        for (name, t) in &outs {
            let file = dir.join(format!("{}.npy", inputs::file_safe(name)));
            std::fs::write(&file, tandem::npy::to_npy(t))
                .with_context(|| format!("writing {}", file.display()))?;
        }
    }
    Ok(())
}

/// How many CPU kernel threads the session runs and where they are pinned.
fn threads_line(session: &Session) -> String {
    let pinned = session.pinned_cpus();
    let cpus: Vec<String> = pinned.iter().map(usize::to_string).collect();
    match pinned.is_empty() {
        true => format!("CPU: {} kernel threads, not pinned", session.cpu_threads()),
        false => format!(
            "CPU: {} kernel threads, pinned to CPUs {}",
            session.cpu_threads(),
            cpus.join(", ")
        ),
    }
}

/// Print the plan's per-node predictions and choices.
fn explain(session: &Session, inputs: &[(&str, tandem::Tensor)]) -> Result<()> {
    let plan = session.plan(inputs)?;
    let ms = |s: f64| format!("{:.3}", s * 1e3);
    println!(
        "{:<40} {:<18} {:>10} {:>10} {:>16}  {:<12} why",
        "node", "op", "cpu ms", "gpu ms", "split ms @cut", "choice"
    );
    for step in &plan.steps {
        let node = &session.graph().nodes[step.node];
        let choice = match &step.kind {
            tandem::plan::StepKind::View => "view".to_string(),
            tandem::plan::StepKind::Whole { device, .. } => device.to_string(),
            tandem::plan::StepKind::Split { cut, .. } => format!("split {cut}/{}", step.rows.end),
        };
        let name: String = node.name.chars().take(40).collect();
        match &step.explain {
            Some(e) => println!(
                "{:<40} {:<18} {:>10} {:>10} {:>16}  {:<12} {}",
                name,
                tandem::fuse::label(node),
                ms(e.cpu),
                e.gpu.map_or("-".into(), ms),
                e.split
                    .map_or("-".into(), |(t, c)| format!("{} @{c}", ms(t))),
                choice,
                e.why
            ),
            None => println!(
                "{:<40} {:<18} {:>10} {:>10} {:>16}  {:<12} {}",
                name,
                tandem::fuse::label(node),
                "-",
                "-",
                "-",
                choice,
                step.fallback.as_deref().unwrap_or(if choice == "view" {
                    "shares its input's storage"
                } else {
                    "placement forced"
                })
            ),
        }
    }
    if let Some(p) = plan.predicted {
        println!(
            "predicted run time: {:.3} ms ({} nodes folded at plan time)",
            p * 1e3,
            plan.folded.len()
        );
    }
    Ok(())
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    /// The binaries' mimalloc is built with `no_thp` (workspace Cargo.toml): without it mimalloc
    /// v3 asks the kernel for transparent huge pages on its 1 GiB arenas (`madvise(..,
    /// MADV_HUGEPAGE)`), and each first touch of a 2 MB page faults and zeroes all of it:
    /// 1.6-2.5x the load and first run here (docs/bench.md, "mimalloc without transparent huge
    /// pages"). The kernel marks a region so advised `hg` in its smaps VmFlags, whatever the
    /// host's THP policy.
    #[test]
    fn the_allocator_asks_for_no_transparent_huge_pages() {
        let block = vec![1u8; 8 << 20];
        let at = block.as_ptr() as usize;
        let smaps = std::fs::read_to_string("/proc/self/smaps").expect("/proc/self/smaps");
        // Each mapping's header line starts with its range, `lo-hi` in hex; its VmFlags follow.
        let range = |line: &str| {
            let (lo, hi) = line.split_whitespace().next()?.split_once('-')?;
            Some(usize::from_str_radix(lo, 16).ok()?..usize::from_str_radix(hi, 16).ok()?)
        };
        let mut inside = false;
        let mut flags = None;
        for line in smaps.lines() {
            match range(line) {
                Some(r) => inside = r.contains(&at),
                None if inside => {
                    flags = line.strip_prefix("VmFlags:").map(str::to_owned).or(flags);
                }
                None => {}
            }
        }
        let flags = flags.expect("the mapping that holds a fresh 8 MB allocation, in smaps");
        assert!(
            !flags.split_whitespace().any(|f| f == "hg"),
            "the allocator advised huge pages for its memory: VmFlags{flags}"
        );
        drop(block);
    }
}
