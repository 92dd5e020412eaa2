//! `fairgate demo`: the noisy-neighbor scenario, compressed to about half a minute, over real
//! HTTP, in one process — the bundled mock upstream with limited capacity, then fairgate twice
//! (FIFO, then DRR) in front of it. Prints per-tenant queue waits side by side and writes an SVG
//! chart. Then a second scene (`agent.rs`): a sequential agent beside a flood of closed loops,
//! alone / FIFO / DRR.
//!
//! Invariants: loopback only, port 0 everywhere; the workload is a fixed schedule (bounded in
//! count and time); every server it starts is shut down before it returns.

pub mod agent;
pub mod chart;
mod workload;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::config::Config;
use crate::server;
use fairgate_mock::{MockConfig, MockServer};

pub use workload::{Sample, Schedule};

/// Options of `fairgate demo`.
#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// Where to write the chart.
    #[arg(long, default_value = "fairgate-demo.svg")]
    pub chart: PathBuf,
    /// Scale the schedule's time (1.0 ≈ 25 s in all; smaller is faster, for tests).
    #[arg(long, default_value_t = 1.0)]
    pub time_scale: f64,
    /// The admin token of the live console whose URL the demo prints (default: a random one).
    #[arg(long)]
    pub console_token: Option<String>,
}

/// Why the demo could not run.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// A server failed to start.
    #[error("cannot start: {0}")]
    Start(String),
    /// The chart could not be written.
    #[error("cannot write the chart: {0}")]
    Chart(#[from] std::io::Error),
}

/// Pool size and mock latency of the demo: 4 slots × 250 ms = 16 requests/s.
const CAPACITY: usize = 4;
const SERVICE: Duration = Duration::from_millis(250);

/// Runs both policies and returns their samples (FIFO first).
pub async fn run(args: &DemoArgs) -> Result<(Vec<Sample>, Vec<Sample>), DemoError> {
    let scale = args.time_scale.clamp(0.05, 10.0);
    let mock = MockServer::start(
        SocketAddr::from(([127, 0, 0, 1], 0)),
        MockConfig {
            base_latency: SERVICE.mul_f64(scale),
            ..MockConfig::default()
        },
    )
    .await
    .map_err(|e| DemoError::Start(e.to_string()))?;
    let schedule = Schedule::noisy_neighbor(scale);
    println!(
        "fairgate demo: tenant A floods {} requests in {:.0} s; 10 small tenants send {} in all; \
         pool of {CAPACITY} slots, {:.0} ms per request.\n",
        schedule.flood_count(),
        schedule.flood_span().as_secs_f64(),
        schedule.small_count(),
        SERVICE.mul_f64(scale).as_secs_f64() * 1000.0
    );
    let token = args
        .console_token
        .clone()
        .unwrap_or_else(|| format!("demo-{:016x}", rand::random::<u64>()));
    let mut results = Vec::new();
    for policy in ["fifo", "drr"] {
        let config = Config::from_toml_str(&config_toml(&mock.base_url(), policy))
            .map_err(|e| DemoError::Start(e.to_string()))?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let env = server::Env::vars([(CONSOLE_TOKEN_ENV, token.as_str())]);
        let proxy = server::start_with_env(config, listener, env)
            .await
            .map_err(|e| DemoError::Start(e.to_string()))?;
        println!(
            "running {policy} … watch it live: http://{}/admin/ui#token={token}",
            proxy.addr
        );
        results.push(schedule.run(proxy.addr).await);
        proxy.shutdown();
        let _ = proxy.join().await;
    }
    let drr = results.pop().unwrap_or_default();
    let fifo = results.pop().unwrap_or_default();
    println!("\n{}", table(&fifo, &drr));
    mock.shutdown().await;
    let [alone, fifo_agent, drr_agent] = agent_scene(scale, &token).await?;
    println!("{}", agent::table(alone, fifo_agent, drr_agent));
    let svg = chart::svg(&[
        ("FIFO: one queue", &points(&fifo)),
        ("DRR: fair queue in tokens", &points(&drr)),
    ]);
    std::fs::write(&args.chart, svg)?;
    println!("chart written to {}", args.chart.display());
    Ok((fifo, drr))
}

