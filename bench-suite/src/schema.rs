//! The JSON report of `tandem-bench run`: a documented, versioned schema (docs/bench.md) keyed
//! by the GPU adapter (`AdapterKey`) and the CPU model, so results from different machines can
//! be pooled and compared.
//!
//! Sits between the runners (tandem and peer rows) and the writers (terminal, Markdown, HTML)
//! and `tandem-bench compare`, which reads two of these files back.

use crate::stats::{percentile, Latency, Pause, RunRule};
use serde::{Deserialize, Serialize};
use tandem::cost::keys::AdapterKey;

/// `schema` field of every report this version writes. Bump the number on any change that an
/// older reader would misread (renamed or re-meant fields); adding optional fields does not.
pub const SCHEMA: &str = "tandem-bench/1";

/// One `tandem-bench run`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    pub schema: String,
    /// Seconds since the Unix epoch when the run started.
    pub started_unix_s: u64,
    pub machine: Machine,
    pub config: Config,
    pub models: Vec<ModelResult>,
    /// CPU GEMM throughput next to the machine's f32 peak (absent with `--no-gemm`).
    pub gemm: Option<GemmResult>,
}

/// What ran the benchmark: the keys results are pooled by.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Machine {
    /// CPU model name as the OS reports it (`cpu_info::CpuInfo::model`).
    pub cpu_model: String,
    pub cores: usize,
    /// Widest SIMD the kernels use, e.g. `avx512f+fma`.
    pub simd: String,
    /// The adapter the `gpu`/`auto` rows used, `None` when none was opened.
    pub adapter: Option<AdapterKey>,
    /// Every adapter measured, `adapter` first; rows of the others have placements suffixed
    /// with the adapter's backend (`gpu@Gl`, `auto@Gl`) and name it in `adapter`.
    #[serde(default)]
    pub adapters: Vec<AdapterKey>,
    pub os: String,
    /// `git describe --always --dirty` of the tree, when available.
    pub git: Option<String>,
    /// 1-minute load average when the run started and ended: above `cores`, other processes
    /// competed with the measurement (a shared machine).
    #[serde(default)]
    pub load_average_start: Option<f64>,
    #[serde(default)]
    pub load_average_end: Option<f64>,
}

/// How the run was configured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Config {
    /// Rule of the CPU rows (tandem cpu and CPU peers).
    pub cpu_rule: RunRule,
    /// Rule of the rows that use the GPU adapter (gpu, auto), usually capped lower.
    pub gpu_rule: RunRule,
    /// CPU threads of tandem and of every CPU peer.
    pub threads: usize,
    pub quick: bool,
    /// Turns each model's rows took (`run --rounds`), each with its share of the rules;
    /// reports from before rounds existed read as 1.
    #[serde(default = "one_round")]
    pub rounds: usize,
    /// Seconds of each slice in which a round's rows interleaved their timed runs (`run
    /// --slice-secs`); 0: each row ran its share at once, as reports from before slices read.
    #[serde(default)]
    pub slice_secs: f64,
    /// Runs each row made after a pause, per round (`run --pause-ms`, `--pause-runs`); absent
    /// in reports from before them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause: Option<Pause>,
    /// Whether tandem's kernel threads and onnxruntime's pool workers were pinned one to a CPU
    /// (`run --pin-threads`).
    #[serde(default)]
    pub pin_threads: bool,
}

fn one_round() -> usize {
    1
}

/// Every row of one model.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ModelResult {
    pub name: String,
    pub path: String,
    /// Inputs as `name dtype [shape]`.
    pub inputs: Vec<String>,
    /// Where `max_abs_diff` compares to: `test_data` (onnxruntime outputs stored by
    /// scripts/fetch_models.py) or `onnxruntime` (this run's onnxruntime outputs).
    pub reference: String,
    pub rows: Vec<Row>,
    /// A cache line's round trip between two threads before each round of the model's rows,
    /// ns (`machine::core_round_trip_ns`): where a VM's vCPUs move apart (a 3x longer trip),
    /// multi-threaded rows of that round ran slower, some more than others.
    #[serde(default)]
    pub core_round_trip_ns: Vec<f64>,
}

