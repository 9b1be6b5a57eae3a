//! The report as tables: a summary (one line per model: tandem against each peer, ratios, cold
//! start per placement), then every row of every model. Written as aligned text for the
//! terminal or as Markdown.
//!
//! Sits between the report schema and `render::{terminal, markdown}`; the HTML page reuses the
//! cells.

use crate::schema::{Config, GemmResult, ModelResult, Report, Row};
use crate::stats::Latency;
use crate::tandem_row::SETTLED_RUNS;

/// A table: header and rows of cells.
pub struct Table {
    pub title: String,
    pub head: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

fn ms(v: Option<f64>) -> String {
    match v {
        Some(x) if x.is_finite() && x >= 100.0 => format!("{x:.0}"),
        Some(x) if x.is_finite() && x >= 10.0 => format!("{x:.1}"),
        Some(x) if x.is_finite() => format!("{x:.2}"),
        _ => "-".into(),
    }
}

/// `a / b` of two rows' centers ([`Latency::center_ms`]: each row's fastest round), then the
/// lowest and highest of their paired rounds' own ratios ([`Latency::paired_ratios`]):
/// `1.19x (1.02-1.29)`. On a host whose speed drifts between processes the range shows how
/// far one round's draw moves a ratio; the head, fastest against fastest, lies within it.
fn ratio(a: Option<&Latency>, b: Option<&Latency>) -> String {
    let (Some(a), Some(b)) = (a, b) else {
        return "-".into();
    };
    let (a_ms, b_ms) = (a.center_ms(), b.center_ms());
    if !a_ms.is_finite() || b_ms <= 0.0 {
        return "-".into();
    }
    let head = format!("{:.2}x", a_ms / b_ms);
    let rounds = a.paired_ratios(b);
    let lo = rounds.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = rounds.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    match lo.is_finite() && hi.is_finite() {
        true => format!("{head} ({lo:.2}-{hi:.2})"),
        false => head,
    }
}

/// An auto row's predicted run time, ms: the first plan's, then (where the report has it)
/// the cost model's after the row's runs, `5.72 / 3.91`.
fn predicted(x: &Row) -> String {
    match (x.predicted_ms, x.predicted_now_ms) {
        (Some(first), Some(now)) => format!("{} / {}", ms(Some(first)), ms(Some(now))),
        (first, _) => ms(first),
    }
}

fn sci(v: Option<f64>) -> String {
    v.map_or("-".into(), |x| {
        if x == 0.0 {
            "0".into()
        } else {
            format!("{x:.1e}")
        }
    })
}

/// The row of `runtime placement` in `m`, if it ran.
pub fn find<'a>(m: &'a ModelResult, runtime: &str, placement: &str) -> Option<&'a Row> {
    m.rows
        .iter()
        .find(|r| r.runtime == runtime && r.placement == placement && r.error.is_none())
}

/// Steady-state latency of `runtime placement` in `m`.
fn latency<'a>(m: &'a ModelResult, runtime: &str, placement: &str) -> Option<&'a Latency> {
    find(m, runtime, placement).and_then(|r| r.latency.as_ref())
}

/// Headline latency of `runtime placement` in `m` ([`Latency::center_ms`]), ms.
pub fn center(m: &ModelResult, runtime: &str, placement: &str) -> Option<f64> {
    latency(m, runtime, placement).map(Latency::center_ms)
}

/// Cold start (load + first run) of `runtime placement` in `m`, ms.
pub fn cold(m: &ModelResult, runtime: &str, placement: &str) -> Option<f64> {
    find(m, runtime, placement).and_then(|r| r.cold.as_ref().map(|c| c.load_ms + c.first_run_ms))
}

