//! The rows of a model's round interleave their timed runs slice by slice (`run
//! --slice-secs`): each row (onnxruntime's driver, tract, tandem's `tandem-bench row`) loads
//! its model and makes its first run, then waits; the suite gives every row a slice of timed
//! runs in turn until each has met its rule, then lets each finish (outputs, profiles,
//! reports) one at a time. So the rows of a round sample the host over the same seconds: on a
//! shared 2-vCPU VM whose speed swings within a second (another tenant on the cores), rows
//! run one after the other each drew their own seconds (docs/bench.md, "Rows in slices").
//!
//! A child speaks a line protocol on its stdin and stdout: it prints `ready[ PAYLOAD]` when
//! its cold start is done, runs one slice per `go` line it reads and answers `slice N` (N its
//! timed runs so far) or `done N` once its rule is met, then waits for `finish`, after which
//! it prints its result and exits. It may print `runs N` progress lines inside a slice.
//!
//! Sits between `run.rs` (the round), the rows' runners (`peers::ort`, `peers::tract`,
//! `tandem_process`) and the children's side of the protocol ([`child_slices`]).

use crate::models::stderr_tail;
use crate::schema::Row;
use crate::stats::Timed;
use std::io::{BufRead, BufReader, Lines, Read, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::thread::JoinHandle;
use std::time::Duration;

/// A row that makes its timed runs in slices, one each time it is asked.
pub trait Slices {
    /// One slice of timed runs; `Ok(true)` once the row's rule is met.
    fn next_slice(&mut self) -> Result<bool, String>;

    /// The process whose threads run the row's work: a child's id, or this process's
    /// (in-process rows); `None` for a row that runs nothing.
    fn process(&self) -> Option<u32>;
}

/// A row of a round (onnxruntime's driver, tract, a tandem child): started, its cold start
/// done; it makes its slices, then finishes into its row.
pub trait RoundRow: Slices {
    /// The row, with the failure `err` of its slices where there was one.
    fn finish(self: Box<Self>, err: Result<(), String>) -> Row;
}

/// A row that failed before its slices (at its start): it makes none and finishes as it is.
pub struct Failed(pub Row);

impl Slices for Failed {
    fn next_slice(&mut self) -> Result<bool, String> {
        Ok(true)
    }

    fn process(&self) -> Option<u32> {
        None
    }
}

impl RoundRow for Failed {
    fn finish(self: Box<Self>, _: Result<(), String>) -> Row {
        self.0
    }
}

/// Asks each of `rows` for a slice in order, again and again, until every one is done or has
/// failed; a row that fails leaves the rotation with its error, returned in its place. After
/// each slice the next waits until the row's threads are idle ([`wait_until_idle`]).
pub fn interleave(rows: &mut [&mut dyn Slices]) -> Vec<Result<(), String>> {
    let mut state: Vec<Option<Result<(), String>>> = rows.iter().map(|_| None).collect();
    while state.iter().any(Option::is_none) {
        for (row, s) in rows.iter_mut().zip(&mut state) {
            if s.is_none() {
                match row.next_slice() {
                    Ok(false) => {}
                    Ok(true) => *s = Some(Ok(())),
                    Err(e) => *s = Some(Err(e)),
                }
                if let Some(pid) = row.process() {
                    wait_until_idle(pid);
                }
            }
        }
    }
    state.into_iter().flatten().collect()
}

/// Polls of a process's threads, this far apart, that must all find none running before it
/// counts as idle.
const IDLE_POLL: Duration = Duration::from_millis(1);
const IDLE_POLLS: usize = 3;
/// The longest wait for a process to go idle.
const IDLE_WAIT_MAX: Duration = Duration::from_millis(300);

/// Waits until no thread of process `pid` (other than the calling thread) is running, in
/// `IDLE_POLLS` polls in a row, at most `IDLE_WAIT_MAX`. A runtime's pool keeps its workers
/// spinning a while after its last run (onnxruntime's: 30-35 ms of CPU in the 40 ms after a
/// slice of resnet50 on a 2-vCPU Zen 4), which would take the cores from the next row's runs.
/// Where /proc cannot be read, waits the polls' time.
pub fn wait_until_idle(pid: u32) {
    let start = std::time::Instant::now();
    let mut quiet = 0;
    while quiet < IDLE_POLLS && start.elapsed() < IDLE_WAIT_MAX {
        std::thread::sleep(IDLE_POLL);
        quiet = match running_threads(pid) {
            Some(0) | None => quiet + 1,
            Some(_) => 0,
        };
    }
}

/// How many threads of process `pid` are running or runnable (state `R` in
/// `/proc/PID/task/*/stat`), the calling thread left out; `None` where that cannot be read.
/// (Their CPU time would not do: a running thread's is brought up to date only at the
/// scheduler's ticks, 4 ms apart here.)
fn running_threads(pid: u32) -> Option<usize> {
    let me = std::fs::read_link("/proc/thread-self")
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_owned()));
    let mut running = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let task = task.ok()?;
        if pid == std::process::id() && Some(task.file_name()) == me {
            continue;
        }
        // `pid (comm) S ...`: the state follows the last `)`. A thread that ended since the
        // listing is not counted.
        if let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) {
            if stat
                .rsplit(')')
                .next()
                .map(str::trim_start)
                .is_some_and(|r| r.starts_with('R'))
            {
                running += 1;
            }
        }
    }
    Some(running)
}

