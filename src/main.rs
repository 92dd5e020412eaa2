//! The `fairgate` binary: see `fairgate --help`. A thin dispatcher: one match, one arm per
//! subcommand, the work lives in the library.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// mimalloc instead of glibc malloc: a request allocates and frees many small buffers across
/// two runtime threads, where glibc's arenas cost ~10% of the proxy's CPU (perf, BENCHMARKS.md).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// A reverse proxy for OpenAI-compatible LLM APIs that keeps many tenants fair.
#[derive(Debug, Parser)]
#[command(name = "fairgate", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the proxy.
    Serve {
        /// Configuration file.
        #[arg(long, default_value = "config.toml")]
        config: PathBuf,
    },
    /// Validate a configuration file.
    Check {
        /// Configuration file.
        #[arg(long, default_value = "config.toml")]
        config: PathBuf,
    },
    /// Run the bundled OpenAI-compatible mock upstream.
    MockUpstream(fairgate_mock::MockArgs),
    /// Run a scenario file through the real scheduler on a virtual clock (FIFO and DRR, or one).
    Simulate {
        /// Scenario file (see scenarios/).
        file: PathBuf,
        /// Only this policy.
        #[arg(long, value_parser = parse_policy)]
        policy: Option<fairgate::scheduler::Policy>,
        /// One JSON report per line instead of tables.
        #[arg(long)]
        json: bool,
    },
    /// Show FIFO against fair scheduling on the bundled mock upstream (about half a minute).
    Demo(fairgate::demo::DemoArgs),
    /// Ask a fairgate (or any) URL whether it is healthy: exit 0 on a 2xx answer, else 1.
    Health(fairgate::cli::health::HealthArgs),
}

fn parse_policy(s: &str) -> Result<fairgate::scheduler::Policy, String> {
    match s {
        "drr" => Ok(fairgate::scheduler::Policy::Drr),
        "fifo" => Ok(fairgate::scheduler::Policy::Fifo),
        other => Err(format!("unknown policy `{other}` (drr | fifo)")),
    }
}

fn main() -> ExitCode {
    fairgate::memory::configure();
    let cli = Cli::parse();
    match cli.command {
        Command::Serve { config } => fairgate::cli::serve(&config),
        Command::Check { config } => fairgate::cli::check(&config),
        Command::MockUpstream(args) => fairgate::cli::block_on(fairgate_mock::run_cli(args)),
        Command::Simulate { file, policy, json } => fairgate::cli::simulate(&file, policy, json),
        Command::Demo(args) => fairgate::cli::demo(&args),
        Command::Health(args) => fairgate::cli::health::run(&args),
    }
}
