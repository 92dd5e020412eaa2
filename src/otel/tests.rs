use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::Full;
use opentelemetry::trace::{SpanId, SpanKind, Status, TraceId};
use opentelemetry::Value;
use opentelemetry_http::HttpClient;

use super::*;

const CLIENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

fn counters() -> Counters {
    Counters {
        dropped: metrics::Counter::noop(),
        exported: metrics::Counter::noop(),
        failed: metrics::Counter::noop(),
    }
}

fn ending() -> Ending<'static> {
    Ending {
        at: Instant::now(),
        status: 200,
        limit: None,
        refused: None,
        model: None,
        estimated: None,
        actual: None,
        endpoint: None,
        method: &http::Method::POST,
        error: None,
        peer: None,
    }
}

/// The default sampler (parent-based, always on) decides for `ctx`, as the metrics stage does.
fn sampled(ctx: crate::context::Ctx) -> crate::context::Ctx {
    let on = Sampler {
        parent_based: true,
        ratio: 1.0,
    };
    ctx.set_recorded(on.sample(ctx.trace()));
    ctx
}

fn scope() -> InstrumentationScope {
    InstrumentationScope::builder("fairgate").build()
}

fn attr<'a>(s: &'a SpanData, key: &str) -> Option<&'a Value> {
    s.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| &kv.value)
}

#[test]
fn the_request_span_continues_the_client_span_and_names_the_refusal() {
    let ctx = sampled(crate::context::Ctx::with_ids(
        None,
        Some(&http::HeaderValue::from_static(CLIENT)),
    ));
    let end = Ending {
        status: 429,
        limit: Some("tenant"),
        refused: Some("rate_limited"),
        model: Some("gpt-4o-mini"),
        estimated: Some(42),
        actual: Some(7),
        endpoint: Some(crate::context::Endpoint::Chat),
        error: Some("rate_limited"),
        ..ending()
    };
    let spans = spans(&ctx, &end, &scope());
    assert_eq!(spans.len(), 1, "no stage reached: the request span only");
    let r = &spans[0];
    assert_eq!(r.name, "chat gpt-4o-mini");
    assert_eq!(attr(r, "gen_ai.operation.name"), Some(&Value::from("chat")));
    assert_eq!(
        attr(r, "gen_ai.provider.name"),
        Some(&Value::from("openai"))
    );
    assert_eq!(attr(r, "error.type"), Some(&Value::from("rate_limited")));
    assert_eq!(attr(r, "http.request.method"), Some(&Value::from("POST")));
    assert_eq!(r.span_kind, SpanKind::Server);
    assert_eq!(
        r.span_context.trace_id(),
        TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap()
    );
    assert_eq!(
        r.parent_span_id,
        SpanId::from_hex("00f067aa0ba902b7").unwrap()
    );
    assert!(r.parent_span_is_remote);
    assert_eq!(r.span_context.span_id().to_bytes(), ctx.trace().span);
    assert!(r.start_time <= r.end_time);
    assert_eq!(attr(r, "fairgate.limit"), Some(&Value::from("tenant")));
    assert_eq!(
        attr(r, "gen_ai.request.model"),
        Some(&Value::from("gpt-4o-mini"))
    );
    assert_eq!(attr(r, "fairgate.tokens.estimated"), Some(&Value::I64(42)));
    assert_eq!(attr(r, "fairgate.tokens.actual"), Some(&Value::I64(7)));
    assert_eq!(attr(r, "http.response.status_code"), Some(&Value::I64(429)));
    assert!(matches!(r.status, Status::Error { .. }), "{:?}", r.status);
}

#[test]
fn an_unsampled_client_trace_is_not_exported() {
    let ctx = sampled(crate::context::Ctx::with_ids(
        None,
        Some(&http::HeaderValue::from_static(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",
        )),
    ));
    assert!(spans(&ctx, &ending(), &scope()).is_empty());
    let new = sampled(crate::context::Ctx::new());
    let s = spans(&new, &ending(), &scope());
    assert_eq!(s[0].name, "POST", "no GenAI endpoint: the method");
    assert_eq!(s.len(), 1);
    assert_eq!(s[0].parent_span_id, SpanId::INVALID);
    assert!(!s[0].parent_span_is_remote);
    assert_eq!(s[0].status, Status::Unset);
}

#[tokio::test]
async fn a_full_queue_drops_and_counts_instead_of_waiting() {
    let cfg = OtelConfig {
        endpoint: Some("http://127.0.0.1:9".into()),
        max_queued: Some(2),
        ..OtelConfig::default()
    };
    let x = Exporter::new(&cfg, &|_| None, counters()).unwrap();
    let ctx = crate::context::Ctx::new();
    ctx.set_recorded(true);
    // Nothing exports (the loop is not running): 2 queued, 3 dropped.
    for _ in 0..5 {
        x.emit(&ctx, &ending());
    }
    assert_eq!(x.dropped(), 3);
}

/// A collector on 127.0.0.1:0 answering `status` to every request (`None`: never answering).
async fn collector(status: Option<u16>) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |_req| async move {
                    match status {
                        Some(s) => Ok::<_, Infallible>(
                            http::Response::builder()
                                .status(s)
                                .body(Full::new(Bytes::from_static(b"{}")))
                                .unwrap(),
                        ),
                        None => std::future::pending().await,
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    addr
}

fn post(addr: std::net::SocketAddr) -> http::Request<Bytes> {
    http::Request::post(format!("http://{addr}/v1/traces"))
        .body(Bytes::from_static(b"{}"))
        .unwrap()
}

/// The SDK may poll the exporter's future on a thread of its own: the call then runs on the
/// runtime captured when the client was made.
#[test]
fn a_call_polled_outside_a_runtime_runs_on_the_captured_one() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let addr = rt.block_on(collector(Some(200)));
    let client = rt.block_on(async { Client::new(Duration::from_secs(30)) });
    assert!(tokio::runtime::Handle::try_current().is_err());
    let res = futures_executor::block_on(client.send_bytes(post(addr))).unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.body().as_ref(), b"{}");
}

#[tokio::test]
async fn a_collector_that_never_answers_fails_the_call_at_the_timeout() {
    let addr = collector(None).await;
    let client = Client::new(Duration::from_millis(50));
    // The outer bound only keeps a broken client from hanging the test.
    let err = tokio::time::timeout(Duration::from_secs(30), client.send_bytes(post(addr)))
        .await
        .expect("the client's own timeout ends the call")
        .unwrap_err();
    assert!(err.to_string().contains("no answer within"), "{err}");
    let addr = collector(Some(503)).await;
    let res = client.send_bytes(post(addr)).await.unwrap();
    assert_eq!(
        res.status(),
        503,
        "a status is an answer; the exporter judges it"
    );
}
