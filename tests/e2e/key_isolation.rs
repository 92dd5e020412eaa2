//! Capacity learned per provider key (issue 13, point 2), end to end with the bundled mock:
//! tenant `b` has its own provider key (`upstream_api_key_env`) and that key is exhausted
//! (every answer to it a 429 with `Retry-After`; the mock's `x-mock-status: 429` on b's
//! requests plays the exhausted key). Tenant `a` uses the pool's key. The figure is a's
//! throughput while b floods ÷ a's throughput on an identical proxy where b is idle (both run
//! side by side, so the machine's load weighs on both). Assertions are on counts and ratios.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::support::*;
use fairgate::server::ServerHandle;
use fairgate_mock::MockConfig;

/// `workers` clients loop as `key` (with `headers`) until `stop`; returns (200s, others).
async fn loop_as(
    proxy: &ServerHandle,
    key: &'static str,
    workers: usize,
    headers: &'static [(&'static str, &'static str)],
    stop: Arc<AtomicBool>,
    check: fn(&Collected),
) -> (usize, usize) {
    let (ok, other) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut tasks = Vec::new();
    for _ in 0..workers {
        let (addr, ok, other, stop) = (proxy.addr, ok.clone(), other.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..5000 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let body = chat("gpt-4o-mini");
                let r = send(post(
                    addr,
                    "/v1/chat/completions",
                    Some(key),
                    &body,
                    headers,
                ))
                .await;
                check(&r);
                if r.status == 200 { &ok } else { &other }.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    (ok.load(Ordering::Relaxed), other.load(Ordering::Relaxed))
}

fn victim_ok(r: &Collected) {
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
}

fn honest_upstream_429(r: &Collected) {
    assert_eq!(r.status, 429, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.headers["x-fairgate-limit"], "upstream");
    assert!(r.headers.contains_key("retry-after"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exhausted_tenant_key_pauses_only_its_tenant_and_never_the_pool() {
    let provider = || MockConfig {
        base_latency: Duration::from_millis(20),
        retry_after: Duration::from_secs(1),
        record_requests: false,
        ..MockConfig::default()
    };
    // `PATH` is set in every test process: b's own provider key is its value (no set_var).
    let config = |base_url: &str| {
        Conf::new(base_url).upstream("max_concurrency", 4).tenant(
            "b",
            "upstream_api_key_env",
            "PATH",
        )
    };
    let (attacked_mock, alone_mock) = (mock_with(provider()).await, mock_with(provider()).await);
    let attacked = config(&attacked_mock.base_url()).start().await;
    let alone = config(&alone_mock.base_url()).start().await;
    let stop = Arc::new(AtomicBool::new(false));
    let timer = {
        let stop = stop.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(3)).await;
            stop.store(true, Ordering::Relaxed);
        })
    };
    const EXHAUSTED: &[(&str, &str)] = &[("x-mock-status", "429")];
    let ((victim, _), (attacker_ok, attacker_429), (victim_alone, _)) = tokio::join!(
        loop_as(&attacked, KEY_A, 8, &[], stop.clone(), victim_ok),
        loop_as(
            &attacked,
            KEY_B,
            16,
            EXHAUSTED,
            stop.clone(),
            honest_upstream_429
        ),
        loop_as(&alone, KEY_A, 8, &[], stop.clone(), victim_ok),
    );
    timer.await.unwrap();
    let ratio = victim as f64 / victim_alone.max(1) as f64;
    let forwarded = attacked_mock.stats.requests() as usize - victim;
    let pool = &attacked.admission.capacity[0];
    println!(
        "exhausted tenant key: victim throughput {victim} under attack vs {victim_alone} alone \
         = {ratio:.2}x; attacker answered {attacker_429} 429s, of which {forwarded} reached the \
         provider; pool limit {} of {}, pool 429s seen {}",
        pool.limit(),
        pool.configured(),
        pool.throttled()
    );
    assert_eq!(attacker_ok, 0);
    assert!(attacker_429 > 0);
    assert_eq!(
        (pool.limit(), pool.throttled(), pool.paused_for()),
        (4, 0, Duration::ZERO),
        "the pool's learned capacity never saw the tenant key's 429s"
    );
    // Refused at admission, before queueing for a pool slot: far more answers than attempts.
    assert!(
        forwarded * 20 <= attacker_429,
        "a paused key's requests are refused before the provider: {forwarded} of {attacker_429}"
    );
    assert!(ratio >= 0.6, "victim under attack ÷ alone = {ratio:.2}");
}

/// Point 5: a retry holds its pool slot while it waits, so the whole wait is capped
/// (`[admission] max_retry_wait_ms`, default 3000): an upstream asking for 10 s gets no retry —
/// the client has its 429 with that Retry-After at once — while short waits are still retried.
#[tokio::test]
async fn a_retry_never_waits_past_max_retry_wait_ms_holding_its_slot() {
    let long = mock_with(MockConfig {
        retry_after: Duration::from_secs(10),
        record_requests: false,
        ..MockConfig::default()
    })
    .await;
    let short = mock_with(MockConfig {
        retry_after: Duration::from_millis(100),
        record_requests: false,
        ..MockConfig::default()
    })
    .await;
    let exhausted = [("x-mock-status", "429")];
    let body = chat("gpt-4o-mini");
    let p = Conf::new(&long.base_url()).start().await;
    let r = send(post(
        p.addr,
        "/v1/chat/completions",
        Some(KEY_A),
        &body,
        &exhausted,
    ))
    .await;
    honest_upstream_429(&r);
    assert_eq!(r.headers["retry-after"], "10");
    assert_eq!(
        long.stats.requests(),
        1,
        "no retry waits 10 s in a pool slot"
    );
    let p = Conf::new(&short.base_url()).start().await;
    let r = send(post(
        p.addr,
        "/v1/chat/completions",
        Some(KEY_A),
        &body,
        &exhausted,
    ))
    .await;
    honest_upstream_429(&r);
    assert_eq!(
        short.stats.requests(),
        4,
        "max_retries = 3 short waits are made"
    );
}
