//! The mock upstream's provider profiles over real sockets (port 0): what a client of each
//! profile sees on the wire (compression, where usage is, rate-limit and retry headers, refusals,
//! CRLF), the TLS + h2 mode and its CLI flags, and fairgate in front of every profile answering a
//! plain and a streamed chat completion with 200. Fairgate's own accounting is not asserted here.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use crate::support::*;
use bytes::Bytes;
use fairgate_mock::{MockConfig, MockServer, Profile, LIMIT_REQUESTS};
use http::{HeaderMap, Request, StatusCode, Version};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const PLAIN: &str =
    r#"{"model":"gpt-4o","max_tokens":4,"messages":[{"role":"user","content":"hello world!"}]}"#;
const STREAM: &str = r#"{"model":"gpt-4o","max_tokens":4,"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hello world!"}]}"#;
/// "hello world!" is 12 bytes: 3 prompt tokens; `max_tokens` 4: 4 output tokens.
const TOTAL: u64 = 7;

const ALL: [Profile; 5] = [
    Profile::Ideal,
    Profile::Openai,
    Profile::Vllm,
    Profile::Groq,
    Profile::Rough,
];

async fn chat(mock: &MockServer, body: &str, headers: &[(&str, &str)]) -> Collected {
    send(post(mock.addr, "/v1/chat/completions", None, body, headers)).await
}

/// The body as sent before `content-encoding` was applied.
fn decoded(headers: &HeaderMap, body: &[u8]) -> Vec<u8> {
    let (out, read) = decode(headers, body);
    read.unwrap_or_else(|e| panic!("{:?} body decodes: {e}", headers.get("content-encoding")));
    out
}

fn json(c: &Collected) -> Value {
    serde_json::from_slice(&decoded(&c.headers, &c.body)).expect("a JSON body")
}

/// The `data:` payloads of an SSE body (CRLF or LF), JSON where they parse.
fn events(c: &Collected) -> Vec<Value> {
    let text = String::from_utf8(decoded(&c.headers, &c.body)).expect("utf-8");
    text.replace("\r\n", "\n")
        .split("\n\n")
        .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
        .map(|d| serde_json::from_str(d).unwrap_or_else(|_| Value::String(d.to_owned())))
        .collect()
}

/// A Go duration as OpenAI writes resets: `250ms`, `6s`, `8.64s`, `1m30s`.
fn is_go_duration(s: &str) -> bool {
    if let Some(ms) = s.strip_suffix("ms") {
        return !ms.is_empty() && ms.bytes().all(|b| b.is_ascii_digit());
    }
    let Some(rest) = s.strip_suffix('s') else {
        return false;
    };
    let rest = rest.split_once('h').map_or(
        rest,
        |(h, r)| if h.parse::<u64>().is_ok() { r } else { "x" },
    );
    let rest = rest.split_once('m').map_or(
        rest,
        |(m, r)| if m.parse::<u64>().is_ok() { r } else { "x" },
    );
    rest.parse::<f64>().is_ok()
}

/// Holds one request in flight on `mock` (a long delay before its head) until the task is aborted.
async fn hold_one(mock: &MockServer) -> tokio::task::JoinHandle<()> {
    let addr = mock.addr;
    let held = tokio::spawn(async move {
        let req = post(
            addr,
            "/v1/chat/completions",
            None,
            PLAIN,
            &[("x-mock-delay-ms", "60000")],
        );
        let _ = client().request(req).await;
    });
    let stats = Arc::clone(&mock.stats);
    assert!(
        eventually(|| stats.in_flight() == 1).await,
        "one request held"
    );
    held
}

fn limited(profile: Profile) -> MockConfig {
    MockConfig {
        profile,
        max_concurrency: Some(1),
        retry_after: Duration::from_millis(1500),
        ..MockConfig::default()
    }
}

