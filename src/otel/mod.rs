//! OpenTelemetry trace export (`[otel] endpoint`, or the standard `OTEL_*` variables:
//! `settings`): one server span per request, named `{gen_ai.operation.name}
//! {gen_ai.request.model}` as OpenTelemetry's GenAI conventions name it (the child of the
//! client's `traceparent` span when it sent one), with child spans `fairgate.estimate`,
//! `fairgate.queue` and the GenAI client span of the upstream call (same name; its id is the
//! parent the provider is sent in `traceparent`), built from the timestamps the request's
//! context already holds (`spans`, attribute names in `semconv`), for the requests the
//! sampler records (`Sampler`, decided once in the metrics stage), and exported as OTLP/HTTP
//! JSON (`POST endpoint/v1/traces`).
//!
//! What is used: the `opentelemetry` crates' types and encoder — `opentelemetry_sdk`'s
//! `SpanData`, ids, `Resource`, and `opentelemetry-otlp`'s `SpanExporter` (HTTP, `http-json`,
//! default features off: no reqwest, no tonic), over `client::Client`, an
//! `opentelemetry_http::HttpClient` on fairgate's own hyper + rustls. Not used: the SDK's
//! tracer and `BatchSpanProcessor` — the spans exist only when the request's body is done, and
//! the processor exports from a thread of its own (blocking it on the export future) with a
//! queue that cannot be told apart from ours in the metrics; this module keeps its own bounded
//! queue and export task instead. `http-json` over `http-proto`: the same crates but
//! `const-hex`, the same wire format fairgate always sent (and `tests/e2e/otel.rs` reads), the
//! collector's answer readable in a log. The SDK's `TraceContextPropagator` is not used to read
//! `traceparent` (`context::Trace` does): it accepts ids shorter than 32/16 hex digits.
//! The exporter's own retries are off (`RetryPolicy::disabled`): without its `tokio` feature
//! it sleeps between them with `std::thread::sleep`, which would block a runtime worker.
//!
//! Invariants: nothing here is on a request's path but one `try_send` when its body is done
//! (in the metrics stage's `Done`); the queue is bounded (`max_queued` requests): when full a
//! request's spans are dropped and counted (`fairgate_otel_dropped_total`), never waited for;
//! an export is bounded by `timeout_ms` and a failed one drops its batch (counted,
//! `fairgate_otel_failed_total`, one `warn` per run of failures). Attributes are the tenant id,
//! the model (its bounded metrics label), estimated and actual tokens, the status, the limit
//! and reason that refused the request, retries and the queue wait: never a key, a header
//! value, a prompt or a completion. A client's trace with the sampled flag off is not exported.

mod client;
pub mod semconv;
mod settings;
mod spans;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry::InstrumentationScope;
use opentelemetry_otlp::{Protocol, RetryPolicy, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::{SpanData, SpanExporter as _};
use opentelemetry_sdk::Resource;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::config::OtelConfig;
use crate::context::Context;
pub use client::Client;
pub use settings::{Sampler, Settings};
pub use spans::spans;

/// The counters of the exporter (registered by the metrics registry).
pub struct Counters {
    /// Requests whose spans were dropped because the queue was full.
    pub dropped: metrics::Counter,
    /// Spans exported (accepted by the collector).
    pub exported: metrics::Counter,
    /// Spans lost to a failed export call.
    pub failed: metrics::Counter,
}

/// How a request ended, as the metrics stage saw it.
#[derive(Debug, Clone, Copy)]
pub struct Ending<'a> {
    /// When its body was done.
    pub at: Instant,
    /// Status sent.
    pub status: u16,
    /// The limit that refused it (`tenant`, `queue`, `upstream`).
    pub limit: Option<&'static str>,
    /// Why it was refused (the metrics reason).
    pub refused: Option<&'static str>,
    /// The model, as labelled (bounded).
    pub model: Option<&'a str>,
    /// Admission's estimate, raw tokens.
    pub estimated: Option<u64>,
    /// The reconciled usage, raw tokens.
    pub actual: Option<u64>,
    /// The GenAI endpoint it was for (`gen_ai.operation.name`), if one.
    pub endpoint: Option<crate::context::Endpoint>,
    /// The request's method.
    pub method: &'a http::Method,
    /// `error.type`: why fairgate refused or cut it, or the failing status passed on.
    pub error: Option<&'static str>,
    /// The server behind the routed pool (`gen_ai.provider.name`, `server.*`).
    pub peer: Option<&'a semconv::Peer>,
}

/// The bounded export queue and its loop; see the module docs.
pub struct Exporter {
    tx: mpsc::Sender<Vec<SpanData>>,
    /// Taken by the one export loop.
    parts: Mutex<
        Option<(
            mpsc::Receiver<Vec<SpanData>>,
            opentelemetry_otlp::SpanExporter,
        )>,
    >,
    url: String,
    sampler: Sampler,
    scope: InstrumentationScope,
    max_batch: usize,
    interval: Duration,
    timeout: Duration,
    counters: Counters,
    dropped: AtomicU64,
    failing: AtomicBool,
}

