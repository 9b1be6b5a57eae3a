//! `tandem-bench compare A.json B.json`: which series changed beyond their own noise.
//!
//! Sits between two reports of `tandem-bench run` (schema.rs) and the terminal. A series is
//! (model, runtime, placement). Its median latency changed only when
//! `|p50_B - p50_A| >= max(floor, 3 x spread)`, where spread is the series' p90 - p50 (the
//! larger of the two runs') and floor is `max(floor_ms, floor_pct% of p50_A)`: tract's bench
//! rule, so that a shared, noisy machine does not cry wolf. Rows with runs after a pause in
//! both reports (`Row::after_pause`) are a second series, `runtime placement after pause`,
//! judged by the same rule on those runs' own median and spread.

use crate::schema::{Report, Row};
use crate::stats::{Latency, RunRule};

/// The thresholds of the rule.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Floor {
    pub ms: f64,
    pub pct: f64,
}

/// What happened to one series.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Within noise.
    Same,
    Faster,
    Slower,
    /// In one report only, or failed in one of them.
    Missing(String),
}

/// One series compared.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    pub model: String,
    pub series: String,
    pub a_ms: f64,
    pub b_ms: f64,
    pub delta_ms: f64,
    /// The |delta| the rule required.
    pub threshold_ms: f64,
    pub verdict: Verdict,
}

/// The rule on two latency summaries: (verdict, threshold).
pub fn judge(a: &Latency, b: &Latency, floor: Floor) -> (Verdict, f64) {
    let spread = a.spread_ms().max(b.spread_ms()).max(0.0);
    let threshold = floor.ms.max(floor.pct / 100.0 * a.p50_ms).max(3.0 * spread);
    let delta = b.p50_ms - a.p50_ms;
    let v = if delta.abs() < threshold {
        Verdict::Same
    } else if delta < 0.0 {
        Verdict::Faster
    } else {
        Verdict::Slower
    };
    (v, threshold)
}

fn find<'a>(r: &'a Report, model: &str, runtime: &str, placement: &str) -> Option<&'a Row> {
    r.models
        .iter()
        .find(|m| m.name == model)?
        .rows
        .iter()
        .find(|x| x.runtime == runtime && x.placement == placement)
}

/// Every series of `a` and of `b`, compared.
pub fn compare(a: &Report, b: &Report, floor: Floor) -> Vec<Change> {
    let mut keys: Vec<(String, String, String)> = Vec::new();
    for r in [a, b] {
        for m in &r.models {
            for x in &m.rows {
                let k = (m.name.clone(), x.runtime.clone(), x.placement.clone());
                if !keys.contains(&k) {
                    keys.push(k);
                }
            }
        }
    }
    keys.into_iter()
        .flat_map(|(model, runtime, placement)| {
            let (ra, rb) = (
                find(a, &model, &runtime, &placement),
                find(b, &model, &runtime, &placement),
            );
            let series = format!("{runtime} {placement}");
            let la = ra.and_then(|x| x.latency.as_ref());
            let lb = rb.and_then(|x| x.latency.as_ref());
            let steady = change(model.clone(), series.clone(), la, lb, floor);
            let paused = |r: Option<&Row>| {
                let samples = r?.after_pause.as_ref()?.samples_ms.clone();
                Some(Latency::from_samples(samples, &ANY_RULE))
            };
            let after_pause = match (paused(ra), paused(rb)) {
                (Some(pa), Some(pb)) => Some(change(
                    model,
                    format!("{series} after pause"),
                    Some(&pa),
                    Some(&pb),
                    floor,
                )),
                _ => None,
            };
            std::iter::once(steady).chain(after_pause)
        })
        .collect()
}

/// A rule every sample count meets (the runs after a pause are not capped).
const ANY_RULE: RunRule = RunRule {
    min_iters: 0,
    min_secs: 0.0,
    max_secs: f64::INFINITY,
};