/// The second scene (`agent.rs`) on a pool answering in 50 ms × scale: the agent alone, then
/// beside the flood under FIFO and under DRR, in that order.
pub async fn agent_scene(scale: f64, token: &str) -> Result<[agent::AgentRun; 3], DemoError> {
    let mock = MockServer::start(
        SocketAddr::from(([127, 0, 0, 1], 0)),
        MockConfig {
            base_latency: Duration::from_millis(50).mul_f64(scale),
            ..MockConfig::default()
        },
    )
    .await
    .map_err(|e| DemoError::Start(e.to_string()))?;
    let span = Duration::from_secs(4).mul_f64(scale);
    let mut runs = Vec::new();
    // Alone last: the first run also pays for warming the connections.
    for (policy, flood) in [("fifo", Some("A")), ("drr", Some("A")), ("drr", None)] {
        let config = Config::from_toml_str(&config_toml(&mock.base_url(), policy))
            .map_err(|e| DemoError::Start(e.to_string()))?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let env = server::Env::vars([(CONSOLE_TOKEN_ENV, token)]);
        let proxy = server::start_with_env(config, listener, env)
            .await
            .map_err(|e| DemoError::Start(e.to_string()))?;
        runs.push(agent::run(proxy.addr, "s1", flood, span).await);
        proxy.shutdown();
        let _ = proxy.join().await;
    }
    mock.shutdown().await;
    Ok([runs[2], runs[0], runs[1]])
}

/// The variable the demo's servers read their console token from (given to them directly,
/// never set in the process environment).
const CONSOLE_TOKEN_ENV: &str = "FAIRGATE_DEMO_CONSOLE_TOKEN";

fn config_toml(base_url: &str, policy: &str) -> String {
    let mut s = format!(
        "[admin]\ntoken_env = \"{CONSOLE_TOKEN_ENV}\"\n\
         [scheduler]\npolicy = \"{policy}\"\n\
         [[upstreams]]\nname = \"mock\"\nbase_url = \"{base_url}\"\nmax_concurrency = {CAPACITY}\n\
         [[tenants]]\nid = \"A\"\napi_keys = [\"demo-A\"]\n"
    );
    for i in 1..=10 {
        s += &format!("[[tenants]]\nid = \"s{i}\"\napi_keys = [\"demo-s{i}\"]\n");
    }
    s
}

fn points(samples: &[Sample]) -> Vec<chart::Point> {
    samples
        .iter()
        .map(|s| chart::Point {
            sent_s: s.sent.as_secs_f64(),
            wait_s: s.queue_wait.as_secs_f64(),
            small: s.tenant != "A",
        })
        .collect()
}

/// Queue-wait percentiles (seconds) of a group of samples: (count, p50, p95, max, errors).
pub fn summary(samples: &[Sample], small: bool) -> (usize, f64, f64, f64, usize) {
    let mut waits: Vec<f64> = samples
        .iter()
        .filter(|s| (s.tenant != "A") == small && s.ok)
        .map(|s| s.queue_wait.as_secs_f64())
        .collect();
    waits.sort_by(f64::total_cmp);
    let q = |p: f64| {
        waits
            .get(((waits.len().max(1) - 1) as f64 * p).round() as usize)
            .copied()
            .unwrap_or(0.0)
    };
    let errors = samples
        .iter()
        .filter(|s| (s.tenant != "A") == small && !s.ok)
        .count();
    (waits.len(), q(0.5), q(0.95), q(1.0), errors)
}

fn table(fifo: &[Sample], drr: &[Sample]) -> String {
    let mut out = format!(
        "{:<22} {:>26}   {:>26}\n{:<22} {:>8} {:>8} {:>8}   {:>8} {:>8} {:>8}\n",
        "queue wait (s)", "FIFO", "DRR", "tenant", "p50", "p95", "max", "p50", "p95", "max"
    );
    for (label, small) in [("A (flood)", false), ("10 small tenants", true)] {
        let (n, f50, f95, fmax, fe) = summary(fifo, small);
        let (_, d50, d95, dmax, de) = summary(drr, small);
        out += &format!(
            "{:<22} {f50:>8.2} {f95:>8.2} {fmax:>8.2}   {d50:>8.2} {d95:>8.2} {dmax:>8.2}\n",
            format!("{label} ({n})")
        );
        if fe + de > 0 {
            out += &format!("  errors: fifo {fe}, drr {de}\n");
        }
    }
    out
}
