//! The self-contained HTML report: the same tables as the Markdown plus inline SVG plots (ratio
//! bars, latency distributions per row, per-op time breakdown, a CPU/GPU timeline of one run
//! per model). No scripts, no external files: open it anywhere, attach it anywhere.
//!
//! Sits between the report schema and `report.html`.

use crate::render::svg::{self, esc};
use crate::render::tables::{self, Table};
use crate::schema::Report;

fn table(t: &Table) -> String {
    let mut s = format!("<h3>{}</h3><table><tr>", esc(&t.title));
    for h in &t.head {
        s += &format!("<th>{}</th>", esc(h));
    }
    s += "</tr>";
    for r in &t.rows {
        s += "<tr>";
        for c in r {
            s += &format!("<td>{}</td>", esc(c));
        }
        s += "</tr>";
    }
    s + "</table>"
}

const STYLE: &str = "body{font-family:sans-serif;margin:20px;color:#222;max-width:1360px}\
table{border-collapse:collapse;margin:6px 0 14px;font-size:12px}\
td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}\
td:first-child,th:first-child{text-align:left}th{background:#f0f0f0}\
h2{border-bottom:2px solid #4e79a7;padding-bottom:3px;margin-top:30px}\
.meta{font-size:12px;color:#555}.notes{font-size:11px;color:#555}";

/// The whole page.
pub fn page(r: &Report) -> String {
    let m = &r.machine;
    let mut s = format!(
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>tandem-bench</title><style>{STYLE}</style></head><body>\
         <h1>tandem-bench</h1><p class=\"meta\">{} &middot; CPU {} ({} cores, {}) &middot; GPU {} &middot; {} threads &middot; {} &middot; tree {}{}</p>",
        esc(&r.schema),
        esc(&m.cpu_model),
        m.cores,
        esc(&m.simd),
        esc(&m.adapter.as_ref().map_or("none".into(), |a| format!("{} ({}, {})", a.name, a.backend, a.driver_info))),
        r.config.threads,
        esc(&tables::method(&r.config)),
        esc(m.git.as_deref().unwrap_or("?")),
        if r.config.quick { " &middot; quick mode" } else { "" },
    );
    s += "<h2>Summary</h2>";
    s += &table(&tables::summary(&r.models));
    s += "<h3>tandem cpu / peer (each row's fastest round; left of 1x: tandem faster)</h3>";
    s += &svg::ratio_chart(r);
    s += &table(&tables::cold_starts(r));
    let paused = tables::after_pause(r);
    if !paused.rows.is_empty() {
        s += &table(&paused);
    }
    let misses = tables::misses(&r.models);
    if !misses.rows.is_empty() {
        s += &table(&misses);
    }
    if let Some(g) = &r.gemm {
        s += &table(&tables::gemm(g));
    }
    for model in &r.models {
        s += &format!("<h2>{}</h2>", esc(&model.name));
        s += &table(&tables::model_rows(model));
        s += "<h3>Latency distribution (dots: every run; box: p50 to p90; bar: p99)</h3>";
        s += &svg::latency_plot(model);
        let breakdown = svg::op_breakdown(model);
        if !breakdown.is_empty() {
            s += "<h3>Time per op type (tandem: its median run; onnxruntime: each node's median over its profiled runs)</h3>";
            s += &breakdown;
        }
        let shown = ["auto", "gpu", "cpu"]
            .iter()
            .find_map(|p| tables::find(model, "tandem", p).filter(|r| !r.timeline.is_empty()));
        if let Some(row) = shown {
            s += &format!("<h3>Timeline of the median run: {}</h3>", esc(&row.label()));
            s += &svg::timeline(row, &svg::top_ops(model));
        }
        let notes: Vec<String> = model
            .rows
            .iter()
            .flat_map(|x| x.notes.iter().map(move |n| format!("{}: {n}", x.label())))
            .collect();
        if !notes.is_empty() {
            s += "<ul class=\"notes\">";
            for n in notes {
                s += &format!("<li>{}</li>", esc(&n));
            }
            s += "</ul>";
        }
    }
    s + "</body></html>\n"
}
