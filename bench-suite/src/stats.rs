//! Latency statistics and the measurement rule every row (tandem or peer) is timed with.
//!
//! Sits between a closure that runs a model once and the report: MLPerf SingleStream style, a
//! row runs until it has at least `min_iters` iterations AND at least `min_secs` seconds, and
//! stops early only at the hard cap `max_secs` (then `capped` says so).

use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

/// When a timed loop stops.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RunRule {
    /// At least this many timed iterations...
    pub min_iters: usize,
    /// ...and at least this long (seconds)...
    pub min_secs: f64,
    /// ...unless this hard cap (seconds) is reached first, after at least one iteration.
    pub max_secs: f64,
}

impl RunRule {
    /// This rule with a lower hard cap (slow devices: lavapipe runs of big models).
    pub fn capped(self, max_secs: f64) -> RunRule {
        RunRule {
            max_secs: self.max_secs.min(max_secs),
            ..self
        }
    }

    /// One round's share of this rule when a row runs in `rounds` turns (at least one
    /// iteration each): iterations, seconds and the cap divided among them.
    pub fn share(self, rounds: usize) -> RunRule {
        let n = rounds.max(1);
        RunRule {
            min_iters: self.min_iters.div_ceil(n).max(1),
            min_secs: self.min_secs / n as f64,
            max_secs: self.max_secs / n as f64,
        }
    }

    /// True when a loop under this rule that stopped after `iters` iterations stopped at the
    /// hard cap: before `min_iters`, or before `min_secs` where the cap comes first. Once
    /// `min_iters` are done, a loop stops at `min_secs` or at a cap no sooner, either way with
    /// both minimums met: the count alone tells. The samples' sum cannot: it leaves out the
    /// untimed work between runs (preparing inputs), so a row that ran its whole `min_secs`
    /// looked capped whenever that work outweighed the last run's overshoot.
    pub fn stopped_by_cap(&self, iters: usize) -> bool {
        iters < self.min_iters || self.max_secs < self.min_secs
    }

    /// True when a loop that has done `iters` iterations in `elapsed` should stop.
    pub fn done(&self, iters: usize, elapsed: Duration) -> bool {
        let s = elapsed.as_secs_f64();
        (iters >= self.min_iters && s >= self.min_secs) || (iters >= 1 && s >= self.max_secs)
    }
}

/// Run `f` under `rule` (no warm-up here: the caller's first run is the cold one) and return
/// the per-iteration times in ms. Each iteration's argument comes from `inputs`, untimed: every
/// runtime gets its inputs ready to consume before its clock starts, as the onnxruntime
/// driver's numpy feeds are. `tick` is called after every iteration (progress bars).
pub fn measure<I, E>(
    rule: &RunRule,
    mut inputs: impl FnMut() -> I,
    mut f: impl FnMut(I) -> Result<(), E>,
    mut tick: impl FnMut(usize),
) -> Result<Vec<f64>, E> {
    let mut timed = Timed::new(*rule);
    timed.slice(None, &mut inputs, &mut f, &mut tick)?;
    Ok(timed.samples_ms)
}

/// How every row of a run is timed, besides its rule.
#[derive(Debug, Clone, Copy)]
pub struct Method {
    /// CPU threads of tandem and of every CPU peer.
    pub threads: usize,
    /// The length of the slices in which a round's rows interleave their timed runs (`None`:
    /// each row runs its share at once).
    pub slice: Option<Duration>,
    /// The runs after a pause each row makes once its timed runs are done.
    pub pause: Pause,
    /// tandem's kernel threads and onnxruntime's pool workers pinned one to a CPU.
    pub pin_threads: bool,
}

impl Method {
    /// How a run's rows are timed, as its report's configuration records it.
    pub fn of(config: &crate::schema::Config) -> Method {
        Method {
            threads: config.threads,
            slice: crate::interleave::slice_of(config.slice_secs),
            pause: config.pause.unwrap_or(Pause { ms: 0.0, runs: 0 }),
            pin_threads: config.pin_threads,
        }
    }
}

/// Runs after a pause: each of `runs` runs made after `ms` milliseconds of sleep, the latency
/// of a model run now and then (an application classifying a file, a frame a second) rather
/// than back to back. Where the OS lets idle CPUs sleep or packs woken threads onto busy ones
/// (this host: docs/bench.md, "A run after a pause"), such runs are slower than steady ones.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Pause {
    pub ms: f64,
    pub runs: usize,
}

impl Pause {
    /// Whether any run after a pause is asked for.
    pub fn is_on(&self) -> bool {
        self.runs > 0
    }

