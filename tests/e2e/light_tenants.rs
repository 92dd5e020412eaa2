//! Tenants that are not backlogged, end to end (issue 23): a sequential agent beside a flood of
//! closed loops is served at the next free slot, and a tenant that keeps many requests in flight
//! with an empty queue gets its share and no more. Measured in orderings and counts (what the mock
//! saw, which tenant completed), never in wall-clock durations.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::support::*;
use fairgate::server::ServerHandle;
use fairgate_mock::MockConfig;

fn body(who: &str) -> String {
    format!(
        r#"{{"model":"gpt-4o-mini","max_tokens":8,"messages":[{{"role":"user","content":"{who}"}}]}}"#
    )
}

/// `n` closed loops of `tenant` until `stop`: each sends its next request when its answer is
/// back; counts the answers in `done` while `counting` is set.
fn loops(
    proxy: &ServerHandle,
    tenant: &'static str,
    n: usize,
    stop: &Arc<AtomicBool>,
    counting: &Arc<AtomicBool>,
    done: &Arc<AtomicUsize>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..n)
        .map(|_| {
            let (addr, stop, counting, done) =
                (proxy.addr, stop.clone(), counting.clone(), done.clone());
            tokio::spawn(async move {
                // Bounded in count as well as by `stop`.
                for _ in 0..20_000 {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let r = send(post(
                        addr,
                        "/v1/chat/completions",
                        Some(&format!("key-{tenant}")),
                        &body(tenant),
                        &[],
                    ))
                    .await;
                    assert_eq!(
                        r.status,
                        200,
                        "{tenant}: {}",
                        String::from_utf8_lossy(&r.body)
                    );
                    if counting.load(Ordering::SeqCst) {
                        done.fetch_add(1, Ordering::SeqCst);
                    }
                }
            })
        })
        .collect()
}

/// A flood of 24 closed loops and one sequential agent on a pool of 4 slots; returns, for each
/// of the agent's requests the mock saw, how many flood requests the mock saw since the agent's
/// previous one.
async fn agent_gaps(policy: &str) -> Vec<usize> {
    let mock = mock_with(MockConfig {
        base_latency: Duration::from_millis(20),
        ..MockConfig::default()
    })
    .await;
    // The default quantum: the rule holds whatever the quantum.
    let proxy = Conf::pool(&mock.base_url(), 4)
        .set("scheduler.policy", policy)
        .add_tenants(&["flood", "agent"])
        .start()
        .await;
    let (stop, counting) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(true)),
    );
    let done = Arc::new(AtomicUsize::new(0));
    let mut tasks = loops(&proxy, "flood", 24, &stop, &counting, &done);
    assert!(queued_at_least(&proxy, 15).await, "the flood is queued");
    let agent_done = Arc::new(AtomicUsize::new(0));
    tasks.extend(loops(&proxy, "agent", 1, &stop, &counting, &agent_done));
    // Until the agent has been answered 40 times (bounded: 400 × 50 ms at most).
    for _ in 0..400 {
        if agent_done.load(Ordering::SeqCst) >= 40 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, Ordering::SeqCst);
    for t in tasks {
        t.await.unwrap();
    }
    let seen = mock.stats.seen_bodies();
    gaps_between(&seen, "agent", &["flood"])
}

async fn queued_at_least(proxy: &ServerHandle, n: usize) -> bool {
    eventually(|| proxy.pools[0].load().0 >= n).await
}

fn median(mut v: Vec<usize>) -> usize {
    v.sort_unstable();
    v[v.len() / 2]
}

#[tokio::test]
async fn a_sequential_agent_beside_a_flood_takes_the_next_free_slot() {
    let (drr, fifo) = (agent_gaps("drr").await, agent_gaps("fifo").await);
    assert!(
        drr.len() >= 10 && fifo.len() >= 3,
        "drr {drr:?} fifo {fifo:?}"
    );
    // Between two of the agent's requests: the flood request that took the slot its answer
    // freed, and the ones that took the slots that freed before its next request arrived — about
    // one per other slot. Under FIFO it queues behind the whole flood (~24).
    let (d, f) = (median(drr.clone()), median(fifo.clone()));
    println!(
        "flood requests between the agent's: drr median {d} {drr:?}; fifo median {f} {fifo:?}"
    );
    assert!(
        d <= 6,
        "drr: the agent waits for more than the next free slot: {drr:?}"
    );
    assert!(
        f >= 15,
        "fifo should queue the agent behind the flood: {fifo:?}"
    );
}

#[tokio::test]
async fn a_tenant_with_many_in_flight_and_an_empty_queue_gets_its_share_and_no_more() {
    let mock = mock_with(MockConfig {
        base_latency: Duration::from_millis(10),
        ..MockConfig::default()
    })
    .await;
    // A small quantum, so the DRR bound (2 quanta) is a small part of what is counted.
    let proxy = Conf::pool(&mock.base_url(), 4)
        .set("scheduler.quantum", 256)
        .add_tenants(&["gamer", "flood"])
        .start()
        .await;
    let (stop, counting) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let (g, f) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut tasks = loops(&proxy, "flood", 24, &stop, &counting, &f);
    assert!(queued_at_least(&proxy, 15).await, "the flood is queued");
    // Four loops on a pool of four: it always has requests in flight and (nearly) never a
    // queue, and asks for more than its half (each loop also spends a round trip and the wait
    // for a free slot between two requests).
    tasks.extend(loops(&proxy, "gamer", 4, &stop, &counting, &g));
    tokio::time::sleep(Duration::from_millis(300)).await;
    counting.store(true, Ordering::SeqCst);
    // Count until 2,000 answers (bounded: 400 × 20 ms at most).
    for _ in 0..400 {
        if g.load(Ordering::SeqCst) + f.load(Ordering::SeqCst) >= 2000 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    counting.store(false, Ordering::SeqCst);
    stop.store(true, Ordering::SeqCst);
    for t in tasks {
        t.await.unwrap();
    }
    let (g, f) = (g.load(Ordering::SeqCst), f.load(Ordering::SeqCst));
    let ratio = g as f64 / f as f64;
    println!("gamer {g} flood {f}: ratio {ratio:.3}");
    assert!(g + f >= 1000, "too few answers counted: {g} + {f}");
    // Equal weights, equal requests: it gains nothing over the backlogged flood. Its own loops
    // lose a round trip and the wait for a free slot between two requests, so on a loaded
    // machine its demand may fall to about its half: no lower bound tighter than "served like a
    // light tenant, not queued behind the flood" (FIFO would give it 4 of 28, 0.17).
    assert!(
        ratio <= 1.1,
        "it beat the backlogged tenant: gamer {g} flood {f}"
    );
    assert!(
        ratio >= 0.6,
        "it was queued behind the flood: gamer {g} flood {f}"
    );
}
