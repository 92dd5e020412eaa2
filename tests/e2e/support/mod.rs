//! Helpers shared by the end-to-end tests: start the mock upstream and fairgate in-process on
//! port 0 (configs built as values with [`Conf`]), and talk raw HTTP to them.
#![allow(dead_code)]

pub mod conf;
pub mod needs;
pub mod official;
pub mod redis_server;

pub use conf::{entry, Conf, With};

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use fairgate::config::Config;
use fairgate::server::{self, ServerHandle};
use fairgate_mock::{MockConfig, MockServer, Profile};
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Tenant keys of the default test config.
pub const KEY_A: &str = "fg-test-a";
pub const KEY_B: &str = "fg-test-b";

/// A mock upstream with default settings.
pub async fn mock() -> MockServer {
    mock_with(MockConfig::default()).await
}

/// A mock upstream with `cfg`.
pub async fn mock_with(cfg: MockConfig) -> MockServer {
    MockServer::start(SocketAddr::from(([127, 0, 0, 1], 0)), cfg)
        .await
        .expect("mock upstream starts")
}

/// A mock upstream answering every request after `ms` milliseconds.
pub async fn mock_slow(ms: u64) -> MockServer {
    mock_with(MockConfig {
        base_latency: std::time::Duration::from_millis(ms),
        ..MockConfig::default()
    })
    .await
}

/// A mock upstream speaking `profile`'s dialect (see `fairgate_mock::Profile`).
pub async fn mock_profile(profile: Profile) -> MockServer {
    mock_with(MockConfig {
        profile,
        ..MockConfig::default()
    })
    .await
}