/// One line per model: steady-state latencies (`Latency::center_ms`), tandem/peer ratios.
pub fn summary(models: &[ModelResult]) -> Table {
    let head = [
        "model",
        "tandem cpu",
        "onnxruntime",
        "tract",
        "cpu/ORT",
        "cpu/tract",
        "burn ndarray",
        "cpu/burn-nd",
        "tandem gpu",
        "burn wgpu",
        "gpu/burn",
        "tandem auto",
        "auto-nosplit",
        "auto/cpu",
    ];
    let rows = models
        .iter()
        .map(|m| {
            let l = |runtime, placement| latency(m, runtime, placement);
            let p = |runtime, placement| ms(center(m, runtime, placement));
            let (cpu, gpu, auto) = (l("tandem", "cpu"), l("tandem", "gpu"), l("tandem", "auto"));
            vec![
                m.name.clone(),
                p("tandem", "cpu"),
                p("onnxruntime", "cpu"),
                p("tract", "cpu"),
                ratio(cpu, l("onnxruntime", "cpu")),
                ratio(cpu, l("tract", "cpu")),
                p("burn-ndarray", "cpu"),
                ratio(cpu, l("burn-ndarray", "cpu")),
                p("tandem", "gpu"),
                p("burn-wgpu", "gpu"),
                ratio(gpu, l("burn-wgpu", "gpu")),
                p("tandem", "auto"),
                p("tandem", "auto-nosplit"),
                ratio(auto, cpu),
            ]
        })
        .collect();
    Table {
        title: "Steady state: latency, ms, the median of each row's fastest round (ratios < 1 \
                mean tandem is faster; in brackets the lowest and highest of the rounds' own \
                ratios)"
            .into(),
        head: head.iter().map(|s| s.to_string()).collect(),
        rows,
    }
}

/// Cold start (load + first run, ms) per model and row.
pub fn cold_starts(r: &Report) -> Table {
    let mut labels: Vec<String> = Vec::new();
    for m in &r.models {
        for x in &m.rows {
            if !labels.contains(&x.label()) {
                labels.push(x.label());
            }
        }
    }
    let mut head = vec!["model".to_string()];
    head.extend(labels.iter().cloned());
    let rows = r
        .models
        .iter()
        .map(|m| {
            let mut cells = vec![m.name.clone()];
            for l in &labels {
                let c = m
                    .rows
                    .iter()
                    .find(|x| x.label() == *l && x.error.is_none())
                    .and_then(|x| x.cold.as_ref());
                cells.push(c.map_or("-".into(), |c| {
                    let mut cell = format!(
                        "{} ({} + {})",
                        ms(Some(c.load_ms + c.first_run_ms)),
                        ms(Some(c.load_ms)),
                        ms(Some(c.first_run_ms))
                    );
                    if let Some(s) = &c.settle {
                        cell += &format!(
                            "; settled {} in {} runs, {} moves{}",
                            ms(Some(s.ms)),
                            s.runs,
                            s.placement_changes,
                            if s.held { "" } else { " (capped)" }
                        );
                    }
                    cell
                }));
            }
            cells
        })
        .collect();
    Table {
        title: format!(
            "Cold start, ms: total (load + first run); `auto` then runs untimed until its \
             placement held for {SETTLED_RUNS} runs: that time, its runs and the re-plans that \
             moved nodes"
        ),
        head,
        rows,
    }
}

/// Runs after a pause per model and row: their median and its ratio to the row's steady
/// median; no rows where none were made.
pub fn after_pause(r: &Report) -> Table {
    let mut labels: Vec<String> = Vec::new();
    for x in r.models.iter().flat_map(|m| &m.rows) {
        if x.after_pause.is_some() && !labels.contains(&x.label()) {
            labels.push(x.label());
        }
    }
    let mut head = vec!["model".to_string()];
    head.extend(labels.iter().cloned());
    let rows = match labels.is_empty() {
        true => Vec::new(),
        false => (r.models.iter())
            .map(|m| {
                let mut cells = vec![m.name.clone()];
                for l in &labels {
                    let x = m.rows.iter().find(|x| x.label() == *l && x.error.is_none());
                    let paused =
                        x.and_then(|x| Some((x.after_pause.as_ref()?, x.latency.as_ref()?)));
                    cells.push(paused.map_or("-".into(), |(p, l)| {
                        format!("{} ({:.2}x)", ms(Some(p.p50_ms)), p.p50_ms / l.p50_ms)
                    }));
                }
                cells
            })
            .collect(),
    };
    let pause = r.config.pause.map_or(0.0, |p| p.ms);
    Table {
        title: format!(
            "After a pause, ms: the median of the runs each made after {pause} ms of sleep \
             (in brackets: over the row's steady median)"
        ),
        head,
        rows,
    }
}

