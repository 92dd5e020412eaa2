//! Admission and upstream backpressure end to end over HTTP with the bundled mock: the 429 storm
//! (provider K=4, fairgate configured with 16), per-tenant request and token budgets, deadlines
//! (infeasible → immediate 429, passed in queue → 504) and size caps before queueing.
//! Assertions are on counts and headers, never on wall-clock durations.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::*;
use fairgate::server::ServerHandle;
use fairgate_mock::MockConfig;
use tokio::time::Instant;

fn header<'a>(c: &'a Collected, name: &str) -> Option<&'a str> {
    c.headers.get(name).and_then(|v| v.to_str().ok())
}

fn chat_max(max_tokens: u64) -> String {
    format!(
        r#"{{"model":"gpt-4o-mini","max_tokens":{max_tokens},"messages":[{{"role":"user","content":"hi"}}]}}"#
    )
}

async fn chat_as(
    proxy: &ServerHandle,
    key: &str,
    body: &str,
    headers: &[(&str, &str)],
) -> Collected {
    send(post(
        proxy.addr,
        "/v1/chat/completions",
        Some(key),
        body,
        headers,
    ))
    .await
}

#[derive(Default)]
struct Tally {
    ok_late: AtomicUsize,
    limited_late: AtomicUsize,
    limited_early: AtomicUsize,
    other: Mutex<Vec<u16>>,
}

