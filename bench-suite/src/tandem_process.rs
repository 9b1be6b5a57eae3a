//! tandem's rows in a process of their own, one per row and round: `run` starts the hidden
//! `tandem-bench row`, which measures one (model, placement) with `tandem_row.rs` and prints
//! the row as JSON. onnxruntime's driver is a fresh process every round too, so each round
//! both sides draw the host's speed anew: on the hosts measured a process keeps the speed it
//! started at for its whole life (docs/bench.md, "The host's two speeds"; squeezenet 3.7 or
//! 4.9 ms a run, by process), and tandem measured inside the suite's own process had one draw
//! against onnxruntime's one per round. A crash in tandem now fails its row, not the run, and
//! its peak RSS is the row's own.
//!
//! The child reads its inputs and the reference outputs from .npy files named in a JSON file
//! (`Io`), reports progress as `runs N` lines on stdout and ends with `row {json}`.
//!
//! Sits between `run.rs` (rows and rounds) and `tandem_row.rs` (the measurement itself).

use crate::models::{read_npys, stderr_tail, write_npys, Named};
use crate::schema::Row;
use crate::stats::RunRule;
use crate::tandem_row::{self, Target, Variant};
use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The files a child reads: inputs and, where there is one, the reference outputs.
#[derive(Serialize, Deserialize)]
struct Io {
    inputs: Vec<(String, PathBuf)>,
    reference: Option<Vec<(String, PathBuf)>>,
}

/// The prefix of the child's last line, before the row's JSON.
const ROW: &str = "row ";
/// The prefix of a progress line, before the count of timed runs.
const RUNS: &str = "runs ";

/// A model's inputs and reference as .npy files in `work`, and the JSON file naming them that
/// each of its tandem rows' child processes reads: written once per model, before its first
/// tandem row (the reference, where onnxruntime's outputs are it, is known by then).
pub struct RowFiles(PathBuf);

impl RowFiles {
    pub fn write(
        inputs: &Named,
        reference: Option<&Named>,
        work: &Path,
    ) -> Result<RowFiles, String> {
        let io = Io {
            inputs: write_npys(inputs, &work.join("tandem_in"))?,
            reference: reference
                .map(|r| write_npys(r, &work.join("tandem_reference")))
                .transpose()?,
        };
        let io_file = work.join("tandem_io.json");
        let json = serde_json::to_vec(&io).map_err(|e| e.to_string())?;
        std::fs::write(&io_file, json).map_err(|e| format!("{}: {e}", io_file.display()))?;
        Ok(RowFiles(io_file))
    }
}

/// Measure `model` on `target` in a child process (`tandem-bench row`) reading `files` (or
/// failing with why they were not written); never panics (a failure, the child's crash
/// included, is a row with `error` set). `tick(done)` reports the child's timed runs.
pub fn bench(
    model: &Path,
    files: Result<&RowFiles, &String>,
    target: Target,
    threads: usize,
    rule: &RunRule,
    tick: &mut dyn FnMut(usize),
) -> Row {
    let placement = target.placement();
    let exe = std::env::current_exe().map_err(|e| format!("the suite's own binary: {e}"));
    match (exe, files) {
        (Ok(exe), Ok(files)) => run_child(&exe, model, files, target, threads, rule, tick),
        (Err(e), _) => Err(e),
        (_, Err(e)) => Err(e.clone()),
    }
    .unwrap_or_else(|e| Row::failed("tandem", &placement, env!("CARGO_PKG_VERSION"), e))
}

/// [`bench`] through `exe row ...`.
fn run_child(
    exe: &Path,
    model: &Path,
    files: &RowFiles,
    target: Target,
    threads: usize,
    rule: &RunRule,
    tick: &mut dyn FnMut(usize),
) -> Result<Row, String> {
    let mut cmd = Command::new(exe);
    cmd.arg("row")
        .arg(model)
        .arg("--io")
        .arg(&files.0)
        .args(["--placement", target.variant.name()])
        .args(["--suffix", target.suffix])
        .args(["--threads", &threads.to_string()])
        .args(["--iters", &rule.min_iters.to_string()])
        .args(["--secs", &rule.min_secs.to_string()])
        .args(["--max-secs", &rule.max_secs.to_string()]);
    if let Some(a) = target.adapter {
        cmd.args(["--adapter-name", &a.name, "--adapter-backend", &a.backend]);
    }
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start `tandem-bench row`: {e}"))?;
    // stderr on a thread of its own, so that neither pipe fills while the other is read.
    let mut stderr = child.stderr.take().expect("piped");
    let err_text = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let mut row = None;
    for line in BufReader::new(child.stdout.take().expect("piped")).lines() {
        let line = line.map_err(|e| format!("reading `tandem-bench row`: {e}"))?;
        if let Some(n) = line.strip_prefix(RUNS).and_then(|n| n.parse().ok()) {
            tick(n);
        } else if let Some(json) = line.strip_prefix(ROW) {
            row = Some(serde_json::from_str::<Row>(json).map_err(|e| format!("its row: {e}")));
        }
    }
    let status = child
        .wait()
        .map_err(|e| format!("waiting for `tandem-bench row`: {e}"))?;
    let err = err_text.join().unwrap_or_default();
    match row {
        Some(row) if status.success() => row,
        _ => Err(format!(
            "`tandem-bench row` ended ({status}) without a row: {}",
            stderr_tail(&err)
        )),
    }
}

