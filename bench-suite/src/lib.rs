//! tandem-bench: tandem measured against its peers (onnxruntime, tract, burn) on real models,
//! every placement, one adapter, side by side; plus criterion kernel benches in `benches/`.
//!
//! Sits between the `tandem` runtime (and the peers) and the reports. The `tandem-bench`
//! binary is a thin command line over this library; the measurement helpers (the run rule and
//! latency statistics in [`stats`], machine facts in [`machine`], the report schema in
//! [`schema`] and its writers in [`render`]) are public so other subcommands (e.g. the
//! co-execution benchmarks) reuse them.

pub mod coexec;
pub mod compare;
pub mod gemm;
pub mod interleave;
pub mod machine;
pub mod models;
pub mod peers;
pub mod render;
pub mod run;
pub mod schema;
pub mod stats;
pub mod tandem_process;
pub mod tandem_row;

/// A `tandem-bench` subcommand: its clap arguments and what it does with them.
pub trait Subcommand: clap::Args {
    fn main(self) -> anyhow::Result<()>;
}