    /// `f` run [`Pause::runs`] times, each after the pause; its times in ms. Inputs as in
    /// [`measure`], made before the pause.
    pub fn measure<I, E>(
        &self,
        mut inputs: impl FnMut() -> I,
        mut f: impl FnMut(I) -> Result<(), E>,
    ) -> Result<Vec<f64>, E> {
        let pause = Duration::from_secs_f64(self.ms.max(0.0) / 1e3);
        let mut samples = Vec::with_capacity(self.runs);
        for _ in 0..self.runs {
            let args = inputs();
            std::thread::sleep(pause);
            let t = Instant::now();
            f(args)?;
            samples.push(t.elapsed().as_secs_f64() * 1e3);
        }
        Ok(samples)
    }
}

/// A row's timed runs under its rule, made in slices (`run --slice-secs`: the rows of a round
/// interleave their timed runs slice by slice). The rule counts the row's own time, the sum
/// of its slices, not the time it waited while the other rows ran theirs.
#[derive(Debug, Clone)]
pub struct Timed {
    rule: RunRule,
    /// The row's own time so far: every slice's wall time (runs and the untimed input
    /// preparation between them).
    spent: Duration,
    pub samples_ms: Vec<f64>,
}

impl Timed {
    pub fn new(rule: RunRule) -> Timed {
        Timed {
            rule,
            spent: Duration::ZERO,
            samples_ms: Vec::new(),
        }
    }

    /// The rule the runs are made under.
    pub fn rule(&self) -> RunRule {
        self.rule
    }

    /// True once the rule is met (or its cap reached).
    pub fn done(&self) -> bool {
        self.rule.done(self.samples_ms.len(), self.spent)
    }

    /// Runs until the rule is met, or, with `slice`, until this slice took that long (at least
    /// one run); true when the rule is met. `inputs`, `f` and `tick` as in [`measure`], `tick`
    /// with the row's runs so far.
    pub fn slice<I, E>(
        &mut self,
        slice: Option<Duration>,
        inputs: &mut impl FnMut() -> I,
        f: &mut impl FnMut(I) -> Result<(), E>,
        tick: &mut impl FnMut(usize),
    ) -> Result<bool, E> {
        let (start, before) = (Instant::now(), self.spent);
        while !self.done() {
            let args = inputs();
            let t = Instant::now();
            f(args)?;
            self.samples_ms.push(t.elapsed().as_secs_f64() * 1e3);
            self.spent = before + start.elapsed();
            tick(self.samples_ms.len());
            if slice.is_some_and(|s| start.elapsed() >= s) {
                break;
            }
        }
        Ok(self.done())
    }
}

/// Summary of one row's steady-state latencies (milliseconds).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    pub iterations: usize,
    /// Sum of the samples, seconds.
    pub wall_s: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub mean_ms: f64,
    pub min_ms: f64,
    pub max_ms: f64,
    /// True when the hard cap stopped the loop before `min_iters` or `min_secs`.
    pub capped: bool,
    /// Every sample, in run order (the HTML report plots their distribution).
    pub samples_ms: Vec<f64>,
    /// Each round's own median (`run --rounds`), in round order: one entry for a row measured
    /// in one turn. The summary's ratios pair two rows' rounds ([`Latency::paired_ratios`]).
    /// Reports from before it existed read as empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub round_p50_ms: Vec<f64>,
}

/// The `q`-quantile (0..=1) of sorted `v` by the nearest-rank method; NaN when empty.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The geometric mean of `v` (positive values); NaN when empty.
pub fn geomean(v: &[f64]) -> f64 {
    (v.iter().map(|x| x.ln()).sum::<f64>() / v.len() as f64).exp()
}

impl Latency {
    /// Statistics of `samples_ms`; `rule` tells whether the loop was capped.
    pub fn from_samples(samples_ms: Vec<f64>, rule: &RunRule) -> Latency {
        let mut sorted = samples_ms.clone();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        let sum: f64 = sorted.iter().sum();
        Latency {
            iterations: n,
            wall_s: sum / 1e3,
            p50_ms: percentile(&sorted, 0.50),
            p90_ms: percentile(&sorted, 0.90),
            p99_ms: percentile(&sorted, 0.99),
            mean_ms: if n == 0 { f64::NAN } else { sum / n as f64 },
            min_ms: sorted.first().copied().unwrap_or(f64::NAN),
            max_ms: sorted.last().copied().unwrap_or(f64::NAN),
            capped: rule.stopped_by_cap(n),
            samples_ms,
            round_p50_ms: vec![percentile(&sorted, 0.50)],
        }
    }

