//! The `fairgate` binary: see `fairgate --help`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "fairgate",
    version,
    about = "Fair multi-tenant proxy for OpenAI-compatible APIs"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
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
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("FAIRGATE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt().with_env_filter(filter).init();
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve { config } => {
            init_tracing();
            fairgate::cli::serve(&config)
        }
        Command::Check { config } => fairgate::cli::check(&config),
    }
}
