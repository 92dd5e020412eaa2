//! OpenTelemetry end to end: fairgate with `[otel] endpoint` pointing at an OTLP/HTTP receiver
//! started here (a small hyper server on 127.0.0.1:0 collecting `POST /v1/traces` bodies), in
//! front of the mock upstream.
//!
//! (a) a request carrying the client's `traceparent` is reported as a server span named
//! `chat gpt-4o-mini` (OpenTelemetry's GenAI `{operation} {model}`) of that trace whose parent
//! is the client's span, with children `fairgate.estimate`, `fairgate.queue` and the GenAI
//! client span of the upstream call (the same name, kind CLIENT), and attributes tenant, model,
//! estimated and actual tokens; the provider is sent a `traceparent` of the same trace whose
//! parent is the client span; (b) a request refused by the tenant's rate limit carries
//! `fairgate.limit = tenant`; (c) no exported byte holds a key or the prompt. Loops are bounded;
//! no assertion is on wall-clock time.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::*;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::Value;

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";
const TRACE_B: &str = "0af7651916cd43dd8448eb211c80319c";
const PROMPT: &str = "PROMPT-NEVER-EXPORTED-91";

/// The GenAI span name of the test's requests (server and client spans alike).
pub(crate) const NAME: &str = "chat gpt-4o-mini";
/// OTLP's span kinds.
pub(crate) const SERVER: u64 = 2;
pub(crate) const CLIENT_KIND: u64 = 3;

/// An OTLP/HTTP receiver: every body POSTed to `/v1/traces`, as JSON.
pub(crate) async fn receiver() -> (SocketAddr, Arc<Mutex<Vec<Value>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let got: Arc<Mutex<Vec<Value>>> = Arc::default();
    let sink = got.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let sink = sink.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let sink = sink.clone();
                    async move {
                        let ok = req.uri().path() == "/v1/traces"
                            && req.headers()["content-type"] == "application/json";
                        let body = req.into_body().collect().await.unwrap().to_bytes();
                        if ok {
                            sink.lock()
                                .unwrap()
                                .push(serde_json::from_slice(&body).unwrap());
                        }
                        let status = if ok { 200 } else { 400 };
                        let res = http::Response::builder()
                            .status(status)
                            .header("content-type", "application/json")
                            .body(Full::new(Bytes::from_static(b"{}")))
                            .unwrap();
                        Ok::<_, Infallible>(res)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (addr, got)
}

/// Every span received so far.
pub(crate) fn spans(got: &Mutex<Vec<Value>>) -> Vec<Value> {
    got.lock()
        .unwrap()
        .iter()
        .flat_map(|req| {
            req["resourceSpans"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|rs| rs["scopeSpans"].as_array().into_iter().flatten())
                .flat_map(|ss| ss["spans"].as_array().into_iter().flatten())
                .cloned()
                .collect::<Vec<_>>()
        })
        .collect()
}

pub(crate) fn attr<'a>(span: &'a Value, key: &str) -> Option<&'a Value> {
    span["attributes"]
        .as_array()?
        .iter()
        .find(|a| a["key"] == key)
        .map(|a| &a["value"])
}

pub(crate) fn int(span: &Value, key: &str) -> Option<u64> {
    attr(span, key)?["intValue"].as_str()?.parse().ok()
}

/// The span of `trace` named `name`; for the GenAI name, the server span (the request).
pub(crate) fn find<'a>(spans: &'a [Value], trace: &str, name: &str) -> Option<&'a Value> {
    find_kind(spans, trace, name, if name == NAME { SERVER } else { 1 })
}

