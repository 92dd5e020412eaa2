//! Fair service across replicas: weights 3:1 are served 3:1 with each tenant's requests spread
//! round-robin over the replicas; a small tenant beside a flood waits about one service time; a
//! tenant's service on other replicas is charged on this one.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weights_three_to_one_hold_across_replicas() {
    let Some(redis) = Redis::start() else { return };
    let mock = slow_mock(15).await;
    let rs = replicas(|i| {
        replica(&redis, &mock.base_url(), i, 6)
            .set("scheduler.quantum", 40)
            .add_tenants(&["heavy", "light", "z"])
            .tenant("heavy", "weight", 3.0)
    })
    .await;
    // Hold every slot (two per replica) while the flood queues up.
    let mut blockers = Vec::new();
    for i in 0..6 {
        let addr = rs[i % 3].addr;
        blockers.push(tokio::spawn(async move {
            chat(addr, "z", 8, &[("x-mock-delay-ms", "1500")]).await
        }));
    }
    assert!(eventually(|| mock.stats.in_flight() == 6).await);
    let per = 360;
    let order = Arc::new(Mutex::new(Vec::new()));
    let addrs: Vec<_> = rs.iter().map(|r| r.addr).collect();
    let pools: Vec<_> = rs.iter().map(|r| r.pools[0].clone()).collect();
    let mut tasks = Vec::new();
    for i in 0..2 * per {
        let tenant = if i % 2 == 0 { "heavy" } else { "light" };
        // Round-robin per tenant over the replicas.
        let addr = addrs[(i / 2) % 3];
        let (order, pools) = (order.clone(), pools.clone());
        tasks.push(tokio::spawn(async move {
            assert_eq!(chat(addr, tenant, 16, &[]).await, 200);
            // Counted only while every replica still has both tenants queued.
            let both = pools.iter().all(|p| {
                let q = |t: &str| {
                    p.tenant_load(&fairgate::domain::TenantId::new(t))
                        .unwrap()
                        .0
                };
                q("heavy") > 0 && q("light") > 0
            });
            order.lock().unwrap().push((tenant, both));
        }));
    }
    assert!(eventually(|| pools.iter().map(|p| p.load().0).sum::<usize>() == 2 * per).await);
    for b in blockers {
        assert_eq!(b.await.unwrap(), 200);
    }
    for t in tasks {
        t.await.unwrap();
    }
    let order = order.lock().unwrap();
    let window: Vec<_> = order.iter().filter(|(_, both)| *both).collect();
    let heavy = window.iter().filter(|(t, _)| *t == "heavy").count() as f64;
    let light = window.iter().filter(|(t, _)| *t == "light").count() as f64;
    let ratio = heavy / light.max(1.0);
    eprintln!(
        "served heavy:light = {heavy}:{light} = {ratio:.3} over {} completions",
        window.len()
    );
    assert!(window.len() >= 200, "window too short: {}", window.len());
    // Measured 2.89-2.96 in isolation (a slight bias towards the light tenant at the window's
    // edges) and once below 2.85 with the whole suite and other builds on both cores: 3 ± 8%
    // (unweighted or FIFO service would give 1).
    assert!(
        (ratio - 3.0).abs() <= 0.24,
        "ratio {ratio:.3}, expected 3 ± 8%"
    );
}

