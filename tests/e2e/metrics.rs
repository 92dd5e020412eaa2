//! `/metrics` end to end: a flood tenant's queue depth and in-flight gauges rise, requests are
//! counted by status, a queue-full 429 is counted by reason, cohort labels replace tenant ids
//! when asked, and the per-request log line carries no key and no prompt text. Assertions are
//! on counts, never on wall-clock durations.

use std::io::Write;
use std::sync::{Arc, Mutex};

use crate::support::*;
use fairgate_mock::MockConfig;

fn body(content: &str) -> String {
    format!(
        r#"{{"model":"gpt-4o-mini","max_tokens":5,"messages":[{{"role":"user","content":"{content}"}}]}}"#
    )
}

#[tokio::test]
async fn flood_raises_queue_depth_and_counts_statuses_and_reasons() {
    let mock = mock_with(MockConfig::default()).await;
    // Histograms per tenant (the default is per plan: tests/metrics_scale.rs).
    let proxy = Conf::pool(&mock.base_url(), 1)
        .set("metrics.histograms", "tenant")
        .add_tenants(&["flood", "small"])
        .tenant("flood", "max_queued", 3)
        .start()
        .await;
    let addr = proxy.addr;
    let slow = [("x-mock-delay-ms", "300")];
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(tokio::spawn(async move {
            send(post(
                addr,
                "/v1/chat/completions",
                Some("key-flood"),
                &body("hi"),
                &slow,
            ))
            .await
        }));
    }
    assert!(eventually(|| proxy.pools[0].load() == (3, 1)).await);
    let text = scrape(addr).await;
    assert_eq!(
        value(&text, "fairgate_queue_depth", &[("tenant", "flood")]),
        Some(3.0)
    );
    assert_eq!(
        value(&text, "fairgate_inflight", &[("tenant", "flood")]),
        Some(1.0)
    );
    assert_eq!(
        value(&text, "fairgate_queue_depth", &[("tenant", "small")]),
        Some(0.0)
    );
    assert!(value(
        &text,
        "fairgate_oldest_queued_seconds",
        &[("tenant", "flood")]
    )
    .is_some());
    assert_eq!(
        value(&text, "fairgate_upstream_limit", &[("upstream", "mock")]),
        Some(1.0)
    );

    // The fifth is refused: the tenant's queue is full.
    let r = send(post(
        addr,
        "/v1/chat/completions",
        Some("key-flood"),
        &body("hi"),
        &[],
    ))
    .await;
    r.assert_error(429, "rate_limit_exceeded");
    for h in held {
        assert_eq!(h.await.unwrap().status, 200);
    }
    let r = send(post(
        addr,
        "/v1/chat/completions",
        Some("key-small"),
        &body("hi"),
        &[],
    ))
    .await;
    assert_eq!(r.status, 200);

    // Durations and estimate errors are recorded when a response body is dropped, on the
    // connection worker's thread, possibly just after the client read the last byte.
    let flood = [("tenant", "flood")];
    let mut text = scrape(addr).await;
    for _ in 0..100 {
        let done = value(&text, "fairgate_request_duration_seconds_count", &flood) == Some(5.0)
            && value(&text, "fairgate_estimate_error_ratio_count", &flood) == Some(4.0);
        if done {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        text = scrape(addr).await;
    }
    let ok = [("tenant", "flood"), ("status", "200")];
    assert_eq!(value(&text, "fairgate_requests_total", &ok), Some(4.0));
    let refused = [("tenant", "flood"), ("status", "429")];
    assert_eq!(value(&text, "fairgate_requests_total", &refused), Some(1.0));
    let reason = [("tenant", "flood"), ("reason", "tenant_queue_full")];
    assert_eq!(value(&text, "fairgate_rejected_total", &reason), Some(1.0));
    let small = [("tenant", "small"), ("status", "200")];
    assert_eq!(value(&text, "fairgate_requests_total", &small), Some(1.0));
    let waits = [("tenant", "flood"), ("class", "interactive")];
    assert_eq!(
        value(&text, "fairgate_queue_wait_seconds_count", &waits),
        Some(4.0)
    );
    assert_eq!(
        value(
            &text,
            "fairgate_request_duration_seconds_count",
            &[("tenant", "flood")]
        ),
        Some(5.0)
    );
    // Time to first byte: the four answers with a body (the refusal's line is written before
    // any body exists).
    assert_eq!(
        value(
            &text,
            "fairgate_time_to_first_byte_seconds_count",
            &[("tenant", "flood")]
        ),
        Some(4.0)
    );
    let model = [("tenant", "flood"), ("model", "gpt-4o-mini")];
    assert!(value(&text, "fairgate_tokens_estimated_total", &model).unwrap() > 0.0);
    assert!(value(&text, "fairgate_tokens_actual_total", &model).unwrap() > 0.0);
    assert_eq!(
        value(
            &text,
            "fairgate_estimate_error_ratio_count",
            &[("tenant", "flood")]
        ),
        Some(4.0)
    );
    // Drained: the gauges fall back.
    assert_eq!(
        value(&text, "fairgate_queue_depth", &[("tenant", "flood")]),
        Some(0.0)
    );
    assert_eq!(
        value(&text, "fairgate_inflight", &[("tenant", "flood")]),
        Some(0.0)
    );
    // Cost units: all five were estimated; four admitted (three after waiting), one refused.
    let cost = |outcome| {
        let labels = [("tenant", "flood"), ("outcome", outcome)];
        value(&text, "fairgate_cost_tokens_total", &labels).unwrap()
    };
    let (admitted, deferred, rejected) = (cost("admitted"), cost("deferred"), cost("rejected"));
    assert!(rejected > 0.0);
    assert_eq!(admitted, 4.0 * rejected, "equal requests, equal estimates");
    // The first was granted at once (unless descheduled for a millisecond), three waited.
    assert!(
        (3.0 * rejected..=4.0 * rejected).contains(&deferred),
        "{deferred}"
    );
    assert!(text.contains("fairgate_upstream_retries_total"));
    assert!(text.contains("fairgate_upstream_429_total"));
    // Served while contended: the Jain index of the pool is defined (flood was backlogged).
    let jain = value(&text, "fairgate_jain_index", &[("pool", "mock")]);
    assert!(
        jain.is_some_and(|j| j > 0.0 && j <= 1.0),
        "{jain:?}\n{text}"
    );
    assert!(!text.contains("key-flood"));
}

