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
//! (`Io`), interleaves its timed runs with the round's other rows (`interleave.rs`: `ready`,
//! then a slice per `go`), reports progress as `runs N` lines on stdout and, told to finish,
//! ends with `row {json}`; a failed row ends it with the error on stderr.
//!
//! Sits between `run.rs` (rows and rounds) and `tandem_row.rs` (the measurement itself).

use crate::interleave::{ChildSlices, Failed, RoundRow, Slices, RUNS};
use crate::models::{read_npys, write_npys, Named};
use crate::schema::Row;
use crate::stats::{Method, Pause, RunRule};
use crate::tandem_row::{self, Target, Variant};
use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The files a child reads: inputs and, where there is one, the reference outputs.
#[derive(Serialize, Deserialize)]
struct Io {
    inputs: Vec<(String, PathBuf)>,
    reference: Option<Vec<(String, PathBuf)>>,
}

/// The prefix of the child's last line, before the row's JSON.
const ROW: &str = "row ";

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

/// A tandem row's child process at `ready`: its cold start done, its timed runs to come in
/// slices ([`crate::interleave`]).
pub struct Started {
    slices: ChildSlices,
    placement: String,
}

/// Starts the child (`tandem-bench row`) that measures `model` on `target` reading `files`,
/// under `rule` and `method`, and waits for its cold start; a failure (the child's crash
/// included) is a row with `error` set. `tick(done)` reports the child's timed runs.
pub fn start(
    model: &Path,
    files: Result<&RowFiles, &String>,
    target: Target,
    rule: &RunRule,
    method: &Method,
    tick: Box<dyn FnMut(usize)>,
) -> Box<dyn RoundRow> {
    let placement = target.placement();
    let exe = std::env::current_exe().map_err(|e| format!("the suite's own binary: {e}"));
    let started = match (exe, files) {
        (Ok(exe), Ok(files)) => {
            let cmd = command(&exe, model, files, target, rule, method);
            ChildSlices::start("`tandem-bench row`", cmd, tick).map(|(slices, _)| Started {
                slices,
                placement: placement.clone(),
            })
        }
        (Err(e), _) => Err(e),
        (_, Err(e)) => Err(e.clone()),
    };
    match started {
        Ok(s) => Box::new(s),
        Err(e) => Box::new(Failed(failed(&placement, e))),
    }
}

fn failed(placement: &str, e: String) -> Row {
    Row::failed("tandem", placement, env!("CARGO_PKG_VERSION"), e)
}

impl Slices for Started {
    fn process(&self) -> Option<u32> {
        self.slices.process()
    }

    fn next_slice(&mut self) -> Result<bool, String> {
        self.slices.next_slice()
    }
}

impl RoundRow for Started {
    fn finish(self: Box<Self>, err: Result<(), String>) -> Row {
        let Started { slices, placement } = *self;
        err.and_then(|()| slices.finish())
            .and_then(|out| {
                let json = out
                    .lines()
                    .find_map(|l| l.strip_prefix(ROW))
                    .ok_or_else(|| format!("`tandem-bench row` printed no row: {out}"))?;
                serde_json::from_str::<Row>(json).map_err(|e| format!("its row: {e}"))
            })
            .unwrap_or_else(|e| failed(&placement, e))
    }
}

/// The command line of the child.
fn command(
    exe: &Path,
    model: &Path,
    files: &RowFiles,
    target: Target,
    rule: &RunRule,
    method: &Method,
) -> Command {
    let mut cmd = Command::new(exe);
    cmd.arg("row")
        .arg(model)
        .arg("--io")
        .arg(&files.0)
        .args(["--placement", target.variant.name()])
        .args(["--suffix", target.suffix])
        .args(["--threads", &method.threads.to_string()])
        .args(["--iters", &rule.min_iters.to_string()])
        .args(["--secs", &rule.min_secs.to_string()])
        .args(["--max-secs", &rule.max_secs.to_string()])
        .args([
            "--slice-secs",
            &method.slice.map_or(0.0, |s| s.as_secs_f64()).to_string(),
        ])
        .args(["--pause-ms", &method.pause.ms.to_string()])
        .args(["--pause-runs", &method.pause.runs.to_string()]);
    if method.pin_threads {
        cmd.arg("--pin-threads");
    }
    if let Some(a) = target.adapter {
        cmd.args(["--adapter-name", &a.name, "--adapter-backend", &a.backend]);
    }
    cmd
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
    /// Seconds of timed runs per slice (0: the whole rule in one).
    #[arg(long)]
    slice_secs: f64,
    /// Runs after the timed ones, each after this many milliseconds of sleep...
    #[arg(long, default_value_t = 0.0)]
    pause_ms: f64,
    /// ...this many.
    #[arg(long, default_value_t = 0)]
    pause_runs: usize,
    /// Pin the kernel threads one to a CPU.
    #[arg(long)]
    pin_threads: bool,
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
        let method = Method {
            threads: self.threads,
            slice: crate::interleave::slice_of(self.slice_secs),
            pause: Pause {
                ms: self.pause_ms,
                runs: self.pause_runs,
            },
            pin_threads: self.pin_threads,
        };
        let row = tandem_row::bench(
            &self.model,
            &inputs,
            reference.as_ref(),
            target,
            &rule,
            &method,
            &mut tick,
        );
        // A failed row ends the child with its error on stderr, which the suite's side
        // (`ChildSlices`) reports wherever the child stopped (before `ready`, in a slice,
        // finishing).
        if let Some(e) = &row.error {
            bail!("{e}");
        }
        println!("{ROW}{}", serde_json::to_string(&row)?);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A child that dies before its cold start is done (here a shell that cannot open the
    /// script `row`) fails with its exit status and the last of its stderr; the inputs and
    /// reference it would have read are on disk, named in the io file.
    #[test]
    fn a_child_that_dies_before_ready_fails_with_why() {
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
        let method = Method {
            threads: 1,
            slice: None,
            pause: Pause { ms: 0.0, runs: 0 },
            pin_threads: false,
        };
        let cmd = command(Path::new("/bin/sh"), model, &files, target, &rule, &method);
        let err = ChildSlices::start("the child", cmd, Box::new(|_| {}))
            .err()
            .expect("no `ready` from the shell");
        assert!(
            err.contains("ended") && err.contains("exit status"),
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