/// 16 clients loop against `proxy` until `stop`; answers after `settled` (the storm proxy's
/// learned limit reached the provider's K: an event, not a time) count as late.
async fn load(proxy: &ServerHandle, settled: Arc<AtomicBool>, stop: Arc<AtomicBool>) -> Arc<Tally> {
    let tally = Arc::new(Tally::default());
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let (addr, tally, stop, settled) =
            (proxy.addr, tally.clone(), stop.clone(), settled.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..2000 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let r = send(post(
                    addr,
                    "/v1/chat/completions",
                    Some(KEY_A),
                    &chat_max(8),
                    &[],
                ))
                .await;
                let late = settled.load(Ordering::Relaxed);
                match (r.status, late) {
                    (200, true) => &tally.ok_late,
                    (200, false) => continue,
                    (429, true) => &tally.limited_late,
                    (429, false) => &tally.limited_early,
                    (s, _) => {
                        tally.other.lock().unwrap().push(s);
                        continue;
                    }
                }
                .fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    tally
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_429_storm_is_absorbed_and_goodput_stays_near_capacity() {
    let provider = || MockConfig {
        max_concurrency: Some(4),
        retry_after: Duration::from_millis(100),
        base_latency: Duration::from_millis(40),
        record_requests: false,
        ..MockConfig::default()
    };
    let (storm_mock, base_mock) = (mock_with(provider()).await, mock_with(provider()).await);
    let storm = Conf::new(&storm_mock.base_url())
        .upstream("max_concurrency", 16)
        .start()
        .await;
    let baseline = Conf::new(&base_mock.base_url())
        .upstream("max_concurrency", 4)
        .start()
        .await;
    let start = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    // Watch the learned limit: answers count as "late" once it has settled near K (and the
    // time it took is reported).
    let settled = Arc::new(Mutex::new(None));
    let learned = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (cap, stop, settled, learned) = (
            storm.admission.capacity[0].clone(),
            stop.clone(),
            settled.clone(),
            learned.clone(),
        );
        tokio::spawn(async move {
            for _ in 0..2000 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                if cap.limit() <= 5 && settled.lock().unwrap().is_none() {
                    *settled.lock().unwrap() = Some(start.elapsed());
                    learned.store(true, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    let timer = {
        let stop = stop.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(5)).await;
            stop.store(true, Ordering::Relaxed);
        })
    };
    let (s, b) = tokio::join!(
        load(&storm, learned.clone(), stop.clone()),
        load(&baseline, learned.clone(), stop.clone())
    );
    timer.await.unwrap();
    watcher.await.unwrap();
    let (ok, late_429, early_429) = (
        s.ok_late.load(Ordering::Relaxed),
        s.limited_late.load(Ordering::Relaxed),
        s.limited_early.load(Ordering::Relaxed),
    );
    let base_ok = b.ok_late.load(Ordering::Relaxed);
    let retries = storm.admission.retries.retries.load(Ordering::Relaxed);
    println!(
        "429 storm: once the limit settled clients got {ok} ok / {late_429} 429 ({:.2}%); first second {early_429} 429; \
         goodput {ok} vs K-limited baseline {base_ok} ({:.0}%); provider 429s {}; retries {retries}; \
         provider max in flight {}; learned limit {} (settled ≤5 after {:?})",
        100.0 * late_429 as f64 / (ok + late_429).max(1) as f64,
        100.0 * ok as f64 / base_ok.max(1) as f64,
        storm_mock.stats.rejected_429(),
        storm_mock.stats.max_in_flight(),
        storm.admission.capacity[0].limit(),
        settled.lock().unwrap(),
    );
    assert!(
        s.other.lock().unwrap().is_empty(),
        "other errors: {:?}",
        s.other.lock().unwrap()
    );
    assert!(b.other.lock().unwrap().is_empty() && b.limited_late.load(Ordering::Relaxed) == 0);
    assert!(
        late_429 * 100 <= ok + late_429,
        "{late_429} 429s of {}",
        ok + late_429
    );
    assert!(
        storm_mock.stats.max_in_flight() == 4,
        "the provider's capacity was used"
    );
    assert!(
        storm.admission.capacity[0].limit() <= 6,
        "the limit learned K"
    );
    assert!(settled.lock().unwrap().is_some());
    assert!(ok >= 50 && base_ok >= 50, "enough samples: {ok}, {base_ok}");
    assert!(ok * 10 >= base_ok * 7, "goodput {ok} vs baseline {base_ok}");
}

#[tokio::test]
async fn tenant_over_requests_per_minute_gets_an_honest_429_and_others_are_unaffected() {
    let mock = mock().await;
    let p = Conf::new(&mock.base_url())
        .tenant("b", "requests_per_minute", 2)
        .start()
        .await;
    for left in ["1", "0"] {
        let r = chat_as(&p, KEY_B, &chat("gpt-4o-mini"), &[]).await;
        assert_eq!(r.status, 200);
        assert_eq!(header(&r, "x-ratelimit-limit-requests"), Some("2"));
        assert_eq!(header(&r, "x-ratelimit-remaining-requests"), Some(left));
        assert!(header(&r, "x-ratelimit-reset-requests").is_some());
    }
    let r = chat_as(&p, KEY_B, &chat("gpt-4o-mini"), &[]).await;
    r.assert_error(429, "rate_limit_exceeded");
    let retry_after: u64 = header(&r, "retry-after").unwrap().parse().unwrap();
    // One request per 30 s refills: honest, not a constant 1.
    assert!(
        (1..=30).contains(&retry_after) && retry_after >= 20,
        "{retry_after}"
    );
    assert_eq!(header(&r, "x-fairgate-limit"), Some("tenant"));
    assert_eq!(header(&r, "x-ratelimit-remaining-requests"), Some("0"));
    for _ in 0..5 {
        let r = chat_as(&p, KEY_A, &chat("gpt-4o-mini"), &[]).await;
        assert_eq!(r.status, 200);
        assert!(
            header(&r, "x-ratelimit-limit-requests").is_none(),
            "a has no limits"
        );
    }
    assert_eq!(mock.stats.requests(), 7);
}

#[tokio::test]
async fn token_budget_exceeded_is_refused_by_the_tenant_limit() {
    let mock = mock().await;
    let p = Conf::new(&mock.base_url())
        .tenant("b", "tokens_per_minute", 1000)
        .start()
        .await;
    let r = chat_as(&p, KEY_B, &chat_max(600), &[]).await;
    assert_eq!(r.status, 200);
    assert_eq!(header(&r, "x-ratelimit-limit-tokens"), Some("1000"));
    let remaining: u64 = header(&r, "x-ratelimit-remaining-tokens")
        .unwrap()
        .parse()
        .unwrap();
    assert!(remaining < 400, "{remaining}");
    let r = chat_as(&p, KEY_B, &chat_max(600), &[]).await;
    r.assert_error(429, "rate_limit_exceeded");
    assert_eq!(r.json()["error"]["type"], "tokens");
    assert_eq!(header(&r, "x-fairgate-limit"), Some("tenant"));
    assert!(header(&r, "retry-after").unwrap().parse::<u64>().unwrap() >= 1);
    // Larger than the whole bucket: can never fit.
    chat_as(&p, KEY_B, &chat_max(5000), &[])
        .await
        .assert_error(400, "request_exceeds_token_budget");
    assert_eq!(mock.stats.requests(), 1);
}

/// Tenant a's slow request, holding the pool's only slot once this returns.
async fn hold_the_only_slot(p: &Arc<ServerHandle>) -> tokio::task::JoinHandle<u16> {
    let blocker = {
        let p = p.clone();
        tokio::spawn(async move {
            let slow = [("x-mock-delay-ms", "3000")];
            chat_as(&p, KEY_A, &chat("gpt-4o-mini"), &slow).await.status
        })
    };
    assert!(eventually(|| p.pools[0].load() == (0, 1)).await);
    blocker
}

#[tokio::test]
async fn deadlines_fail_fast_when_infeasible_and_expire_in_queue_with_504() {
    let mock = mock().await;
    let p = Arc::new(
        Conf::new(&mock.base_url())
            .upstream("max_concurrency", 1)
            .start()
            .await,
    );
    let blocker = hold_the_only_slot(&p).await;
    chat_as(
        &p,
        KEY_B,
        &chat("gpt-4o-mini"),
        &[("x-fairgate-deadline-ms", "soon")],
    )
    .await
    .assert_error(400, "invalid_deadline");
    // Feasible by the prediction (one slot ahead), but the blocker holds it past the deadline.
    let r = chat_as(
        &p,
        KEY_B,
        &chat("gpt-4o-mini"),
        &[("x-fairgate-deadline-ms", "1500")],
    )
    .await;
    r.assert_error(504, "deadline_exceeded");
    assert_eq!(
        p.pools[0].load(),
        (0, 1),
        "removed from the queue before dispatch"
    );
    // Now a backlog: a's own next request would wait behind three of its own.
    let mut queued = Vec::new();
    for _ in 0..3 {
        let p = p.clone();
        queued.push(tokio::spawn(async move {
            chat_as(&p, KEY_A, &chat("gpt-4o-mini"), &[]).await.status
        }));
    }
    assert!(eventually(|| p.pools[0].load() == (3, 1)).await);
    let r = chat_as(
        &p,
        KEY_A,
        &chat("gpt-4o-mini"),
        &[("x-fairgate-deadline-ms", "1500")],
    )
    .await;
    r.assert_error(429, "deadline_infeasible");
    assert_eq!(header(&r, "x-fairgate-limit"), Some("queue"));
    assert!(header(&r, "retry-after").unwrap().parse::<u64>().unwrap() >= 2);
    let ms: u64 = header(&r, "retry-after-ms").unwrap().parse().unwrap();
    assert!(ms >= 1000, "retry-after-ms {ms}");
    assert_eq!(p.pools[0].load(), (3, 1), "refused at once, nothing queued");
    // Each tenant missed one deadline: b's expired in the queue, a's was infeasible.
    let text = crate::support::scrape(p.addr).await;
    for t in ["a", "b"] {
        let misses =
            crate::support::value(&text, "fairgate_deadline_misses_total", &[("tenant", t)]);
        assert_eq!(misses, Some(1.0), "tenant {t}\n{text}");
    }
    assert_eq!(blocker.await.unwrap(), 200);
    for q in queued {
        assert_eq!(q.await.unwrap(), 200);
    }
    assert_eq!(
        mock.stats.requests(),
        4,
        "the expired request never went upstream"
    );
}

#[tokio::test]
async fn oversize_requests_are_refused_before_queueing() {
    let mock = mock().await;
    let p = Conf::new(&mock.base_url())
        .tenant("b", "max_input_tokens", 50)
        .tenant("b", "max_output_tokens", 100)
        .start()
        .await;
    chat_as(&p, KEY_B, &chat_max(200), &[])
        .await
        .assert_error(400, "max_tokens_too_large");
    let long = format!(
        r#"{{"model":"gpt-4o-mini","messages":[{{"role":"user","content":"{}"}}]}}"#,
        "x".repeat(400)
    );
    let r = chat_as(&p, KEY_B, &long, &[]).await;
    r.assert_error(400, "context_length_exceeded");
    assert!(r.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("limit is 50"));
    assert_eq!(p.pools[0].load(), (0, 0));
    assert_eq!(mock.stats.requests(), 0, "nothing reached the upstream");
    // The other tenant has the defaults.
    assert_eq!(chat_as(&p, KEY_A, &long, &[]).await.status, 200);
}

fn remaining_tokens(r: &Collected) -> u64 {
    header(r, "x-ratelimit-remaining-tokens")
        .unwrap()
        .parse()
        .unwrap()
}

/// Asserts the tenant's `x-ratelimit-*` trio for requests and tokens; returns the remaining
/// request count.
fn assert_rate_headers(r: &Collected, what: &str) -> u64 {
    assert_eq!(
        header(r, "x-ratelimit-limit-requests"),
        Some("100000"),
        "{what}: {:?}",
        r.headers
    );
    assert_eq!(
        header(r, "x-ratelimit-limit-tokens"),
        Some("100000"),
        "{what}"
    );
    for h in ["x-ratelimit-reset-requests", "x-ratelimit-reset-tokens"] {
        // OpenAI's duration format: `250ms`, `6s`, `1m30s`, `1.5s` (never `6.000s`).
        let v = header(r, h).unwrap_or_else(|| panic!("{what}: {h}"));
        assert!(
            v.ends_with('s') && !v.contains(".000") && v.starts_with(|c: char| c.is_ascii_digit()),
            "{what}: {h}: {v}"
        );
    }
    header(r, "x-ratelimit-remaining-requests")
        .unwrap()
        .parse()
        .unwrap()
}

#[tokio::test]
async fn every_response_of_a_limited_tenant_carries_its_rate_headers() {
    let mock = mock().await;
    let p = Arc::new(
        Conf::new(&mock.base_url())
            .server("max_body_bytes", 4096)
            .set("admission.max_retries", 0)
            .upstream("max_concurrency", 1)
            // Buckets of 100 requests and 100000 tokens that refill one request (token) a
            // minute: the counts below are exact.
            .tenant("b", "requests_per_minute", 1)
            .tenant("b", "tokens_per_minute", 1)
            .tenant("b", "burst", 100000.0)
            .tenant("b", "max_output_tokens", 100)
            .tenant("b", "max_queued", 1)
            .start()
            .await,
    );
    let ok = chat_as(&p, KEY_B, &chat("gpt-4o-mini"), &[]).await;
    assert_eq!(ok.status, 200);
    let left = assert_rate_headers(&ok, "success");
    assert_eq!(left, 99_999);
    // Refused before admission charged anything: the buckets as they are, unchanged.
    let big = format!(r#"{{"model":"gpt-4o-mini","pad":"{}"}}"#, "x".repeat(5000));
    let r = chat_as(&p, KEY_B, &big, &[]).await;
    assert_eq!(r.status, 413);
    assert_eq!(assert_rate_headers(&r, "413 body"), left);
    let r = chat_as(&p, KEY_B, &chat_max(500), &[]).await;
    r.assert_error(400, "max_tokens_too_large");
    assert_eq!(assert_rate_headers(&r, "400 size cap"), left);
    let deadline = |ms| [("x-fairgate-deadline-ms", ms)];
    let r = chat_as(&p, KEY_B, &chat("gpt-4o-mini"), &deadline("soon")).await;
    r.assert_error(400, "invalid_deadline");
    assert_eq!(assert_rate_headers(&r, "400 deadline"), left);
    // Upstream errors, passed through: the provider's own x-ratelimit-* (its shared key's
    // budget) is replaced by the tenant's.
    let r = chat_as(&p, KEY_B, &chat("gpt-4o-mini"), &[("x-mock-status", "500")]).await;
    assert_eq!(r.status, 500);
    assert_eq!(assert_rate_headers(&r, "upstream 500"), 99_998);
    let r = chat_as(&p, KEY_B, &chat("gpt-4o-mini"), &[("x-mock-status", "429")]).await;
    assert_eq!(r.status, 429);
    assert_eq!(header(&r, "x-fairgate-limit"), Some("upstream"));
    assert_eq!(assert_rate_headers(&r, "upstream 429"), 99_997);
    // Queue refusals: a's request holds the only slot.
    let blocker = hold_the_only_slot(&p).await;
    let r = chat_as(&p, KEY_B, &chat("gpt-4o-mini"), &deadline("1500")).await;
    r.assert_error(504, "deadline_exceeded");
    assert_eq!(assert_rate_headers(&r, "504 in queue"), 99_996);
    let after_504 = remaining_tokens(&r);
    let queued = {
        let p = p.clone();
        tokio::spawn(async move { chat_as(&p, KEY_B, &chat("gpt-4o-mini"), &[]).await })
    };
    assert!(eventually(|| p.pools[0].load() == (1, 1)).await);
    let r = chat_as(&p, KEY_B, &chat("gpt-4o-mini"), &[]).await;
    r.assert_error(429, "rate_limit_exceeded");
    assert_eq!(header(&r, "x-fairgate-limit"), Some("queue"));
    assert_eq!(assert_rate_headers(&r, "429 queue full"), 99_994);
    let queue_full = remaining_tokens(&r);
    assert!(queue_full < after_504);
    let r = chat_as(&p, KEY_B, &chat("gpt-4o-mini"), &deadline("100")).await;
    r.assert_error(429, "deadline_infeasible");
    assert_eq!(assert_rate_headers(&r, "429 deadline infeasible"), 99_994);
    // Requests that never went upstream got their estimate back: the 504's, then the
    // queue-full one's (the same body as the queued one, which still holds its tokens).
    assert_eq!(remaining_tokens(&r), after_504);
    assert_eq!(blocker.await.unwrap(), 200);
    let r = queued.await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(assert_rate_headers(&r, "queued success"), 99_995);
    // The unlimited tenant's refusals carry none.
    let r = chat_as(&p, KEY_A, &big, &[]).await;
    assert_eq!(r.status, 413);
    assert!(header(&r, "x-ratelimit-limit-requests").is_none());
}

fn num(r: &Collected, name: &str) -> u64 {
    header(r, name)
        .unwrap_or_else(|| panic!("{name} missing: {:?}", r.headers))
        .parse()
        .unwrap()
}

#[tokio::test]
async fn input_and_output_token_budgets_refuse_separately_and_are_reconciled() {
    let mock = mock().await;
    // Buckets of 1000 input and 1000 output tokens refilling one token a minute: exact counts.
    let p = Conf::new(&mock.base_url())
        .tenant("b", "input_tokens_per_minute", 1)
        .tenant("b", "output_tokens_per_minute", 1)
        .tenant("b", "burst", 1000.0)
        .start()
        .await;
    let out = |n: &'static str| [("x-mock-output-tokens", n)];
    let r = chat_as(&p, KEY_B, &chat_max(600), &out("600")).await;
    assert_eq!(r.status, 200);
    assert_eq!(num(&r, "x-ratelimit-limit-output-tokens"), 1000);
    assert_eq!(num(&r, "x-ratelimit-remaining-output-tokens"), 400);
    assert_eq!(num(&r, "x-ratelimit-limit-input-tokens"), 1000);
    assert!(
        header(&r, "x-ratelimit-limit-tokens").is_none(),
        "not configured"
    );
    // Over the output budget: refused by the tenant's limit, with the honest refill time of the
    // 200 missing tokens (one a minute), not a constant.
    let r = chat_as(&p, KEY_B, &chat_max(600), &[]).await;
    r.assert_error(429, "rate_limit_exceeded");
    assert_eq!(header(&r, "x-fairgate-limit"), Some("tenant"));
    let msg = r.json()["error"]["message"].as_str().unwrap().to_owned();
    assert!(msg.contains("output tokens per minute"), "{msg}");
    let retry_after = num(&r, "retry-after");
    assert!((11_900..=12_000).contains(&retry_after), "{retry_after}");
    assert_eq!(num(&r, "x-ratelimit-remaining-output-tokens"), 400);
    // ...while a request that fits the output budget passes: input is fine.
    let r = chat_as(&p, KEY_B, &chat_max(10), &out("10")).await;
    assert_eq!(r.status, 200);
    assert_eq!(num(&r, "x-ratelimit-remaining-output-tokens"), 390);
    // Reconcile: estimated 300 output tokens, used 10 → 290 come back once the body is done.
    let r = chat_as(&p, KEY_B, &chat_max(300), &out("10")).await;
    assert_eq!(num(&r, "x-ratelimit-remaining-output-tokens"), 90);
    let r = chat_as(&p, KEY_B, &chat_max(1), &out("1")).await;
    assert_eq!(r.status, 200);
    assert_eq!(num(&r, "x-ratelimit-remaining-output-tokens"), 90 + 290 - 1);
    // Over the input budget while output is fine: a ~700-token prompt fits once, not twice.
    let long = format!(
        r#"{{"model":"gpt-4o-mini","max_tokens":1,"messages":[{{"role":"user","content":"{}"}}]}}"#,
        "hello ".repeat(700)
    );
    let r = chat_as(&p, KEY_B, &long, &out("1")).await;
    assert_eq!(r.status, 200);
    let r = chat_as(&p, KEY_B, &long, &out("1")).await;
    r.assert_error(429, "rate_limit_exceeded");
    let msg = r.json()["error"]["message"].as_str().unwrap().to_owned();
    assert!(msg.contains("input tokens per minute"), "{msg}");
    assert!(num(&r, "x-ratelimit-remaining-output-tokens") >= 300);
    assert!(num(&r, "x-ratelimit-remaining-input-tokens") < 700);
    assert_eq!(mock.stats.requests(), 5);
    // The unlimited tenant is unaffected.
    assert_eq!(chat_as(&p, KEY_A, &long, &[]).await.status, 200);
}

/// One answer of the reserve-and-degrade load: class, status, queue ms, and whether it came
/// after the learned limit had settled.
#[derive(Clone, Copy, Debug)]
struct Answer {
    batch: bool,
    status: u16,
    queue_ms: u64,
    settled: bool,
}

const KEY_RECOVERY: &str = "fg-test-a-recovery";

/// Interactive (tenant a) and batch (tenant b) at equal class shares, so any batch slowdown is
/// the degraded pool's doing; `max_concurrency = 16`, one slot reserved for recovery keys.
fn reserve_config(base_url: &str) -> Conf {
    Conf::new(base_url)
        .set("scheduler.reserved_slots", 1)
        .set("scheduler.classes.interactive", 1)
        .set("scheduler.classes.batch", 1)
        .upstream("max_concurrency", 16)
        .tenant("a", "recovery_api_keys", [KEY_RECOVERY])
        .tenant("b", "priority", "batch")
}

/// 12 interactive and 12 batch clients loop against `proxy` until `stop`.
async fn flood(
    proxy: &ServerHandle,
    settled: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
) -> Vec<Answer> {
    let answers = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..24 {
        let batch = i % 2 == 1;
        let key = if batch { KEY_B } else { KEY_A };
        let (addr, answers, stop, settled) =
            (proxy.addr, answers.clone(), stop.clone(), settled.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..2000 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let r = send(post(
                    addr,
                    "/v1/chat/completions",
                    Some(key),
                    &chat_max(8),
                    &[],
                ))
                .await;
                answers.lock().unwrap().push(Answer {
                    batch,
                    status: r.status,
                    queue_ms: num(&r, "x-fairgate-queue-ms"),
                    settled: settled.load(Ordering::Relaxed),
                });
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    Arc::try_unwrap(answers).unwrap().into_inner().unwrap()
}

/// Served (200) interactive and batch answers after the limit settled.
fn served(answers: &[Answer]) -> (usize, usize) {
    let ok = |batch: bool| {
        answers
            .iter()
            .filter(|a| a.settled && a.status == 200 && a.batch == batch)
            .count()
    };
    (ok(false), ok(true))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_a_429_storm_recovery_keeps_its_slot_and_batch_is_slowed_first() {
    let latency = Duration::from_millis(40);
    let storm_mock = mock_with(MockConfig {
        max_concurrency: Some(4),
        retry_after: Duration::from_millis(100),
        base_latency: latency,
        record_requests: false,
        ..MockConfig::default()
    })
    .await;
    // The baseline: the same proxy config and load, a provider without a limit.
    let base_mock = mock_with(MockConfig {
        base_latency: latency,
        record_requests: false,
        ..MockConfig::default()
    })
    .await;
    let storm = Arc::new(reserve_config(&storm_mock.base_url()).start().await);
    let baseline = reserve_config(&base_mock.base_url()).start().await;
    let (settled, stop) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    // "Settled": the learned limit is near the provider's K. The baseline counts from the same
    // moment.
    let driver = {
        let (storm, settled, stop) = (storm.clone(), settled.clone(), stop.clone());
        tokio::spawn(async move {
            let cap = storm.admission.capacity[0].clone();
            for _ in 0..1000 {
                if cap.limit() <= 6 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            assert!(cap.limit() <= 6, "the limit learned K");
            settled.store(true, Ordering::Relaxed);
            // Recovery requests while both floods saturate the learned capacity.
            let mut recovery = Vec::new();
            for _ in 0..12 {
                tokio::time::sleep(Duration::from_millis(150)).await;
                let r = chat_as(&storm, KEY_RECOVERY, &chat_max(8), &[]).await;
                recovery.push((r.status, num(&r, "x-fairgate-queue-ms")));
            }
            tokio::time::sleep(Duration::from_millis(700)).await;
            stop.store(true, Ordering::Relaxed);
            recovery
        })
    };
    let (s, b) = tokio::join!(
        flood(&storm, settled.clone(), stop.clone()),
        flood(&baseline, settled.clone(), stop.clone())
    );
    let recovery = driver.await.unwrap();
    let mut interactive_waits: Vec<u64> = s
        .iter()
        .filter(|a| a.settled && a.status == 200 && !a.batch)
        .map(|a| a.queue_ms)
        .collect();
    interactive_waits.sort_unstable();
    let median = interactive_waits[interactive_waits.len() / 2];
    let mut recovery_waits: Vec<u64> = recovery.iter().map(|r| r.1).collect();
    recovery_waits.sort_unstable();
    let recovery_median = recovery_waits[recovery_waits.len() / 2];
    let ((si, sb), (bi, bb)) = (served(&s), served(&b));
    println!(
        "reserve and degrade: learned limit {}; recovery queue ms {recovery_waits:?} vs \
         interactive median {median} (p90 {}); served after settling: storm {si} interactive / \
         {sb} batch, baseline {bi} / {bb}",
        storm.admission.capacity[0].limit(),
        interactive_waits[interactive_waits.len() * 9 / 10],
    );
    assert!(recovery.iter().all(|r| r.0 == 200), "{recovery:?}");
    assert!(
        interactive_waits.len() >= 20 && bi >= 20 && bb >= 20,
        "enough samples"
    );
    // The recovery reservation keeps working: its waits are well below ordinary traffic's,
    // even the worst of them (right after a cut or during a pause, when more is in flight
    // than the shrunken capacity allows).
    assert!(
        recovery_median * 2 <= median && *recovery_waits.last().unwrap() < median,
        "recovery {recovery_waits:?} vs interactive median {median}"
    );
    // Batch is slowed first: with equal class shares it gets as much as interactive at full
    // capacity (the baseline), and clearly less once the pool has shrunk. (Without the degrade
    // the storm's ratio is the baseline's, ~1; with it 0.55–0.75 here: batch keeps at least one
    // of the 3–4 ordinary slots left.)
    assert!(sb < si, "storm: {si} interactive, {sb} batch");
    assert!(
        (sb as f64 / si as f64) < 0.85 * (bb as f64 / bi as f64),
        "storm {sb}/{si} vs baseline {bb}/{bi}"
    );
}

#[tokio::test]
async fn a_429_that_outlasts_the_retries_is_passed_on_and_counted_as_exhausted() {
    let mock = mock_with(MockConfig {
        retry_after: Duration::from_millis(100),
        ..MockConfig::default()
    })
    .await;
    let p = Conf::new(&mock.base_url())
        .set("admission.max_retries", 2)
        .set("admission.retry_backoff_ms", 10)
        .set("admission.retry_backoff_max_ms", 20)
        .start()
        .await;
    let r = chat_as(&p, KEY_A, &chat("gpt-4o-mini"), &[("x-mock-status", "429")]).await;
    r.assert_error(429, "rate_limit_exceeded");
    assert_eq!(header(&r, "x-fairgate-limit"), Some("upstream"));
    assert!(header(&r, "retry-after").is_some());
    assert!(
        header(&r, "retry-after-ms").is_some(),
        "the SDKs' preferred header"
    );
    assert_eq!(
        mock.stats.requests(),
        3,
        "the first attempt and two retries"
    );
    let text = crate::support::scrape(p.addr).await;
    let plain = |name| crate::support::value(&text, name, &[]);
    assert_eq!(
        plain("fairgate_upstream_retries_total"),
        Some(2.0),
        "{text}"
    );
    assert_eq!(
        plain("fairgate_upstream_retries_exhausted_total"),
        Some(1.0),
        "{text}"
    );
}

/// A provider 429 that clears is retried inside the permit and succeeds, and the extra attempt
/// is the tenant's own cost: its fair-queue credit ends lower than a tenant that sent the same
/// request without a retry.
#[tokio::test]
async fn a_retry_that_then_succeeds_is_served_and_charged_to_its_tenant() {
    let mock = mock_with(MockConfig {
        max_concurrency: Some(1),
        retry_after: Duration::from_millis(100),
        ..MockConfig::default()
    })
    .await;
    let p = Arc::new(
        Conf::new(&mock.base_url())
            .upstream("max_concurrency", 2)
            .set("admission.max_retries", 5)
            .set("admission.retry_backoff_ms", 20)
            .set("admission.retry_backoff_max_ms", 50)
            .start()
            .await,
    );
    // b alone, no retry: the control.
    assert_eq!(
        chat_as(&p, KEY_B, &chat("gpt-4o-mini"), &[]).await.status,
        200
    );
    // b holds the provider's only slot; a's request meets its 429, waits, and is retried.
    let holder = {
        let p = p.clone();
        tokio::spawn(async move {
            let slow = [("x-mock-delay-ms", "400")];
            chat_as(&p, KEY_B, &chat("gpt-4o-mini"), &slow).await.status
        })
    };
    assert!(eventually(|| mock.stats.in_flight() == 1).await);
    let r = chat_as(&p, KEY_A, &chat("gpt-4o-mini"), &[]).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(holder.await.unwrap(), 200);
    assert!(
        mock.stats.rejected_429() >= 1,
        "the provider refused a's first attempt"
    );
    let retries = p.admission.retries.retries.load(Ordering::Relaxed);
    assert!(retries >= 1);
    assert!(eventually(|| p.pools[0].load() == (0, 0)).await);
    let credit = |t: &str| {
        p.pools[0]
            .credit(&fairgate::domain::TenantId::new(t))
            .unwrap()
    };
    // b's credit went back to zero (or a small under-estimate); a carries the attempts' debt.
    assert!(
        credit("a") < credit("b"),
        "a {} vs b {} after {retries} retries",
        credit("a"),
        credit("b")
    );
}
