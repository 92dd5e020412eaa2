//! OpenTelemetry trace export (`[otel] endpoint`): one span per request (`fairgate.request`,
//! the child of the client's `traceparent` span when it sent one) with child spans
//! `fairgate.estimate`, `fairgate.queue` and `fairgate.upstream` (whose id is the parent the
//! provider is sent in `traceparent`), built from the timestamps the request's context already
//! holds, and exported as OTLP/HTTP JSON (`POST endpoint/v1/traces`).
//!
//! Why not the `opentelemetry-otlp` crate: its HTTP exporter needs `opentelemetry-proto` and
//! `prost` (protobuf) plus `opentelemetry-http`, and its batch processor exports from a thread
//! of its own by blocking on the exporter's future (no tokio runtime there for our hyper
//! client) unless an experimental runtime feature is on. OTLP/HTTP accepts JSON, which
//! `serde_json` already writes: this module is the small part of an SDK fairgate needs.
//!
//! Invariants: nothing here is on a request's path but one `try_send` when its body is done
//! (in the metrics stage's `Done`); the queue is bounded (`max_queued` requests): when full a
//! request's spans are dropped and counted (`fairgate_otel_dropped_total`), never waited for;
//! an export is bounded by `timeout_ms` and a failed one drops its batch (counted,
//! `fairgate_otel_failed_total`, one `warn` per run of failures). Attributes are the tenant id,
//! the model (its bounded metrics label), estimated and actual tokens, the status, the limit
//! and reason that refused the request, retries and the queue wait: never a key, a header
//! value, a prompt or a completion. A client's trace with the sampled flag off is not exported.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Uri};
use http_body_util::{BodyExt, Full};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::config::OtelConfig;
use crate::context::Context;

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
}