/// Every row of one model.
pub fn model_rows(m: &ModelResult) -> Table {
    let head = [
        "row",
        "load",
        "1st run",
        "p50",
        "p90",
        "p99",
        "after pause",
        "runs",
        "inf/s",
        "RSS MiB",
        "GPU MiB",
        "max|diff|",
        "nodes cpu/gpu/split",
        "time cpu/gpu/split",
        "predicted first / learnt",
        "status",
    ];
    let rows = m
        .rows
        .iter()
        .map(|x| {
            let l = x.latency.as_ref();
            let n = x.nodes.as_ref();
            let mut status = x.error.clone().unwrap_or_else(|| "ok".into());
            if l.is_some_and(|l| l.capped) {
                status += " (capped)";
            }
            vec![
                x.label(),
                ms(x.cold.as_ref().map(|c| c.load_ms)),
                ms(x.cold.as_ref().map(|c| c.first_run_ms)),
                ms(l.map(|l| l.p50_ms)),
                ms(l.map(|l| l.p90_ms)),
                ms(l.map(|l| l.p99_ms)),
                ms(x.after_pause.as_ref().map(|p| p.p50_ms)),
                l.map_or("-".into(), |l| l.iterations.to_string()),
                x.throughput_per_s.map_or("-".into(), |t| format!("{t:.1}")),
                x.peak_rss_mib.map_or("-".into(), |v| format!("{v:.0}")),
                x.gpu_buffers_mib.map_or("-".into(), |v| format!("{v:.1}")),
                sci(x.max_abs_diff),
                n.map_or("-".into(), |n| format!("{}/{}/{}", n.cpu, n.gpu, n.split)),
                n.map_or("-".into(), |n| {
                    format!(
                        "{:.0}/{:.0}/{:.0}%",
                        100.0 * n.cpu_time_share,
                        100.0 * n.gpu_time_share,
                        100.0 * n.split_time_share
                    )
                }),
                predicted(x),
                status,
            ]
        })
        .collect();
    Table {
        title: format!(
            "{} (reference: {}; inputs: {}{})",
            m.name,
            m.reference,
            m.inputs.join(", "),
            round_trips(&m.core_round_trip_ns)
        ),
        head: head.iter().map(|s| s.to_string()).collect(),
        rows,
    }
}

