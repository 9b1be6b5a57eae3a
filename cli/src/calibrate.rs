//! `tandem calibrate`: measure this machine's CPU and GPU on the operator micro-benchmarks, fit
//! the cost model, save the profile, and optionally print the held-out accuracy table.
//!
//! Sits between the user's shell and `tandem::cost` (which does all the work).

use anyhow::{Context, Result};
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;
use tandem::cost::calibrate::calibrate_on_threads;
use tandem::cost::persist::profile_path;
use tandem::cost::{AdapterKey, CalibrationOptions, CpuKey, Progress};

#[derive(clap::Args)]
pub struct CalibrateArgs {
    /// Time budget for the measurements, in seconds.
    #[arg(long = "budget-s", default_value_t = 60.0)]
    pub budget_s: f64,
    /// Print the held-out accuracy per op kind and device.
    #[arg(long)]
    pub report: bool,
    /// With --report: also every held-out point (shape, predicted and measured time).
    #[arg(long)]
    pub points: bool,
    /// Where to save the profile, beside the file's profiles of other adapters and CPUs
    /// (default: $TANDEM_PROFILE, else the platform cache directory).
    #[arg(long)]
    pub profile: Option<PathBuf>,
    /// CPU threads for kernels (default: all cores); part of the profile's key.
    #[arg(long)]
    pub threads: Option<usize>,
    /// Measure the CPU only, even when a GPU adapter exists.
    #[arg(long)]
    pub cpu_only: bool,
}

/// A one-line progress bar on stderr, redrawn in place.
fn draw(p: &Progress) {
    let frac = (p.elapsed.as_secs_f64() / p.budget.as_secs_f64().max(1e-9))
        .max(p.done as f64 / p.planned.max(1) as f64)
        .min(1.0);
    let width = 30;
    let filled = (frac * width as f64) as usize;
    let what: String = p.what.chars().take(48).collect();
    eprint!(
        "\r[{}{}] {:>3.0}% {:>5.1}s  {:<48}",
        "#".repeat(filled),
        " ".repeat(width - filled),
        frac * 100.0,
        p.elapsed.as_secs_f64(),
        what
    );
    let _ = std::io::stderr().flush();
}

pub fn run(a: &CalibrateArgs) -> Result<()> {
    anyhow::ensure!(
        a.budget_s.is_finite() && a.budget_s > 0.0,
        "--budget-s must be a positive number of seconds"
    );
    let gpu = if a.cpu_only {
        None
    } else {
        match tandem::gpu::Gpu::new() {
            Ok(g) => Some(g),
            Err(e) => {
                eprintln!("warning: calibrating the CPU only: {e}");
                None
            }
        }
    };
    match &gpu {
        Some(g) => eprintln!("calibrating the CPU and {}", g.adapter()),
        None => eprintln!("calibrating the CPU"),
    }
    let opts = CalibrationOptions {
        budget: Duration::from_secs_f64(a.budget_s),
        ..Default::default()
    };
    let (model, report) =
        calibrate_on_threads(gpu.as_ref(), a.threads.unwrap_or(0), &opts, &mut draw);
    eprintln!();
    let threads = model.cpu.threads;
    let adapter = gpu.as_ref().map(|g| AdapterKey::from_desc(g.adapter()));
    let path = profile_path(
        a.profile.as_deref(),
        adapter.as_ref(),
        &CpuKey::detect(threads),
    )
    .context("no cache directory known: pass --profile PATH")?;
    model.save(&path)?;
    println!(
        "saved the cost profile ({} samples, {:.1} s) to {}",
        report.samples,
        report.elapsed.as_secs_f64(),
        path.display()
    );
    if let Some(e) = &report.gpu_error {
        println!("warning: GPU measurements stopped: {e}");
    }
    if a.report && a.points {
        println!("{report:#}");
    } else if a.report {
        println!("{report}");
    }
    Ok(())
}