// The flood often queues entirely before the replicas' first lease rounds have leased any slot
// (a cold connection and script load take tens of ms), so the small request can arrive while
// the noisy tenant is still a newcomer that has not had its first turn on that replica. The
// scheduler once let that first turn run a whole quantum (~50 requests here, ~800 ms) before the
// later newcomer; now a newcomer cuts into another newcomer's turn after its first request
// (`scheduler::tests::newcomers_that_queued_while_the_pool_had_no_slot_…`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn noisy_neighbor_small_tenant_waits_about_one_service_time() {
    let Some(redis) = Redis::start() else { return };
    let mock = slow_mock(30).await;
    let rs = replicas(|i| replica(&redis, &mock.base_url(), i, 6).add_tenants(&["noisy", "small"]))
        .await;
    // The noisy tenant floods every replica; completions are counted per replica.
    let done: Arc<Vec<std::sync::atomic::AtomicUsize>> =
        Arc::new((0..3).map(|_| Default::default()).collect());
    let mut flood = Vec::new();
    for i in 0..150 {
        let (addr, done) = (rs[i % 3].addr, done.clone());
        flood.push(tokio::spawn(async move {
            assert_eq!(chat(addr, "noisy", 8, &[]).await, 200);
            done[i % 3].fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }));
    }
    assert!(eventually(|| rs.iter().map(|r| r.pools[0].load().0).sum::<usize>() >= 120).await);
    let before = done[1].load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(chat(rs[1].addr, "small", 8, &[]).await, 200);
    let ahead = done[1].load(std::sync::atomic::Ordering::SeqCst) - before;
    let queued = rs[1].pools[0].load().0;
    eprintln!(
        "noisy requests finished on the small tenant's replica while it waited: {ahead} \
         ({queued} still queued there)"
    );
    // Its replica holds about two slots: the small request takes the next free one, so only
    // what was in flight plus what the other slot finishes during its own service go first
    // (slack for a loaded machine); behind the flood (FIFO) it would be all ~45 queued there.
    assert!(ahead <= 8, "{ahead} noisy requests went first");
    for f in flood {
        f.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_elsewhere_is_charged_here() {
    let Some(redis) = Redis::start() else { return };
    let mock = slow_mock(15).await;
    let rs = replicas(|i| {
        replica(&redis, &mock.base_url(), i, 6)
            .set("scheduler.quantum", 64)
            .add_tenants(&["heavy", "light"])
    })
    .await;
    // Heavy floods all three replicas, light only replica 0. Per replica, light would get half
    // of replica 0 (1/6 of the pool); charged for what heavy gets on replicas 1 and 2, heavy
    // yields replica 0 to light (about 1/3 of the pool: replica 0's share of the slots).
    let order = Arc::new(Mutex::new(Vec::new()));
    let pools: Vec<_> = rs.iter().map(|r| r.pools[0].clone()).collect();
    let mut tasks = Vec::new();
    for i in 0..600 {
        let (tenant, addr) = if i % 4 == 3 {
            ("light", rs[0].addr)
        } else {
            ("heavy", rs[i % 3].addr)
        };
        let (order, pools) = (order.clone(), pools.clone());
        tasks.push(tokio::spawn(async move {
            assert_eq!(chat(addr, tenant, 16, &[]).await, 200);
            let q = |p: &fairgate::queue::FairQueue, t: &str| {
                p.tenant_load(&fairgate::domain::TenantId::new(t))
                    .unwrap()
                    .0
            };
            let both = q(&pools[0], "light") > 0 && pools.iter().all(|p| q(p, "heavy") > 0);
            order.lock().unwrap().push((tenant, both));
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let order = order.lock().unwrap();
    let window: Vec<_> = order.iter().filter(|(_, both)| *both).collect();
    let light = window.iter().filter(|(t, _)| *t == "light").count() as f64;
    let share = light / window.len().max(1) as f64;
    eprintln!(
        "light's share of the pool while both backlogged: {share:.3} over {} completions",
        window.len()
    );
    assert!(window.len() >= 100, "window too short: {}", window.len());
    assert!(
        (0.27..=0.40).contains(&share),
        "light got {share:.3}; per-replica fairness alone gives ~0.167, replica 0's slots 1/3"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sequential_agent_takes_its_replicas_next_free_slot() {
    let Some(redis) = Redis::start() else { return };
    let mock = mock_with(MockConfig {
        base_latency: Duration::from_millis(20),
        ..MockConfig::default()
    })
    .await;
    // The default quantum; a pool of 6 shared by three replicas (two slots each).
    let rs = replicas(|i| replica(&redis, &mock.base_url(), i, 6).add_tenants(&["flood", "agent"]))
        .await;
    let body = |who: &str| {
        format!(
            r#"{{"model":"gpt-4o-mini","max_tokens":8,"messages":[{{"role":"user","content":"{who}"}}]}}"#
        )
    };
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut flood = Vec::new();
    for i in 0..24 {
        let (addr, stop, body) = (
            rs[i % 3].addr,
            stop.clone(),
            body(&format!("flood-{}", i % 3)),
        );
        flood.push(tokio::spawn(async move {
            for _ in 0..10_000 {
                if stop.load(std::sync::atomic::Ordering::SeqCst) {
                    break;
                }
                let r = send(post(
                    addr,
                    "/v1/chat/completions",
                    Some("key-flood"),
                    &body,
                    &[],
                ))
                .await;
                assert_eq!(r.status, 200);
            }
        }));
    }
    assert!(eventually(|| rs.iter().map(|r| r.pools[0].load().0).sum::<usize>() >= 12).await);
    // The agent: one request at a time, all to replica 1, 30 of them.
    let agent = body("agent");
    for _ in 0..30 {
        let r = send(post(
            rs[1].addr,
            "/v1/chat/completions",
            Some("key-agent"),
            &agent,
            &[],
        ))
        .await;
        assert_eq!(r.status, 200);
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    for f in flood {
        f.await.unwrap();
    }
    // Flood requests of the agent's replica the mock saw between two of the agent's: the one
    // that took the slot its answer freed, and about one more for the replica's other slot, when
    // it takes its replica's next free slot (slack for a loaded machine); behind a round of the
    // flood it would be tens (a quantum of 20-token requests, less what other replicas charge).
    let seen = mock.stats.seen_bodies();
    let mut gaps = gaps_between(&seen, "agent", &["flood-1"]);
    gaps.sort_unstable();
    eprintln!("replica 1's flood requests between the agent's: {gaps:?}");
    assert!(gaps.len() >= 10, "{gaps:?}");
    assert!(
        gaps[gaps.len() / 2] <= 4,
        "the agent waited for more than a free slot: {gaps:?}"
    );
}