/// One finished span.
#[derive(Debug, Clone, PartialEq)]
pub struct Span {
    /// Name.
    pub name: &'static str,
    /// OTLP span kind (1 internal, 2 server, 3 client).
    pub kind: u8,
    /// Trace id.
    pub trace_id: [u8; 16],
    /// Span id.
    pub span_id: [u8; 8],
    /// Parent span id.
    pub parent: Option<[u8; 8]>,
    /// Start, Unix ns.
    pub start: u64,
    /// End, Unix ns.
    pub end: u64,
    /// Attributes (string or integer values).
    pub attributes: Vec<(&'static str, Value)>,
    /// An error status (5xx, or a refusal).
    pub error: bool,
}

/// The spans of one request, from its context: the request span and whichever stages it
/// reached. Empty when the client's trace is not sampled.
pub fn spans(ctx: &Context, end: &Ending<'_>) -> Vec<Span> {
    let trace = ctx.trace();
    if !trace.sampled {
        return Vec::new();
    }
    let started = ctx.started();
    let ns = |at: Instant| trace.unix_nanos(started, at);
    let mut attrs: Vec<(&'static str, Value)> =
        vec![("http.response.status_code", json!(end.status))];
    if let Some(id) = ctx.identity_if_known() {
        attrs.push(("fairgate.tenant", json!(id.tenant.id.as_str())));
    }
    if let Some(m) = end.model {
        attrs.push(("gen_ai.request.model", json!(m)));
    }
    if let Some(e) = end.estimated {
        attrs.push(("fairgate.tokens.estimated", json!(e)));
    }
    if let Some(a) = end.actual {
        attrs.push(("fairgate.tokens.actual", json!(a)));
    }
    if let Some(l) = end.limit {
        attrs.push(("fairgate.limit", json!(l)));
    }
    if let Some(r) = end.refused {
        attrs.push(("fairgate.refused", json!(r)));
    }
    let error = end.status >= 500 || end.refused.is_some();
    let child = |name, kind, span_id, start: Instant, stop: Instant, attributes| Span {
        name,
        kind,
        trace_id: trace.trace_id,
        span_id,
        parent: Some(trace.span),
        start: ns(start),
        end: ns(stop.max(start)),
        attributes,
        error: false,
    };
    let mut out = Vec::with_capacity(4);
    if let Some((began, ended)) = ctx.estimated_span() {
        let mut a = Vec::new();
        if let Some(e) = ctx.estimate_if_counted() {
            a.push(("fairgate.tokens.input", json!(e.input.tokens)));
        }
        out.push(child("fairgate.estimate", 1, random_id(), began, ended, a));
    }
    if let Some(d) = ctx.dispatch() {
        let queued = d.at.checked_sub(d.waited).unwrap_or(d.at);
        out.push(child(
            "fairgate.queue",
            1,
            random_id(),
            queued,
            d.at,
            vec![("fairgate.queue_ms", json!(d.waited.as_millis() as u64))],
        ));
        out.push(child(
            "fairgate.upstream",
            3,
            trace.upstream_span,
            d.at,
            end.at,
            vec![("fairgate.retries", json!(ctx.retries()))],
        ));
    }
    out.push(Span {
        name: "fairgate.request",
        kind: 2,
        trace_id: trace.trace_id,
        span_id: trace.span,
        parent: trace.parent,
        start: ns(started),
        end: ns(end.at.max(started)),
        attributes: attrs,
        error,
    });
    out
}

fn random_id() -> [u8; 8] {
    rand::random::<u64>().max(1).to_be_bytes()
}

/// OTLP/JSON `ExportTraceServiceRequest` of `spans`.
pub fn encode(service: &str, spans: &[Span]) -> Value {
    let spans: Vec<Value> = spans
        .iter()
        .map(|s| {
            let attributes: Vec<Value> = s
                .attributes
                .iter()
                .map(|(k, v)| {
                    let value = match v {
                        Value::Number(n) if n.is_u64() || n.is_i64() => {
                            json!({ "intValue": n.to_string() })
                        }
                        Value::String(x) => json!({ "stringValue": x }),
                        other => json!({ "stringValue": other.to_string() }),
                    };
                    json!({ "key": k, "value": value })
                })
                .collect();
            let mut span = json!({
                "traceId": hex::encode(s.trace_id),
                "spanId": hex::encode(s.span_id),
                "name": s.name,
                "kind": s.kind,
                "startTimeUnixNano": s.start.to_string(),
                "endTimeUnixNano": s.end.to_string(),
                "attributes": attributes,
                "status": { "code": if s.error { 2 } else { 0 } },
            });
            if let Some(p) = s.parent {
                span["parentSpanId"] = json!(hex::encode(p));
            }
            span
        })
        .collect();
    json!({
        "resourceSpans": [{
            "resource": { "attributes": [
                { "key": "service.name", "value": { "stringValue": service } },
            ] },
            "scopeSpans": [{
                "scope": { "name": "fairgate", "version": env!("CARGO_PKG_VERSION") },
                "spans": spans,
            }],
        }],
    })
}

type HttpClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// The bounded export queue and its loop; see the module docs.
pub struct Exporter {
    tx: mpsc::Sender<Vec<Span>>,
    rx: Mutex<Option<mpsc::Receiver<Vec<Span>>>>,
    url: Uri,
    service: String,
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
    /// `None` when `[otel] endpoint` is not set.
    pub fn new(cfg: &OtelConfig, counters: Counters) -> Option<Arc<Self>> {
        let endpoint = cfg.endpoint.as_deref()?;
        let url: Uri = format!("{}/v1/traces", endpoint.trim_end_matches('/'))
            .parse()
            .ok()?;
        let (tx, rx) = mpsc::channel(cfg.max_queued);
        Some(Arc::new(Self {
            tx,
            rx: Mutex::new(Some(rx)),
            url,
            service: cfg.service_name.clone(),
            max_batch: cfg.max_batch,
            interval: Duration::from_millis(cfg.export_interval_ms),
            timeout: Duration::from_millis(cfg.timeout_ms),
            counters,
            dropped: AtomicU64::new(0),
            failing: AtomicBool::new(false),
        }))
    }

    /// Queues the spans of a finished request (never waits: a full queue drops them, counted).
    pub fn emit(&self, ctx: &Context, end: &Ending<'_>) {
        let spans = spans(ctx, end);
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
        let Some(mut rx) = self.rx.lock().unwrap_or_else(|p| p.into_inner()).take() else {
            return;
        };
        let client: HttpClient = Client::builder(TokioExecutor::new()).build(
            HttpsConnectorBuilder::new()
                .with_webpki_roots()
                .https_or_http()
                .enable_http1()
                .build(),
        );
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
                    let spans: Vec<Span> = batch.into_iter().flatten().collect();
                    self.export(&client, &spans).await;
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

    async fn export(&self, client: &HttpClient, spans: &[Span]) {
        let body = serde_json::to_vec(&encode(&self.service, spans)).unwrap_or_default();
        let mut req = Request::new(Full::new(Bytes::from(body)));
        *req.method_mut() = http::Method::POST;
        *req.uri_mut() = self.url.clone();
        req.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        let call = async {
            let res = client.request(req).await.map_err(|e| e.to_string())?;
            let status = res.status();
            // Read (bounded by the timeout) so the connection can be reused.
            let _ = res.into_body().collect().await;
            if status.is_success() {
                Ok(())
            } else {
                Err(format!("collector answered {status}"))
            }
        };
        let n = spans.len() as u64;
        let result = match tokio::time::timeout(self.timeout, call).await {
            Ok(r) => r,
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
mod tests {
    use super::*;

    #[test]
    fn spans_encode_as_otlp_json_with_hex_ids_and_typed_attributes() {
        let s = Span {
            name: "fairgate.request",
            kind: 2,
            trace_id: [0xab; 16],
            span_id: [0x01; 8],
            parent: Some([0x02; 8]),
            start: 1,
            end: 2,
            attributes: vec![("fairgate.tenant", json!("a")), ("n", json!(5u64))],
            error: true,
        };
        let v = encode("svc", &[s]);
        let span = &v["resourceSpans"][0]["scopeSpans"][0]["spans"][0];
        assert_eq!(span["traceId"], "abababababababababababababababab");
        assert_eq!(span["parentSpanId"], "0202020202020202");
        assert_eq!(span["startTimeUnixNano"], "1");
        assert_eq!(span["attributes"][0]["value"]["stringValue"], "a");
        assert_eq!(span["attributes"][1]["value"]["intValue"], "5");
        assert_eq!(span["status"]["code"], 2);
        assert_eq!(
            v["resourceSpans"][0]["resource"]["attributes"][0]["value"]["stringValue"],
            "svc"
        );
    }

    #[tokio::test]
    async fn a_full_queue_drops_and_counts_instead_of_waiting() {
        let cfg = OtelConfig {
            endpoint: Some("http://127.0.0.1:9".into()),
            max_queued: 2,
            ..OtelConfig::default()
        };
        let counters = Counters {
            dropped: metrics::Counter::noop(),
            exported: metrics::Counter::noop(),
            failed: metrics::Counter::noop(),
        };
        let x = Exporter::new(&cfg, counters).unwrap();
        let ctx = crate::context::Ctx::new();
        let end = Ending {
            at: Instant::now(),
            status: 200,
            limit: None,
            refused: None,
            model: None,
            estimated: None,
            actual: None,
        };
        // Nothing exports (the loop is not running): 2 queued, 3 dropped.
        for _ in 0..5 {
            x.emit(&ctx, &end);
        }
        assert_eq!(x.dropped(), 3);
    }

    #[test]
    fn an_unsampled_client_trace_is_not_exported() {
        let ctx = crate::context::Ctx::with_ids(
            None,
            Some(&http::HeaderValue::from_static(
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",
            )),
        );
        let end = Ending {
            at: Instant::now(),
            status: 200,
            limit: None,
            refused: None,
            model: None,
            estimated: None,
            actual: None,
        };
        assert!(spans(&ctx, &end).is_empty());
        let sampled = crate::context::Ctx::new();
        let s = spans(&sampled, &end);
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].parent, None);
    }
}
