//! A pool of several endpoints across three replicas: together they never send an endpoint
//! more than its `max_concurrency` (each replica alone would fill a primary of 2 with 2 of its
//! own: 6), and an endpoint one replica ejected gets nothing from the others.

use std::sync::atomic::{AtomicU64, Ordering};

use super::*;
use toml::Value;

/// Replica `i` with one pool `mock` over `endpoints` (name, base URL, max_concurrency,
/// priority), tenant `a`, up to 3 attempts a request.
fn pool_replica(redis: &Redis, i: usize, endpoints: &[(&str, &str, u32, u32)]) -> Conf {
    let eps = endpoints
        .iter()
        .map(|&(name, url, max, priority)| {
            Value::Table(
                entry("name", name)
                    .with("base_url", url)
                    .with("max_concurrency", max)
                    .with("priority", priority),
            )
        })
        .collect();
    let pool = entry("name", "mock").with("endpoints", Value::Array(eps));
    clustered(Conf::bare().push("upstreams", pool), redis, i)
        .set("admission.max_retries", 3)
        .add_tenants(&["a"])
}

/// Endpoint `endpoint`'s state in a scrape of `addr` (`none`: no state is 1).
async fn state(addr: SocketAddr, endpoint: &str) -> String {
    let text = scrape(addr).await;
    ["in_service", "paused", "probing", "ejected"]
        .into_iter()
        .find(|s| {
            value(
                &text,
                "fairgate_endpoint_state",
                &[("endpoint", endpoint), ("state", s)],
            ) == Some(1.0)
        })
        .unwrap_or("none")
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_never_push_an_endpoint_past_its_limit() {
    let Some(redis) = Redis::start() else { return };
    let primary = slow_mock(40).await;
    let backup = slow_mock(40).await;
    let (p, b) = (primary.base_url(), backup.base_url());
    let rs =
        replicas(|i| pool_replica(&redis, i, &[("primary", &p, 2, 0), ("backup", &b, 6, 1)])).await;
    let mut tasks = Vec::new();
    for i in 0..90 {
        let addr = rs[i % 3].addr;
        tasks.push(tokio::spawn(async move { chat(addr, "a", 8, &[]).await }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap(), 200);
    }
    let (pmax, bmax) = (primary.stats.max_in_flight(), backup.stats.max_in_flight());
    let (pn, bn) = (primary.stats.requests(), backup.stats.requests());
    eprintln!(
        "3 replicas, 90 requests: primary (limit 2) peak {pmax}, {pn} requests; \
         backup (limit 6) peak {bmax}, {bn} requests"
    );
    assert!(
        pmax <= 2,
        "the primary saw {pmax} in flight, its limit is 2"
    );
    assert!(bmax <= 6, "the backup saw {bmax} in flight, its limit is 6");
    assert!(
        pmax >= 1 && bmax >= 2,
        "the pool was barely used ({pmax}, {bmax})"
    );
    assert_eq!(pn + bn, 90);
    // Idle replicas give every endpoint lease back.
    let mut conn = redis.conn().await;
    let drained = until(200, || {
        let mut conn = conn.clone();
        async move {
            let mut n = 0u64;
            for ep in ["primary", "backup"] {
                let k: u64 = redis::cmd("ZCARD")
                    .arg(format!("{{fairgate}}:pool:mock:ep:{ep}:leases"))
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                n += k;
            }
            n == 0
        }
    })
    .await;
    let _: () = redis::cmd("PING").query_async(&mut conn).await.unwrap();
    assert!(drained, "idle replicas still hold endpoint leases");
}

/// A local endpoint that answers every request `502` and closes the connection, counting the
/// connections (one a request).
async fn broken() -> (String, Arc<AtomicU64>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1", l.local_addr().unwrap());
    let accepted = Arc::new(AtomicU64::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = l.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buf = vec![0; 64 * 1024];
                let _ = conn.read(&mut buf).await;
                let answer =
                    "HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
                let _ = conn.write_all(answer.as_bytes()).await;
            });
        }
    });
    (url, accepted)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ejection_seen_by_one_replica_is_honoured_by_the_others() {
    let Some(redis) = Redis::start() else { return };
    let good = slow_mock(0).await;
    let (bad, hits) = broken().await;
    let g = good.base_url();
    let health = toml::Table::new()
        .with("consecutive_failures", 2)
        .with("eject_ms", 60_000)
        .with("max_eject_ms", 60_000);
    let rs = replicas(|i| {
        pool_replica(&redis, i, &[("bad", &bad, 4, 0), ("good", &g, 4, 0)])
            .upstream("health", health.clone())
    })
    .await;
    // Replica 0 alone meets the broken endpoint (listed first: an idle pool's picks go to it)
    // until it ejects it, every request still answered by the good one.
    let mut ejected = false;
    for _ in 0..20 {
        assert_eq!(chat(rs[0].addr, "a", 8, &[]).await, 200);
        if state(rs[0].addr, "bad").await == "ejected" {
            ejected = true;
            break;
        }
    }
    assert!(ejected, "replica 0 never ejected the broken endpoint");
    // The others hear of it at their next lease round (a third of the 1.5 s TTL).
    for r in &rs[1..] {
        let addr = r.addr;
        let seen = until(200, || async move { state(addr, "bad").await == "ejected" }).await;
        assert!(seen, "replica at {addr} does not honour the ejection");
    }
    let before = hits.load(Ordering::SeqCst);
    for i in 0..30 {
        assert_eq!(chat(rs[1 + i % 2].addr, "a", 8, &[]).await, 200);
    }
    let after = hits.load(Ordering::SeqCst);
    eprintln!("the broken endpoint: {before} connections before the ejection, {after} after");
    assert_eq!(
        after, before,
        "replicas 1 and 2 sent to the ejected endpoint"
    );
}