    /// The row's headline latency: the median of its fastest round. Each round is a fresh
    /// process, and the 2-vCPU hosts measured give a process one of two speeds for its life
    /// (up to 2x apart, docs/bench.md "The host's two speeds"), so a row's rounds are draws
    /// of the host as much as runs of the runtime. Its fastest round is its speed on the host
    /// undisturbed, and two rows' fastest rounds compare the runtimes rather than the draws:
    /// resnet50's tandem rounds of 38.0, 55.0, 38.6 and 64.4 ms (two slow draws) against
    /// onnxruntime's 38.8-40.7 read 1.21x as the geometric mean of the rounds, 0.98x this way.
    /// That quotient lies within the paired rounds' ratios ([`Latency::paired_ratios`]), which
    /// the summary prints beside it. A round's share of the rule is seconds as well as runs, so
    /// each round counts once however many samples it took. A row of one round (or from a
    /// report before rounds): its median.
    pub fn center_ms(&self) -> f64 {
        match self.round_p50_ms.len() {
            0 => self.p50_ms,
            _ => self
                .round_p50_ms
                .iter()
                .copied()
                .fold(f64::INFINITY, f64::min),
        }
    }

    /// `self / other` per round, round i of each taken together (the rows of a round
    /// interleave their timed runs, so round i of each ran over the same seconds);
    /// empty unless both have the same number of rounds, at least two.
    pub fn paired_ratios(&self, other: &Latency) -> Vec<f64> {
        let (a, b) = (&self.round_p50_ms, &other.round_p50_ms);
        if a.len() < 2 || a.len() != b.len() {
            return Vec::new();
        }
        a.iter().zip(b).map(|(x, y)| x / y).collect()
    }

    /// Inferences per second at the mean latency (one stream).
    pub fn throughput(&self) -> f64 {
        1e3 / self.mean_ms
    }