/// A path under `tests/fixtures/`.
pub fn fixture(name: &str) -> String {
    format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// A mock upstream with `cfg` over TLS (ALPN h2 and http/1.1) with the self-signed
/// `localhost` / 127.0.0.1 certificate of `tests/fixtures/`.
pub async fn mock_tls(cfg: MockConfig) -> MockServer {
    let cert = fixture("localhost.crt");
    let key = fixture("localhost.key");
    let acceptor = fairgate_mock::tls_acceptor(cert.as_ref(), key.as_ref()).expect("fixture TLS");
    MockServer::start_tls(SocketAddr::from(([127, 0, 0, 1], 0)), cfg, acceptor)
        .await
        .expect("TLS mock upstream starts")
}

/// Starts fairgate on 127.0.0.1:0 with the given TOML text (a test of the text itself; others
/// build a [`Conf`]).
pub async fn proxy(toml: &str) -> ServerHandle {
    let config = Config::from_toml_str(toml).expect("valid test config");
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    server::start(config, listener).await.expect("proxy starts")
}

/// Starts fairgate on 127.0.0.1:0 with the given TOML, its `*_env` settings read from `env`
/// (tests run in parallel threads of one process: none may `set_var`).
pub async fn proxy_with_env(toml: &str, env: &[(&str, &str)]) -> ServerHandle {
    let config = Config::from_toml_str(toml).expect("valid test config");
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    server::start_with_env(config, listener, server::Env::vars(env.iter().copied()))
        .await
        .expect("proxy starts")
}

/// Starts a mock and a proxy in front of it with the default test config.
pub async fn pair() -> (MockServer, ServerHandle) {
    let mock = mock().await;
    let proxy = Conf::new(&mock.base_url()).start().await;
    (mock, proxy)
}

/// A unique env var name for this test process and `tag` (for [`proxy_with_env`]).
pub fn unique_env(tag: &str) -> String {
    format!(
        "FG_TEST_KEY_{}_{}_{}",
        tag,
        std::process::id(),
        rand::random::<u32>()
    )
}

/// A plain HTTP/1.1 client.
pub fn client() -> Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

/// A collected response.
pub struct Collected {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: Bytes,
}

impl Collected {
    /// The body as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "body is not JSON ({e}): {}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    /// Asserts an OpenAI-shaped error with `status` and `code`.
    pub fn assert_error(&self, status: u16, code: &str) {
        assert_eq!(
            self.status,
            status,
            "{}",
            String::from_utf8_lossy(&self.body)
        );
        let v = self.json();
        let e = &v["error"];
        assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
        assert!(e["type"].as_str().is_some(), "{v}");
        assert_eq!(e["code"], code, "{v}");
        assert!(self.headers.contains_key("x-fairgate-queue-ms"));
    }
}

/// Sends `req` and collects the response (bounded by a 20 s safety timeout).
pub async fn send(req: Request<Full<Bytes>>) -> Collected {
    let fut = async {
        let res: Response<_> = client().request(req).await.expect("response");
        let (parts, body) = res.into_parts();
        let body = body.collect().await.expect("body").to_bytes();
        Collected {
            status: parts.status.as_u16(),
            headers: parts.headers,
            body,
        }
    };
    tokio::time::timeout(Duration::from_secs(20), fut)
        .await
        .expect("response within the safety timeout")
}

/// Builds a POST with a JSON body, optional bearer key and extra headers.
pub fn post(
    addr: SocketAddr,
    path: &str,
    key: Option<&str>,
    body: &str,
    headers: &[(&str, &str)],
) -> Request<Full<Bytes>> {
    let mut b =
        Request::post(format!("http://{addr}{path}")).header("content-type", "application/json");
    if let Some(key) = key {
        b = b.header("authorization", format!("Bearer {key}"));
    }
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(Full::new(Bytes::copy_from_slice(body.as_bytes())))
        .unwrap()
}

/// A minimal chat request body.
pub fn chat(model: &str) -> String {
    format!(r#"{{"model":"{model}","messages":[{{"role":"user","content":"hello"}}]}}"#)
}

/// Writes raw bytes and reads until the server closes or `max` bytes (10 s safety timeout).
pub async fn raw(addr: SocketAddr, request: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(request).await.unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let read = async {
        loop {
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    buf.extend_from_slice(&chunk[..n]);
                    if buf.len() > 1 << 20 {
                        break;
                    }
                }
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(10), read).await;
    String::from_utf8_lossy(&buf).into_owned()
}

/// Polls `cond` every 10 ms for at most 10 s; true once it holds.
pub async fn eventually(mut cond: impl FnMut() -> bool) -> bool {
    for _ in 0..1000 {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    cond()
}

/// `GET /metrics` of the proxy at `addr` (the main listener).
pub async fn scrape(addr: SocketAddr) -> String {
    let req = Request::get(format!("http://{addr}/metrics"))
        .body(Full::<Bytes>::default())
        .unwrap();
    let r = send(req).await;
    assert_eq!(r.status, 200);
    String::from_utf8(r.body.to_vec()).unwrap()
}

/// `/metrics` of `addr` scraped with the admin bearer `token` (a proxy whose `trusted_sources`
/// leave out loopback answers only that).
pub async fn scrape_with(addr: SocketAddr, token: &str) -> String {
    let req = Request::get(format!("http://{addr}/metrics"))
        .header("authorization", format!("Bearer {token}"))
        .body(Full::<Bytes>::default())
        .unwrap();
    let r = send(req).await;
    assert_eq!(r.status, 200);
    String::from_utf8(r.body.to_vec()).unwrap()
}

/// The value of the series `name` whose labels include every `k="v"` of `labels` (an
/// unlabelled series matches empty `labels`).
pub fn value(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines()
        .filter(|l| {
            l.starts_with(name) && matches!(l.as_bytes().get(name.len()), Some(b'{' | b' '))
        })
        .find(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// `body` as it was before its `content-encoding` (gzip, deflate, br, zstd) was applied: what
/// decoded, and whether all of it did (a stream cut mid-way decodes only in part).
pub fn decode(headers: &http::HeaderMap, body: &[u8]) -> (Vec<u8>, std::io::Result<usize>) {
    use std::io::Read;
    let mut out = Vec::new();
    let read = match headers.get("content-encoding").map(|v| v.to_str().unwrap()) {
        None => return (body.to_vec(), Ok(body.len())),
        Some("gzip") => flate2::read::GzDecoder::new(body).read_to_end(&mut out),
        Some("deflate") => flate2::read::ZlibDecoder::new(body).read_to_end(&mut out),
        Some("br") => brotli::Decompressor::new(body, 4096).read_to_end(&mut out),
        Some("zstd") => {
            zstd::stream::read::Decoder::new(body).and_then(|mut d| d.read_to_end(&mut out))
        }
        Some(other) => panic!("unexpected content-encoding {other}"),
    };
    (out, read)
}

/// The JSON records of a JSONL body (a batch's input or output file), blank lines skipped.
pub fn jsonl(body: &[u8]) -> Vec<serde_json::Value> {
    body.split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).expect("a JSON line"))
        .collect()
}

/// The `custom_id`s of batch output records, sorted.
pub fn custom_ids(records: &[serde_json::Value]) -> Vec<String> {
    let mut ids: Vec<String> = records
        .iter()
        .map(|v| v["custom_id"].as_str().expect("a custom_id").to_owned())
        .collect();
    ids.sort();
    ids
}

/// For each request the mock saw whose first message is `victim` (after the first), how many
/// requests whose first message is one of `counted` it saw since the victim's previous one.
pub fn gaps_between(seen: &[serde_json::Value], victim: &str, counted: &[&str]) -> Vec<usize> {
    let content = |b: &serde_json::Value| b["messages"][0]["content"].as_str().map(str::to_owned);
    let is_victim = |b: &serde_json::Value| content(b).as_deref() == Some(victim);
    let first = seen
        .iter()
        .position(is_victim)
        .expect("the victim was served");
    let (mut gaps, mut since) = (Vec::new(), 0);
    for b in &seen[first + 1..] {
        if is_victim(b) {
            gaps.push(since);
            since = 0;
        } else if content(b).is_some_and(|c| counted.contains(&c.as_str())) {
            since += 1;
        }
    }
    gaps
}
