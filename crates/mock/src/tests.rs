//! End-to-end tests of the mock over real loopback sockets (port 0, parallel-safe, no wall-time
//! assertions): a hyper client for well-behaved traffic, raw TCP for clients that vanish.
//!
//! Topics of their own: `openai` (async-openai parses every shape), `profiles` (each
//! provider profile's wire format).

mod openai;
mod profiles;

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{MockConfig, MockServer};

async fn start(cfg: MockConfig) -> MockServer {
    let addr = "127.0.0.1:0".parse().expect("addr");
    MockServer::start(addr, cfg).await.expect("mock starts")
}

fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

fn post(
    server: &MockServer,
    path: &str,
    body: &str,
    headers: &[(&str, &str)],
) -> Request<Full<Bytes>> {
    let mut req = Request::post(format!("{}{path}", server.base_url()))
        .header("content-type", "application/json")
        .header("authorization", "Bearer upstream-key");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.body(Full::new(Bytes::from(body.to_owned())))
        .expect("request")
}

async fn send(req: Request<Full<Bytes>>) -> (StatusCode, HeaderMap, Bytes) {
    let resp = client().request(req).await.expect("response head");
    let (parts, body) = resp.into_parts();
    let bytes = body.collect().await.expect("whole body").to_bytes();
    (parts.status, parts.headers, bytes)
}

fn json_of(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).expect("JSON body")
}

/// The `data:` payloads of an SSE body, in order.
fn sse_data(bytes: &[u8]) -> Vec<String> {
    let text = std::str::from_utf8(bytes).expect("utf-8");
    text.split("\n\n")
        .filter_map(|event| event.lines().find_map(|l| l.strip_prefix("data: ")))
        .map(str::to_owned)
        .collect()
}

/// Polls `cond` until it holds, for at most 5 s.
async fn eventually(what: &str, cond: impl Fn() -> bool) {
    for _ in 0..1000 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("timed out waiting for: {what}");
}

const CHAT: &str = r#"{"model":"gpt-4o","messages":[{"role":"user","content":"hello world!"}]}"#;

#[tokio::test]
async fn chat_json_reports_usage() {
    let server = start(MockConfig::default()).await;
    let (status, headers, body) = send(post(&server, "/chat/completions", CHAT, &[])).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["content-type"], "application/json");
    let v = json_of(&body);
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], "gpt-4o");
    assert_eq!(v["choices"][0]["message"]["content"], "tok ".repeat(16));
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens":3,"completion_tokens":16,"total_tokens":19})
    );
    assert_eq!((server.stats.completed(), server.stats.in_flight()), (1, 0));
}

#[tokio::test]
async fn output_tokens_header_beats_body_and_max_tokens_caps() {
    let server = start(MockConfig::default()).await;
    let body = r#"{"messages":[],"mock_output_tokens":7}"#;
    let (_, _, b) = send(post(
        &server,
        "/chat/completions",
        body,
        &[("x-mock-output-tokens", "5")],
    ))
    .await;
    assert_eq!(json_of(&b)["usage"]["completion_tokens"], 5);
    let (_, _, b) = send(post(&server, "/chat/completions", body, &[])).await;
    assert_eq!(json_of(&b)["usage"]["completion_tokens"], 7);
    let capped = r#"{"messages":[],"max_tokens":3}"#;
    let (_, _, b) = send(post(
        &server,
        "/chat/completions",
        capped,
        &[("x-mock-output-tokens", "50")],
    ))
    .await;
    let v = json_of(&b);
    assert_eq!(v["usage"]["completion_tokens"], 3);
    assert_eq!(v["choices"][0]["finish_reason"], "length");
}

#[tokio::test]
async fn chat_sse_has_one_chunk_per_token_and_no_usage_by_default() {
    let server = start(MockConfig::default()).await;
    let body = r#"{"messages":[{"role":"user","content":"hi"}],"stream":true}"#;
    let (status, headers, b) = send(post(
        &server,
        "/chat/completions",
        body,
        &[("x-mock-output-tokens", "4")],
    ))
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["content-type"], "text/event-stream");
    let data = sse_data(&b);
    assert_eq!(
        data.len(),
        4 + 1 + 1,
        "4 tokens, final chunk, [DONE]: {data:?}"
    );
    assert_eq!(data[5], "[DONE]");
    let chunks: Vec<Value> = data[..5].iter().map(|d| json_of(d.as_bytes())).collect();
    assert!(chunks
        .iter()
        .all(|c| c["object"] == "chat.completion.chunk" && c.get("usage").is_none()));
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(chunks[3]["choices"][0]["delta"]["content"], "tok ");
    assert_eq!(chunks[4]["choices"][0]["finish_reason"], "stop");
    assert_eq!(server.stats.completed(), 1);
}

