//! Figures for tenants at runtime (`tenant::runtime`), in one process on 127.0.0.1, bounded:
//!
//! 1. startup with `N` tenants in the config file against `N` API tenants in the SQLite store
//!    (`[store] path`, written directly before the start), each with one key; then one request
//!    of the last tenant, to show its key works;
//! 2. request latency (p50, p99) of a config tenant's closed-loop clients, alone, while `KEYS`
//!    keys are created through the admin API (8 at a time), and alone again; printed as ratios
//!    to the first run (the second alone run shows the noise);
//! 3. how long creating `CREATE` more API tenants one by one takes through the admin API (each
//!    publishes a new generation: the cost grows with the number of tenants).
//!
//! `cargo run --release --example runtime_tenants` (under `flock /tmp/release.lock` on a shared
//! machine); `N`, `KEYS`, `CREATE` override 10000, 1000, 100. `PACE_MS`: each of the 4 clients
//! waits that long before each request (default 0: back to back, which keeps the cores busy
//! alone, so any other work shows as queueing; paced, the load leaves the cores room).
//!
//! The clients share the process with the proxy, but not an executor: the 4 request clients
//! run on their own runtime (2 threads), the 8 key creators (the admin client, which would be
//! another host's sign-up service) on theirs (1 thread), each with its own HTTP client and
//! connections, all at normal priority; the mock upstream runs on the main runtime. On one
//! shared runtime a request client's task also waited behind the creators' tasks, a cost of
//! the harness, not of the proxy. `ADMIN_IDLE=1` runs the admin client's thread at
//! `SCHED_IDLE` (as the proxy's control-plane thread): on 2 cores kept busy by the request
//! clients, the creators' own CPU (another host's, in production) then stops counting as the
//! proxy's, and what remains of the slowdown is the proxy's own admin handling.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use fairgate::tenant::runtime::record::{new_key, TenantRecord};
use fairgate::tenant::runtime::sqlite::Sqlite;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

const TOKEN: &str = "tok-runtime-bench";

fn env_num(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn base(mock: &str, store: Option<&std::path::Path>) -> String {
    let mut t = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n[admin]\ntoken_env = \"FG_BENCH_TOKEN\"\n\
         [[upstreams]]\nname = \"mock\"\nbase_url = \"{mock}\"\nmax_concurrency = 64\n\
         [[tenants]]\nid = \"load\"\napi_keys = [\"fg-load\"]\n"
    );
    if let Some(p) = store {
        t.push_str(&format!("[store]\npath = \"{}\"\n", p.display()));
    }
    t
}

async fn start(text: &str) -> (fairgate::server::ServerHandle, Duration) {
    let config = fairgate::config::Config::from_toml_str(text).expect("config");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let env = fairgate::server::Env::vars([("FG_BENCH_TOKEN", TOKEN)]);
    let t0 = Instant::now();
    let h = fairgate::server::start_with_env(config, listener, env)
        .await
        .expect("proxy");
    (h, t0.elapsed())
}

type Http = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

async fn call(c: &Http, addr: SocketAddr, path: &str, key: &str, body: &str) -> u16 {
    call_body(c, addr, path, key, body).await.0
}

