//! `fairgate mock-upstream`: runs a [`MockServer`] until SIGINT or SIGTERM.
//!
//! Invariants: prints exactly one line to stdout once listening (`mock upstream listening on
//! http://ADDR/v1`, `https://` with `--tls-cert`/`--tls-key`), so scripts can wait for it;
//! records no request logs (nobody could read them).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::{tls_acceptor, MockConfig, MockServer, Profile};

/// Flags of `fairgate mock-upstream`.
#[derive(Debug, Clone, clap::Args)]
pub struct MockArgs {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:9000")]
    pub listen: SocketAddr,
    /// Answer 429 with Retry-After beyond this many requests in flight (default: unlimited).
    #[arg(long)]
    pub max_concurrency: Option<usize>,
    /// Delay before every response head, in milliseconds.
    #[arg(long, default_value_t = 0)]
    pub base_latency_ms: u64,
    /// Delay per generated output token, in milliseconds.
    #[arg(long, default_value_t = 0)]
    pub per_token_ms: u64,
    /// Output tokens when a request does not choose.
    #[arg(long, default_value_t = 16)]
    pub output_tokens: u32,
    /// Retry-After sent with 429s, in seconds.
    #[arg(long, default_value_t = 1)]
    pub retry_after_secs: u64,
    /// Which provider's dialect to speak: compression, where usage is, rate-limit and retry
    /// headers (ideal: the plain OpenAI dialect of earlier versions).
    #[arg(long, value_enum, default_value_t = Profile::Ideal)]
    pub profile: Profile,
    /// Serve TLS (ALPN h2 and http/1.1) with this PEM certificate chain; needs --tls-key.
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}

impl MockArgs {
    /// The server configuration these flags describe.
    pub fn config(&self) -> MockConfig {
        MockConfig {
            max_concurrency: self.max_concurrency,
            retry_after: Duration::from_secs(self.retry_after_secs),
            base_latency: Duration::from_millis(self.base_latency_ms),
            per_token: Duration::from_millis(self.per_token_ms),
            default_output_tokens: self.output_tokens,
            record_requests: false,
            profile: self.profile,
            ..MockConfig::default()
        }
    }
}

/// Runs the mock upstream until SIGINT (or SIGTERM on Unix), then shuts it down.
pub async fn run_cli(args: MockArgs) -> Result<(), std::io::Error> {
    let server = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => {
            let acceptor = tls_acceptor(cert, key).map_err(std::io::Error::other)?;
            MockServer::start_tls(args.listen, args.config(), acceptor).await?
        }
        _ => MockServer::start(args.listen, args.config()).await?,
    };
    println!("mock upstream listening on {}", server.base_url());
    shutdown_signal().await?;
    server.shutdown().await;
    Ok(())
}

#[cfg(unix)]
async fn shutdown_signal() -> Result<(), std::io::Error> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r,
        _ = term.recv() => Ok(()),
    }
}

#[cfg(not(unix))]
async fn shutdown_signal() -> Result<(), std::io::Error> {
    tokio::signal::ctrl_c().await
}