#[tokio::test]
async fn openai_compresses_by_accept_encoding_and_reports_limits() {
    let mock = mock_profile(Profile::Openai).await;
    for (accept, coding) in [
        ("gzip", "gzip"),
        ("br", "br"),
        ("deflate", "deflate"),
        ("zstd", "zstd"),
        ("gzip;q=0.5, br", "br"),
    ] {
        let c = chat(&mock, PLAIN, &[("accept-encoding", accept)]).await;
        assert_eq!(c.status, 200);
        assert_eq!(c.headers["content-encoding"], coding, "{accept}");
        assert_eq!(c.headers["vary"], "accept-encoding");
        assert!(
            serde_json::from_slice::<Value>(&c.body).is_err(),
            "really compressed"
        );
        assert_eq!(json(&c)["usage"]["total_tokens"], TOTAL);
    }
    let plain = chat(&mock, PLAIN, &[]).await;
    assert!(!plain.headers.contains_key("content-encoding"));
    assert_eq!(plain.json()["usage"]["total_tokens"], TOTAL);
    let h = &plain.headers;
    assert_eq!(
        h["x-ratelimit-limit-requests"],
        LIMIT_REQUESTS.to_string().as_str()
    );
    let remaining: u64 = h["x-ratelimit-remaining-requests"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(remaining < LIMIT_REQUESTS, "requests so far were charged");
    for reset in ["x-ratelimit-reset-requests", "x-ratelimit-reset-tokens"] {
        let v = h[reset].to_str().unwrap();
        assert!(is_go_duration(v), "{reset}: {v}");
    }

    let s = chat(&mock, STREAM, &[("accept-encoding", "gzip")]).await;
    assert_eq!(s.headers["content-encoding"], "gzip");
    let ev = events(&s);
    assert_eq!(ev.last(), Some(&Value::from("[DONE]")));
    let usage_chunk = &ev[ev.len() - 2];
    assert_eq!(usage_chunk["choices"], serde_json::json!([]));
    assert_eq!(usage_chunk["usage"]["total_tokens"], TOTAL);
}

#[tokio::test]
async fn openai_429_carries_retry_after_ms_and_limit_headers() {
    let mock = mock_with(limited(Profile::Openai)).await;
    let held = hold_one(&mock).await;
    let c = chat(&mock, PLAIN, &[]).await;
    held.abort();
    assert_eq!(c.status, 429);
    assert_eq!(c.headers["retry-after"], "2");
    assert_eq!(c.headers["retry-after-ms"], "1500");
    assert_eq!(c.headers["x-ratelimit-remaining-requests"], "0");
    assert!(c.headers.contains_key("x-ratelimit-reset-tokens"));
    assert_eq!(c.json()["error"]["code"], "rate_limit_exceeded");
}

#[tokio::test]
async fn vllm_puts_usage_on_the_final_chunk_never_compresses_and_503s() {
    let mock = mock_with(limited(Profile::Vllm)).await;
    let s = chat(&mock, STREAM, &[("accept-encoding", "gzip, br")]).await;
    assert!(!s.headers.contains_key("content-encoding"));
    let ev = events(&s);
    let last_chunk = &ev[ev.len() - 2];
    assert_eq!(last_chunk["choices"][0]["finish_reason"], "length");
    assert_eq!(last_chunk["usage"]["total_tokens"], TOTAL);
    assert!(
        ev.iter().all(|e| e["choices"] != serde_json::json!([])),
        "no usage-only chunk"
    );

    let held = hold_one(&mock).await;
    let c = chat(&mock, PLAIN, &[]).await;
    held.abort();
    assert_eq!(c.status, 503);
    assert_eq!(c.headers["retry-after"], "2");
    assert!(!c.headers.contains_key("retry-after-ms"));
    assert_eq!(c.json()["error"]["type"], "server_error");
}

#[tokio::test]
async fn groq_sends_usage_under_x_groq_in_the_last_chunk() {
    let mock = mock_profile(Profile::Groq).await;
    let unasked = STREAM.replace(r#""stream_options":{"include_usage":true},"#, "");
    let s = chat(&mock, &unasked, &[]).await;
    let ev = events(&s);
    let last_chunk = &ev[ev.len() - 2];
    assert_eq!(last_chunk["x_groq"]["usage"]["total_tokens"], TOTAL);
    assert!(ev.iter().all(|e| e.get("usage").is_none()));
    assert!(s.headers.contains_key("x-ratelimit-remaining-tokens"));
}

#[tokio::test]
async fn rough_uses_crlf_keep_alives_usage_details_and_per_model_limits() {
    let mock = mock_profile(Profile::Rough).await;
    let s = chat(&mock, STREAM, &[]).await;
    let text = std::str::from_utf8(&s.body).unwrap();
    assert_eq!(
        text.matches("\r\n").count(),
        text.matches('\n').count(),
        "{text:?}"
    );
    assert!(text.contains(": keep-alive\r\n\r\n"));
    let ev = events(&s);
    assert_eq!(ev.last(), Some(&Value::from("[DONE]")));
    assert_eq!(ev[ev.len() - 2]["usage"]["total_tokens"], TOTAL);

    let c = chat(&mock, PLAIN, &[]).await;
    let usage = &c.json()["usage"];
    assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], 1);
    assert_eq!(usage["completion_tokens_details"]["reasoning_tokens"], 2);
    assert!(c
        .headers
        .contains_key("x-ratelimit-remaining-requests-gpt-4o"));
    assert!(c.headers.contains_key("x-ratelimit-limit-tokens-gpt-4o"));
}