#[tokio::test]
async fn share_ratios_approach_one_under_contention() {
    let mock = mock_with(MockConfig::default()).await;
    let proxy = Conf::pool(&mock.base_url(), 1)
        .set("scheduler.quantum", 100)
        .add_tenants(&["a", "b", "idle"])
        .start()
        .await;
    let addr = proxy.addr;
    let slow = [("x-mock-delay-ms", "40")];
    let mut held = Vec::new();
    for key in ["key-a", "key-b"] {
        for _ in 0..8 {
            held.push(tokio::spawn(async move {
                let b = r#"{"model":"gpt-4o-mini","max_tokens":60,"messages":[{"role":"user","content":"hi"}]}"#;
                send(post(addr, "/v1/chat/completions", Some(key), b, &slow)).await
            }));
        }
    }
    assert!(eventually(|| proxy.pools[0].load().0 >= 14).await);
    // The first scrape opens the window; the second sees the tokens dispatched in between: at
    // least ten, alternating a, b (each visit of quantum 100 fits one ~70-token request), so
    // the two tenants' counts differ by at most one.
    scrape(addr).await;
    assert!(eventually(|| proxy.pools[0].load().0 <= 4).await);
    let text = scrape(addr).await;
    for t in ["a", "b"] {
        let r = value(&text, "fairgate_share_ratio", &[("tenant", t)]).unwrap();
        assert!((0.8..=1.2).contains(&r), "{t}: share ratio {r}\n{text}");
    }
    // The idle tenant is entitled to nothing: no share ratio.
    assert_eq!(
        value(&text, "fairgate_share_ratio", &[("tenant", "idle")]),
        None
    );
    let jain = value(&text, "fairgate_jain_index", &[("pool", "mock")]).unwrap();
    assert!(jain > 0.95, "jain {jain}");
    for h in held {
        assert_eq!(h.await.unwrap().status, 200);
    }
}

