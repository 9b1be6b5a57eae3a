//! `tandem simulate`: predicted latency of a model (or single layers) under every scheduling
//! policy on simulated hardware described by device profiles (profiles/*.json). No GPU needed.
//!
//! Sits between the user's shell and `tandem::simulate`; formats tables, holds no logic.

use crate::inputs;
use anyhow::{bail, Context, Result};
use std::path::PathBuf;
use tandem::schedule::{Choice, Policy};
use tandem::simulate::{simulate_graph, simulate_layer, Layer, Profile};
use tandem::{Placement, Session, SessionOptions};

#[derive(clap::Args)]
pub struct SimulateArgs {
    /// The .onnx model (optional with --layer or --export-this-machine).
    model: Option<PathBuf>,
    /// A device profile JSON (repeatable: one table per profile).
    #[arg(long = "profile", value_name = "FILE")]
    profiles: Vec<PathBuf>,
    /// An input as NAME=FILE.npy (repeatable); others get the defaults of `tandem run`.
    #[arg(long = "input", value_name = "NAME=FILE.npy")]
    inputs: Vec<String>,
    /// Value of a symbolic input dimension, as NAME=N (repeatable).
    #[arg(long = "dim", value_name = "NAME=N")]
    dims: Vec<String>,
    /// The whole shape of an input, as NAME=D0,D1,... (repeatable; only shapes matter here).
    #[arg(long = "shape", value_name = "NAME=DIMS")]
    shapes: Vec<String>,
    /// A single layer built in memory: matmul:M,K,N or conv:N,C,H,W,OC,K[,STRIDE[,PAD]]
    /// (repeatable); reports each device alone, HEFT+split, and a 5%-step grid over the cut.
    #[arg(long = "layer", value_name = "SPEC")]
    layers: Vec<String>,
    /// Write this machine's calibrated cost model (loaded or calibrated now) as a device
    /// profile to FILE.
    #[arg(long, value_name = "FILE")]
    export_this_machine: Option<PathBuf>,
}

pub fn run(a: &SimulateArgs) -> Result<()> {
    if let Some(out) = &a.export_this_machine {
        export(out)?;
    }
    if a.profiles.is_empty() {
        if a.export_this_machine.is_some() {
            return Ok(());
        }
        bail!("give at least one --profile FILE (see profiles/)");
    }
    let profiles: Vec<Profile> = a
        .profiles
        .iter()
        .map(|p| Profile::load(p).with_context(|| format!("--profile {}", p.display())))
        .collect::<Result<_>>()?;
    let layers: Vec<Layer> = a
        .layers
        .iter()
        .map(|l| l.parse::<Layer>())
        .collect::<tandem::Result<_>>()?;
    if a.model.is_none() && layers.is_empty() {
        bail!("give a model or at least one --layer");
    }
    if let Some(model) = &a.model {
        let session = Session::new(
            model.as_path(),
            SessionOptions::default().placement(Placement::Cpu),
        )?;
        let given = inputs::load(&session, &a.inputs, &a.dims)?;
        let by_name: std::collections::HashMap<&str, &tandem::Tensor> =
            given.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let mut metas: Vec<tandem::TensorMeta> = session
            .inputs()
            .iter()
            .map(|io| by_name[io.name.as_str()].meta())
            .collect();
        for spec in &a.shapes {
            let bad = || format!("--shape {spec}: expected NAME=D0,D1,...");
            let (name, dims) = spec.split_once('=').with_context(bad)?;
            let dims: Vec<usize> = dims
                .split(',')
                .map(|d| d.trim().parse::<usize>())
                .collect::<std::result::Result<_, _>>()
                .with_context(bad)?;
            let at = session
                .inputs()
                .iter()
                .position(|io| io.name == name)
                .with_context(|| format!("--shape {spec}: the model has no input `{name}`"))?;
            metas[at] = tandem::TensorMeta::new(metas[at].dtype, dims);
        }
        let shapes: Vec<String> = session
            .inputs()
            .iter()
            .zip(&metas)
            .map(|(io, m)| format!("{}{:?}", io.name, m.shape))
            .collect();
        for p in &profiles {
            println!("{} [{}] on {}", model.display(), shapes.join(", "), p.name);
            let results = simulate_graph(session.graph(), &metas, p)?;
            let single = results
                .iter()
                .filter(|r| matches!(r.policy, Policy::CpuOnly | Policy::GpuOnly))
                .map(|r| r.predicted)
                .fold(f64::INFINITY, f64::min);
            println!(
                "  {:<14} {:>12} {:>9} {:>6} {:>6} {:>6}",
                "policy", "predicted ms", "speedup", "cpu", "gpu", "split"
            );
            for r in &results {
                println!(
                    "  {:<14} {:>12.3} {:>8.2}x {:>6} {:>6} {:>6}",
                    r.policy.name(),
                    r.predicted * 1e3,
                    single / r.predicted,
                    r.cpu_nodes,
                    r.gpu_nodes,
                    r.split_nodes
                );
            }
            if let Some(r) = results.first() {
                println!(
                    "  (speedup vs the best single device; {} views/folded nodes, {} nodes the GPU refuses)",
                    r.free_nodes, r.gpu_refused
                );
            }
        }
    }
    for p in &profiles {
        if layers.is_empty() {
            break;
        }
        println!("single layers on {}", p.name);
        println!(
            "  {:<34} {:>9} {:>9} {:>10} {:>9} {:>10} {:>12} {:>8}",
            "layer", "cpu ms", "gpu ms", "split ms", "speedup", "gpu rows", "grid best", "vs grid"
        );
        for l in &layers {
            let r = simulate_layer(*l, p)?;
            let gpu_share = match r.choice {
                Choice::On(tandem::Device::Cpu) => 0.0,
                Choice::On(tandem::Device::Gpu) => 100.0,
                Choice::Split { cut } => 100.0 * (r.rows - cut) as f64 / r.rows as f64,
            };
            println!(
                "  {:<34} {:>9.3} {:>9.3} {:>10.3} {:>8.2}x {:>9.1}% {:>4}% {:>6.3} {:>8.3}",
                l.to_string(),
                r.cpu * 1e3,
                r.gpu * 1e3,
                r.chosen * 1e3,
                r.speedup(),
                gpu_share,
                r.grid_best.0,
                r.grid_best.1 * 1e3,
                r.vs_grid()
            );
        }
    }
    Ok(())
}

/// Load (or calibrate) this machine's cost model and write it as a device profile.
fn export(out: &std::path::Path) -> Result<()> {
    let gpu = tandem::gpu::Gpu::new().ok();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let tandem::cost::LoadedProfile { model, warning, .. } =
        tandem::cost::CostModel::load_or_calibrate(
            gpu.as_ref(),
            threads,
            None,
            std::time::Duration::from_secs(10),
        );
    if let Some(w) = warning {
        eprintln!("note: cost profile: {w}");
    }
    let profile = Profile::from_cost_model(&model, "this-machine");
    std::fs::write(out, serde_json::to_string_pretty(&profile)? + "\n")
        .with_context(|| format!("writing {}", out.display()))?;
    println!("wrote {}", out.display());
    Ok(())
}
