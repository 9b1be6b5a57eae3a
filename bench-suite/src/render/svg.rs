//! Inline SVG plots for the HTML report, drawn by hand (no JS, no plotting crate): latency
//! distributions, per-op time breakdowns, a CPU/GPU timeline, and ratio bars.
//!
//! Sits between the report schema and `render::html`.

use crate::render::tables::center;
use crate::schema::{ModelResult, Report, Row};
use std::fmt::Write;

const PALETTE: [&str; 10] = [
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
    "#9c755f", "#bab0ac",
];

/// `s` escaped for SVG/HTML text.
pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Colour of a row by runtime (tandem rows by placement).
fn row_color(r: &Row) -> &'static str {
    match (r.runtime.as_str(), r.placement.as_str()) {
        ("tandem", "cpu") => PALETTE[0],
        ("tandem", "gpu") => PALETTE[1],
        ("tandem", "auto") => PALETTE[4],
        ("tandem", _) => PALETTE[3],
        ("onnxruntime", _) => PALETTE[2],
        ("tract", _) => PALETTE[6],
        _ => PALETTE[8],
    }
}

/// Log10 axis ticks (1, 2, 5 per decade) between lo and hi.
fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let mut t = Vec::new();
    let mut d = 10f64.powf(lo.log10().floor());
    while d <= hi * 1.0001 {
        for m in [1.0, 2.0, 5.0] {
            let v = d * m;
            if v >= lo * 0.9999 && v <= hi * 1.0001 {
                t.push(v);
            }
        }
        d *= 10.0;
    }
    t
}

fn fmt_ms(v: f64) -> String {
    if v >= 10.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// Every sample of every row of `m` on a log time axis: dots (jittered), a box from p50 to
/// p90, a tick at p99.
pub fn latency_plot(m: &ModelResult) -> String {
    let rows: Vec<&Row> = m.rows.iter().filter(|r| r.latency.is_some()).collect();
    if rows.is_empty() {
        return String::new();
    }
    let (mut lo, mut hi) = (f64::INFINITY, 0.0f64);
    for r in &rows {
        for &s in &r.latency.as_ref().unwrap().samples_ms {
            lo = lo.min(s);
            hi = hi.max(s);
        }
    }
    let lo = 10f64.powf((lo.max(1e-3)).log10().floor());
    let hi = 10f64.powf(hi.max(lo * 10.0).log10().ceil());
    let (left, width, lane) = (170.0, 760.0, 26.0);
    let h = 40.0 + lane * rows.len() as f64;
    let x = |v: f64| left + width * (v.max(lo).log10() - lo.log10()) / (hi.log10() - lo.log10());
    let mut s = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{h}" font-family="sans-serif" font-size="11">"#,
        left + width + 20.0
    );
    for t in log_ticks(lo, hi) {
        let _ = write!(
            s,
            r##"<line x1="{0:.1}" y1="10" x2="{0:.1}" y2="{1}" stroke="#ddd"/><text x="{0:.1}" y="{2}" text-anchor="middle" fill="#555">{3}</text>"##,
            x(t),
            h - 22.0,
            h - 8.0,
            fmt_ms(t)
        );
    }
    let _ = write!(
        s,
        r##"<text x="{}" y="{}" text-anchor="end" fill="#555">ms, log scale</text>"##,
        left - 8.0,
        h - 24.0
    );
    for (i, r) in rows.iter().enumerate() {
        let l = r.latency.as_ref().unwrap();
        let y = 20.0 + lane * i as f64;
        let c = row_color(r);
        let _ = write!(
            s,
            r#"<text x="{}" y="{}" text-anchor="end">{}</text>"#,
            left - 8.0,
            y + 4.0,
            esc(&r.label())
        );
        let _ = write!(
            s,
            r#"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="14" fill="{c}" fill-opacity="0.25" stroke="{c}"/>"#,
            x(l.p50_ms),
            y - 7.0,
            (x(l.p90_ms) - x(l.p50_ms)).max(1.5)
        );
        let _ = write!(
            s,
            r#"<line x1="{0:.1}" y1="{1:.1}" x2="{0:.1}" y2="{2:.1}" stroke="{c}" stroke-width="2"/>"#,
            x(l.p99_ms),
            y - 7.0,
            y + 7.0
        );
        for (k, &v) in l.samples_ms.iter().enumerate().take(2000) {
            let jitter = ((k * 7919) % 11) as f64 - 5.0;
            let _ = write!(
                s,
                r#"<circle cx="{:.1}" cy="{:.1}" r="1.6" fill="{c}" fill-opacity="0.6"/>"#,
                x(v),
                y + jitter
            );
        }
    }
    s + "</svg>"
}

