//! Pool capacity across replicas, held by leases in Redis: the provider never sees more than the
//! pool's `max_concurrency` over three replicas; a replica that dies holding leases gives its
//! slots back within the lease TTL; a limit learned from the provider's 429s (K = 4 behind a
//! configured 12) is shared by the replicas, so together they stay near K.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_limit_holds_across_replicas() {
    let Some(redis) = Redis::start() else { return };
    let mock = slow_mock(30).await;
    let rs = replicas(|i| replica(&redis, &mock.base_url(), i, 6).add_tenants(&["a", "b"])).await;
    let mut tasks = Vec::new();
    for i in 0..120 {
        let addr = rs[i % 3].addr;
        let tenant = if i % 2 == 0 { "a" } else { "b" };
        tasks.push(tokio::spawn(
            async move { chat(addr, tenant, 8, &[]).await },
        ));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap(), 200);
    }
    let max = mock.stats.max_in_flight();
    eprintln!("max in flight at the mock across 3 replicas: {max} (limit 6)");
    assert!(
        max <= 6,
        "the mock saw {max} in flight, the pool limit is 6"
    );
    assert!(max >= 3, "the replicas barely used the pool ({max})");
    // Everything drains and every replica gives its leases back.
    let mut conn = redis.conn().await;
    let drained = until(200, || {
        let mut conn = conn.clone();
        async move {
            let n: u64 = redis::cmd("ZCARD")
                .arg("{fairgate}:pool:mock:leases")
                .query_async(&mut conn)
                .await
                .unwrap();
            n == 0
        }
    })
    .await;
    let _: () = redis::cmd("PING").query_async(&mut conn).await.unwrap();
    assert!(drained, "idle replicas still hold leases");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_replicas_slots_come_back_within_the_ttl() {
    let Some(redis) = Redis::start() else { return };
    let mock = slow_mock(0).await;
    let doomed = replica(&redis, &mock.base_url(), 9, 4).add_tenants(&["a"]);
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let (kill_tx, kill_rx) = tokio::sync::oneshot::channel::<()>();
    // The doomed replica runs on its own runtime: dropping it is a crash (no release runs).
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let handle = doomed.start().await;
            addr_tx.send(handle.addr).unwrap();
            let _ = kill_rx.await;
            std::mem::forget(handle);
        });
        drop(rt);
    });
    let doomed_addr = addr_rx.recv().unwrap();
    // It takes all four slots with long requests.
    for _ in 0..4 {
        tokio::spawn(async move {
            let req = post(
                doomed_addr,
                "/v1/chat/completions",
                Some("key-a"),
                &body(8),
                &[("x-mock-delay-ms", "30000")],
            );
            let _ = tokio::time::timeout(Duration::from_secs(40), client().request(req)).await;
        });
    }
    assert!(eventually(|| mock.stats.in_flight() == 4).await);
    let mut conn = redis.conn().await;
    let leases = |mut conn: redis::aio::MultiplexedConnection| async move {
        let n: u64 = redis::cmd("ZCARD")
            .arg("{fairgate}:pool:mock:leases")
            .query_async(&mut conn)
            .await
            .unwrap();
        n
    };
    assert_eq!(leases(conn.clone()).await, 4);
    let survivor = replica(&redis, &mock.base_url(), 1, 4)
        .add_tenants(&["a"])
        .start()
        .await;
    kill_tx.send(()).unwrap();
    thread.join().unwrap();
    // Within the TTL (1.5 s; polled for at most 3 s) the dead replica's leases are gone...
    let c = conn.clone();
    assert!(
        until(150, || {
            let c = c.clone();
            async move {
                let n: Vec<String> = redis::cmd("ZRANGE")
                    .arg("{fairgate}:pool:mock:leases")
                    .arg(0)
                    .arg(-1)
                    .query_async(&mut c.clone())
                    .await
                    .unwrap();
                !n.iter().any(|m| m.starts_with("r9:"))
            }
        })
        .await,
        "the dead replica's leases expired"
    );
    // ...and the survivor can use all four slots.
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let addr = survivor.addr;
        tasks.push(tokio::spawn(async move {
            chat(addr, "a", 8, &[("x-mock-delay-ms", "300")]).await
        }));
    }
    assert!(
        until(150, || async { survivor.pools[0].load().1 == 4 }).await,
        "the survivor holds all four slots"
    );
    for t in tasks {
        assert_eq!(t.await.unwrap(), 200);
    }
    let _: () = redis::cmd("PING").query_async(&mut conn).await.unwrap();
}