#[tokio::test]
async fn chat_sse_ends_with_usage_chunk_when_include_usage() {
    let server = start(MockConfig::default()).await;
    let body = r#"{"messages":[{"role":"user","content":"12345"}],"stream":true,
        "stream_options":{"include_usage":true},"max_tokens":3}"#;
    let (_, _, b) = send(post(&server, "/chat/completions", body, &[])).await;
    let data = sse_data(&b);
    assert_eq!(data.len(), 3 + 1 + 1 + 1, "{data:?}");
    let usage = json_of(data[4].as_bytes());
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(
        usage["usage"],
        json!({"prompt_tokens":2,"completion_tokens":3,"total_tokens":5})
    );
    assert_eq!(
        json_of(data[3].as_bytes())["choices"][0]["finish_reason"],
        "length"
    );
    assert_eq!(data[5], "[DONE]");
}

#[tokio::test]
async fn completions_json_and_sse() {
    let server = start(MockConfig::default()).await;
    let (_, _, b) = send(post(
        &server,
        "/completions",
        r#"{"prompt":"abcdefgh","max_tokens":2}"#,
        &[],
    ))
    .await;
    let v = json_of(&b);
    assert_eq!(
        (v["object"].as_str(), v["choices"][0]["text"].as_str()),
        (Some("text_completion"), Some("tok tok "))
    );
    assert_eq!(v["usage"]["prompt_tokens"], 2);
    let body = r#"{"prompt":"a","stream":true,"stream_options":{"include_usage":true}}"#;
    let (_, _, b) = send(post(
        &server,
        "/completions",
        body,
        &[("x-mock-output-tokens", "2")],
    ))
    .await;
    let data = sse_data(&b);
    assert_eq!(data.len(), 2 + 1 + 1 + 1, "{data:?}");
    assert_eq!(json_of(data[3].as_bytes())["usage"]["completion_tokens"], 2);
}

#[tokio::test]
async fn responses_json_and_sse_carry_usage() {
    let server = start(MockConfig::default()).await;
    let (_, _, b) = send(post(
        &server,
        "/responses",
        r#"{"model":"gpt-4o","input":"abcd"}"#,
        &[("x-mock-output-tokens", "2")],
    ))
    .await;
    let v = json_of(&b);
    assert_eq!(v["object"], "response");
    assert_eq!(v["output"][0]["content"][0]["text"], "tok tok ");
    assert_eq!(v["usage"]["input_tokens"], 1);
    assert_eq!(
        (
            v["usage"]["output_tokens"].as_u64(),
            v["usage"]["total_tokens"].as_u64()
        ),
        (Some(2), Some(3))
    );
    let (_, _, b) = send(post(
        &server,
        "/responses",
        r#"{"input":"abcd","stream":true}"#,
        &[("x-mock-output-tokens", "2")],
    ))
    .await;
    let data = sse_data(&b);
    assert_eq!(data.len(), 1 + 2 + 1, "{data:?}");
    assert_eq!(
        json_of(data[3].as_bytes())["response"]["usage"]["output_tokens"],
        2
    );
}

#[tokio::test]
async fn embeddings_are_deterministic_and_models_listed() {
    let server = start(MockConfig::default()).await;
    let body = r#"{"model":"text-embedding-3-small","input":["abcd","efgh"],"dimensions":4}"#;
    let (_, _, a) = send(post(&server, "/embeddings", body, &[])).await;
    let (_, _, b) = send(post(&server, "/embeddings", body, &[])).await;
    assert_eq!(a, b);
    let v = json_of(&a);
    assert_eq!(v["data"].as_array().map(Vec::len), Some(2));
    assert_eq!(v["data"][1]["embedding"].as_array().map(Vec::len), Some(4));
    assert_eq!(v["usage"], json!({"prompt_tokens":2,"total_tokens":2}));
    let req = Request::get(format!("{}/models", server.base_url()))
        .body(Full::default())
        .expect("req");
    let (status, _, b) = send(req).await;
    let v = json_of(&b);
    assert_eq!(
        (status, v["object"].as_str()),
        (StatusCode::OK, Some("list"))
    );
    assert_eq!(v["data"][0]["id"], "gpt-4o-mini");
}

#[tokio::test]
async fn bad_requests_get_openai_shaped_errors() {
    let server = start(MockConfig::default()).await;
    let (status, _, b) = send(post(&server, "/chat/completions", "{not json", &[])).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let v = json_of(&b);
    assert_eq!(
        (v["error"]["type"].as_str(), v["error"]["code"].as_str()),
        (Some("invalid_request_error"), Some("invalid_json"))
    );
    let (status, _, b) = send(post(&server, "/nope", CHAT, &[])).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(json_of(&b)["error"]["message"].is_string());
    let (status, _, b) = send(post(
        &server,
        "/chat/completions",
        CHAT,
        &[("x-mock-status", "500")],
    ))
    .await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(json_of(&b)["error"]["type"], "server_error");
    assert_eq!(server.stats.in_flight(), 0);
}

