//! The demo: magika (Google's file-type classifier, Apache-2.0, fetched by `scripts/setup.sh`
//! from its PyPI wheel) reads the first and last KiB of a few of this repository's own files,
//! embedded in the binary, and names their content type, on the CPU and on the GPU; the report
//! shows where each node ran.
//!
//! Sits between the `tandem` command and the library; the preprocessing follows magika 1.0.3
//! (see docs/models.md).

use anyhow::{Context, Result};
use std::path::PathBuf;
use tandem::plan::StepKind;
use tandem::report::Ran;
use tandem::{Placement, Session, SessionOptions, Tensor};

#[derive(clap::Args, Default)]
pub struct DemoArgs {
    /// Folder holding magika's model.onnx and config.json (default: models/magika, made by
    /// scripts/setup.sh; or $TANDEM_MODELS/magika).
    #[arg(long)]
    model_dir: Option<PathBuf>,
    /// Print every node of the GPU run, not only the summary.
    #[arg(long)]
    report: bool,
}

/// Files of this repository, embedded at build time: the samples the demo classifies.
const SAMPLES: &[(&str, &[u8])] = &[
    ("Cargo.toml", include_bytes!("../../Cargo.toml")),
    ("cli/src/demo.rs", include_bytes!("demo.rs")),
    ("scripts/setup.sh", include_bytes!("../../scripts/setup.sh")),
    (
        "scripts/fetch_models.py",
        include_bytes!("../../scripts/fetch_models.py"),
    ),
    ("README.md", include_bytes!("../../README.md")),
    ("docs/models.md", include_bytes!("../../docs/models.md")),
];

const BEG: usize = 1024;
const END: usize = 1024;
const BLOCK: usize = 4096;
const PAD: i32 = 256;

fn is_ws(b: &u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c)
}

/// magika's model input for one file: the first and last KiB (after stripping whitespace),
/// padded with token 256.
pub fn features(bytes: &[u8]) -> Vec<i32> {
    let n = bytes.len().min(BLOCK);
    let head = &bytes[..n];
    let head = &head[head.iter().position(|b| !is_ws(b)).unwrap_or(n)..];
    let mut beg: Vec<i32> = head.iter().take(BEG).map(|&b| b as i32).collect();
    beg.resize(BEG, PAD);
    let tail = &bytes[bytes.len() - n..];
    let tail = &tail[..tail.iter().rposition(|b| !is_ws(b)).map_or(0, |p| p + 1)];
    let tail = &tail[tail.len().saturating_sub(END)..];
    let mut end = vec![PAD; END - tail.len()];
    end.extend(tail.iter().map(|&b| b as i32));
    beg.extend(end);
    beg
}

fn model_dir(args: &DemoArgs) -> PathBuf {
    args.model_dir.clone().unwrap_or_else(|| {
        std::env::var_os("TANDEM_MODELS")
            .map(|m| PathBuf::from(m).join("magika"))
            .unwrap_or_else(|| PathBuf::from("models/magika"))
    })
}

pub fn run(args: &DemoArgs) -> Result<()> {
    let dir = model_dir(args);
    let model = dir.join("model.onnx");
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("config.json")).with_context(|| {
            format!(
                "{} is missing: run scripts/setup.sh first",
                dir.join("config.json").display()
            )
        })?)?;
    let labels: Vec<String> = config["target_labels_space"]
        .as_array()
        .context("config.json has no target_labels_space")?
        .iter()
        .map(|l| l.as_str().unwrap_or("?").to_string())
        .collect();
    let mut flat = Vec::new();
    for (_, bytes) in SAMPLES {
        flat.extend(features(bytes));
    }
    let input = Tensor::new(vec![SAMPLES.len(), BEG + END], tandem::Data::I32(flat));
    println!(
        "tandem demo: magika content-type model ({}), {} files of this repo, batch {}",
        model.display(),
        SAMPLES.len(),
        SAMPLES.len()
    );
    let mut results = Vec::new();
    for placement in [Placement::Cpu, Placement::Gpu, Placement::Auto] {
        let session = Session::new(
            model.as_path(),
            SessionOptions::default().placement(placement),
        )
        .with_context(|| format!("loading {}", model.display()))?;
        for w in session.warnings() {
            println!("note: {w}");
        }
        session.run(&[("bytes", input.clone())])?; // warm-up: plans and compiles pipelines
        let (outs, report) = session.run_with_report(&[("bytes", input.clone())])?;
        println!(
            "\nplacement {placement:?}: {:.2} ms; {} nodes on cpu, {} on gpu, {} split, {} folded at plan time",
            report.total.as_secs_f64() * 1e3,
            report.count(tandem::Device::Cpu),
            report.count(tandem::Device::Gpu),
            report.nodes.iter().filter(|n| matches!(n.ran, Ran::Split { .. })).count(),
            report.nodes.iter().filter(|n| n.ran == Ran::Folded).count()
        );
        for n in report.fallbacks() {
            println!(
                "  {} ({}) ran on the cpu: {}",
                n.name,
                n.op_type,
                n.fallback.as_deref().unwrap_or("")
            );
        }
        if placement == Placement::Auto {
            print_auto_choices(&session, &input)?;
        }
        if args.report {
            println!("{report}");
        }
        results.push(outs[0].1.clone());
    }
    println!(
        "\n{:<26} {:<12} {:>8}   {:<12} {:>8}   {:<12} {:>8}",
        "file", "cpu says", "p", "gpu says", "p", "auto says", "p"
    );
    let classes = labels.len();
    for (i, (name, _)) in SAMPLES.iter().enumerate() {
        let mut row = format!("{name:<26}");
        for probs in &results {
            let p = probs.as_f32().context("magika outputs f32")?;
            let row_p = &p[i * classes..(i + 1) * classes];
            let (best, score) =
                row_p
                    .iter()
                    .enumerate()
                    .fold((0, f32::MIN), |a, (j, &v)| if v > a.1 { (j, v) } else { a });
            row += &format!(" {:<12} {:>8.4}  ", labels[best], score);
        }
        println!("{row}");
    }
    println!(
        "\nmax |cpu - gpu| over all probabilities: {:.2e}; max |cpu - auto|: {:.2e}",
        tandem::testing::max_abs_diff(&results[0], &results[1]),
        tandem::testing::max_abs_diff(&results[0], &results[2])
    );
    Ok(())
}

