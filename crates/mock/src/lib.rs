//! The bundled OpenAI-compatible mock upstream, used by tests, benchmarks and the demo.
//!
//! Serves `/v1/chat/completions`, `/v1/completions` (JSON and SSE), `/v1/embeddings`,
//! `/v1/responses` (JSON and SSE), `/v1/models` and `/healthz` over HTTP/1.1 and h2c, or over
//! TLS with ALPN `h2` / `http/1.1` ([`MockServer::start_tls`]). Every completion carries a
//! deterministic `usage`; the output length and failures are chosen per request with `x-mock-*`
//! headers (see `request.rs`) so tests can make actual cost differ from estimates, time out, see
//! 5xx/429, or have a stream cut mid-way. [`MockConfig::profile`] picks which real provider's
//! dialect it speaks (compression, where usage is, rate-limit and retry headers; see `profile.rs`).
//!
//! Per-request knobs:
//! - output length: header `x-mock-output-tokens: N`, else body `"mock_output_tokens": N`, else
//!   `max_tokens` / `max_completion_tokens` / `max_output_tokens` (capped at [`MAX_TOKENS_CAP`]),
//!   else [`MockConfig::default_output_tokens`]; always at most `max_tokens` when given.
//! - `x-mock-delay-ms: N` extra delay before the head; `x-mock-token-delay-ms: N` replaces
//!   [`MockConfig::per_token`]; `x-mock-status: N` answers N with an OpenAI-shaped error (429s
//!   carry the retry headers); `x-mock-abort-after: N` sends at most N SSE frames (never the
//!   last) then cuts the connection (counted in [`MockStats::aborted`], not `cancelled`);
//!   `x-mock-error-after: N` ends a stream after N tokens with an error event (no `[DONE]`);
//!   `x-mock-usage: omit` sends a complete stream without usage, whatever the profile.
//!
//! Prompt tokens are ceil(bytes of message content / prompt / input text ÷ 4), at least 1.
//!
//! Invariants:
//! - Binds exactly the address given; [`MockServer::start`] returns once it is listening.
//! - Beyond `max_concurrency` admitted requests in flight, refuses (429; 503 in the `vllm`
//!   profile; after reading the body and a delay in `rough`) and never counts the refused request
//!   as in flight.
//! - Dropping the [`MockServer`] or calling [`MockServer::shutdown`] stops accepting and closes
//!   every open connection; the counters in [`MockStats`] stay readable afterwards.

mod body;
mod cli;
mod dialect;
mod encoding;
mod envelope;
mod format;
mod handlers;
mod limits;
mod profile;
mod reply;
mod request;
mod sse;
mod stats;
#[cfg(test)]
mod tests;
mod tls;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;

pub use body::MockBody;
pub use cli::{run_cli, MockArgs};
pub use encoding::Encoding;
pub use limits::{go_duration, LIMIT_REQUESTS, LIMIT_TOKENS};
pub use profile::{Profile, ROUGH_REJECT_DELAY};
pub use reply::{DEFAULT_EMBEDDING_DIMS, MAX_BODY_BYTES};
pub use request::{HARD_CAP, MAX_TOKENS_CAP};
pub use stats::{MockStats, SEEN_CAPACITY};
pub use tls::tls_acceptor;

/// How the mock behaves; per-request `x-mock-*` headers override parts of it.
#[derive(Debug, Clone)]
pub struct MockConfig {
    /// Beyond this many requests in flight: 429 with `Retry-After`. `None`: unlimited.
    pub max_concurrency: Option<usize>,
    /// Sent as `Retry-After` (seconds, rounded up, min 1) and `retry-after-ms` on 429.
    pub retry_after: Duration,
    /// Delay before the response head.
    pub base_latency: Duration,
    /// Delay per generated output token (streaming: before each token chunk).
    pub per_token: Duration,
    /// Output tokens when the request does not choose.
    pub default_output_tokens: u32,
    /// Served by `/v1/models`; the first is the model echoed when a request names none.
    pub models: Vec<String>,
    /// Keep the `seen_*` logs of [`MockStats`] (the CLI turns this off: nobody can read them).
    pub record_requests: bool,
    /// The provider dialect (default [`Profile::Ideal`]: the mock as it always was).
    pub profile: Profile,
}