/// One (runtime, placement) measured on one model.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Row {
    /// `tandem`, `onnxruntime`, `tract`, `burn-ndarray`, `burn-wgpu`.
    pub runtime: String,
    /// `cpu`, `gpu`, `auto` (HEFT with row splits), `auto-nosplit` (HEFT, no splits).
    pub placement: String,
    /// Name of the GPU adapter this row used, if any.
    pub adapter: Option<String>,
    /// Runtime version (crate or wheel).
    pub version: String,
    /// `None` when the row ran; else why it did not (load or run error, peer missing).
    pub error: Option<String>,
    pub cold: Option<Cold>,
    pub latency: Option<Latency>,
    /// Inferences per second at the mean latency.
    pub throughput_per_s: Option<f64>,
    /// Peak resident host memory while this row ran (VmHWM after resetting it), MiB.
    pub peak_rss_mib: Option<f64>,
    /// GPU buffer-pool bytes after the timed runs (`Gpu::pooled_bytes`), MiB.
    pub gpu_buffers_mib: Option<f64>,
    /// Max |output - reference| over every element of every output; `None` when not compared.
    pub max_abs_diff: Option<f64>,
    /// tandem only: where nodes ran, from the report of the median run.
    pub nodes: Option<NodeSummary>,
    /// tandem auto only: the plan's predicted makespan, ms (compare with `latency.p50_ms`).
    pub predicted_ms: Option<f64>,
    /// tandem auto only: what the cost model predicts after the row's runs, having learnt
    /// from them (`Session::plan_now`; the plan in use keeps its first prediction until runs
    /// miss it by half). Reports from before it existed read as `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted_now_ms: Option<f64>,
    /// tandem only: time per op type in the median run, largest first.
    pub op_times: Vec<OpTime>,
    /// tandem only: the median run's CPU / GPU / transfer timeline.
    pub timeline: Vec<Span>,
    /// Notes a reader needs (fallbacks, recalibrated cost profile, capped loop).
    pub notes: Vec<String>,
    /// Runs made after a pause ([`Pause`]), every round's pooled; absent where none were asked
    /// for or the runtime does not make them (burn).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after_pause: Option<AfterPause>,
}

/// A row's runs after a pause.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AfterPause {
    /// The sleep before each run, ms.
    pub pause_ms: f64,
    pub p50_ms: f64,
    /// Every run's time, in run order, ms.
    pub samples_ms: Vec<f64>,
}

impl AfterPause {
    /// The runs' statistics; `None` without runs.
    pub fn from_samples(pause_ms: f64, samples_ms: Vec<f64>) -> Option<AfterPause> {
        if samples_ms.is_empty() {
            return None;
        }
        let mut sorted = samples_ms.clone();
        sorted.sort_by(f64::total_cmp);
        Some(AfterPause {
            pause_ms,
            p50_ms: percentile(&sorted, 0.5),
            samples_ms,
        })
    }
}

impl Row {
    /// A row that did not run, with why.
    pub fn failed(runtime: &str, placement: &str, version: &str, why: String) -> Row {
        Row {
            runtime: runtime.into(),
            placement: placement.into(),
            adapter: None,
            version: version.into(),
            error: Some(why),
            cold: None,
            latency: None,
            throughput_per_s: None,
            peak_rss_mib: None,
            gpu_buffers_mib: None,
            max_abs_diff: None,
            nodes: None,
            predicted_ms: None,
            predicted_now_ms: None,
            op_times: Vec::new(),
            timeline: Vec::new(),
            notes: Vec::new(),
            after_pause: None,
        }
    }

    /// Fold a later round's row of the same runtime and placement into this one (`run
    /// --rounds`): the samples pooled and their statistics taken under the whole `rule`, the
    /// larger of each peak and of max |diff|, notes not yet here added. The predicted time
    /// comes from the fastest round so far, the one the headline latency is
    /// ([`Latency::center_ms`]). Where nodes ran, the per-op times and the timeline come from
    /// the round whose breakdown took least in all: they are measured on runs after the timed
    /// ones, which a host changing speed may catch in another phase (squeezenet: a fastest
    /// round of 4.74 ms a run, then reported runs whose Conv nodes alone took 7.68 ms), and a
    /// slow draw had put tandem's Conv at 4.73 ms in shufflenet's breakdown against
    /// onnxruntime's 2.49, at parity run for run. Cold start stays the first round's. A round
    /// that failed fails the row, naming the round.
    pub fn pool(&mut self, later: Row, round: usize, rule: &RunRule) {
        if self.error.is_none() {
            if let Some(e) = later.error {
                self.error = Some(format!("round {}: {e}", round + 1));
            }
        }
        let faster = match (&self.latency, &later.latency) {
            (Some(a), Some(b)) => b.center_ms() < a.center_ms(),
            _ => false,
        };
        let took = |ops: &[OpTime]| ops.iter().map(|o| o.ms).sum::<f64>();
        let quicker_breakdown = !later.op_times.is_empty()
            && (self.op_times.is_empty() || took(&later.op_times) < took(&self.op_times));
        if quicker_breakdown {
            self.op_times = later.op_times;
            self.nodes = later.nodes.or(self.nodes.take());
            self.timeline = later.timeline;
        }
        if faster {
            self.predicted_ms = later.predicted_ms.or(self.predicted_ms);
            self.predicted_now_ms = later.predicted_now_ms.or(self.predicted_now_ms);
        }
        if let (Some(a), Some(b)) = (&self.latency, later.latency) {
            let samples = a.samples_ms.iter().copied().chain(b.samples_ms).collect();
            let mut pooled = Latency::from_samples(samples, rule);
            pooled.round_p50_ms = [&a.round_p50_ms[..], &b.round_p50_ms].concat();
            // Capped where a round stopped at its share's cap.
            pooled.capped |= a.capped || b.capped;
            self.throughput_per_s = Some(pooled.throughput());
            self.latency = Some(pooled);
        }
        self.after_pause = match (self.after_pause.take(), later.after_pause) {
            (Some(a), Some(b)) => {
                AfterPause::from_samples(a.pause_ms, [a.samples_ms, b.samples_ms].concat())
            }
            (a, b) => a.or(b),
        };
        let larger = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(x), Some(y)) => Some(if y > x || y.is_nan() { y } else { x }),
            (a, b) => a.or(b),
        };
        self.peak_rss_mib = larger(self.peak_rss_mib, later.peak_rss_mib);
        self.gpu_buffers_mib = larger(self.gpu_buffers_mib, later.gpu_buffers_mib);
        self.max_abs_diff = larger(self.max_abs_diff, later.max_abs_diff);
        for n in later.notes {
            if !self.notes.contains(&n) {
                self.notes.push(n);
            }
        }
    }

    /// `runtime placement` (e.g. `tandem auto`), the row's label in tables and plots.
    pub fn label(&self) -> String {
        format!("{} {}", self.runtime, self.placement)
    }
}