    /// The noise measure the compare rule uses: p90 - p50.
    pub fn spread_ms(&self) -> f64 {
        self.p90_ms - self.p50_ms
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles_match_hand_values() {
        let v: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.5), 5.0);
        assert_eq!(percentile(&v, 0.9), 9.0);
        assert_eq!(percentile(&v, 0.99), 10.0);
        assert_eq!(percentile(&v, 0.0), 1.0);
        assert!(percentile(&[], 0.5).is_nan());
    }

    /// Each run after a pause comes after its sleep, and only the run is timed.
    #[test]
    fn runs_after_a_pause_wait_before_each_and_time_the_run_alone() {
        let pause = Pause { ms: 20.0, runs: 3 };
        let start = Instant::now();
        let mut calls = 0;
        let samples = pause
            .measure(
                || (),
                |()| {
                    calls += 1;
                    std::thread::sleep(Duration::from_millis(2));
                    Ok::<(), ()>(())
                },
            )
            .unwrap();
        assert_eq!((calls, samples.len()), (3, 3));
        assert!(
            start.elapsed() >= Duration::from_millis(66),
            "three pauses and runs"
        );
        assert!(
            samples.iter().all(|&ms| (2.0..20.0).contains(&ms)),
            "{samples:?}"
        );
        assert!(Pause { ms: 50.0, runs: 0 }
            .measure(|| (), |()| Err::<(), ()>(()))
            .unwrap()
            .is_empty());
    }

    /// Slices of no length run one run each, the rule counting runs over all of them; the
    /// time between slices (the other rows' slices) is not the row's: 2 ms runs with 100 ms
    /// waits between them do not meet 0.2 s of the row's own time after three slices.
    #[test]
    fn slices_pool_runs_and_count_only_their_own_time() {
        let rule = RunRule {
            min_iters: 3,
            min_secs: 0.0,
            max_secs: 10.0,
        };
        let mut timed = Timed::new(rule);
        let mut ticks = Vec::new();
        let mut run = |_: ()| Ok::<(), ()>(());
        for want in [false, false, true] {
            let done = timed.slice(Some(Duration::ZERO), &mut || (), &mut run, &mut |n| {
                ticks.push(n)
            });
            assert_eq!(done, Ok(want));
        }
        assert_eq!(ticks, [1, 2, 3]);
        assert_eq!(timed.samples_ms.len(), 3);
        // A met rule runs nothing more.
        assert_eq!(
            timed.slice(None, &mut || (), &mut run, &mut |_| {}),
            Ok(true)
        );
        assert_eq!(timed.samples_ms.len(), 3);

        let rule = RunRule {
            min_iters: 1,
            min_secs: 0.2,
            max_secs: 10.0,
        };
        let mut timed = Timed::new(rule);
        let mut run = |_: ()| {
            std::thread::sleep(Duration::from_millis(2));
            Ok::<(), ()>(())
        };
        for _ in 0..3 {
            let done = timed.slice(Some(Duration::ZERO), &mut || (), &mut run, &mut |_| {});
            assert_eq!(done, Ok(false), "after {} runs", timed.samples_ms.len());
            std::thread::sleep(Duration::from_millis(100));
        }
        assert_eq!(timed.samples_ms.len(), 3);
        // Unsliced, it runs until its own 0.2 s are spent.
        assert_eq!(
            timed.slice(None, &mut || (), &mut run, &mut |_| {}),
            Ok(true)
        );
        assert!(timed.samples_ms.iter().sum::<f64>() >= 190.0);
    }

    #[test]
    fn summary_of_unsorted_samples() {
        let rule = RunRule {
            min_iters: 4,
            min_secs: 0.0,
            max_secs: 1.0,
        };
        let l = Latency::from_samples(vec![4.0, 1.0, 3.0, 2.0], &rule);
        assert_eq!(
            (l.min_ms, l.max_ms, l.p50_ms, l.mean_ms),
            (1.0, 4.0, 2.0, 2.5)
        );
        assert_eq!(l.samples_ms, vec![4.0, 1.0, 3.0, 2.0]);
        assert!(!l.capped);
        assert!(Latency::from_samples(vec![1.0], &rule).capped);
    }

    #[test]
    fn capped_means_the_cap_stopped_the_loop_not_a_short_sum() {
        // 200 runs of 2 ms under a rule of 10 runs and 0.5 s: the loop ran its 0.5 s, a
        // fifth of it preparing inputs between runs, so the timed sum (0.4 s) falls short of
        // the seconds without any cap.
        let rule = RunRule {
            min_iters: 10,
            min_secs: 0.5,
            max_secs: 30.0,
        };
        assert!(!Latency::from_samples(vec![2.0; 200], &rule).capped);
        assert!(!Latency::from_samples(vec![1.0; 10], &rule).capped);
        assert!(Latency::from_samples(vec![4.0; 9], &rule).capped);
        // A cap below the seconds wanted stops every loop short of them.
        let short = RunRule {
            max_secs: 0.2,
            ..rule
        };
        assert!(Latency::from_samples(vec![4.0; 200], &short).capped);
        // The rule's own loop agrees: one that met both minimums is not capped, one stopped
        // at the cap is.
        let ms = Duration::from_millis;
        assert!(rule.done(200, ms(500)) && !rule.stopped_by_cap(200));
        assert!(rule.done(3, ms(30_000)) && rule.stopped_by_cap(3));
    }

    #[test]
    fn the_center_is_the_fastest_rounds_median() {
        let rule = RunRule {
            min_iters: 1,
            min_secs: 0.0,
            max_secs: 1.0,
        };
        let mut l = Latency::from_samples(vec![1.0; 9], &rule);
        assert_eq!(l.center_ms(), 1.0);
        // A slow round at 4 ms beside it leaves the center at the fast one's 1 ms, and a
        // faster one at 0.5 ms takes it, whatever the samples pooled.
        l.round_p50_ms.push(4.0);
        assert_eq!(l.center_ms(), 1.0);
        l.round_p50_ms.push(0.5);
        assert_eq!(l.center_ms(), 0.5);
        l.round_p50_ms.clear();
        assert_eq!(l.center_ms(), l.p50_ms, "no rounds recorded: the median");
    }

    #[test]
    fn rule_needs_both_iterations_and_time_unless_capped() {
        let r = RunRule {
            min_iters: 10,
            min_secs: 2.0,
            max_secs: 5.0,
        };
        let s = Duration::from_secs_f64;
        assert!(!r.done(10, s(1.0)));
        assert!(!r.done(5, s(3.0)));
        assert!(r.done(10, s(2.0)));
        assert!(r.done(1, s(5.0)));
        assert!(!r.done(0, s(9.0)));
        assert_eq!(r.capped(1.0).max_secs, 1.0);
    }

    #[test]
    fn a_share_divides_the_rule_among_rounds() {
        let r = RunRule {
            min_iters: 20,
            min_secs: 2.0,
            max_secs: 60.0,
        };
        let third = r.share(3);
        assert_eq!(
            (third.min_iters, third.min_secs, third.max_secs),
            (7, 2.0 / 3.0, 20.0)
        );
        assert_eq!(r.share(1), r);
        assert_eq!(r.share(0), r);
        let one = RunRule { min_iters: 1, ..r };
        assert_eq!(one.share(5).min_iters, 1);
    }
}