/// Sends a request head announcing `PLAIN` but only half of it; returns the socket.
async fn half_sent(mock: &MockServer) -> TcpStream {
    let mut tcp = TcpStream::connect(mock.addr).await.unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: mock\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n",
        PLAIN.len()
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    tcp.write_all(&PLAIN.as_bytes()[..10]).await.unwrap();
    tcp
}

async fn read_all(tcp: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), tcp.read_to_end(&mut out));
    read.await
        .expect("answer within the safety timeout")
        .unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn rough_refuses_only_after_the_whole_body_with_an_http_date() {
    // The method tells the two apart: the ideal profile answers a half-sent request at once.
    let ideal = mock_with(limited(Profile::Ideal)).await;
    let held = hold_one(&ideal).await;
    let mut tcp = half_sent(&ideal).await;
    assert!(read_all(&mut tcp).await.starts_with("HTTP/1.1 429"));
    held.abort();

    let rough = mock_with(limited(Profile::Rough)).await;
    let held = hold_one(&rough).await;
    let mut tcp = half_sent(&rough).await;
    let stats = Arc::clone(&rough.stats);
    assert!(
        eventually(|| stats.rejected_429() == 1).await,
        "refusal decided"
    );
    let mut byte = [0u8; 1];
    let early = tokio::time::timeout(Duration::from_millis(300), tcp.read(&mut byte)).await;
    assert!(early.is_err(), "no answer while the body is incomplete");
    tcp.write_all(&PLAIN.as_bytes()[10..]).await.unwrap();
    let answer = read_all(&mut tcp).await;
    held.abort();
    assert!(answer.starts_with("HTTP/1.1 429"), "{answer}");
    let lower = answer.to_ascii_lowercase();
    assert!(!lower.contains("retry-after-ms"));
    let date = lower
        .lines()
        .find_map(|l| l.strip_prefix("retry-after: "))
        .expect("Retry-After");
    let original = &answer[lower.find(date).unwrap()..][..date.len()];
    assert!(httpdate::parse_http_date(original).is_ok(), "{original}");
}

#[tokio::test]
async fn error_event_and_omitted_usage_knobs() {
    let mock = mock_profile(Profile::Openai).await;
    let s = chat(&mock, STREAM, &[("x-mock-error-after", "2")]).await;
    let ev = events(&s);
    assert_eq!(ev.len(), 3, "two tokens then the error: {ev:?}");
    assert_eq!(ev[2]["error"]["type"], "server_error");
    let s = chat(&mock, STREAM, &[("x-mock-usage", "omit")]).await;
    let ev = events(&s);
    assert_eq!(ev.last(), Some(&Value::from("[DONE]")));
    assert_eq!(ev[ev.len() - 2]["choices"][0]["finish_reason"], "length");
    assert!(!String::from_utf8_lossy(&s.body).contains("usage"));
}