/// Top `k` op types by time of `runtime placement` in `m`: `Op 12.3 ms (40%, 5x)`.
pub fn top_ops(m: &ModelResult, runtime: &str, placement: &str, k: usize) -> String {
    let Some(row) = find(m, runtime, placement).filter(|r| !r.op_times.is_empty()) else {
        return "-".into();
    };
    let total: f64 = row.op_times.iter().map(|o| o.ms).sum();
    row.op_times
        .iter()
        .take(k)
        .map(|o| {
            format!(
                "{} {:.2} ms ({:.0}%, {}x)",
                o.op,
                o.ms,
                100.0 * o.ms / total.max(1e-12),
                o.count
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Where tandem cpu is slower than onnxruntime: the top three op types by time of each (its
/// own op types: onnxruntime's are those its profiler names after its fusions).
pub fn misses(models: &[ModelResult]) -> Table {
    let rows = models
        .iter()
        .filter_map(|m| {
            let (c, o) = (
                center(m, "tandem", "cpu")?,
                center(m, "onnxruntime", "cpu")?,
            );
            (c > o).then(|| {
                vec![
                    m.name.clone(),
                    format!("{:.2}x", c / o),
                    top_ops(m, "tandem", "cpu", 3),
                    top_ops(m, "onnxruntime", "cpu", 3),
                ]
            })
        })
        .collect();
    Table {
        title: "Where tandem cpu misses onnxruntime: top three op types by time of each".into(),
        head: vec![
            "model".into(),
            "cpu/ORT".into(),
            "tandem cpu top ops".into(),
            "onnxruntime top ops".into(),
        ],
        rows,
    }
}

/// The GEMM comparison.
pub fn gemm(g: &GemmResult) -> Table {
    let p = &g.peak;
    let rows = g
        .gflops
        .iter()
        .map(|(name, v)| {
            vec![
                name.clone(),
                format!("{v:.1}"),
                format!("{:.0}%", 100.0 * v / p.gflops),
            ]
        })
        .collect();
    Table {
        title: format!(
            "CPU GEMM {} f32, {} threads; peak {:.0} GFLOP/s = {} cores x {:.2} GHz (measured; /proc/cpuinfo says {}) x {} lanes x {} FMA pipes (measured) x 2",
            g.shape, g.threads, p.gflops, p.cores, p.clock_ghz,
            p.cpuinfo_ghz.map_or("?".into(), |c| format!("{c:.2}")), p.lanes, p.fma_units
        ),
        head: vec!["implementation".into(), "GFLOP/s".into(), "of peak".into()],
        rows,
    }
}

/// `; core-to-core round trip 120, 410 ns` (by round), or nothing where none was measured.
fn round_trips(ns: &[f64]) -> String {
    match ns {
        [] => String::new(),
        _ => {
            let each: Vec<String> = ns.iter().map(|n| format!("{n:.0}")).collect();
            format!("; core-to-core round trip {} ns", each.join(", "))
        }
    }
}

/// Every table of the report, in reading order.
pub fn all(r: &Report) -> Vec<Table> {
    let mut t = vec![
        summary(&r.models),
        cold_starts(r),
        after_pause(r),
        misses(&r.models),
    ];
    t.extend(r.gemm.iter().map(gemm));
    t.extend(r.models.iter().map(model_rows));
    t
}

fn header(r: &Report) -> String {
    let m = &r.machine;
    format!(
        "{} | CPU {} ({} cores, {}) | GPU {} | {} threads | {}{} | tree {} | load average {} -> {}",
        r.schema,
        m.cpu_model,
        m.cores,
        m.simd,
        m.adapter.as_ref().map_or("none".into(), |a| format!(
            "{} ({}, {})",
            a.name, a.backend, a.driver_info
        )),
        r.config.threads,
        method(&r.config),
        if r.config.quick { " | quick" } else { "" },
        m.git.as_deref().unwrap_or("?"),
        m.load_average_start
            .map_or("?".into(), |l| format!("{l:.1}")),
        m.load_average_end.map_or("?".into(), |l| format!("{l:.1}")),
    )
}

/// How the rows were timed: the rules, the rounds and the slices the rows' runs interleaved in,
/// the runs after a pause, and whether threads were pinned.
pub fn method(c: &Config) -> String {
    let (cpu, gpu) = (&c.cpu_rule, &c.gpu_rule);
    let pause = match c.pause {
        Some(p) if p.is_on() => {
            format!(", then {} runs a round each after {} ms idle", p.runs, p.ms)
        }
        _ => String::new(),
    };
    let pinned = if c.pin_threads {
        ", threads pinned"
    } else {
        ""
    };
    format!(
        "rule cpu: >= {} runs and >= {} s (cap {} s), gpu: >= {} runs and >= {} s (cap {} s){}{pause}{pinned}",
        cpu.min_iters,
        cpu.min_secs,
        cpu.max_secs,
        gpu.min_iters,
        gpu.min_secs,
        gpu.max_secs,
        match (c.rounds, c.slice_secs) {
            (0 | 1, 0.0) => String::new(),
            (0 | 1, s) => format!(", runs interleaved in {s} s slices"),
            (n, 0.0) => format!(", in {n} rounds"),
            (n, s) => format!(", in {n} rounds, runs interleaved in {s} s slices"),
        },
    )
}

/// Aligned text tables.
pub fn terminal(r: &Report) -> String {
    let mut s = header(r) + "\n";
    for t in all(r) {
        if t.rows.is_empty() {
            continue;
        }
        let mut w: Vec<usize> = t.head.iter().map(|h| h.chars().count()).collect();
        for row in &t.rows {
            for (i, c) in row.iter().enumerate() {
                w[i] = w[i].max(c.chars().count().min(90));
            }
        }
        s += &format!("\n{}\n", t.title);
        let line = |cells: &[String]| {
            cells
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    let c: String = c.chars().take(90).collect();
                    if i == 0 {
                        format!("{c:<0$}", w[i])
                    } else {
                        format!("{c:>0$}", w[i])
                    }
                })
                .collect::<Vec<_>>()
                .join("  ")
        };
        s += &(line(&t.head) + "\n");
        for row in &t.rows {
            s += &(line(row) + "\n");
        }
    }
    s + &grouped_notes(&r.models)
}

/// Each distinct note of the rows once, after the rows ("model runtime placement") that carry
/// it, in the order they first appear: a note every `auto` row repeats reads once.
fn grouped_notes(models: &[ModelResult]) -> String {
    let mut groups: Vec<(Vec<String>, &str)> = Vec::new();
    for m in models {
        for x in &m.rows {
            for n in &x.notes {
                let row = format!("{} {}", m.name, x.label());
                match groups.iter_mut().find(|(_, g)| g == n) {
                    Some((rows, _)) => rows.push(row),
                    None => groups.push((vec![row], n)),
                }
            }
        }
    }
    let mut s = String::new();
    if !groups.is_empty() {
        s += "\nNotes (each once; per row in report.md)\n";
    }
    for (rows, note) in groups {
        s += &format!("- {}: {note}\n", rows.join(", "));
    }
    s
}

/// Markdown: the same tables, plus every row's notes.
pub fn markdown(r: &Report) -> String {
    let mut s = format!("# tandem-bench report\n\n{}\n", header(r));
    for t in all(r) {
        if t.rows.is_empty() {
            continue;
        }
        s += &format!(
            "\n## {}\n\n| {} |\n|{}\n",
            t.title,
            t.head.join(" | "),
            " --- |".repeat(t.head.len())
        );
        for row in &t.rows {
            let cells: Vec<String> = row.iter().map(|c| c.replace('|', "\\|")).collect();
            s += &format!("| {} |\n", cells.join(" | "));
        }
    }
    s += "\n## Notes\n\n";
    for m in &r.models {
        for x in &m.rows {
            for n in &x.notes {
                s += &format!("- {} {}: {}\n", m.name, x.label(), n.replace('|', "\\|"));
            }
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::{OpTime, SCHEMA};
    use crate::stats::{Latency, RunRule};

    /// The method line names the rounds and the slices the rows' runs interleaved in, where
    /// there were any; the terminal, Markdown and HTML reports all print it.
    #[test]
    fn the_method_says_how_rows_were_interleaved() {
        let rule = RunRule {
            min_iters: 20,
            min_secs: 2.0,
            max_secs: 10.0,
        };
        let config = |rounds, slice_secs| Config {
            cpu_rule: rule,
            gpu_rule: rule,
            threads: 2,
            quick: false,
            rounds,
            slice_secs,
            pause: None,
            pin_threads: false,
        };
        let sliced = method(&config(3, 0.1));
        assert!(
            sliced.starts_with("rule cpu: >= 20 runs and >= 2 s (cap 10 s)"),
            "{sliced}"
        );
        assert!(
            sliced.ends_with(", in 3 rounds, runs interleaved in 0.1 s slices"),
            "{sliced}"
        );
        assert!(method(&config(3, 0.0)).ends_with("(cap 10 s), in 3 rounds"));
        assert!(method(&config(1, 0.0)).ends_with("(cap 10 s)"));
        let paused = Config {
            pause: Some(crate::stats::Pause { ms: 50.0, runs: 5 }),
            pin_threads: true,
            ..config(1, 0.0)
        };
        assert!(
            method(&paused)
                .ends_with("(cap 10 s), then 5 runs a round each after 50 ms idle, threads pinned"),
            "{}",
            method(&paused)
        );
    }

    /// The table of runs after a pause gives each row's median and its ratio to the steady
    /// median, and is empty where no row made any.
    #[test]
    fn runs_after_a_pause_read_against_the_steady_median() {
        let mut tandem = row("tandem", 4.0, &[]);
        tandem.after_pause = crate::schema::AfterPause::from_samples(50.0, vec![9.0, 6.0, 7.0]);
        let ort = row("onnxruntime", 5.0, &[]);
        let mut report = Report {
            schema: SCHEMA.into(),
            started_unix_s: 0,
            machine: crate::machine::describe(Vec::new()),
            config: Config {
                cpu_rule: RunRule {
                    min_iters: 1,
                    min_secs: 0.0,
                    max_secs: 1.0,
                },
                gpu_rule: RunRule {
                    min_iters: 1,
                    min_secs: 0.0,
                    max_secs: 1.0,
                },
                threads: 2,
                quick: true,
                rounds: 1,
                slice_secs: 0.0,
                pause: Some(crate::stats::Pause { ms: 50.0, runs: 3 }),
                pin_threads: false,
            },
            models: vec![model("m", vec![tandem, ort])],
            gemm: None,
        };
        let t = after_pause(&report);
        assert_eq!(t.head, ["model", "tandem cpu"]);
        assert_eq!(t.rows, [["m", "7.00 (1.75x)"]]);
        report.models[0].rows[0].after_pause = None;
        assert!(after_pause(&report).rows.is_empty());
    }

    fn row(runtime: &str, p50: f64, ops: &[(&str, usize, f64)]) -> Row {
        let mut r = Row::failed(runtime, "cpu", "v", String::new());
        r.error = None;
        let rule = RunRule {
            min_iters: 1,
            min_secs: 0.0,
            max_secs: 1.0,
        };
        r.latency = Some(Latency::from_samples(vec![p50; 3], &rule));
        r.op_times = (ops.iter())
            .map(|&(op, count, ms)| OpTime {
                op: op.into(),
                count,
                ms,
            })
            .collect();
        r
    }

    fn model(name: &str, rows: Vec<Row>) -> ModelResult {
        ModelResult {
            core_round_trip_ns: Vec::new(),
            name: name.into(),
            path: String::new(),
            inputs: Vec::new(),
            reference: "test_data".into(),
            rows,
        }
    }

    /// A row measured in rounds of the given own medians (each round three equal samples).
    fn rounds(runtime: &str, medians: &[f64]) -> Row {
        let rule = RunRule {
            min_iters: 1,
            min_secs: 0.0,
            max_secs: 1.0,
        };
        let mut r = row(runtime, medians[0], &[]);
        for (i, &p50) in medians.iter().enumerate().skip(1) {
            r.pool(row(runtime, p50, &[]), i, &rule);
        }
        r
    }

    #[test]
    fn each_note_reads_once_after_the_rows_that_carry_it() {
        let noted = |notes: &[&str]| {
            let mut r = row("tandem", 1.0, &[]);
            r.notes = notes.iter().map(|n| n.to_string()).collect();
            r
        };
        let models = vec![
            model("a", vec![noted(&["no splits", "cost profile: calibrated"])]),
            model("b", vec![noted(&["no splits"]), noted(&[])]),
        ];
        let text = grouped_notes(&models);
        let notes = text.split("Notes").nth(1).expect("a notes section");
        assert_eq!(notes.matches("no splits").count(), 1, "{text}");
        assert!(
            notes.contains("- a tandem cpu, b tandem cpu: no splits"),
            "{text}"
        );
        assert!(
            notes.contains("- a tandem cpu: cost profile: calibrated"),
            "{text}"
        );
    }

    /// A model's section names the round trip measured before each of its rounds.
    #[test]
    fn a_model_section_names_each_rounds_core_round_trip() {
        let mut m = model("m", vec![row("tandem", 1.0, &[])]);
        assert!(!model_rows(&m).title.contains("round trip"));
        m.core_round_trip_ns = vec![118.4, 407.0];
        let title = model_rows(&m).title;
        assert!(
            title.ends_with("; core-to-core round trip 118, 407 ns)"),
            "{title}"
        );
    }

    #[test]
    fn summary_ratios_give_the_range_of_the_rounds_own_ratios() {
        let m = model(
            "m",
            vec![
                rounds("tandem", &[4.0, 6.0, 5.0]),
                rounds("onnxruntime", &[4.0, 4.0, 5.0]),
                rounds("tract", &[8.0, 8.0]),
            ],
        );
        let t = summary(&[m]);
        let cell = |name: &str| t.rows[0][t.head.iter().position(|h| h == name).unwrap()].clone();
        // Fastest rounds 4.0 and 4.0; the rounds' own ratios 1.00, 1.50, 1.00 (the pooled
        // medians' 5 / 4 would read 1.25x).
        assert_eq!(cell("cpu/ORT"), "1.00x (1.00-1.50)");
        // tract took two rounds against tandem's three: no pairs, the ratio alone.
        assert_eq!(cell("cpu/tract"), "0.50x");
        assert_eq!(cell("cpu/burn-nd"), "-");
    }

    /// A row of two rounds: `n` samples at each given median.
    fn uneven_rounds(runtime: &str, rounds: [(f64, usize); 2]) -> Row {
        let rule = RunRule {
            min_iters: 1,
            min_secs: 0.0,
            max_secs: 1.0,
        };
        let round = |(p50, n): (f64, usize)| {
            let mut r = row(runtime, p50, &[]);
            r.latency = Some(Latency::from_samples(vec![p50; n], &rule));
            r
        };
        let mut r = round(rounds[0]);
        r.pool(round(rounds[1]), 1, &rule);
        r
    }

    #[test]
    fn an_auto_row_shows_its_first_and_its_learnt_prediction() {
        let mut auto = row("tandem", 3.9, &[]);
        auto.placement = "auto".into();
        auto.predicted_ms = Some(5.72);
        auto.predicted_now_ms = Some(3.91);
        let mut older = row("tandem", 3.9, &[]);
        older.placement = "auto-nosplit".into();
        older.predicted_ms = Some(5.72);
        let t = model_rows(&model("m", vec![auto, older, row("tandem", 4.0, &[])]));
        let col = t
            .head
            .iter()
            .position(|h| h.starts_with("predicted"))
            .unwrap();
        let cells: Vec<&str> = t.rows.iter().map(|r| r[col].as_str()).collect();
        // A report from before the learnt prediction existed shows the first alone.
        assert_eq!(cells, ["5.72 / 3.91", "5.72", "-"]);
    }

    #[test]
    fn a_round_with_more_samples_does_not_outweigh_the_other() {
        // Both rounds read tandem at 0.98x of onnxruntime, but the host ran onnxruntime's first
        // round and tandem's second in a fast minute, so those took more samples: the pooled
        // medians (1.96 against 1.0) would read 1.96x.
        let m = model(
            "m",
            vec![
                uneven_rounds("tandem", [(0.98, 3), (1.96, 6)]),
                uneven_rounds("onnxruntime", [(1.0, 6), (2.0, 3)]),
            ],
        );
        let t = summary(&[m]);
        let col = t.head.iter().position(|h| h == "cpu/ORT").unwrap();
        assert_eq!(t.rows[0][col], "0.98x (0.98-0.98)");
    }

    #[test]
    fn misses_list_the_top_ops_of_tandem_and_of_onnxruntime() {
        let slow = model(
            "slow",
            vec![
                row("tandem", 4.0, &[("Conv", 5, 3.0), ("Relu", 5, 0.5)]),
                row(
                    "onnxruntime",
                    2.0,
                    &[("FusedConv", 5, 1.5), ("ReorderInput", 1, 0.2)],
                ),
            ],
        );
        let fast = model(
            "fast",
            vec![
                row("tandem", 1.0, &[("Conv", 1, 0.9)]),
                row("onnxruntime", 2.0, &[("Conv", 1, 1.8)]),
            ],
        );
        let unprofiled = model(
            "unprofiled",
            vec![
                row("tandem", 3.0, &[("MatMul", 2, 2.5)]),
                row("onnxruntime", 1.0, &[]),
            ],
        );
        let t = misses(&[slow, fast, unprofiled]);
        assert_eq!(t.head.len(), 4);
        assert_eq!(
            t.rows,
            vec![
                vec![
                    "slow".to_string(),
                    "2.00x".into(),
                    "Conv 3.00 ms (86%, 5x), Relu 0.50 ms (14%, 5x)".into(),
                    "FusedConv 1.50 ms (88%, 5x), ReorderInput 0.20 ms (12%, 1x)".into(),
                ],
                vec![
                    "unprofiled".to_string(),
                    "3.00x".into(),
                    "MatMul 2.50 ms (100%, 2x)".into(),
                    "-".into(),
                ],
            ]
        );
    }
}