/// Measure one (model, placement) of tandem and print its row as JSON (the child process
/// `run` starts for each of tandem's rows and rounds; not for direct use).
#[derive(clap::Args)]
pub struct Args {
    /// The .onnx model.
    model: PathBuf,
    /// The JSON file naming the inputs' and the reference outputs' .npy files.
    #[arg(long)]
    io: PathBuf,
    /// cpu, gpu, auto or auto-nosplit.
    #[arg(long)]
    placement: String,
    /// The row's adapter suffix (`@Gl`).
    #[arg(long, default_value = "")]
    suffix: String,
    /// The adapter to open, by name and backend (none: the one tandem picks).
    #[arg(long, requires = "adapter_backend")]
    adapter_name: Option<String>,
    #[arg(long)]
    adapter_backend: Option<String>,
    #[arg(long)]
    threads: usize,
    #[arg(long)]
    iters: usize,
    #[arg(long)]
    secs: f64,
    #[arg(long)]
    max_secs: f64,
}

/// Least time between two progress lines.
const TICK_EVERY: Duration = Duration::from_millis(100);

impl crate::Subcommand for Args {
    fn main(self) -> anyhow::Result<()> {
        let Some(variant) = Variant::parse(&self.placement) else {
            bail!("unknown placement `{}`", self.placement);
        };
        let io: Io = serde_json::from_slice(
            &std::fs::read(&self.io).with_context(|| self.io.display().to_string())?,
        )
        .with_context(|| format!("{}: not a tandem-bench row's files", self.io.display()))?;
        let inputs = read_npys(&io.inputs).map_err(anyhow::Error::msg)?;
        let reference = io
            .reference
            .as_deref()
            .map(read_npys)
            .transpose()
            .map_err(anyhow::Error::msg)?;
        let adapter = match (&self.adapter_name, &self.adapter_backend) {
            (Some(name), Some(backend)) => Some(
                tandem::gpu::list_adapters()
                    .into_iter()
                    .map(|(d, _, _)| d)
                    .find(|d| &d.name == name && &d.backend == backend)
                    .with_context(|| format!("no adapter `{name}` on {backend}"))?,
            ),
            _ => None,
        };
        let target = Target {
            variant,
            adapter: adapter.as_ref(),
            suffix: &self.suffix,
        };
        let rule = RunRule {
            min_iters: self.iters,
            min_secs: self.secs,
            max_secs: self.max_secs,
        };
        let mut last = Instant::now();
        let mut tick = |n: usize| {
            if last.elapsed() >= TICK_EVERY {
                println!("{RUNS}{n}");
                last = Instant::now();
            }
        };
        let row = tandem_row::bench(
            &self.model,
            &inputs,
            reference.as_ref(),
            target,
            self.threads,
            &rule,
            &mut tick,
        );
        println!("{ROW}{}", serde_json::to_string(&row)?);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A child that dies without printing its row (here a shell that cannot open the script
    /// `row`) fails the row with its exit status and the last of its stderr; the inputs and
    /// reference it would have read are on disk, named in the io file.
    #[test]
    fn a_child_that_dies_without_its_row_fails_the_row_with_why() {
        let work = std::env::temp_dir().join(format!("tandem-process-{}", std::process::id()));
        let inputs = vec![("x".to_string(), tandem::Tensor::f32(&[2], vec![1.0, 2.0]))];
        let target = Target {
            variant: Variant::Cpu,
            adapter: None,
            suffix: "",
        };
        let rule = RunRule {
            min_iters: 1,
            min_secs: 0.0,
            max_secs: 1.0,
        };
        let files = RowFiles::write(&inputs, Some(&inputs), &work).unwrap();
        let model = Path::new("model.onnx");
        let got = run_child(
            Path::new("/bin/sh"),
            model,
            &files,
            target,
            1,
            &rule,
            &mut |_| {},
        );
        let err = got.expect_err("no row from the shell");
        assert!(
            err.contains("without a row") && err.contains("exit status"),
            "{err}"
        );
        assert!(
            err.contains("cannot open row"),
            "the shell's complaint: {err}"
        );
        let io: Io =
            serde_json::from_slice(&std::fs::read(work.join("tandem_io.json")).unwrap()).unwrap();
        assert_eq!(read_npys(&io.inputs).unwrap()[0].1, inputs[0].1);
        assert_eq!(read_npys(&io.reference.unwrap()).unwrap()[0].0, "x");
        let _ = std::fs::remove_dir_all(&work);
    }
}