/// Cluster-wide leases of pool `mock` right now.
async fn leased(conn: &redis::aio::MultiplexedConnection) -> u64 {
    redis::cmd("ZCARD")
        .arg("{fairgate}:pool:mock:leases")
        .query_async(&mut conn.clone())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_learned_from_429s_is_shared_by_the_replicas() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let Some(redis) = Redis::start() else { return };
    // The provider takes K = 4 at a time; the pool is configured with 12 over three replicas.
    let mock = mock_with(MockConfig {
        max_concurrency: Some(4),
        retry_after: Duration::from_millis(100),
        base_latency: Duration::from_millis(40),
        record_requests: false,
        ..MockConfig::default()
    })
    .await;
    let rs = replicas(|i| replica(&redis, &mock.base_url(), i, 12).add_tenants(&["a"])).await;
    let conn = redis.conn().await;
    // "Late": once the replicas have learned and shared a limit near K (an event, not a time).
    let learned = Arc::new(AtomicBool::new(false));
    let late = {
        let learned = learned.clone();
        move || learned.load(Ordering::Relaxed)
    };
    let stop = Arc::new(AtomicBool::new(false));
    // [ok once learned, 429 once learned, other statuses]
    let tally: Arc<[AtomicUsize; 3]> = Arc::default();
    let mut clients = Vec::new();
    for c in 0..18 {
        let (addr, stop, tally, late) = (rs[c % 3].addr, stop.clone(), tally.clone(), late.clone());
        clients.push(tokio::spawn(async move {
            for _ in 0..2000 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let status = chat(addr, "a", 8, &[]).await;
                let i = match status {
                    200 => 0,
                    429 => 1,
                    _ => 2,
                };
                if late() || i == 2 {
                    tally[i].fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    // Once the shared limit is near K: the provider's refusals, and the cluster's leased slots
    // (what the replicas together let through to the provider), sampled.
    let mut shared_limit = None;
    for _ in 0..1000 {
        shared_limit = redis::cmd("GET")
            .arg("{fairgate}:pool:mock:limit")
            .query_async::<Option<u32>>(&mut conn.clone())
            .await
            .unwrap();
        if shared_limit.is_some_and(|l| l <= 6) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        shared_limit.is_some_and(|l| l <= 6),
        "the replicas learned and shared a limit near K: {shared_limit:?}"
    );
    // Settled: 50 more completions at the learned limit (the 429s of the cut that published it
    // are still being answered right after it), then the counting starts.
    let at_learn = mock.stats.completed();
    assert!(eventually(|| mock.stats.completed() >= at_learn + 50).await);
    learned.store(true, Ordering::Relaxed);
    let (rejected_at_settle, completed_at_settle) =
        (mock.stats.rejected_429(), mock.stats.completed());
    let mut max_leased = 0;
    let mut samples = Vec::new();
    for _ in 0..200 {
        let n = leased(&conn).await;
        max_leased = max_leased.max(n);
        samples.push(n);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.unwrap();
    }
    let rejected = mock.stats.rejected_429() - rejected_at_settle;
    let completed = mock.stats.completed() - completed_at_settle;
    let mean = samples.iter().sum::<u64>() as f64 / samples.len() as f64;
    let (ok, limited, other) = (
        tally[0].load(Ordering::Relaxed),
        tally[1].load(Ordering::Relaxed),
        tally[2].load(Ordering::Relaxed),
    );
    let limits: Vec<u32> = rs.iter().map(|r| r.admission.capacity[0].limit()).collect();
    let shared: Option<u32> = redis::cmd("GET")
        .arg("{fairgate}:pool:mock:limit")
        .query_async(&mut conn.clone())
        .await
        .unwrap();
    eprintln!(
        "cluster 429 storm (K = 4, configured 12 over 3 replicas), once the limit was learned: \
         clients {ok} ok / {limited} 429 / {other} other; provider completed {completed}, \
         refused {rejected}; cluster leases max {max_leased} mean {mean:.2}; shared limit \
         {shared:?}, local learned limits {limits:?}"
    );
    assert_eq!(other, 0, "no other statuses");
    assert!(ok >= 100, "the storm barely ran ({ok} ok)");
    assert!(
        limited * 100 <= ok + limited,
        "{limited} 429s of {}",
        ok + limited
    );
    // Not the configured 12: the learned limit holds across the replicas together (probing
    // back up overshoots K for a moment: three replicas contending split ⌊limit / 3⌋ each, so a
    // limit of 4 or 5 uses 3 slots and 6 uses 6, until the next 429 republishes)...
    // The 95th percentile, not the maximum: one sample taken while a starved replica's lease
    // round lags (seen on a loaded two-core machine) is not the steady state this asserts; the
    // provider's refusals below bound what such moments cost.
    let mut sorted = samples.clone();
    sorted.sort_unstable();
    let p95 = sorted[sorted.len() * 95 / 100];
    assert!(
        p95 <= 8 && mean <= 5.0,
        "the replicas together leased {p95} at p95 (max {max_leased}), {mean:.2} on average \
         (K = 4)"
    );
    // ...and is not stuck far below K either (an estimate of 2 once held it there).
    assert!(
        mean >= 2.5,
        "the replicas together used {mean:.2} slots on average (K = 4)"
    );
    assert!(
        rejected * 10 <= completed,
        "the provider refused {rejected} attempts for {completed} completions"
    );
}