/// A slice's length from `--slice-secs`: `None` (the whole rule) for 0.
pub fn slice_of(slice_secs: f64) -> Option<Duration> {
    (slice_secs > 0.0).then(|| Duration::from_secs_f64(slice_secs))
}

/// The line a child prints when its cold start is done.
const READY: &str = "ready";
/// The line that gives a child its slice.
const GO: &str = "go";
/// A child's answer after a slice, before its rule is met.
const SLICE: &str = "slice ";
/// A child's answer after the slice that met its rule.
const DONE: &str = "done ";
/// The line that lets a child finish.
const FINISH: &str = "finish";
/// How an error names a child that closed its stdout (it is exiting: waited for, not killed).
const ENDED: &str = "ended";
/// A progress line inside a slice: the timed runs so far.
pub const RUNS: &str = "runs ";

/// A child process making its slices: started, then at `ready`.
pub struct ChildSlices {
    name: String,
    child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
    stderr: Option<JoinHandle<String>>,
    tick: Box<dyn FnMut(usize)>,
}

impl ChildSlices {
    /// Starts `cmd` (named `name` in errors) and waits for its `ready` line; returns it with
    /// what followed `ready` on that line. `tick` gets its `runs N` and slice counts.
    pub fn start(
        name: &str,
        mut cmd: Command,
        tick: Box<dyn FnMut(usize)>,
    ) -> Result<(ChildSlices, String), String> {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start {name}: {e}"))?;
        // stderr on a thread of its own, so that neither pipe fills while the other is read.
        let mut stderr = child.stderr.take().expect("piped");
        let stderr = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = stderr.read_to_string(&mut s);
            s
        });
        let mut slices = ChildSlices {
            name: name.to_string(),
            stdin: child.stdin.take().expect("piped"),
            lines: BufReader::new(child.stdout.take().expect("piped")).lines(),
            child,
            stderr: Some(stderr),
            tick,
        };
        let ready = slices.next_answer()?;
        match ready.strip_prefix(READY) {
            Some(rest) => Ok((slices, rest.trim_start().to_string())),
            None => Err(slices.ended(&format!("said `{ready}` before `{READY}`"))),
        }
    }

    /// The child's next line that is not a progress line (those go to `tick`).
    fn next_answer(&mut self) -> Result<String, String> {
        loop {
            match self.lines.next() {
                Some(Ok(line)) => match line.strip_prefix(RUNS).map(str::parse) {
                    Some(Ok(n)) => (self.tick)(n),
                    _ => return Ok(line),
                },
                Some(Err(e)) => return Err(format!("reading {}: {e}", self.name)),
                None => return Err(self.ended(ENDED)),
            }
        }
    }

    /// The error for a child that stopped speaking the protocol: `what`, its exit status and
    /// the last of its stderr. One that still runs (it said something else) is killed, and its
    /// stderr left unread: a process it started may hold the pipe open.
    fn ended(&mut self, what: &str) -> String {
        let running = what != ENDED && !matches!(self.child.try_wait(), Ok(Some(_)));
        if running {
            let _ = self.child.kill();
        }
        let status = self
            .child
            .wait()
            .map_or_else(|e| e.to_string(), |s| s.to_string());
        let err = match running {
            true => String::new(),
            false => self
                .stderr
                .take()
                .and_then(|h| h.join().ok())
                .unwrap_or_default(),
        };
        format!("{} {what} ({status}): {}", self.name, stderr_tail(&err))
    }

    fn say(&mut self, line: &str) -> Result<(), String> {
        let sent = writeln!(self.stdin, "{line}").and_then(|()| self.stdin.flush());
        sent.map_err(|e| self.ended(&format!("stopped listening ({e})")))
    }

    /// Lets the child finish and returns everything it printed after (its result), once it
    /// exited successfully.
    pub fn finish(mut self) -> Result<String, String> {
        self.say(FINISH)?;
        let mut out = Vec::new();
        for line in self.lines.by_ref() {
            out.push(line.map_err(|e| format!("reading {}: {e}", self.name))?);
        }
        let status = self
            .child
            .wait()
            .map_err(|e| format!("waiting for {}: {e}", self.name))?;
        let err = self
            .stderr
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default();
        match status.success() {
            true => Ok(out.join("\n")),
            false => Err(format!(
                "{} ended ({status}) while finishing: {}",
                self.name,
                stderr_tail(&err)
            )),
        }
    }
}

