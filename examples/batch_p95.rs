//! Interactive p95 with and without a large batch running, in one run (issue 15 point 4).
//!
//! One in-process mock upstream (fixed latency per request) behind fairgate with
//! `max_concurrency` slots; tenant `i` sends interactive chat requests from a few closed loops;
//! tenant `b` submits a batch of `LINES` lines through the Batch API. Phase 1 measures `i`'s
//! latency alone, phase 2 the same load while the batch runs; prints both p95s, their ratio and
//! the batch's throughput on the leftover capacity.
//!
//! ```sh
//! cargo run --example batch_p95 -- [LINES] [REQUESTS_PER_PHASE] [MAX_INFLIGHT_PER_TENANT]
//! ```

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use fairgate::config::Config;
use fairgate_mock::{MockConfig, MockServer};
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;

type Http = Client<HttpConnector, Full<Bytes>>;

const CHAT: &str =
    r#"{"model":"gpt-4o-mini","max_tokens":16,"messages":[{"role":"user","content":"hello"}]}"#;
const LOOPS: usize = 4;

async fn call(c: &Http, req: Request<Full<Bytes>>) -> (u16, Bytes) {
    let res = c.request(req).await.expect("response");
    let status = res.status().as_u16();
    (
        status,
        res.into_body().collect().await.expect("body").to_bytes(),
    )
}

fn req(
    addr: SocketAddr,
    method: &str,
    path: &str,
    key: &str,
    ct: &str,
    body: Bytes,
) -> Request<Full<Bytes>> {
    Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"))
        .header("authorization", format!("Bearer {key}"))
        .header("content-type", ct)
        .body(Full::new(body))
        .unwrap()
}

/// `LOOPS` closed loops sending `n` requests in all; the p95 latency in ms.
async fn interactive(c: &Http, addr: SocketAddr, n: usize) -> f64 {
    let mut tasks = Vec::new();
    for _ in 0..LOOPS {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            for _ in 0..n / LOOPS {
                let t = Instant::now();
                let (s, _) = call(
                    &c,
                    req(
                        addr,
                        "POST",
                        "/v1/chat/completions",
                        "key-i",
                        "application/json",
                        Bytes::from_static(CHAT.as_bytes()),
                    ),
                )
                .await;
                assert_eq!(s, 200);
                lat.push(t.elapsed().as_secs_f64() * 1000.0);
            }
            lat
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all.sort_by(f64::total_cmp);
    all[(all.len() * 95 / 100).min(all.len() - 1)]
}

/// Uploads a `lines`-line batch for tenant `b` and creates it; the batch id.
async fn submit(c: &Http, addr: SocketAddr, lines: usize) -> String {
    let jsonl: String = (0..lines)
        .map(|i| format!("{{\"custom_id\":\"r{i}\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{CHAT}}}\n"))
        .collect();
    let body = format!(
        "--B\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--B\r\n\
         Content-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\n\r\n{jsonl}\r\n--B--\r\n"
    );
    let (s, f) = call(
        c,
        req(
            addr,
            "POST",
            "/v1/files",
            "key-b",
            "multipart/form-data; boundary=B",
            Bytes::from(body),
        ),
    )
    .await;
    assert_eq!(s, 200, "{}", String::from_utf8_lossy(&f));
    let file: serde_json::Value = serde_json::from_slice(&f).unwrap();
    let create = serde_json::json!({"input_file_id": file["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"});
    let (s, b) = call(
        c,
        req(
            addr,
            "POST",
            "/v1/batches",
            "key-b",
            "application/json",
            Bytes::from(create.to_string()),
        ),
    )
    .await;
    assert_eq!(s, 200, "{}", String::from_utf8_lossy(&b));
    let batch: serde_json::Value = serde_json::from_slice(&b).unwrap();
    batch["id"].as_str().unwrap().to_owned()
}

/// (status, completed lines) of batch `id`.
async fn progress(c: &Http, addr: SocketAddr, id: &str) -> (String, u64) {
    let (_, b) = call(
        c,
        req(
            addr,
            "GET",
            &format!("/v1/batches/{id}"),
            "key-b",
            "application/json",
            Bytes::new(),
        ),
    )
    .await;
    let v: serde_json::Value = serde_json::from_slice(&b).unwrap();
    (
        v["status"].as_str().unwrap_or("").to_owned(),
        v["request_counts"]["completed"].as_u64().unwrap_or(0),
    )
}

#[tokio::main]
async fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let lines = args.first().copied().unwrap_or(5000);
    let n = args.get(1).copied().unwrap_or(400);
    let inflight = args.get(2).copied().unwrap_or(4);
    let mock = MockServer::start(
        SocketAddr::from(([127, 0, 0, 1], 0)),
        MockConfig {
            base_latency: Duration::from_millis(20),
            record_requests: false,
            ..MockConfig::default()
        },
    )
    .await
    .unwrap();
    let db = std::env::temp_dir().join(format!("fg-bench-{:x}.sqlite", rand::random::<u64>()));
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n[[upstreams]]\nname = \"mock\"\nbase_url = \"{}\"\nmax_concurrency = 8\n\
         [[tenants]]\nid = \"i\"\napi_keys = [\"key-i\"]\n[[tenants]]\nid = \"b\"\napi_keys = [\"key-b\"]\n\
         [jobs]\npath = \"{}\"\nmax_inflight_per_tenant = {inflight}\n",
        mock.base_url(),
        db.display()
    );
    println!(
        "pool max_concurrency 8, batch max_inflight_per_tenant {inflight}, mock 20 ms per request"
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy = fairgate::server::start(Config::from_toml_str(&toml).unwrap(), listener)
        .await
        .unwrap();
    let addr = proxy.addr;
    let c: Http = Client::builder(TokioExecutor::new()).build_http();
    interactive(&c, addr, 40).await; // warm-up
    let alone = interactive(&c, addr, n).await;
    let id = submit(&c, addr, lines).await;
    // Let the batch fill its slots first.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let t = Instant::now();
    let (_, before) = progress(&c, addr, &id).await;
    let with_batch = interactive(&c, addr, n).await;
    let (status, after) = progress(&c, addr, &id).await;
    let secs = t.elapsed().as_secs_f64();
    println!("interactive p95 alone:          {alone:.1} ms ({n} requests, {LOOPS} loops)");
    println!("interactive p95 with the batch: {with_batch:.1} ms");
    println!("ratio: {:.2}", with_batch / alone);
    println!(
        "batch throughput meanwhile: {:.1} lines/s ({} lines in {secs:.1} s; batch {status}, {after}/{lines} done)",
        (after - before) as f64 / secs,
        after - before
    );
    let _ = std::fs::remove_file(&db);
}