/// Cold start, reported apart from steady state.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Cold {
    /// Load: parse, import, open the device (and for `auto` load or calibrate the cost
    /// model), ms.
    pub load_ms: f64,
    /// First run: planning, pipeline compilation, weight uploads, the run itself, ms.
    pub first_run_ms: f64,
    /// tandem `auto` only: the untimed runs after the first until the plan's placement held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settle: Option<Settle>,
}

/// An `auto` session's runs between its first run and its timed runs: it learns from each run
/// and re-plans after misses, and a re-plan that moves nodes to the GPU compiles their pipelines
/// in the run after it (`tandem_row::settle`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Settle {
    /// Runs until the placement held (those runs included), and their time, ms.
    pub runs: usize,
    pub ms: f64,
    /// Re-plans that moved a node meanwhile.
    pub placement_changes: usize,
    /// False when the cap came before the placement held.
    pub held: bool,
}

/// Where a run's nodes ran and their share of the summed node time.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct NodeSummary {
    pub cpu: usize,
    pub gpu: usize,
    pub split: usize,
    pub view: usize,
    pub folded: usize,
    /// Nodes not where the placement asked (each reason is in `Row::notes`).
    pub fallbacks: usize,
    pub cpu_time_share: f64,
    pub gpu_time_share: f64,
    pub split_time_share: f64,
}

/// Summed time of one op type in one run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OpTime {
    pub op: String,
    pub count: usize,
    pub ms: f64,
}

/// One interval of a run's timeline.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Span {
    /// `cpu`, `gpu` or `transfer`.
    pub lane: String,
    pub name: String,
    pub op: String,
    pub start_ms: f64,
    pub dur_ms: f64,
}

/// CPU GEMM (MatMul 1024^3 unless stated) next to the f32 peak and the other GEMMs measured in
/// the same run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GemmResult {
    /// `m x k x n`.
    pub shape: String,
    pub threads: usize,
    pub peak: Peak,
    /// GFLOP/s by implementation: `tandem MatMul` (through a session), `gemm crate`,
    /// `numpy BLAS`.
    pub gflops: Vec<(String, f64)>,
}