impl Slices for ChildSlices {
    fn process(&self) -> Option<u32> {
        Some(self.child.id())
    }

    fn next_slice(&mut self) -> Result<bool, String> {
        self.say(GO)?;
        let answer = self.next_answer()?;
        let (done, n) = match (answer.strip_prefix(SLICE), answer.strip_prefix(DONE)) {
            (Some(n), _) => (false, n),
            (_, Some(n)) => (true, n),
            _ => return Err(self.ended(&format!("answered `{answer}` to `{GO}`"))),
        };
        if let Ok(n) = n.parse() {
            (self.tick)(n);
        }
        Ok(done)
    }
}

/// The child's side: prints `ready`, then runs one slice of `timed` per `go` read from stdin
/// (`slice` long, or the whole rule where `None`), answering each, and returns once it read
/// `finish` after its rule was met. `inputs`, `f` and `tick` as in [`Timed::slice`].
pub fn child_slices<I, E: From<String>>(
    timed: &mut Timed,
    slice: Option<Duration>,
    inputs: &mut impl FnMut() -> I,
    f: &mut impl FnMut(I) -> Result<(), E>,
    tick: &mut impl FnMut(usize),
) -> Result<(), E> {
    let mut stdout = std::io::stdout();
    let mut say = |line: String| -> Result<(), E> {
        writeln!(stdout, "{line}")
            .and_then(|()| stdout.flush())
            .map_err(|e| E::from(format!("stdout: {e}")))
    };
    say(READY.to_string())?;
    for line in std::io::stdin().lock().lines() {
        let line = line.map_err(|e| E::from(format!("stdin: {e}")))?;
        match line.trim() {
            GO => {
                let done = timed.slice(slice, inputs, f, tick)?;
                let n = timed.samples_ms.len();
                say(format!("{}{n}", if done { DONE } else { SLICE }))?;
            }
            FINISH if timed.done() => return Ok(()),
            other => return Err(E::from(format!("unexpected `{other}` on stdin"))),
        }
    }
    Err(E::from("stdin closed before `finish`".to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A row that is done after `slices` slices, or fails at slice `fails`, logging each.
    struct Fake<'a> {
        name: char,
        slices: usize,
        fails: Option<usize>,
        taken: usize,
        log: &'a std::cell::RefCell<String>,
    }

    impl Slices for Fake<'_> {
        fn process(&self) -> Option<u32> {
            None
        }

        fn next_slice(&mut self) -> Result<bool, String> {
            self.taken += 1;
            self.log.borrow_mut().push(self.name);
            if self.fails == Some(self.taken) {
                return Err(format!("{} failed", self.name));
            }
            Ok(self.taken == self.slices)
        }
    }

    /// Rows alternate slice by slice; one done or failed leaves the rotation, the rest go on.
    #[test]
    fn rows_alternate_until_each_is_done_or_failed() {
        let log = std::cell::RefCell::new(String::new());
        let fake = |name, slices, fails| Fake {
            name,
            slices,
            fails,
            taken: 0,
            log: &log,
        };
        let (mut a, mut b, mut c) = (
            fake('a', 2, None),
            fake('b', 4, None),
            fake('c', 9, Some(3)),
        );
        let got = interleave(&mut [&mut a, &mut b, &mut c]);
        assert_eq!(*log.borrow(), "abcabcbcb");
        assert_eq!(got, vec![Ok(()), Ok(()), Err("c failed".to_string())]);
    }

    /// A child that exits without `ready` fails with its status and stderr; one that says
    /// something else is stopped and named with what it said.
    #[test]
    fn a_child_that_never_gets_ready_fails_with_why() {
        let start_fails = |script: &str| {
            let mut cmd = Command::new("/bin/sh");
            cmd.args(["-c", script]);
            let started = ChildSlices::start("the child", cmd, Box::new(|_| {}));
            started.err().expect("no `ready`")
        };
        let err = start_fails("echo 'runs 2'; echo 'no model here' >&2; exit 3");
        assert!(err.contains("the child ended (exit status: 3)"), "{err}");
        assert!(err.contains("no model here"), "{err}");
        let err = start_fails("echo loading; sleep 30");
        assert!(err.contains("said `loading` before `ready`"), "{err}");
        assert!(err.contains("SIGKILL"), "{err}");
    }

    /// A child that spins shows a running thread; one that sleeps shows none, and waiting for
    /// it to go idle returns.
    #[test]
    fn a_spinning_child_runs_and_a_sleeping_one_is_idle() {
        let spin = Command::new("/bin/sh")
            .args(["-c", "while :; do :; done"])
            .spawn()
            .unwrap();
        let sleep = Command::new("sleep").arg("30").spawn().unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let spinning = (0..20).any(|_| running_threads(spin.id()).unwrap() > 0);
        let sleeping = (0..5).all(|_| running_threads(sleep.id()) == Some(0));
        wait_until_idle(sleep.id());
        for mut c in [spin, sleep] {
            let _ = c.kill();
            let _ = c.wait();
        }
        assert!(spinning, "a busy loop never showed as running");
        assert!(sleeping, "a sleeping process showed as running");
        assert_eq!(running_threads(u32::MAX), None, "no such process");
    }

    /// A shell child speaking the protocol: ready, two slices, done, finish, then its result.
    #[test]
    fn a_child_takes_slices_then_finishes_with_its_result() {
        let script = "echo 'ready {\"x\": 1}'; read a; echo 'runs 3'; echo 'slice 5'; \
                      read b; echo 'done 9'; read c; [ \"$a$b$c\" = gogofinish ] || exit 4; \
                      echo result";
        let mut cmd = Command::new("/bin/sh");
        cmd.args(["-c", script]);
        let ticks = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
        let t = ticks.clone();
        let (mut child, payload) =
            ChildSlices::start("sh", cmd, Box::new(move |n| t.borrow_mut().push(n))).unwrap();
        assert_eq!(payload, "{\"x\": 1}");
        assert_eq!(child.next_slice(), Ok(false));
        assert_eq!(child.next_slice(), Ok(true));
        assert_eq!(child.finish(), Ok("result".to_string()));
        assert_eq!(*ticks.borrow(), [3, 5, 9]);
    }
}