impl std::fmt::Debug for Exporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exporter")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl Exporter {
    /// `None` when neither `[otel] endpoint` nor the environment names a collector
    /// ([`Settings::resolve`]). The OTLP exporter reads `OTEL_EXPORTER_OTLP_HEADERS` /
    /// `OTEL_EXPORTER_OTLP_TRACES_HEADERS` (e.g. a collector's auth header) itself.
    pub fn new(
        cfg: &OtelConfig,
        env: &dyn Fn(&str) -> Option<String>,
        counters: Counters,
    ) -> Option<Arc<Self>> {
        let cfg = Settings::resolve(cfg, env)?;
        let url = cfg.url.clone();
        let timeout = Duration::from_millis(cfg.timeout_ms);
        let built = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpJson)
            .with_endpoint(url.clone())
            .with_timeout(timeout)
            .with_http_client(Client::new(timeout))
            .with_retry_policy(RetryPolicy::disabled())
            .build();
        let mut otlp = match built {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(error = %e, "otel: cannot export to {url}; spans are not exported");
                return None;
            }
        };
        otlp.set_resource(
            &Resource::builder_empty()
                .with_service_name(cfg.service_name.clone())
                .with_attributes(
                    cfg.resource
                        .iter()
                        .map(|(k, v)| opentelemetry::KeyValue::new(k.clone(), v.clone())),
                )
                .build(),
        );
        let (tx, rx) = mpsc::channel(cfg.max_queued);
        Some(Arc::new(Self {
            tx,
            parts: Mutex::new(Some((rx, otlp))),
            url,
            sampler: cfg.sampler,
            scope: InstrumentationScope::builder("fairgate")
                .with_version(env!("CARGO_PKG_VERSION"))
                .build(),
            max_batch: cfg.max_batch,
            interval: Duration::from_millis(cfg.export_interval_ms),
            timeout,
            counters,
            dropped: AtomicU64::new(0),
            failing: AtomicBool::new(false),
        }))
    }

    /// Whether a request of `trace` is recorded (see [`Sampler`]).
    pub fn sample(&self, trace: &crate::context::Trace) -> bool {
        self.sampler.sample(trace)
    }

    /// Queues the spans of a finished, recorded request (never waits: a full queue drops them,
    /// counted). An unrecorded request costs nothing here.
    pub fn emit(&self, ctx: &Context, end: &Ending<'_>) {
        if !ctx.recorded() {
            return;
        }
        let spans = spans(ctx, end, &self.scope);
        if spans.is_empty() {
            return;
        }
        if self.tx.try_send(spans).is_err() {
            self.counters.dropped.increment(1);
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Requests whose spans were dropped (queue full) so far.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// The export loop (one per exporter; a second call returns at once): every
    /// `export_interval_ms`, up to `max_batch` requests per call, until `stop`, then a last
    /// flush of what is queued.
    pub async fn run(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let taken = self.parts.lock().unwrap_or_else(|p| p.into_inner()).take();
        let Some((mut rx, otlp)) = taken else {
            return;
        };
        let mut tick = tokio::time::interval(self.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let stopping = tokio::select! {
                _ = tick.tick() => false,
                r = stop.changed() => r.is_err() || *stop.borrow(),
            };
            loop {
                let mut batch = Vec::new();
                while batch.len() < self.max_batch {
                    match rx.try_recv() {
                        Ok(spans) => batch.push(spans),
                        Err(_) => break,
                    }
                }
                let full = batch.len() == self.max_batch;
                if !batch.is_empty() {
                    let spans: Vec<SpanData> = batch.into_iter().flatten().collect();
                    self.export(&otlp, spans).await;
                }
                if !full {
                    break;
                }
            }
            if stopping {
                return;
            }
        }
    }

    async fn export(&self, otlp: &opentelemetry_otlp::SpanExporter, spans: Vec<SpanData>) {
        let n = spans.len() as u64;
        // The client bounds each call by `timeout`; this bounds the exporter's work around it.
        let result = match tokio::time::timeout(self.timeout, otlp.export(spans)).await {
            Ok(r) => r.map_err(|e| e.to_string()),
            Err(_) => Err(format!("no answer within {:?}", self.timeout)),
        };
        match result {
            Ok(()) => {
                self.counters.exported.increment(n);
                if self.failing.swap(false, Ordering::Relaxed) {
                    tracing::info!("otel: the collector accepts spans again");
                }
            }
            Err(why) => {
                self.counters.failed.increment(n);
                if !self.failing.swap(true, Ordering::Relaxed) {
                    tracing::warn!(error = %why, "otel: span export failed; dropping the batch");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