async fn call_body(c: &Http, addr: SocketAddr, path: &str, key: &str, body: &str) -> (u16, String) {
    let req = http::Request::post(format!("http://{addr}{path}"))
        .header("authorization", format!("Bearer {key}"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap();
    let res = c.request(req).await.expect("answer");
    let status = res.status().as_u16();
    let body = res
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    (status, String::from_utf8_lossy(&body).into_owned())
}

const CHAT: &str =
    r#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}],"max_tokens":8}"#;

/// p50 and p99 (ms) of 4 closed-loop clients of the config tenant until `stop`.
async fn latencies(c: Http, addr: SocketAddr, stop: Arc<AtomicBool>) -> (f64, f64, usize) {
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let (c, stop) = (c.clone(), stop.clone());
            tokio::spawn(async move {
                let mut v = Vec::new();
                let pace = Duration::from_millis(env_num("PACE_MS", 0) as u64);
                while !stop.load(Ordering::Relaxed) && v.len() < 1_000_000 {
                    if !pace.is_zero() {
                        tokio::time::sleep(pace).await;
                    }
                    let t0 = Instant::now();
                    assert_eq!(
                        call(&c, addr, "/v1/chat/completions", "fg-load", CHAT).await,
                        200
                    );
                    v.push(t0.elapsed().as_secs_f64() * 1000.0);
                }
                v
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all.sort_by(f64::total_cmp);
    let q = |p: f64| all[((all.len() as f64 * p) as usize).min(all.len() - 1)];
    (q(0.5), q(0.99), all.len())
}

#[tokio::main]
async fn main() {
    let n = env_num("N", 10_000);
    let mock = fairgate_mock::MockServer::start(
        SocketAddr::from(([127, 0, 0, 1], 0)),
        fairgate_mock::MockConfig {
            record_requests: false,
            ..Default::default()
        },
    )
    .await
    .expect("mock");
    let url = mock.base_url();

    // 1. Startup: N config tenants vs N API tenants.
    let mut text = base(&url, None);
    for i in 0..n {
        text.push_str(&format!(
            "[[tenants]]\nid = \"c{i}\"\napi_keys = [\"fg-c{i}\"]\n"
        ));
    }
    let (h, config_start) = start(&text).await;
    h.shutdown();
    let _ = h.join().await;
    let path = std::env::temp_dir().join(format!("fg-bench-{:x}.db", rand::random::<u64>()));
    let db = Sqlite::open(&path).unwrap();
    let mut last_key = String::new();
    for i in 0..n {
        let t = TenantRecord {
            id: format!("t{i}"),
            spec: serde_json::Map::new(),
            created_at: 0,
            updated_at: 0,
            deleted: false,
        };
        db.put_tenant(&t, true).unwrap();
        let (k, key) = new_key(&t.id, None, None);
        db.put_key(&k, true).unwrap();
        last_key = key;
    }
    drop(db);
    let (h, api_start) = start(&base(&url, Some(&path))).await;
    let c: Http = Client::builder(TokioExecutor::new()).build_http();
    let ok = call(&c, h.addr, "/v1/chat/completions", &last_key, CHAT).await;
    println!(
        "startup with {n} config tenants: {:.0} ms; with {n} API tenants (+1 config): {:.0} ms; \
         last API tenant's key answered {ok}",
        config_start.as_secs_f64() * 1000.0,
        api_start.as_secs_f64() * 1000.0
    );

    // 2. Request latency alone and during a burst of key creations: the request clients and
    // the admin client on runtimes of their own (see the module docs).
    let addr = h.addr;
    let load_rt = runtime("load", 2);
    let admin_rt = if env_num("ADMIN_IDLE", 0) == 1 {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("admin")
            .on_thread_start(|| {
                fairgate::tenant::runtime::control::lower_priority();
            })
            .enable_all()
            .build()
            .expect("runtime")
    } else {
        runtime("admin", 1)
    };
    let lc: Http = Client::builder(TokioExecutor::new()).build_http();
    let ac: Http = Client::builder(TokioExecutor::new()).build_http();
    let stop = Arc::new(AtomicBool::new(false));
    let run = load_rt.spawn(latencies(lc.clone(), addr, stop.clone()));
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::Relaxed);
    let (p50, p99, count) = run.await.unwrap();
    println!("alone: p50 {p50:.2} ms, p99 {p99:.2} ms over {count} requests");
    let alone = (p50, p99);
    let keys = env_num("KEYS", 1000);
    let stop = Arc::new(AtomicBool::new(false));
    let run = load_rt.spawn(latencies(lc.clone(), addr, stop.clone()));
    let t0 = Instant::now();
    let creators: Vec<_> = (0..8)
        .map(|w| {
            let c = ac.clone();
            admin_rt.spawn(async move {
                for i in (w..keys).step_by(8) {
                    let path = format!("/admin/tenants/t{}/keys", i % n);
                    let (status, body) = call_body(&c, addr, &path, TOKEN, "{}").await;
                    assert_eq!(status, 201, "{body}");
                }
            })
        })
        .collect();
    for t in creators {
        t.await.unwrap();
    }
    let burst = t0.elapsed();
    stop.store(true, Ordering::Relaxed);
    let (p50, p99, count) = run.await.unwrap();
    println!(
        "during {keys} key creations ({:.0} ms, {:.0}/s): p50 {p50:.2} ms, p99 {p99:.2} ms over \
         {count} requests",
        burst.as_secs_f64() * 1000.0,
        keys as f64 / burst.as_secs_f64()
    );
    // Alone again, to show the noise between two runs without a burst.
    let stop = Arc::new(AtomicBool::new(false));
    let again = load_rt.spawn(latencies(lc.clone(), addr, stop.clone()));
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::Relaxed);
    let (a50, a99, acount) = again.await.unwrap();
    println!("alone again: p50 {a50:.2} ms, p99 {a99:.2} ms over {acount} requests");
    println!(
        "ratios during the burst / alone before: p50 {:.2}, p99 {:.2}; alone after / before: \
         p50 {:.2}, p99 {:.2}",
        p50 / alone.0,
        p99 / alone.1,
        a50 / alone.0,
        a99 / alone.1
    );

    // 3. Creating tenants one by one (each publishes a generation).
    let create = env_num("CREATE", 100);
    let t0 = Instant::now();
    for i in 0..create {
        let body = format!(r#"{{"id":"new{i}","weight":2}}"#);
        assert_eq!(call(&c, addr, "/admin/tenants", TOKEN, &body).await, 201);
    }
    let took = t0.elapsed();
    println!(
        "{create} tenants created one by one beside {n}: {:.1} ms each",
        took.as_secs_f64() * 1000.0 / create as f64
    );
    h.shutdown();
    let _ = h.join().await;
    let _ = std::fs::remove_file(&path);
    load_rt.shutdown_background();
    admin_rt.shutdown_background();
}

/// A runtime of `threads` threads named `name`, for one kind of client.
fn runtime(name: &str, threads: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .thread_name(name)
        .enable_all()
        .build()
        .expect("runtime")
}