#[tokio::test]
async fn rejects_beyond_max_concurrency_with_retry_after() {
    let cfg = MockConfig {
        max_concurrency: Some(1),
        retry_after: Duration::from_millis(1500),
        ..MockConfig::default()
    };
    let server = start(cfg).await;
    let slow = r#"{"messages":[],"stream":true}"#;
    let hdrs = [
        ("x-mock-output-tokens", "1000"),
        ("x-mock-token-delay-ms", "5"),
    ];
    let held = client()
        .request(post(&server, "/chat/completions", slow, &hdrs))
        .await
        .expect("head");
    assert_eq!(server.stats.in_flight(), 1);
    let (status, headers, b) = send(post(&server, "/chat/completions", CHAT, &[])).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        (&headers["retry-after"], &headers["retry-after-ms"]),
        (&"2".parse().expect("v"), &"1500".parse().expect("v"))
    );
    assert_eq!(headers["x-ratelimit-remaining-requests"], "0");
    assert_eq!(json_of(&b)["error"]["type"], "rate_limit_exceeded");
    assert_eq!(
        (
            server.stats.rejected_429(),
            server.stats.requests(),
            server.stats.max_in_flight()
        ),
        (1, 2, 1)
    );
    drop(held);
    eventually("held stream released", || server.stats.in_flight() == 0).await;
    let (status, _, _) = send(post(&server, "/chat/completions", CHAT, &[])).await;
    assert_eq!(status, StatusCode::OK);
}

const RAW_STREAM: &str = "POST /v1/chat/completions HTTP/1.1\r\nhost: mock\r\ncontent-type: application/json\r\n\
x-mock-output-tokens: 1000\r\nx-mock-token-delay-ms: 2\r\ncontent-length: 30\r\n\r\n{\"messages\":[],\"stream\":true}\n";

#[tokio::test]
async fn client_dropping_mid_stream_counts_cancelled() {
    let server = start(MockConfig::default()).await;
    let mut tcp = tokio::net::TcpStream::connect(server.addr)
        .await
        .expect("connect");
    tcp.write_all(RAW_STREAM.as_bytes()).await.expect("write");
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains("chat.completion.chunk") {
        let n = tcp.read(&mut buf).await.expect("read");
        assert!(n > 0, "stream ended early");
        got.extend_from_slice(&buf[..n]);
    }
    assert_eq!(server.stats.in_flight(), 1);
    drop(tcp);
    eventually("cancelled stream released", || {
        server.stats.in_flight() == 0
    })
    .await;
    assert_eq!((server.stats.cancelled(), server.stats.completed()), (1, 0));
}

#[tokio::test]
async fn client_dropping_before_the_head_counts_cancelled() {
    let server = start(MockConfig::default()).await;
    let mut tcp = tokio::net::TcpStream::connect(server.addr)
        .await
        .expect("connect");
    let req = RAW_STREAM.replace("x-mock-output-tokens: 1000", "x-mock-delay-ms: 60000");
    tcp.write_all(req.as_bytes()).await.expect("write");
    eventually("request admitted", || server.stats.in_flight() == 1).await;
    drop(tcp);
    eventually("waiting request released", || server.stats.in_flight() == 0).await;
    assert_eq!(server.stats.cancelled(), 1);
}

#[tokio::test]
async fn abort_after_cuts_the_stream_without_done() {
    let server = start(MockConfig::default()).await;
    let body = r#"{"messages":[],"stream":true}"#;
    let req = post(
        &server,
        "/chat/completions",
        body,
        &[("x-mock-abort-after", "2"), ("x-mock-output-tokens", "10")],
    );
    let resp = client().request(req).await.expect("head");
    assert_eq!(resp.status(), StatusCode::OK);
    let mut body = resp.into_body();
    let mut data = Vec::new();
    let failed = loop {
        match body.frame().await {
            Some(Ok(frame)) => data.extend_from_slice(frame.data_ref().map_or(&[][..], |d| &d[..])),
            Some(Err(_)) => break true,
            None => break false,
        }
    };
    assert!(failed, "an aborted stream must not end cleanly");
    assert_eq!(sse_data(&data).len(), 2);
    eventually("aborted stream released", || server.stats.in_flight() == 0).await;
    assert_eq!((server.stats.aborted(), server.stats.cancelled()), (1, 0));
}

#[tokio::test]
async fn serves_h2c_and_records_what_it_saw() {
    let server = start(MockConfig::default()).await;
    let h2: Client<HttpConnector, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http();
    let body = r#"{"messages":[],"stream_options":{"include_usage":true}}"#;
    let resp = h2
        .request(post(&server, "/chat/completions", body, &[]))
        .await
        .expect("h2 response");
    assert_eq!(
        (resp.version(), resp.status()),
        (http::Version::HTTP_2, StatusCode::OK)
    );
    assert_eq!(
        server.stats.seen_authorization(),
        vec![Some("Bearer upstream-key".to_owned())]
    );
    assert_eq!(
        server.stats.seen_bodies()[0]["stream_options"]["include_usage"],
        true
    );
    assert_eq!(
        server.stats.seen_headers()[0]["content-type"],
        "application/json"
    );
}
