//! Attack: a tenant queues many large bodies that are cheap in tokens (a big unknown field)
//! (issue 13, point 3). The pool holds at most `max_queued_bytes_per_tenant` of its bytes; the
//! rest get 429 `x-fairgate-limit: queue` with a Retry-After, counted as
//! `fairgate_rejected_total{reason="tenant_queue_bytes"}`; the victim is served; the bytes of
//! requests that ended or were cancelled are released.

use std::time::Duration;

use fairgate_mock::MockConfig;

use super::support::{figure, scrape, value, victim_run};
use crate::support::{mock_with, post, send, Collected, Conf, KEY_A, KEY_B};

const MIB: usize = 1 << 20;
const ATTACK: usize = 16;
const VICTIM_REQUESTS: usize = 3;

/// A chat request with a `blob` of `size` bytes nobody reads.
fn big(size: usize) -> String {
    format!(
        r#"{{"model":"gpt-4o-mini","max_tokens":4,"messages":[{{"role":"user","content":"hi"}}],"blob":"{}"}}"#,
        "x".repeat(size)
    )
}

#[tokio::test]
async fn big_cheap_bodies_are_bounded_in_bytes_and_the_victim_served() {
    let mock = mock_with(MockConfig {
        base_latency: Duration::from_millis(100),
        ..MockConfig::default()
    })
    .await;
    let proxy = Conf::new(&mock.base_url())
        .upstream("max_concurrency", 1)
        .set("scheduler.max_queued_bytes_per_tenant", 4194304)
        .start()
        .await;
    let alone = victim_run(proxy.addr, &mock.stats, KEY_B, VICTIM_REQUESTS, &[])
        .await
        .ok;

    let addr = proxy.addr;
    let body = big(MIB);
    let attack: Vec<_> = (0..ATTACK)
        .map(|_| {
            let body = body.clone();
            tokio::spawn(async move {
                send(post(addr, "/v1/chat/completions", Some(KEY_A), &body, &[])).await
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let under_attack = victim_run(addr, &mock.stats, KEY_B, VICTIM_REQUESTS, &[])
        .await
        .ok;
    let mut answers: Vec<Collected> = Vec::new();
    for a in attack {
        answers.push(a.await.unwrap());
    }
    let accepted = answers.iter().filter(|r| r.status == 200).count();
    let refused: Vec<&Collected> = answers.iter().filter(|r| r.status == 429).collect();
    assert_eq!(accepted + refused.len(), ATTACK, "only 200s and 429s");
    for r in &refused {
        r.assert_error(429, "rate_limit_exceeded");
        assert_eq!(r.headers["x-fairgate-limit"], "queue");
        let retry: u64 = r.headers["retry-after"].to_str().unwrap().parse().unwrap();
        assert!(retry >= 1);
    }
    let metrics = scrape(addr).await;
    let counted = value(
        &metrics,
        "fairgate_rejected_total",
        &[("tenant", "a"), ("reason", "tenant_queue_bytes")],
    );
    figure(
        "big cheap bodies (16 × 1 MiB unknown field, budget 4 MiB)",
        "victim served under attack / alone",
        under_attack as f64 / alone as f64,
        &format!(
            "attacker: {accepted} accepted, {} refused 429 queue",
            refused.len()
        ),
    );
    assert_eq!(under_attack, alone);
    assert!(!refused.is_empty(), "the byte budget refused nothing");
    assert_eq!(counted, refused.len() as f64);
    // The bytes held at once never exceed the budget (by more than one request alone): with
    // the 16 arriving together, at most 4 MiB / 1 MiB of them were admitted before the first
    // ended — a bound on count, not time: each admitted one held its bytes until it ended.
    assert!(accepted < ATTACK, "{accepted}");

    // Everything was released (answers ended): the budget admits 3 more at once again.
    let again: Vec<_> = (0..3)
        .map(|_| {
            let body = body.clone();
            tokio::spawn(async move {
                send(post(addr, "/v1/chat/completions", Some(KEY_A), &body, &[]))
                    .await
                    .status
            })
        })
        .collect();
    for a in again {
        assert_eq!(a.await.unwrap(), 200);
    }
}

#[tokio::test]
async fn a_cancelled_request_releases_its_bytes() {
    let mock = mock_with(MockConfig {
        base_latency: Duration::from_millis(300),
        ..MockConfig::default()
    })
    .await;
    let proxy = Conf::new(&mock.base_url())
        .upstream("max_concurrency", 1)
        .set("scheduler.max_queued_bytes_per_tenant", 2097152)
        .start()
        .await;
    let addr = proxy.addr;
    let body = big(MIB);
    // Two requests hold the tenant's 2 MiB; both clients go away before an answer.
    for _ in 0..2 {
        let body = body.clone();
        let _ = tokio::time::timeout(
            Duration::from_millis(50),
            send(post(addr, "/v1/chat/completions", Some(KEY_A), &body, &[])),
        )
        .await;
    }
    // Once the cancellations are seen, the budget is free again: bounded polling, no sleep
    // assertion.
    let mut status = 0;
    for _ in 0..50 {
        status = send(post(addr, "/v1/chat/completions", Some(KEY_A), &body, &[]))
            .await
            .status;
        if status == 200 {
            break;
        }
    }
    assert_eq!(status, 200);
}