/// One series compared: both latencies judged, or why not.
fn change(
    model: String,
    series: String,
    la: Option<&Latency>,
    lb: Option<&Latency>,
    floor: Floor,
) -> Change {
    match (la, lb) {
        (Some(la), Some(lb)) => {
            let (verdict, threshold_ms) = judge(la, lb, floor);
            Change {
                model,
                series,
                a_ms: la.p50_ms,
                b_ms: lb.p50_ms,
                delta_ms: lb.p50_ms - la.p50_ms,
                threshold_ms,
                verdict,
            }
        }
        (la, lb) => Change {
            model,
            series,
            a_ms: la.map_or(f64::NAN, |l| l.p50_ms),
            b_ms: lb.map_or(f64::NAN, |l| l.p50_ms),
            delta_ms: f64::NAN,
            threshold_ms: f64::NAN,
            verdict: Verdict::Missing(
                if la.is_none() {
                    "no timing in A"
                } else {
                    "no timing in B"
                }
                .into(),
            ),
        },
    }
}

/// The comparison as a terminal table; changed series are marked.
pub fn render(changes: &[Change]) -> String {
    let mut s = format!(
        "{:<20} {:<30} {:>10} {:>10} {:>10} {:>10}  verdict\n",
        "model", "series", "A p50 ms", "B p50 ms", "delta", "needs"
    );
    for c in changes {
        let v = match &c.verdict {
            Verdict::Same => "same (noise)".to_string(),
            Verdict::Faster => format!("FASTER {:.1}%", -100.0 * c.delta_ms / c.a_ms),
            Verdict::Slower => format!("SLOWER {:.1}%", 100.0 * c.delta_ms / c.a_ms),
            Verdict::Missing(why) => why.clone(),
        };
        s += &format!(
            "{:<20} {:<30} {:>10.3} {:>10.3} {:>+10.3} {:>10.3}  {v}\n",
            c.model, c.series, c.a_ms, c.b_ms, c.delta_ms, c.threshold_ms
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lat(p50: f64, p90: f64) -> Latency {
        let rule = RunRule {
            min_iters: 1,
            min_secs: 0.0,
            max_secs: 1.0,
        };
        let mut l = Latency::from_samples(vec![p50], &rule);
        l.p50_ms = p50;
        l.p90_ms = p90;
        l
    }

    const FLOOR: Floor = Floor { ms: 0.1, pct: 0.0 };

    #[test]
    fn a_change_inside_three_spreads_is_noise() {
        // spread 1 ms -> threshold 3 ms; +2.9 ms is noise, +3 ms is not
        let (v, t) = judge(&lat(10.0, 11.0), &lat(12.9, 13.5), FLOOR);
        assert_eq!((v, t), (Verdict::Same, 3.0));
        assert_eq!(
            judge(&lat(10.0, 11.0), &lat(13.0, 13.5), FLOOR).0,
            Verdict::Slower
        );
        assert_eq!(
            judge(&lat(10.0, 11.0), &lat(7.0, 7.5), FLOOR).0,
            Verdict::Faster
        );
    }

    /// Runs after a pause are a series of their own, judged on their own spread; a report
    /// without them leaves the steady series alone.
    #[test]
    fn runs_after_a_pause_are_a_series_of_their_own() {
        let report = |p50: f64, paused: Option<Vec<f64>>| {
            let mut row = Row::failed("tandem", "cpu", "0", String::new());
            row.error = None;
            row.latency = Some(lat(p50, p50));
            row.after_pause = paused.and_then(|v| crate::schema::AfterPause::from_samples(50.0, v));
            let mut r: Report = serde_json::from_str(&format!(
                r#"{{"schema": "tandem-bench/1", "started_unix_s": 0,
                    "machine": {{"cpu_model": "c", "cores": 2, "simd": "s", "adapter": null,
                                "os": "o", "git": null}},
                    "config": {{"cpu_rule": {RULE}, "gpu_rule": {RULE}, "threads": 2,
                               "quick": true}},
                    "models": [{{"name": "m", "path": "p", "inputs": [],
                                "reference": "onnxruntime", "rows": []}}],
                    "gemm": null}}"#,
                RULE = r#"{"min_iters": 1, "min_secs": 0.0, "max_secs": 1.0}"#
            ))
            .unwrap();
            r.models[0].rows.push(row);
            r
        };
        let a = report(10.0, Some(vec![20.0, 21.0, 20.5, 20.2]));
        let b = report(10.0, Some(vec![30.0, 31.0, 30.5, 30.2]));
        let changes = compare(&a, &b, FLOOR);
        let series: Vec<(&str, &Verdict)> = changes
            .iter()
            .map(|c| (c.series.as_str(), &c.verdict))
            .collect();
        assert_eq!(
            series,
            [
                ("tandem cpu", &Verdict::Same),
                ("tandem cpu after pause", &Verdict::Slower)
            ]
        );
        assert_eq!(changes[1].a_ms, 20.2, "the runs' own median");
        // Within their own spread: noise.
        let c = report(10.0, Some(vec![20.0, 26.0, 20.5, 20.2]));
        let d = report(10.0, Some(vec![22.0, 21.0, 28.5, 20.2]));
        assert_eq!(compare(&c, &d, FLOOR)[1].verdict, Verdict::Same);
        assert_eq!(compare(&a, &report(10.0, None), FLOOR).len(), 1);
    }

    #[test]
    fn the_noisier_run_sets_the_spread() {
        // A is tight, B has a 2 ms spread -> threshold 6 ms
        let (v, t) = judge(&lat(10.0, 10.1), &lat(15.0, 17.0), FLOOR);
        assert_eq!((v, t), (Verdict::Same, 6.0));
    }

    #[test]
    fn the_floor_applies_when_runs_are_perfectly_steady() {
        let f = Floor { ms: 0.5, pct: 10.0 };
        // no spread: threshold = max(0.5 ms, 10% of 10 ms) = 1 ms
        assert_eq!(
            judge(&lat(10.0, 10.0), &lat(10.9, 10.9), f),
            (Verdict::Same, 1.0)
        );
        assert_eq!(
            judge(&lat(10.0, 10.0), &lat(11.0, 11.0), f).0,
            Verdict::Slower
        );
        // small series: the absolute floor wins
        assert_eq!(
            judge(&lat(1.0, 1.0), &lat(1.4, 1.4), f),
            (Verdict::Same, 0.5)
        );
    }
}