fn tls_connector() -> tokio_rustls::TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(fixture("localhost.crt")).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    tokio_rustls::TlsConnector::from(Arc::new(cfg))
}

#[tokio::test]
async fn tls_mode_speaks_h2_by_alpn() {
    let mock = mock_tls(MockConfig {
        profile: Profile::Openai,
        ..MockConfig::default()
    })
    .await;
    assert!(mock.base_url().starts_with("https://127.0.0.1:"));
    let tcp = TcpStream::connect(mock.addr).await.unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    let tls = tls_connector().connect(name, tcp).await.expect("handshake");
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .expect("h2 handshake");
    tokio::spawn(conn);
    let req = Request::post(format!(
        "https://localhost:{}/v1/chat/completions",
        mock.addr.port()
    ))
    .header("content-type", "application/json")
    .body(Full::new(Bytes::from_static(PLAIN.as_bytes())))
    .unwrap();
    let resp = sender.send_request(req).await.expect("response");
    assert_eq!(resp.version(), Version::HTTP_2);
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(resp.headers().contains_key("x-ratelimit-limit-tokens"));
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["usage"]["total_tokens"], TOTAL);
}

#[test]
fn cli_serves_a_profile_over_tls_and_wants_both_tls_files() {
    let bin = env!("CARGO_BIN_EXE_fairgate");
    let mut child = Command::new(bin)
        .args([
            "mock-upstream",
            "--listen",
            "127.0.0.1:0",
            "--profile",
            "rough",
        ])
        .args(["--tls-cert", &fixture("localhost.crt")])
        .args(["--tls-key", &fixture("localhost.key")])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    let read = BufReader::new(child.stdout.take().unwrap()).read_line(&mut line);
    let _ = child.kill();
    let _ = child.wait();
    read.unwrap();
    assert!(
        line.starts_with("mock upstream listening on https://127.0.0.1:"),
        "{line}"
    );

    let out = Command::new(bin)
        .args(["mock-upstream", "--listen", "127.0.0.1:0"])
        .args(["--tls-cert", &fixture("localhost.crt")])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--tls-key"));
    let out = Command::new(bin)
        .args(["mock-upstream", "--profile", "nonesuch"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("openai"));
}

#[tokio::test]
async fn fairgate_in_front_of_every_profile_answers_plain_and_streamed_chats() {
    for profile in ALL {
        let mock = mock_profile(profile).await;
        let proxy = Conf::new(&mock.base_url()).start().await;
        let gzip = [("accept-encoding", "gzip")];
        let path = "/v1/chat/completions";
        let c = send(post(proxy.addr, path, Some(KEY_A), PLAIN, &gzip)).await;
        assert_eq!(c.status, 200, "{profile:?}: {:?}", c.body);
        let v = json(&c);
        assert!(
            v["choices"][0]["message"]["content"].is_string(),
            "{profile:?}: {v}"
        );

        let s = send(post(proxy.addr, path, Some(KEY_A), STREAM, &gzip)).await;
        assert_eq!(s.status, 200, "{profile:?}: {:?}", s.body);
        let content_type = s.headers["content-type"].to_str().unwrap();
        assert!(content_type.starts_with("text/event-stream"), "{profile:?}");
        let ev = events(&s);
        assert_eq!(
            ev.last(),
            Some(&Value::from("[DONE]")),
            "{profile:?}: {ev:?}"
        );
        let tokens = ev
            .iter()
            .filter(|e| e["choices"][0]["delta"]["content"].is_string())
            .count();
        assert_eq!(tokens, 4, "{profile:?}: every token chunk arrived");
    }
}
