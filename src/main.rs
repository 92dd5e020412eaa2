//! The `fairgate` binary: see `fairgate --help`.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// A reverse proxy for OpenAI-compatible LLM APIs that keeps many tenants fair.
#[derive(Debug, Parser)]
#[command(name = "fairgate", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the bundled OpenAI-compatible mock upstream.
    MockUpstream(fairgate::mock::MockArgs),
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::MockUpstream(args) => fairgate::mock::run_cli(args).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fairgate: {e}");
            ExitCode::FAILURE
        }
    }
}
