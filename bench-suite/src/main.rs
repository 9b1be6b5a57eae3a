//! The `tandem-bench` command: `run` (models x placements x peers -> reports) and `compare`
//! (two reports, changes beyond noise).
//!
//! Sits between the command line and the `tandem_bench` library. Each subcommand is a module
//! whose `Args` (clap) implements [`tandem_bench::Subcommand`]; adding one is one line in the
//! `subcommands!` list below (its doc comment becomes the help text).

use clap::Parser;
use tandem_bench::Subcommand;

/// mimalloc, not glibc malloc: the runtime allocates small shape vectors in every node and frees
/// tensors on other threads than made them; glibc cost the tiny Llama decode step about 12 % of
/// its time and page-faulted on every convnet run (docs/bench.md, "mimalloc"). Peers measured
/// in this process (tract) share it; onnxruntime runs in its own (Python) with its arena.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

macro_rules! subcommands {
    ($($(#[$doc:meta])* $variant:ident => $args:ty),* $(,)?) => {
        #[derive(clap::Subcommand)]
        enum Command {
            $($(#[$doc])* $variant($args),)*
        }
        impl Command {
            fn main(self) -> anyhow::Result<()> {
                match self {
                    $(Command::$variant(a) => a.main(),)*
                }
            }
        }
    };
}

subcommands! {
    /// Measure models on tandem (cpu, gpu, auto, auto-nosplit) and on the installed peers.
    Run => tandem_bench::run::Args,
    /// Compare two JSON reports; flag only changes beyond each series' own noise.
    Compare => tandem_bench::compare::Args,
    /// The hybrid scheduler's benchmarks on the test bed: split vs grid, auto vs best device, held-out accuracy, overhead per node.
    Coexec => tandem_bench::coexec::Args,
    /// One of tandem's rows, measured in this process and printed as JSON (`run` starts one per row and round).
    #[command(hide = true)]
    Row => tandem_bench::tandem_process::Args,
}

#[derive(Parser)]
#[command(
    name = "tandem-bench",
    version,
    about = "tandem against its peers, side by side"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

fn main() -> anyhow::Result<()> {
    tandem::gpu::quiet_wayland_probe();
    Cli::parse().command.main()
}