/// The span of `trace` named `name` of OTLP kind `kind` (1 internal, 2 server, 3 client).
pub(crate) fn find_kind<'a>(
    spans: &'a [Value],
    trace: &str,
    name: &str,
    kind: u64,
) -> Option<&'a Value> {
    spans
        .iter()
        .find(|s| s["traceId"] == trace && s["name"] == name && s["kind"] == kind)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_continue_the_client_trace_and_reach_the_collector() {
    let (collector, got) = receiver().await;
    let mock = mock().await;
    let proxy = Conf::new(&mock.base_url())
        .tenant("b", "requests_per_minute", 1)
        .set("otel.endpoint", format!("http://{collector}"))
        .set("otel.export_interval_ms", 20)
        .start()
        .await;
    let body = format!(
        r#"{{"model":"gpt-4o-mini","max_tokens":20,"messages":[{{"role":"user","content":"{PROMPT}"}}]}}"#
    );
    let traceparent = format!("00-{TRACE}-{CLIENT_SPAN}-01");
    let r = send(post(
        proxy.addr,
        "/v1/chat/completions",
        Some(KEY_A),
        &body,
        &[("traceparent", &traceparent)],
    ))
    .await;
    assert_eq!(r.status, 200);
    // (b) tenant b: one request a minute; the second is refused by its own limit.
    let traceparent_b = format!("00-{TRACE_B}-{CLIENT_SPAN}-01");
    let mut statuses = Vec::new();
    for _ in 0..2 {
        let r = send(post(
            proxy.addr,
            "/v1/chat/completions",
            Some(KEY_B),
            &chat("gpt-4o-mini"),
            &[("traceparent", &traceparent_b)],
        ))
        .await;
        statuses.push(r.status);
    }
    assert_eq!(statuses, [200, 429]);

    // Bounded wait for the exports (20 ms interval): 500 × 10 ms.
    let mut all = Vec::new();
    for _ in 0..500 {
        all = spans(&got);
        let refused = all.iter().any(|s| {
            s["traceId"] == TRACE_B && s["kind"] == SERVER && attr(s, "fairgate.limit").is_some()
        });
        if find(&all, TRACE, NAME).is_some() && refused {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // (a) The request span: the client's trace, the client's span as parent.
    let root = find(&all, TRACE, NAME).expect("request span exported");
    assert_eq!(root["parentSpanId"], CLIENT_SPAN);
    assert_eq!(root["kind"], 2);
    assert_eq!(attr(root, "fairgate.tenant").unwrap()["stringValue"], "a");
    assert_eq!(
        attr(root, "gen_ai.request.model").unwrap()["stringValue"],
        "gpt-4o-mini"
    );
    let estimated = int(root, "fairgate.tokens.estimated").unwrap();
    let actual = int(root, "fairgate.tokens.actual").unwrap();
    assert!(estimated > 0 && actual > 0, "{estimated} {actual}");
    assert_eq!(int(root, "http.response.status_code"), Some(200));
    let root_id = root["spanId"].as_str().unwrap();
    let (start, end) = (
        root["startTimeUnixNano"]
            .as_str()
            .unwrap()
            .parse::<u64>()
            .unwrap(),
        root["endTimeUnixNano"]
            .as_str()
            .unwrap()
            .parse::<u64>()
            .unwrap(),
    );
    assert!(start > 0 && start <= end);
    for (name, kind) in [
        ("fairgate.estimate", 1),
        ("fairgate.queue", 1),
        (NAME, CLIENT_KIND),
    ] {
        let child = find_kind(&all, TRACE, name, kind).unwrap_or_else(|| panic!("{name} exported"));
        assert_eq!(child["parentSpanId"], root_id, "{name}");
        let s: u64 = child["startTimeUnixNano"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        let e: u64 = child["endTimeUnixNano"].as_str().unwrap().parse().unwrap();
        assert!(
            start <= s && s <= e && e <= end,
            "{name}: {s}..{e} not in {start}..{end}"
        );
    }
    // The provider saw this trace, its parent being the upstream span.
    let upstream = find_kind(&all, TRACE, NAME, CLIENT_KIND).unwrap();
    let sent = mock.stats.seen_headers()[0]["traceparent"]
        .to_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        sent,
        format!("00-{TRACE}-{}-01", upstream["spanId"].as_str().unwrap())
    );

    // The resource and scope are fairgate's.
    let first = got.lock().unwrap()[0]["resourceSpans"][0].clone();
    assert_eq!(
        first["resource"]["attributes"][0]["key"], "service.name",
        "{first}"
    );
    assert_eq!(
        first["resource"]["attributes"][0]["value"]["stringValue"],
        "fairgate"
    );
    assert_eq!(first["scopeSpans"][0]["scope"]["name"], "fairgate");

    // (b) The refusal names the limit.
    let refused = all
        .iter()
        .find(|s| {
            s["traceId"] == TRACE_B
                && s["kind"] == SERVER
                && int(s, "http.response.status_code") == Some(429)
        })
        .expect("the refused request's span");
    assert_eq!(
        attr(refused, "fairgate.limit").unwrap()["stringValue"],
        "tenant"
    );
    assert_eq!(refused["status"]["code"], 2);

    // (c) Never a key or the prompt.
    let text = serde_json::to_string(&*got.lock().unwrap()).unwrap();
    for secret in [KEY_A, KEY_B, PROMPT] {
        assert!(!text.contains(secret), "{secret} exported");
    }
}

/// Without `[otel]` the client's `traceparent` reaches the provider untouched.
#[tokio::test]
async fn without_otel_the_clients_traceparent_passes_as_it_came() {
    let (mock, proxy) = pair().await;
    let traceparent = format!("00-{TRACE}-{CLIENT_SPAN}-01");
    let r = send(post(
        proxy.addr,
        "/v1/chat/completions",
        Some(KEY_A),
        &chat("gpt-4o-mini"),
        &[("traceparent", &traceparent)],
    ))
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(
        mock.stats.seen_headers()[0]["traceparent"],
        traceparent.as_str()
    );
}
