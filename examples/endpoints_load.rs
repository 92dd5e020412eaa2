//! Load figures of a pool of endpoints, in one process on 127.0.0.1 (bounded in time):
//!
//! 1. goodput of one endpoint of capacity 12 against a pool of three endpoints of capacity 4
//!    (each mock refuses with 429 beyond its capacity), the pool configured at the capacities
//!    and configured at twice them (the limits must be learned);
//! 2. client errors when one of the three dies mid-load (its mock shut down, connections closed);
//! 3. the time from the dead endpoint's return (a new mock on the same address) until a request
//!    completes on it again.
//!
//! `cargo run --release --example endpoints_load` (under `flock /tmp/release.lock` on a shared
//! machine). Every request asks the mock for `SERVICE_MS` before its head; `CLIENTS` closed-loop
//! clients run for `SECS` seconds per phase. Ratios are within one run.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use fairgate_mock::{MockConfig, MockServer};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

const SERVICE_MS: u64 = 50;
const CLIENTS: usize = 24;
const SECS: u64 = 8;

fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

async fn mock(addr: SocketAddr, capacity: usize) -> MockServer {
    MockServer::start(
        addr,
        MockConfig {
            max_concurrency: Some(capacity),
            retry_after: Duration::from_millis(100),
            record_requests: false,
            ..MockConfig::default()
        },
    )
    .await
    .expect("mock starts")
}

fn any() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

async fn proxy(endpoints: &[(&str, String, u32)]) -> fairgate::server::ServerHandle {
    let mut t = String::from(
        "[server]\nlisten = \"127.0.0.1:0\"\n[metrics]\n[[upstreams]]\nname = \"pool\"\n",
    );
    for (name, url, max) in endpoints {
        t.push_str(&format!(
            "[[upstreams.endpoints]]\nname = \"{name}\"\nbase_url = \"{url}\"\nmax_concurrency = {max}\n"
        ));
    }
    t.push_str("[[tenants]]\nid = \"load\"\napi_keys = [\"fg-load\"]\n");
    let config = fairgate::config::Config::from_toml_str(&t).expect("config");
    let listener = tokio::net::TcpListener::bind(any()).await.unwrap();
    fairgate::server::start(config, listener)
        .await
        .expect("proxy")
}

#[derive(Default)]
struct Counts {
    ok: AtomicU64,
    refused: AtomicU64,
    failed: AtomicU64,
    /// The statuses and bodies of the failures (first few).
    why: std::sync::Mutex<Vec<String>>,
}

/// `CLIENTS` closed-loop clients against `addr` until `stop`.
async fn load(addr: SocketAddr, stop: Arc<AtomicBool>, counts: Arc<Counts>) {
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let body = Bytes::from_static(
        br#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hello"}],"max_tokens":16}"#,
    );
    let tasks: Vec<_> = (0..env_num("CLIENTS", CLIENTS as u64))
        .map(|_| {
            let (client, stop, counts, body) =
                (client.clone(), stop.clone(), counts.clone(), body.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let req = http::Request::post(format!("http://{addr}/v1/chat/completions"))
                        .header("authorization", "Bearer fg-load")
                        .header("content-type", "application/json")
                        .header(
                            "x-mock-delay-ms",
                            env_num("SERVICE_MS", SERVICE_MS).to_string(),
                        )
                        .body(Full::new(body.clone()))
                        .unwrap();
                    let outcome = async {
                        let res = client.request(req).await.map_err(|e| e.to_string())?;
                        let status = res.status().as_u16();
                        let body = res.into_body().collect().await.map_err(|e| e.to_string())?;
                        Ok::<(u16, Bytes), String>((status, body.to_bytes()))
                    }
                    .await;
                    match outcome {
                        Ok((200, _)) => counts.ok.fetch_add(1, Ordering::Relaxed),
                        Ok((429, _)) => counts.refused.fetch_add(1, Ordering::Relaxed),
                        other => {
                            let mut why = counts.why.lock().unwrap();
                            if why.len() < 3 {
                                why.push(match other {
                                    Ok((s, b)) => format!("{s} {}", String::from_utf8_lossy(&b)),
                                    Err(e) => e,
                                });
                            }
                            counts.failed.fetch_add(1, Ordering::Relaxed)
                        }
                    };
                }
            })
        })
        .collect();
    for t in tasks {
        let _ = t.await;
    }
}