/// What the scheduler decided, per op type, and why for the costliest and the hybrid nodes.
fn print_auto_choices(session: &Session, input: &Tensor) -> Result<()> {
    let plan = session.plan(&[("bytes", input.clone())])?;
    let mut by_op: std::collections::BTreeMap<&str, std::collections::BTreeMap<String, usize>> =
        Default::default();
    let mut notable = Vec::new();
    for step in &plan.steps {
        let Some(e) = &step.explain else { continue };
        let node = &session.graph().nodes[step.node];
        let choice = match &step.kind {
            StepKind::Whole { device, .. } => device.to_string(),
            StepKind::Split { .. } => "split".to_string(),
            StepKind::View => continue,
        };
        *by_op
            .entry(&node.op_type)
            .or_default()
            .entry(choice.clone())
            .or_default() += 1;
        notable.push((choice, e.cpu.min(e.gpu.unwrap_or(f64::MAX)), node, e));
    }
    let summary: Vec<String> = by_op
        .iter()
        .map(|(op, c)| {
            let parts: Vec<String> = c.iter().map(|(d, n)| format!("{n} {d}")).collect();
            format!("{op} {}", parts.join("+"))
        })
        .collect();
    println!("  scheduler (auto), per op type: {}", summary.join(", "));
    notable.sort_by(|a, b| {
        (a.0 == "cpu")
            .cmp(&(b.0 == "cpu"))
            .then(b.1.total_cmp(&a.1))
    });
    println!("  hybrid and costliest nodes (predicted by this machine's measured cost profile):");
    for (choice, _, node, e) in notable.iter().take(5) {
        println!(
            "    {:<12} {:<10} cpu {:>8.3} ms, gpu {:>9} ms: {}",
            node.op_type,
            choice,
            e.cpu * 1e3,
            e.gpu.map_or("-".to_string(), |g| format!("{:.3}", g * 1e3)),
            e.why
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_files_are_stripped_and_padded_like_magika() {
        // magika left-strips the head and right-strips the tail, independently.
        let f = features(b"  \n#!/bin/sh\necho hi\n\n");
        assert_eq!(f.len(), 2048);
        let head: Vec<i32> = b"#!/bin/sh\necho hi\n\n"
            .iter()
            .map(|&b| b as i32)
            .collect();
        assert_eq!(&f[..head.len()], head.as_slice());
        assert!(f[head.len()..1024].iter().all(|&x| x == PAD));
        let tail: Vec<i32> = b"  \n#!/bin/sh\necho hi"
            .iter()
            .map(|&b| b as i32)
            .collect();
        assert_eq!(&f[2048 - tail.len()..], tail.as_slice());
        assert!(f[1024..2048 - tail.len()].iter().all(|&x| x == PAD));
    }

    #[test]
    fn long_files_use_the_first_and_last_kib() {
        let bytes: Vec<u8> = (0..10_000u32).map(|i| b'a' + (i % 26) as u8).collect();
        let f = features(&bytes);
        assert_eq!(f[0], b'a' as i32);
        assert_eq!(f[2047], *bytes.last().unwrap() as i32);
        assert!(f.iter().all(|&x| x != PAD));
    }
}