/// The model's op types that take the most time (share of each row's total, summed over the
/// rows), at most 9: each gets its own palette colour in every plot of the model.
pub fn top_ops(m: &ModelResult) -> Vec<String> {
    let mut ops: Vec<(String, f64)> = Vec::new();
    for r in m.rows.iter().filter(|r| !r.op_times.is_empty()) {
        let total: f64 = r.op_times.iter().map(|o| o.ms).sum::<f64>().max(1e-12);
        for o in &r.op_times {
            match ops.iter_mut().find(|(n, _)| *n == o.op) {
                Some(e) => e.1 += o.ms / total,
                None => ops.push((o.op.clone(), o.ms / total)),
            }
        }
    }
    ops.sort_by(|a, b| b.1.total_cmp(&a.1));
    ops.into_iter().take(9).map(|(n, _)| n).collect()
}

/// Colour of `op` among `top` (grey for the rest).
fn op_color(op: &str, top: &[String]) -> &'static str {
    top.iter()
        .position(|t| t == op)
        .map_or("#bbb", |i| PALETTE[i])
}

/// Stacked bars of time per op type, one per row of `m` that has per-op times (tandem's rows
/// and onnxruntime's; top 9 op types + other).
pub fn op_breakdown(m: &ModelResult) -> String {
    let rows: Vec<&Row> = m.rows.iter().filter(|r| !r.op_times.is_empty()).collect();
    if rows.is_empty() {
        return String::new();
    }
    let top = top_ops(m);
    let (left, width, lane) = (170.0, 760.0, 28.0);
    let h = 30.0 + lane * rows.len() as f64 + 40.0;
    let mut s = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{h}" font-family="sans-serif" font-size="11">"#,
        left + width + 20.0
    );
    for (i, r) in rows.iter().enumerate() {
        let total: f64 = r.op_times.iter().map(|o| o.ms).sum();
        let y = 10.0 + lane * i as f64;
        let _ = write!(
            s,
            r#"<text x="{}" y="{}" text-anchor="end">{} ({} ms)</text>"#,
            left - 8.0,
            y + 13.0,
            esc(&r.label()),
            fmt_ms(total)
        );
        let mut x = left;
        let mut other = 0.0;
        for o in &r.op_times {
            if !top.contains(&o.op) {
                other += o.ms;
                continue;
            }
            let w = width * o.ms / total;
            let _ = write!(
                s,
                r#"<rect x="{x:.1}" y="{y}" width="{w:.1}" height="18" fill="{}"><title>{} {:.2} ms ({} nodes)</title></rect>"#,
                op_color(&o.op, &top),
                esc(&o.op),
                o.ms,
                o.count
            );
            x += w;
        }
        let w = width * other / total;
        let _ = write!(
            s,
            r##"<rect x="{x:.1}" y="{y}" width="{w:.1}" height="18" fill="#ccc"><title>other {other:.2} ms</title></rect>"##
        );
    }
    // legend
    let ly = 18.0 + lane * rows.len() as f64;
    let mut lx = left;
    for op in top.iter().map(String::as_str).chain(["other"]) {
        let c = if op == "other" {
            "#ccc"
        } else {
            op_color(op, &top)
        };
        let _ = write!(
            s,
            r#"<rect x="{lx:.1}" y="{ly}" width="10" height="10" fill="{c}"/><text x="{:.1}" y="{}">{}</text>"#,
            lx + 14.0,
            ly + 9.0,
            esc(op)
        );
        lx += 24.0 + 6.5 * op.len() as f64;
        if lx > left + width - 60.0 {
            break;
        }
    }
    s + "</svg>"
}