#[tokio::test]
async fn cohort_labels_replace_tenant_ids_when_per_tenant_labels_are_off() {
    let mock = mock_with(MockConfig::default()).await;
    let proxy = Conf::pool(&mock.base_url(), 4)
        .set("metrics.per_tenant_labels", false)
        .set("plans.gold.weight", 2.0)
        .add_tenants(&["a", "b", "c"])
        .tenant("a", "plan", "gold")
        .tenant("b", "plan", "gold")
        .start()
        .await;
    for key in ["key-a", "key-b", "key-c"] {
        let r = send(post(
            proxy.addr,
            "/v1/chat/completions",
            Some(key),
            &body("hi"),
            &[],
        ))
        .await;
        assert_eq!(r.status, 200);
    }
    let text = scrape(proxy.addr).await;
    // One meaning per label: the cohort is a `plan` label, never a `tenant` one.
    let gold = [("plan", "gold"), ("status", "200")];
    assert_eq!(value(&text, "fairgate_requests_total", &gold), Some(2.0));
    let none = [("plan", "none"), ("status", "200")];
    assert_eq!(value(&text, "fairgate_requests_total", &none), Some(1.0));
    assert!(!text.contains("tenant=\""));
}

/// A `MakeWriter` into a shared buffer.
#[derive(Clone, Default)]
struct Buf(Arc<Mutex<Vec<u8>>>);

impl Write for Buf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Buf {
    type Writer = Buf;
    fn make_writer(&'a self) -> Buf {
        self.clone()
    }
}

// The thread-local subscriber is inherited by the server's connection workers.
#[tokio::test]
async fn one_json_log_line_per_request_without_key_or_prompt() {
    let buf = Buf::default();
    let subscriber = tracing_subscriber::fmt()
        .json()
        .flatten_event(true)
        .with_max_level(tracing::Level::DEBUG)
        .with_writer(buf.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    // While only one dispatcher exists, tracing caches a callsite's interest from whichever
    // thread hits it first — here possibly a connection worker of another test of this binary,
    // which has no subscriber ("never"). A second live dispatcher makes tracing ask every
    // dispatcher instead.
    let _second = tracing::Dispatch::new(tracing_subscriber::registry());
    let mock = mock_with(MockConfig::default()).await;
    let proxy = Conf::pool(&mock.base_url(), 2)
        .add_tenants(&["a"])
        .tenant("a", "max_queued", 1)
        .start()
        .await;
    let prompt = "the-secret-prompt-xyzzy";
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let traceparent = format!("00-{trace}-00f067aa0ba902b7-01");
    let r = send(post(
        proxy.addr,
        "/v1/chat/completions",
        Some("key-a"),
        &body(prompt),
        &[("traceparent", &traceparent)],
    ))
    .await;
    assert_eq!(r.status, 200);
    let bad = r#"{"model":"gpt-4o-mini","max_tokens":99999999,"messages":[{"role":"user","content":"the-secret-prompt-xyzzy"}]}"#;
    let r = send(post(
        proxy.addr,
        "/v1/chat/completions",
        Some("key-a"),
        bad,
        &[],
    ))
    .await;
    assert_eq!(r.status, 400);
    let r = send(post(
        proxy.addr,
        "/v1/chat/completions",
        Some("wrong-key-xyzzy"),
        bad,
        &[],
    ))
    .await;
    assert_eq!(r.status, 401);

    // The line is written when the response body is dropped, on the connection worker's
    // thread, which can be just after the client has read the last byte: wait for it (bounded).
    let read = || {
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v["target"] == "fairgate::request")
            .collect();
        (text, lines)
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let (text, lines) = loop {
        let (text, lines) = read();
        if lines.len() >= 2 || std::time::Instant::now() > deadline {
            break (text, lines);
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    };
    assert_eq!(lines.len(), 2, "{text}");
    let ok = &lines[0];
    assert_eq!(ok["tenant"], "a");
    assert_eq!(ok["model"], "gpt-4o-mini");
    assert_eq!(ok["status"], 200);
    assert!(ok["estimated_tokens"].as_u64().unwrap() > 0);
    assert!(ok["actual_tokens"].as_u64().unwrap() > 0);
    assert!(ok["queue_ms"].is_u64());
    assert!(ok["upstream_ms"].is_u64());
    // The line joins the request's trace: the client's, continued.
    assert_eq!(ok["trace_id"], trace);
    let refused = &lines[1];
    assert_eq!(
        refused["trace_id"].as_str().map(str::len),
        Some(32),
        "a new trace's id"
    );
    assert_eq!(refused["status"], 400);
    assert_eq!(refused["refused"], "output_too_large");
    for secret in [prompt, "key-a", "wrong-key-xyzzy", "Bearer"] {
        assert!(!text.contains(secret), "log contains {secret}: {text}");
    }
}