/// The machine's f32 peak: `cores x clock x lanes x fma_units x 2`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Peak {
    /// f32 lanes per SIMD register (16 with AVX-512).
    pub lanes: usize,
    /// Vector FMAs one core retires per cycle on `lanes`-wide vectors, measured (timed
    /// independent FMA chains over the measured clock, rounded): 1 for AVX-512 on Zen 4, 2 on
    /// Zen 5 and Intel server cores.
    pub fma_units: usize,
    pub cores: usize,
    /// Measured with a dependent add chain (1 cycle per add), GHz.
    pub clock_ghz: f64,
    /// The clock `/proc/cpuinfo` states, GHz (a cross-check).
    #[serde(default)]
    pub cpuinfo_ghz: Option<f64>,
    pub gflops: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timed(samples: Vec<f64>, rss: f64, diff: f64, note: &str) -> Row {
        let rule = RunRule {
            min_iters: 1,
            min_secs: 0.0,
            max_secs: 1.0,
        };
        let mut row = Row::failed("tandem", "cpu", "0", String::new());
        row.error = None;
        row.latency = Some(Latency::from_samples(samples, &rule));
        row.peak_rss_mib = Some(rss);
        row.max_abs_diff = Some(diff);
        row.notes.push(note.into());
        row
    }

    #[test]
    fn the_breakdown_comes_from_its_quickest_round_the_prediction_from_the_fastest() {
        let rule = RunRule {
            min_iters: 1,
            min_secs: 0.0,
            max_secs: 10.0,
        };
        let with_conv = |p50: f64, conv_ms: f64| {
            let mut r = timed(vec![p50], 50.0, 0.0, "n");
            r.op_times = vec![OpTime {
                op: "Conv".into(),
                count: 1,
                ms: conv_ms,
            }];
            r.predicted_ms = Some(conv_ms);
            r
        };
        let conv = |r: &Row| (r.op_times[0].ms, r.predicted_ms);
        let predicted = |mut r: Row, ms: f64| {
            r.predicted_ms = Some(ms);
            r
        };
        // A slow first round (5 ms), a fast second (3 ms), a middling third (4 ms).
        let mut row = with_conv(5.0, 4.5);
        row.pool(with_conv(3.0, 2.5), 1, &rule);
        assert_eq!(conv(&row), (2.5, Some(2.5)), "the faster round's");
        row.pool(with_conv(4.0, 3.5), 2, &rule);
        assert_eq!(conv(&row), (2.5, Some(2.5)), "still the fastest round's");
        assert_eq!(row.latency.as_ref().unwrap().center_ms(), 3.0);
        // A fourth round, timed slower, whose reported runs were quicker: its breakdown, the
        // fastest round's prediction.
        row.pool(predicted(with_conv(3.5, 2.0), 9.0), 3, &rule);
        assert_eq!(conv(&row), (2.0, Some(2.5)));
        // A fifth, timed fastest, whose reported runs caught a slow phase: its prediction only.
        row.pool(predicted(with_conv(2.8, 7.0), 2.8), 4, &rule);
        assert_eq!(conv(&row), (2.0, Some(2.8)));
    }

    #[test]
    fn pooled_rounds_keep_every_sample_and_the_larger_peaks() {
        let rule = RunRule {
            min_iters: 4,
            min_secs: 0.0,
            max_secs: 10.0,
        };
        let mut row = timed(vec![5.0, 1.0], 100.0, 1e-6, "a");
        row.pool(timed(vec![3.0, 4.0], 90.0, 2e-6, "b"), 1, &rule);
        let l = row.latency.as_ref().unwrap();
        assert_eq!(l.samples_ms, vec![5.0, 1.0, 3.0, 4.0]);
        assert_eq!(
            (l.min_ms, l.p50_ms, l.max_ms, l.iterations),
            (1.0, 3.0, 5.0, 4)
        );
        assert!(!l.capped, "four samples meet the whole rule's four");
        // A round stopped at its cap leaves the pooled row capped, however many samples.
        let mut short = timed(vec![2.0], 80.0, 1e-6, "c");
        short.latency.as_mut().unwrap().capped = true;
        let mut other = timed(vec![1.0; 4], 80.0, 1e-6, "d");
        other.pool(short, 1, &rule);
        assert!(other.latency.as_ref().unwrap().capped);
        assert_eq!(
            l.round_p50_ms,
            vec![1.0, 3.0],
            "each round's own median, in order"
        );
        assert_eq!(row.throughput_per_s, Some(1e3 / 3.25));
        assert_eq!(
            (row.peak_rss_mib, row.max_abs_diff),
            (Some(100.0), Some(2e-6))
        );
        assert_eq!(row.notes, vec!["a", "b"]);
        assert!(row.error.is_none());
        // Runs after a pause pool too, their median over every round's.
        let paused = |v: Vec<f64>| AfterPause::from_samples(50.0, v);
        let mut a = timed(vec![1.0], 1.0, 0.0, "a");
        a.after_pause = paused(vec![9.0, 2.0]);
        let mut b = timed(vec![1.0], 1.0, 0.0, "a");
        b.after_pause = paused(vec![3.0]);
        a.pool(b, 1, &rule);
        assert_eq!(a.after_pause, paused(vec![9.0, 2.0, 3.0]));
        assert_eq!(a.after_pause.map(|p| p.p50_ms), Some(3.0));

        let mut failed = Row::failed("tandem", "cpu", "0", "out of memory".into());
        failed.notes.push("a".into());
        row.pool(failed, 2, &rule);
        assert_eq!(row.error.as_deref(), Some("round 3: out of memory"));
        assert_eq!(row.latency.as_ref().unwrap().iterations, 4);
    }
}