/// One run as lanes (cpu, gpu, transfer) of spans coloured by op type (`top`: see
/// [`top_ops`]).
pub fn timeline(r: &Row, top: &[String]) -> String {
    if r.timeline.is_empty() {
        return String::new();
    }
    let end = r
        .timeline
        .iter()
        .map(|s| s.start_ms + s.dur_ms)
        .fold(0.0, f64::max)
        .max(1e-3);
    let (left, width, lane) = (80.0, 850.0, 30.0);
    let lanes = ["cpu", "gpu", "transfer"];
    let h = 20.0 + lane * lanes.len() as f64 + 30.0;
    let x = |v: f64| left + width * v / end;
    let mut s = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{h}" font-family="sans-serif" font-size="11">"#,
        left + width + 20.0
    );
    for (i, l) in lanes.iter().enumerate() {
        let y = 10.0 + lane * i as f64;
        let _ = write!(
            s,
            r##"<text x="{}" y="{}" text-anchor="end">{l}</text><rect x="{left}" y="{y}" width="{width}" height="22" fill="#f4f4f4"/>"##,
            left - 8.0,
            y + 15.0
        );
        for sp in r.timeline.iter().filter(|sp| sp.lane == *l) {
            let c = if *l == "transfer" {
                "#333"
            } else {
                op_color(&sp.op, top)
            };
            let _ = write!(
                s,
                r#"<rect x="{:.2}" y="{y}" width="{:.2}" height="22" fill="{c}"><title>{} ({}) {:.3} ms at {:.3} ms</title></rect>"#,
                x(sp.start_ms),
                (x(sp.start_ms + sp.dur_ms) - x(sp.start_ms)).max(0.5),
                esc(&sp.name),
                esc(&sp.op),
                sp.dur_ms,
                sp.start_ms
            );
        }
    }
    let y = 10.0 + lane * lanes.len() as f64 + 12.0;
    for k in 0..=5 {
        let v = end * k as f64 / 5.0;
        let _ = write!(
            s,
            r##"<text x="{:.1}" y="{y}" text-anchor="middle" fill="#555">{} ms</text>"##,
            x(v),
            fmt_ms(v)
        );
    }
    s + "</svg>"
}

/// Per model, tandem cpu / peer ratio of their centers (`Latency::center_ms`: fastest rounds)
/// as bars around the 1.0 line (log scale).
pub fn ratio_chart(r: &Report) -> String {
    let peers = ["onnxruntime", "tract"];
    let data: Vec<(String, Vec<Option<f64>>)> = r
        .models
        .iter()
        .map(|m| {
            let cpu = center(m, "tandem", "cpu");
            let v = peers
                .iter()
                .map(|p| Some(cpu? / center(m, p, "cpu")?))
                .collect();
            (m.name.clone(), v)
        })
        .collect();
    if data.iter().all(|(_, v)| v.iter().all(Option::is_none)) {
        return String::new();
    }
    let (left, width, lane) = (170.0, 700.0, 26.0);
    let (lo, hi) = (0.1f64, 10.0f64);
    let x =
        |v: f64| left + width * (v.clamp(lo, hi).log10() - lo.log10()) / (hi.log10() - lo.log10());
    let h = 30.0 + lane * data.len() as f64 + 30.0;
    let mut s = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{h}" font-family="sans-serif" font-size="11">"#,
        left + width + 200.0
    );
    for t in [0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0] {
        let stroke = if t == 1.0 { "#000" } else { "#ddd" };
        let _ = write!(
            s,
            r##"<line x1="{0:.1}" y1="10" x2="{0:.1}" y2="{1}" stroke="{stroke}"/><text x="{0:.1}" y="{2}" text-anchor="middle" fill="#555">{t}x</text>"##,
            x(t),
            h - 28.0,
            h - 14.0
        );
    }
    for (i, (name, v)) in data.iter().enumerate() {
        let y = 14.0 + lane * i as f64;
        let _ = write!(
            s,
            r#"<text x="{}" y="{}" text-anchor="end">{}</text>"#,
            left - 8.0,
            y + 12.0,
            esc(name)
        );
        for (k, ratio) in v.iter().enumerate() {
            let Some(q) = ratio else { continue };
            let (x0, x1) = (x(1.0).min(x(*q)), x(1.0).max(x(*q)));
            let c = if k == 0 { PALETTE[2] } else { PALETTE[6] };
            let _ = write!(
                s,
                r#"<rect x="{x0:.1}" y="{:.1}" width="{:.1}" height="9" fill="{c}"><title>tandem cpu / {} = {q:.2}x</title></rect>"#,
                y + 1.0 + 10.0 * k as f64,
                (x1 - x0).max(1.0),
                peers[k]
            );
        }
    }
    let ly = h - 10.0;
    for (k, p) in peers.iter().enumerate() {
        let c = if k == 0 { PALETTE[2] } else { PALETTE[6] };
        let lx = left + width + 20.0;
        let _ = write!(
            s,
            r#"<rect x="{lx}" y="{:.1}" width="10" height="10" fill="{c}"/><text x="{}" y="{:.1}">tandem cpu / {p}</text>"#,
            20.0 + 16.0 * k as f64,
            lx + 14.0,
            29.0 + 16.0 * k as f64
        );
    }
    let _ = ly;
    s + "</svg>"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_cover_decades_with_1_2_5() {
        assert_eq!(
            log_ticks(1.0, 100.0),
            vec![1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0]
        );
        assert_eq!(esc("a<b&\"c\""), "a&lt;b&amp;&quot;c&quot;");
    }
}