/// `tandem-bench compare A.json B.json`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The baseline report.
    pub a: std::path::PathBuf,
    /// The report compared with it.
    pub b: std::path::PathBuf,
    /// Smallest change ever flagged, ms.
    #[arg(long, default_value_t = 0.05)]
    pub floor_ms: f64,
    /// Smallest change ever flagged, percent of A's median.
    #[arg(long, default_value_t = 2.0)]
    pub floor_pct: f64,
    /// Exit with status 1 when a series got slower.
    #[arg(long)]
    pub fail_on_slower: bool,
}

impl crate::Subcommand for Args {
    fn main(self) -> anyhow::Result<()> {
        use anyhow::Context;
        let read = |p: &std::path::Path| -> anyhow::Result<Report> {
            let text =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            let r: Report = serde_json::from_str(&text)
                .with_context(|| format!("{} is not a tandem-bench report", p.display()))?;
            if r.schema != crate::schema::SCHEMA {
                anyhow::bail!(
                    "{}: schema {} (this build reads {})",
                    p.display(),
                    r.schema,
                    crate::schema::SCHEMA
                );
            }
            Ok(r)
        };
        let (a, b) = (read(&self.a)?, read(&self.b)?);
        if a.machine.cpu_model != b.machine.cpu_model || a.machine.adapter != b.machine.adapter {
            println!("note: the reports come from different machines (CPU or adapter differ)");
        }
        let changes = compare(
            &a,
            &b,
            Floor {
                ms: self.floor_ms,
                pct: self.floor_pct,
            },
        );
        print!("{}", render(&changes));
        let slower = changes
            .iter()
            .filter(|c| c.verdict == Verdict::Slower)
            .count();
        let faster = changes
            .iter()
            .filter(|c| c.verdict == Verdict::Faster)
            .count();
        println!(
            "{slower} slower, {faster} faster, {} within noise",
            changes
                .iter()
                .filter(|c| c.verdict == Verdict::Same)
                .count()
        );
        if self.fail_on_slower && slower > 0 {
            std::process::exit(1);
        }
        Ok(())
    }
}
