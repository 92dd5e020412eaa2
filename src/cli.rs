//! The subcommands behind `src/main.rs`, kept in the library so they are testable.

use std::path::Path;
use std::process::ExitCode;

use crate::config::Config;

/// `fairgate check`: prints `ok: N tenants, M upstreams` (plus warnings such as unset env
/// variables) and exits 0, or prints the error naming the key path and exits 1.
pub fn check(path: &Path) -> ExitCode {
    match crate::config::check(path) {
        Ok((summary, warnings)) => {
            for w in warnings {
                eprintln!("{w}");
            }
            println!("{summary}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `fairgate serve`: loads the config, runs the server until SIGTERM/SIGINT.
pub fn serve(path: &Path) -> ExitCode {
    let config = match Config::load(path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(crate::server::run(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