/// Runs the load for `secs` and returns (goodput per second, refused, failed).
async fn phase(addr: SocketAddr, secs: u64) -> (f64, u64, u64) {
    let stop = Arc::new(AtomicBool::new(false));
    let counts = Arc::new(Counts::default());
    let run = tokio::spawn(load(addr, stop.clone(), counts.clone()));
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs(secs)).await;
    stop.store(true, Ordering::Relaxed);
    run.await.unwrap();
    let took = t0.elapsed().as_secs_f64();
    for w in counts.why.lock().unwrap().iter() {
        println!("  failure: {w}");
    }
    (
        counts.ok.load(Ordering::Relaxed) as f64 / took,
        counts.refused.load(Ordering::Relaxed),
        counts.failed.load(Ordering::Relaxed),
    )
}

#[tokio::main]
async fn main() {
    let secs = env_num("SECS", SECS);
    let rounds = env_num("ROUNDS", 2);
    let service = env_num("SERVICE_MS", SERVICE_MS);
    println!(
        "{} clients, {service} ms per request, {secs} s per phase, {rounds} rounds; ideal goodput {:.0}/s",
        env_num("CLIENTS", CLIENTS as u64),
        12_000.0 / service as f64
    );
    for round in 1..=rounds {
        let one = mock(any(), 12).await;
        let p1 = proxy(&[("one", one.base_url(), 12)]).await;
        let (g1, r1, f1) = phase(p1.addr, secs).await;
        drop(p1);
        let three: Vec<MockServer> =
            futures_util::future::join_all((0..3).map(|_| mock(any(), 4))).await;
        let eps = |max: u32| -> Vec<(&str, String, u32)> {
            ["e0", "e1", "e2"]
                .into_iter()
                .zip(&three)
                .map(|(n, m)| (n, m.base_url(), max))
                .collect()
        };
        let p3 = proxy(&eps(4)).await;
        let (g3, r3, f3) = phase(p3.addr, secs).await;
        drop(p3);
        let p3l = proxy(&eps(8)).await;
        let (g3l, r3l, f3l) = phase(p3l.addr, secs).await;
        let rejected: u64 = three.iter().map(|m| m.stats.rejected_429()).sum();
        println!(
            "round {round}: one of 12: {g1:.1}/s (429 {r1}, errors {f1}); three of 4: {g3:.1}/s \
             (429 {r3}, errors {f3}), ratio {:.3}; three of 4 configured 8 (learned): {g3l:.1}/s \
             (429 {r3l}, errors {f3l}), ratio {:.3}; mock 429s {rejected}",
            g3 / g1,
            g3l / g1
        );
        drop(p3l);
        drop(three);

        // One endpoint dies mid-load, then comes back on its address.
        let mut three: Vec<Option<MockServer>> =
            futures_util::future::join_all((0..3).map(|_| mock(any(), 4)))
                .await
                .into_iter()
                .map(Some)
                .collect();
        let dying_addr = three[2].as_ref().unwrap().addr;
        let eps: Vec<(&str, String, u32)> = ["e0", "e1", "e2"]
            .into_iter()
            .zip(&three)
            .map(|(n, m)| (n, m.as_ref().unwrap().base_url(), 4))
            .collect();
        let p = proxy(&eps).await;
        let stop = Arc::new(AtomicBool::new(false));
        let counts = Arc::new(Counts::default());
        let run = tokio::spawn(load(p.addr, stop.clone(), counts.clone()));
        tokio::time::sleep(Duration::from_secs(secs / 2)).await;
        let before = (
            counts.ok.load(Ordering::Relaxed),
            counts.failed.load(Ordering::Relaxed),
        );
        three[2].take().unwrap().shutdown().await;
        let died = Instant::now();
        tokio::time::sleep(Duration::from_secs(secs / 2)).await;
        let after_death = (
            counts.ok.load(Ordering::Relaxed) - before.0,
            counts.failed.load(Ordering::Relaxed) - before.1,
        );
        let back = mock(dying_addr, 4).await;
        let returned = Instant::now();
        let mut used_after = None;
        while returned.elapsed() < Duration::from_secs(60) {
            if back.stats.completed() > 0 {
                used_after = Some(returned.elapsed());
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        stop.store(true, Ordering::Relaxed);
        run.await.unwrap();
        println!(
            "round {round}: e2 died under load: {} client errors in the {:.1} s after ({} ok, \
             {:.1}/s); came back after {:.1} s down: used again after {}",
            after_death.1,
            died.elapsed().as_secs_f64() - returned.elapsed().as_secs_f64(),
            after_death.0,
            after_death.0 as f64 / (secs / 2) as f64,
            (returned - died).as_secs_f64(),
            used_after.map_or("never (60 s)".into(), |d| format!("{} ms", d.as_millis())),
        );
        drop(p);
    }
}
