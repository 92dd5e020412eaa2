//! The subcommands behind `src/main.rs`, kept in the library so they are testable.

pub mod health;

use std::path::Path;
use std::process::ExitCode;

use crate::config::Config;

/// `fairgate check`: prints `ok: N tenants, M upstreams` (plus warnings such as unset env
/// variables) and exits 0, or prints the error naming the key path and exits 1.
pub fn check(path: &Path) -> ExitCode {
    // The config file, then what it points to that `serve` would load (upstream TLS files,
    // the Redis CA file).
    let checked = crate::config::check(path).and_then(|ok| {
        let config = crate::config::Config::load(path)?;
        for (i, u) in config.upstreams.iter().enumerate() {
            crate::upstream::check_tls(u, i)?;
        }
        crate::cluster::check(&config)?;
        Ok(ok)
    });
    match checked {
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

/// `fairgate serve`: loads the config, runs the server until SIGTERM/SIGINT; SIGHUP reloads
/// the file.
pub fn serve(path: &Path) -> ExitCode {
    let config = match Config::load(path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let _flush_on_exit = init_tracing(config.log.format);
    // The parse's garbage (~30 MiB at 10,000 tenants) goes back now, not at the first burst.
    crate::memory::release_now();
    block_on(crate::server::run(config, Some(path.to_owned())))
}

/// Installs the process's log subscriber: `FAIRGATE_LOG` filter (default `info`), text or JSON
/// lines by `[log] format`, written to stdout in batches off the request path
/// ([`crate::log`]). Keep the returned guard until exit (it writes what is left); `None` if a
/// subscriber was already installed.
pub fn init_tracing(format: crate::config::LogFormat) -> Option<crate::log::FlushGuard> {
    let filter = tracing_subscriber::EnvFilter::try_from_env("FAIRGATE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let (writer, guard) = crate::log::Batched::new(std::io::stdout());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        .with_timer(crate::log::clock::Clock)
        .with_writer(writer);
    let installed = match format {
        crate::config::LogFormat::Text => builder.fmt_fields(crate::log::fields::Fields).try_init(),
        crate::config::LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    installed.ok().map(|()| guard)
}

/// Runs `fut` on a fresh multi-thread runtime, beside the task that hands freed memory back
/// ([`crate::memory::collect_every`]); an error is printed and exits 1.
pub fn block_on<E: std::fmt::Display>(
    fut: impl std::future::Future<Output = Result<(), E>>,
) -> ExitCode {
    let result = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())
        .and_then(|rt| {
            rt.spawn(crate::memory::collect_every(crate::memory::EVERY));
            rt.block_on(fut).map_err(|e| e.to_string())
        });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fairgate: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `fairgate simulate FILE [--policy drr|fifo] [--json]`: runs the scenario through the
/// scheduler on a virtual clock and prints the per-tenant report.
pub fn simulate(path: &Path, policy: Option<crate::scheduler::Policy>, json: bool) -> ExitCode {
    let scenario = match crate::sim::Scenario::load(path) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let policies = match policy {
        Some(p) => vec![p],
        None => vec![
            crate::scheduler::Policy::Fifo,
            crate::scheduler::Policy::Drr,
        ],
    };
    for p in policies {
        let report = crate::sim::run(&scenario, p);
        if json {
            println!("{}", serde_json::to_string(&report).unwrap_or_default());
        } else {
            println!("{report}");
        }
    }
    if policy.is_none() {
        for c in crate::sim::compare(&scenario) {
            if json {
                println!("{}", serde_json::to_string(&c).unwrap_or_default());
            } else {
                println!("{c}");
            }
        }
    }
    ExitCode::SUCCESS
}

/// `fairgate demo`: FIFO against DRR on the bundled mock upstream.
pub fn demo(args: &crate::demo::DemoArgs) -> ExitCode {
    block_on(async {
        crate::demo::run(args).await?;
        Ok::<(), crate::demo::DemoError>(())
    })
}