impl Default for MockConfig {
    fn default() -> Self {
        MockConfig {
            max_concurrency: None,
            retry_after: Duration::from_secs(1),
            base_latency: Duration::ZERO,
            per_token: Duration::ZERO,
            default_output_tokens: 16,
            models: ["gpt-4o-mini", "gpt-4o", "text-embedding-3-small"]
                .map(String::from)
                .into(),
            record_requests: true,
            profile: Profile::Ideal,
        }
    }
}

/// A running mock upstream; dropping it stops it.
#[derive(Debug)]
pub struct MockServer {
    /// The bound address (the real port when started on port 0).
    pub addr: SocketAddr,
    /// Live counters and request logs.
    pub stats: Arc<MockStats>,
    scheme: &'static str,
    stop: watch::Sender<()>,
    accept: JoinHandle<()>,
}

impl MockServer {
    /// Binds `listen` (port 0 picks a free port) and spawns the accept loop on the current runtime.
    pub async fn start(listen: SocketAddr, cfg: MockConfig) -> std::io::Result<MockServer> {
        Self::start_inner(listen, cfg, None).await
    }

    /// Like [`start`](Self::start), over TLS with `acceptor` (see [`tls_acceptor`]).
    pub async fn start_tls(
        listen: SocketAddr,
        cfg: MockConfig,
        acceptor: TlsAcceptor,
    ) -> std::io::Result<MockServer> {
        Self::start_inner(listen, cfg, Some(acceptor)).await
    }

    async fn start_inner(
        listen: SocketAddr,
        cfg: MockConfig,
        tls: Option<TlsAcceptor>,
    ) -> std::io::Result<MockServer> {
        let listener = TcpListener::bind(listen).await?;
        let addr = listener.local_addr()?;
        let stats = Arc::new(MockStats::default());
        let shared = Arc::new(reply::Shared::new(cfg, Arc::clone(&stats)));
        let (stop, stopped) = watch::channel(());
        let scheme = if tls.is_some() { "https" } else { "http" };
        let accept = tokio::spawn(accept_loop(listener, shared, tls, stopped));
        Ok(MockServer {
            addr,
            stats,
            scheme,
            stop,
            accept,
        })
    }

    /// The OpenAI base URL of this mock, e.g. `http://127.0.0.1:PORT/v1` (`https://` over TLS).
    pub fn base_url(&self) -> String {
        format!("{}://{}/v1", self.scheme, self.addr)
    }

    /// Stops accepting, closes open connections, and waits for the accept loop to end.
    pub async fn shutdown(self) {
        let MockServer { stop, accept, .. } = self;
        drop(stop);
        // The loop only ends by the stop signal; a panic in it is not ours to re-raise here.
        let _ = accept.await;
    }
}

async fn accept_loop(
    listener: TcpListener,
    shared: Arc<reply::Shared>,
    tls: Option<TlsAcceptor>,
    mut stopped: watch::Receiver<()>,
) {
    let builder = Arc::new(auto::Builder::new(TokioExecutor::new()));
    loop {
        let (tcp, _peer) = tokio::select! {
            _ = stopped.changed() => return,
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                // Transient (e.g. EMFILE): back off briefly instead of spinning.
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                }
            },
        };
        let _ = tcp.set_nodelay(true);
        let shared = Arc::clone(&shared);
        let builder = Arc::clone(&builder);
        let mut stopped = stopped.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let serve = async {
                match tls {
                    // A failed handshake only ends this connection.
                    Some(tls) => {
                        if let Ok(stream) = tls.accept(tcp).await {
                            serve(&builder, shared, stream).await;
                        }
                    }
                    None => serve(&builder, shared, tcp).await,
                }
            };
            tokio::select! {
                _ = serve => {}
                _ = stopped.changed() => {}
            }
        });
    }
}

/// Serves one connection (HTTP/1.1 or h2, by preface) until it ends.
async fn serve<IO>(builder: &auto::Builder<TokioExecutor>, shared: Arc<reply::Shared>, io: IO)
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |req| envelope::handle(Arc::clone(&shared), req));
    let _ = builder.serve_connection(TokioIo::new(io), service).await;
}
