//! Degraded mode: Redis killed mid-run loses or hangs no request, sets the degraded gauge, bounds
//! the overshoot by the local allowance and recovers after a restart (while a hard token budget
//! fails closed); Redis stalls shorter than `degrade_after_ms` degrade no replica and the pool
//! limit holds; one replica cut off alone runs on its allowance and the bound holds.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_degrades_without_losing_requests_and_recovers() {
    let Some(mut redis) = Redis::start() else {
        return;
    };
    let mock = slow_mock(20).await;
    let rs = replicas(|i| {
        replica(&redis, &mock.base_url(), i, 6)
            .add_tenants(&["a", "b", "capped"])
            .tenant("capped", "tokens_per_minute", 1000000)
            .tenant("capped", "requests_per_minute", 100000)
    })
    .await;
    let addrs: Vec<_> = rs.iter().map(|r| r.addr).collect();
    assert_eq!(
        chat(addrs[0], "capped", 8, &[]).await,
        200,
        "budgeted tenant, Redis up"
    );
    let run = |n: usize| {
        let addrs = addrs.clone();
        tokio::spawn(async move {
            let mut tasks = Vec::new();
            for i in 0..n {
                let addr = addrs[i % 3];
                let tenant = if i % 2 == 0 { "a" } else { "b" };
                tasks.push(tokio::spawn(
                    async move { chat(addr, tenant, 8, &[]).await },
                ));
                tokio::time::sleep(Duration::from_millis(4)).await;
            }
            let mut ok = 0;
            for t in tasks {
                // `send` panics after its safety timeout: a hung request fails the test.
                if t.await.unwrap() == 200 {
                    ok += 1;
                }
            }
            ok
        })
    };
    let load = run(150);
    assert!(eventually(|| mock.stats.completed() >= 40).await);
    redis.kill();
    mock.stats.reset_max_in_flight();
    let addr0 = addrs[0];
    assert!(
        until(250, || async move {
            metric(addr0, "fairgate_cluster_degraded").await == Some(1.0)
        })
        .await,
        "degraded gauge set"
    );
    // A hard token budget fails closed while Redis is away; the tenant is told whose limit.
    let r = send(post(
        addrs[1],
        "/v1/chat/completions",
        Some("key-capped"),
        &body(8),
        &[],
    ))
    .await;
    assert_eq!(r.status, 429);
    assert_eq!(r.headers["x-fairgate-limit"], "tenant");
    assert_eq!(load.await.unwrap(), 150, "every request answered 200");
    let degraded_max = mock.stats.max_in_flight();
    eprintln!("max in flight while degraded: {degraded_max} (allowance 3 × ⌈6/3⌉ = 6)");
    assert!(degraded_max <= 6);
    // Recovery: Redis back on the same port, every replica rejoins.
    assert!(redis.spawn());
    for &addr in &addrs {
        assert!(
            until(250, || async move {
                metric(addr, "fairgate_cluster_degraded").await == Some(0.0)
            })
            .await,
            "replica {addr} recovered"
        );
    }
    mock.stats.reset_max_in_flight();
    assert_eq!(run(90).await.unwrap(), 90);
    let max = mock.stats.max_in_flight();
    eprintln!("max in flight after recovery: {max}");
    assert!(max <= 6);
    assert_eq!(
        chat(addrs[2], "capped", 8, &[]).await,
        200,
        "budget open again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_stall_shorter_than_degrade_after_neither_degrades_nor_overshoots() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let Some(redis) = Redis::start() else { return };
    let mock = slow_mock(30).await;
    let rs = replicas(|i| replica(&redis, &mock.base_url(), i, 6).add_tenants(&["a", "b"])).await;
    let addrs: Vec<_> = rs.iter().map(|r| r.addr).collect();
    let mut tasks = Vec::new();
    for i in 0..200 {
        let addr = addrs[i % 3];
        let tenant = if i % 2 == 0 { "a" } else { "b" };
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(6 * i as u64)).await;
            chat(addr, tenant, 8, &[]).await
        }));
    }
    assert!(eventually(|| mock.stats.completed() >= 20).await);
    mock.stats.reset_max_in_flight();
    // Every replica's degraded gauge, sampled while Redis stalls.
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (addrs, stop) = (addrs.clone(), stop.clone());
        tokio::spawn(async move {
            let mut seen = 0.0f64;
            for _ in 0..500 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                for &a in &addrs {
                    seen = seen.max(metric(a, "fairgate_cluster_degraded").await.unwrap_or(0.0));
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            seen
        })
    };
    // Three stalls of 300 ms (three timeouts' worth each, less than `degrade_after_ms`).
    let mut conn = redis.conn().await;
    for _ in 0..3 {
        let _: () = redis::cmd("DEBUG")
            .arg("SLEEP")
            .arg("0.3")
            .query_async(&mut conn)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    let mut ok = 0;
    for t in tasks {
        if t.await.unwrap() == 200 {
            ok += 1;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let degraded = watcher.await.unwrap();
    let max = mock.stats.max_in_flight();
    eprintln!(
        "three 300 ms Redis stalls (timeout 100 ms): {ok}/200 answered 200, max in flight {max} \
         (limit 6), degraded gauge max {degraded}"
    );
    assert_eq!(ok, 200);
    assert_eq!(
        degraded, 0.0,
        "a stall shorter than degrade_after_ms degraded a replica"
    );
    assert!(max <= 6, "{max} in flight for a limit of 6");
}

/// A TCP relay to Redis that the test can cut: every relayed connection is dropped and new ones
/// are refused, so one replica alone loses Redis while the others keep it.
async fn relay(target: u16) -> (SocketAddr, tokio::sync::watch::Sender<bool>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (cut, cut_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        loop {
            let Ok((mut inbound, _)) = listener.accept().await else {
                return;
            };
            if *cut_rx.borrow() {
                continue; // refused: dropped at once
            }
            let mut cut_rx = cut_rx.clone();
            tokio::spawn(async move {
                let Ok(mut outbound) = tokio::net::TcpStream::connect(("127.0.0.1", target)).await
                else {
                    return;
                };
                tokio::select! {
                    _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                    _ = cut_rx.wait_for(|c| *c) => {}
                }
            });
        }
    });
    (addr, cut)
}

/// One replica cut off from Redis while the others keep it: it degrades, runs on its local
/// allowance (⌈limit / expected_replicas⌉ slots, `requests_per_minute ÷ expected_replicas`), and
/// dispatches nothing new between the cut and its degraded mode (it held no lease); the
/// provider sees at most the others' leases plus that allowance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_replica_cut_off_runs_on_its_allowance_and_the_bound_holds() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let Some(redis) = Redis::start() else { return };
    let mock = slow_mock(30).await;
    let (relayed, cut) = relay(redis.port).await;
    let rs = replicas(|i| {
        let conf = replica(&redis, &mock.base_url(), i, 6)
            .add_tenants(&["a", "b", "rpm"])
            .tenant("rpm", "requests_per_minute", 30);
        if i == 2 {
            conf.set("cluster.redis_url", format!("redis://{relayed}"))
        } else {
            conf
        }
    })
    .await;
    let addrs: Vec<SocketAddr> = rs.iter().map(|r| r.addr).collect();
    // Replicas 0 and 1 keep the pool busy; replica 2 is idle, so it holds no lease.
    let stop = Arc::new(AtomicBool::new(false));
    let mut load = Vec::new();
    for c in 0..8 {
        let (addr, stop) = (addrs[c % 2], stop.clone());
        let tenant = if c % 2 == 0 { "a" } else { "b" };
        load.push(tokio::spawn(async move {
            let mut statuses = Vec::new();
            for _ in 0..1000 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                statuses.push(chat(addr, tenant, 8, &[]).await);
            }
            statuses
        }));
    }
    assert!(eventually(|| mock.stats.completed() >= 20).await);
    cut.send_replace(true);
    // Replica 2's requests arrive right after the cut: they queue, and nothing of replica 2 is
    // dispatched until it has degraded (sampled: in flight stays 0 while not degraded).
    let mut asks = Vec::new();
    for _ in 0..12 {
        let addr = addrs[2];
        asks.push(tokio::spawn(async move { chat(addr, "a", 8, &[]).await }));
    }
    let q2 = rs[2].pools[0].clone();
    let addr2 = addrs[2];
    let mut dispatched_before_degraded = 0;
    let mut degraded = false;
    for _ in 0..400 {
        let in_flight_before = q2.load().1;
        if metric(addr2, "fairgate_cluster_degraded").await == Some(1.0) {
            degraded = true;
            break;
        }
        dispatched_before_degraded = dispatched_before_degraded.max(in_flight_before);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(degraded, "the cut-off replica degraded");
    assert_eq!(
        dispatched_before_degraded, 0,
        "nothing dispatched between the cut and degraded mode"
    );
    for (i, &addr) in addrs.iter().enumerate().take(2) {
        assert_eq!(
            metric(addr, "fairgate_cluster_degraded").await,
            Some(0.0),
            "replica {i} still has Redis"
        );
    }
    mock.stats.reset_max_in_flight();
    // On its allowance it serves: all twelve answered 200, never more than ⌈6/3⌉ at once.
    let mut max_local = 0;
    while asks.iter().any(|t| !t.is_finished()) {
        max_local = max_local.max(q2.load().1);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for t in asks {
        assert_eq!(t.await.unwrap(), 200);
    }
    assert!(
        max_local <= 2,
        "replica 2 ran {max_local} at once on an allowance of 2"
    );
    // requests_per_minute = 30 over 3 expected replicas: 10 a minute here, one bucket of 10.
    let mut admitted = 0;
    for _ in 0..14 {
        match chat(addr2, "rpm", 8, &[]).await {
            200 => admitted += 1,
            429 => {}
            s => panic!("unexpected status {s}"),
        }
    }
    assert_eq!(
        admitted, 10,
        "the degraded replica's share of the request rate"
    );
    stop.store(true, Ordering::Relaxed);
    for t in load {
        assert!(t.await.unwrap().iter().all(|&s| s == 200));
    }
    let max = mock.stats.max_in_flight();
    eprintln!(
        "one replica cut off: provider max in flight {max} (bound: limit 6 + allowance 2), \
         replica 2 max {max_local}, rpm admitted {admitted} of 14"
    );
    assert!(max <= 8, "provider saw {max} in flight");
}
