//! Chrome trace (Perfetto / chrome://tracing) of one run: a CPU lane, a GPU lane and a
//! transfers lane.
//!
//! Sits between a [`RunReport`] and the `--trace` file of the CLI.

use crate::plan::Device;
use crate::report::{Ran, RunReport};
use std::fmt::Write;

/// `s` as a JSON string literal, quotes included.
fn quoted(s: &str) -> String {
    serde_json::to_string(s).expect("a string always serialises")
}

/// The trace as Chrome's JSON trace-event format (complete events, microseconds).
pub fn chrome_trace(report: &RunReport) -> String {
    let mut ev = Vec::new();
    for (tid, name) in [(1, "CPU"), (2, "GPU"), (3, "transfers")] {
        ev.push(format!(
            r#"{{"ph":"M","pid":1,"tid":{tid},"name":"thread_name","args":{{"name":"{name}"}}}}"#
        ));
    }
    let us = |d: std::time::Duration| d.as_secs_f64() * 1e6;
    for n in &report.nodes {
        let lanes: Vec<(u32, f64, f64)> = match n.ran {
            Ran::On(Device::Cpu) => vec![(1, us(n.start), us(n.time))],
            Ran::On(Device::Gpu) => vec![(2, us(n.start), us(n.time))],
            Ran::Split { .. } => vec![
                (1, us(n.start), us(n.time)),
                (2, us(n.start), n.gpu_time.map_or(0.0, us)),
            ],
            Ran::View | Ran::Folded => continue,
        };
        for (tid, ts, dur) in lanes {
            let mut e = String::new();
            let _ = write!(
                e,
                r#"{{"ph":"X","pid":1,"tid":{tid},"ts":{ts:.3},"dur":{dur:.3},"name":{},"cat":{},"args":{{"ran":"{}"}}}}"#,
                quoted(&n.name),
                quoted(&n.op_type),
                n.ran
            );
            ev.push(e);
        }
    }
    for t in &report.transfers {
        let name = match t.to {
            Device::Gpu => "upload",
            Device::Cpu => "download",
        };
        ev.push(format!(
            r#"{{"ph":"X","pid":1,"tid":3,"ts":{:.3},"dur":{:.3},"name":"{name}","args":{{"bytes":{}}}}}"#,
            us(t.start),
            us(t.time),
            t.bytes
        ));
    }
    format!("{{\"traceEvents\":[\n{}\n]}}\n", ev.join(",\n"))
}
