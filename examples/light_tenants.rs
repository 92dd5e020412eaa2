//! Issue 23's table end to end, in one process on 127.0.0.1 (bounded in time): a sequential
//! agent and an interactive user (0.2 s think), each beside a flood tenant running 24 closed
//! loops, on a pool of 4 slots in front of the bundled mock answering in 50 ms ±30% (35 ms plus a
//! uniform 0–30 ms `x-mock-delay-ms`), short requests (`max_tokens` 8), equal weights; alone,
//! FIFO, DRR at the default quantum, DRR at quantum 64, and the victim at weight 1000 (the limit).
//!
//!     cargo run --release --example light_tenants [seconds per run, default 10]
//!
//! Prints a markdown table: the victim's requests/s (÷ alone) and its p95 queue wait (its
//! `x-fairgate-queue-ms`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use fairgate::config::Config;
use fairgate_mock::{MockConfig, MockServer};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use tokio::time::Instant;

type Http = Client<HttpConnector, Full<Bytes>>;

/// One request; its queue wait (ms) when answered 200.
async fn request(client: &Http, addr: SocketAddr, key: &str) -> Option<f64> {
    let delay = rand::random::<u64>() % 31;
    let body = r#"{"model":"gpt-4o-mini","max_tokens":8,"messages":[{"role":"user","content":"Classify: is this ticket urgent?"}]}"#;
    let req = http::Request::post(format!("http://{addr}/v1/chat/completions"))
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {key}"))
        .header("x-mock-delay-ms", delay.to_string())
        .header("x-mock-output-tokens", "4")
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .ok()?;
    let res = tokio::time::timeout(Duration::from_secs(60), client.request(req))
        .await
        .ok()?
        .ok()?;
    let wait = res
        .headers()
        .get("x-fairgate-queue-ms")?
        .to_str()
        .ok()?
        .parse::<f64>()
        .ok()?;
    let ok = res.status().is_success();
    res.into_body().collect().await.ok()?;
    ok.then_some(wait)
}

#[derive(Clone, Copy)]
struct Setup {
    policy: &'static str,
    quantum: Option<u64>,
    victim_weight: f64,
    flood: bool,
}

/// One run: the victim's (requests/s, p95 queue wait ms).
async fn one(mock: &MockServer, setup: Setup, think: Duration, secs: f64) -> (f64, f64) {
    let mut toml = format!(
        "[scheduler]\npolicy = \"{}\"\n{}\
         [[upstreams]]\nname = \"mock\"\nbase_url = \"{}\"\nmax_concurrency = 4\n\
         [[tenants]]\nid = \"flood\"\napi_keys = [\"k-flood\"]\n\
         [[tenants]]\nid = \"victim\"\napi_keys = [\"k-victim\"]\nweight = {}\n",
        setup.policy,
        setup
            .quantum
            .map(|q| format!("quantum = {q}\n"))
            .unwrap_or_default(),
        mock.base_url(),
        setup.victim_weight
    );
    toml.push('\n');
    let config = Config::from_toml_str(&toml).expect("a valid config");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy = fairgate::server::start(config, listener).await.unwrap();
    let addr = proxy.addr;
    let client: Http = Client::builder(TokioExecutor::new()).build_http();
    let end = Instant::now() + Duration::from_secs_f64(secs);
    let mut flood = Vec::new();
    if setup.flood {
        for _ in 0..24 {
            let client = client.clone();
            flood.push(tokio::spawn(async move {
                while Instant::now() < end {
                    request(&client, addr, "k-flood").await;
                }
            }));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let waits = Arc::new(std::sync::Mutex::new(Vec::new()));
    let start = Instant::now();
    while Instant::now() < end {
        if let Some(w) = request(&client, addr, "k-victim").await {
            waits.lock().unwrap().push(w);
        }
        tokio::time::sleep(think).await;
    }
    let took = start.elapsed().as_secs_f64();
    for f in flood {
        let _ = f.await;
    }
    proxy.shutdown();
    let _ = proxy.join().await;
    let mut w = waits.lock().unwrap().clone();
    w.sort_by(f64::total_cmp);
    let p95 = w
        .get(((w.len().max(1) - 1) as f64 * 0.95).round() as usize)
        .copied()
        .unwrap_or(0.0);
    (w.len() as f64 / took, p95)
}

#[tokio::main]
async fn main() {
    let secs: f64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(10.0);
    let mock = MockServer::start(
        SocketAddr::from(([127, 0, 0, 1], 0)),
        MockConfig {
            base_latency: Duration::from_millis(35),
            record_requests: false,
            ..MockConfig::default()
        },
    )
    .await
    .unwrap();
    let drr = |quantum, victim_weight| Setup {
        policy: "drr",
        quantum,
        victim_weight,
        flood: true,
    };
    let setups = [
        (
            "alone",
            Setup {
                flood: false,
                ..drr(None, 1.0)
            },
        ),
        (
            "FIFO",
            Setup {
                policy: "fifo",
                ..drr(None, 1.0)
            },
        ),
        ("DRR, default quantum", drr(None, 1.0)),
        ("DRR, quantum 64", drr(Some(64), 1.0)),
        ("weight 1000: the limit", drr(None, 1000.0)),
    ];
    println!("{secs} s per run; pool of 4, 50 ms ±30%, flood of 24 closed loops\n");
    println!("| victim | {} |", setups.map(|s| s.0).join(" | "));
    println!("|---|{}", "---|".repeat(setups.len()));
    for (victim, think) in [
        ("sequential agent", Duration::ZERO),
        ("interactive user (0.2 s think)", Duration::from_millis(200)),
    ] {
        let mut rate = format!("| {victim}, requests/s |");
        let mut wait = format!("| {victim}, p95 queue wait |");
        let mut alone = 0.0;
        for (name, setup) in setups {
            let (per_s, p95) = one(&mock, setup, think, secs).await;
            if name == "alone" {
                alone = per_s;
                rate += &format!(" {per_s:.1} |");
                wait += " — |";
            } else {
                rate += &format!(" {per_s:.1} ({:.2}×) |", per_s / alone);
                wait += &format!(" {p95:.0} ms |");
            }
        }
        println!("{rate}\n{wait}");
    }
    mock.shutdown().await;
}
