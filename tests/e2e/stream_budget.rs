//! Accounting while streaming, end to end over real sockets against the mock's slow long
//! streams (`x-mock-output-tokens`, `x-mock-token-delay-ms`):
//! - a stream's output is counted as it passes: the tenant's token bucket and fair-queue credit
//!   show its cost while it runs, not only at its end;
//! - `max_stream_output_tokens` and `cut_off_over_budget` (the token bucket, or a spend budget)
//!   end a stream cleanly (a final error
//!   event in OpenAI's shape, then `data: [DONE]`), cancel the upstream request, and count
//!   `fairgate_rejected_total{reason="stream_budget"}`.

use std::time::Duration;

use crate::support::*;
use bytes::Bytes;
use fairgate::domain::TenantId;
use http_body_util::BodyExt;

fn stream_body() -> String {
    r#"{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"write a lot"}]}"#
        .to_owned()
}

/// The SSE payloads of a body (`data: ` lines).
fn events(body: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(body)
        .split("\n\n")
        .filter_map(|e| e.trim().strip_prefix("data: ").map(str::to_owned))
        .collect()
}

/// Asserts a stream cut by fairgate: every event is whole JSON, the last two are the error and
/// `[DONE]`; returns the content deltas received.
fn assert_cut(body: &Bytes) -> usize {
    let ev = events(body);
    assert!(ev.len() >= 2, "{}", String::from_utf8_lossy(body));
    assert_eq!(ev[ev.len() - 1], "[DONE]");
    let err: serde_json::Value = serde_json::from_str(&ev[ev.len() - 2]).unwrap();
    assert_eq!(err["error"]["code"], "stream_budget_exceeded", "{err}");
    assert_eq!(err["error"]["type"], "tokens", "{err}");
    assert!(err["error"]["message"]
        .as_str()
        .is_some_and(|m| !m.is_empty()));
    let mut deltas = 0;
    for e in &ev[..ev.len() - 2] {
        let v: serde_json::Value = serde_json::from_str(e).unwrap_or_else(|x| panic!("{x}: {e}"));
        if v["choices"][0]["delta"]["content"].is_string() {
            deltas += 1;
        }
    }
    deltas
}

async fn rejected(addr: std::net::SocketAddr, tenant: &str) -> f64 {
    let text = scrape(addr).await;
    value(
        &text,
        "fairgate_rejected_total",
        &[("tenant", tenant), ("reason", "stream_budget")],
    )
    .unwrap_or(0.0)
}

#[tokio::test]
async fn a_stream_past_max_stream_output_tokens_is_ended_cleanly_and_cancelled_upstream() {
    let mock = mock().await;
    let proxy = Conf::new(&mock.base_url())
        .tenant("b", "max_stream_output_tokens", 200)
        .start()
        .await;
    let r = send(post(
        proxy.addr,
        "/v1/chat/completions",
        Some(KEY_B),
        &stream_body(),
        &[
            ("x-mock-output-tokens", "5000"),
            ("x-mock-token-delay-ms", "1"),
        ],
    ))
    .await;
    assert_eq!(r.status, 200);
    let deltas = assert_cut(&r.body);
    eprintln!("max_stream_output_tokens = 200, 5 000 asked: cut after {deltas} deltas");
    // Cut within one counting step (64 tokens) of the cap, far from the 5 000 asked for.
    assert!((200..=400).contains(&deltas), "{deltas} deltas");
    let stats = mock.stats.clone();
    assert!(
        eventually(|| stats.cancelled() >= 1).await,
        "the upstream request was cancelled"
    );
    assert_eq!(rejected(proxy.addr, "b").await, 1.0);
    // Tenant a has no cap: its stream runs to its end.
    let r = send(post(
        proxy.addr,
        "/v1/chat/completions",
        Some(KEY_A),
        &stream_body(),
        &[("x-mock-output-tokens", "600")],
    ))
    .await;
    let ev = events(&r.body);
    assert_eq!(ev.last().map(String::as_str), Some("[DONE]"));
    assert!(!String::from_utf8_lossy(&r.body).contains("stream_budget_exceeded"));
    assert_eq!(rejected(proxy.addr, "a").await, 0.0);
}

#[tokio::test]
async fn a_stream_past_the_tenants_remaining_budget_is_cut_with_cut_off_over_budget() {
    let mock = mock().await;
    // 3 000 tokens a minute; the stream is admitted at its estimate (~520) and asks for 8 000.
    let proxy = Conf::new(&mock.base_url())
        .tenant("b", "tokens_per_minute", 3000)
        .tenant("b", "cut_off_over_budget", true)
        .start()
        .await;
    let r = send(post(
        proxy.addr,
        "/v1/chat/completions",
        Some(KEY_B),
        &stream_body(),
        &[
            ("x-mock-output-tokens", "8000"),
            ("x-mock-token-delay-ms", "1"),
        ],
    ))
    .await;
    assert_eq!(r.status, 200);
    let deltas = assert_cut(&r.body);
    eprintln!(
        "tokens_per_minute = 3000, cut_off_over_budget, 8 000 asked: cut after {deltas} deltas"
    );
    // The bucket held 3 000 (plus what refilled meanwhile, 50 a second).
    assert!((2000..=4500).contains(&deltas), "{deltas} deltas");
    assert_eq!(rejected(proxy.addr, "b").await, 1.0);
}

/// A spend budget cuts a stream too: with `cut_off_over_budget`, the output past the estimate
/// is reserved as it streams and the stream is ended where the day budget runs out; without it
/// the stream runs to its end (the overrun is the estimate error the bound allows) and the next
/// request is refused.
#[tokio::test]
async fn a_stream_past_a_spend_budget_is_cut_with_cut_off_over_budget() {
    let mut budget = toml::Table::new();
    budget.insert("period".into(), "day".into());
    budget.insert("tokens".into(), 2000.into());
    let mock = mock().await;
    let proxy = Conf::new(&mock.base_url())
        .tenant("b", "budgets", vec![budget.clone()])
        .tenant("b", "cut_off_over_budget", true)
        .tenant("a", "budgets", vec![budget])
        .start()
        .await;
    let long = [
        ("x-mock-output-tokens", "8000"),
        ("x-mock-token-delay-ms", "1"),
    ];
    // Admitted at its estimate (~520 tokens), it asks for 8 000.
    let r = send(post(
        proxy.addr,
        "/v1/chat/completions",
        Some(KEY_B),
        &stream_body(),
        &long,
    ))
    .await;
    assert_eq!(r.status, 200);
    let deltas = assert_cut(&r.body);
    eprintln!(
        "a day budget of 2 000 tokens, cut_off_over_budget, 8 000 asked: cut after {deltas} deltas"
    );
    // Cut within one counting step (64 tokens) of the budget, less the prompt.
    assert!((1800..=2100).contains(&deltas), "{deltas} deltas");
    assert_eq!(rejected(proxy.addr, "b").await, 1.0);
    send(post(
        proxy.addr,
        "/v1/chat/completions",
        Some(KEY_B),
        &stream_body(),
        &[],
    ))
    .await
    .assert_error(429, "insufficient_quota");
    // Without cut_off_over_budget the stream runs to its end, settled then.
    let r = send(post(
        proxy.addr,
        "/v1/chat/completions",
        Some(KEY_A),
        &stream_body(),
        &[("x-mock-output-tokens", "3000")],
    ))
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(events(&r.body).last().map(String::as_str), Some("[DONE]"));
    assert!(!String::from_utf8_lossy(&r.body).contains("stream_budget_exceeded"));
    send(post(
        proxy.addr,
        "/v1/chat/completions",
        Some(KEY_A),
        &stream_body(),
        &[],
    ))
    .await
    .assert_error(429, "insufficient_quota");
}

/// While a long stream runs, its counted output is already charged: another request of the
/// same tenant sees the bucket lowered by it, and the tenant's fair-queue credit (one default
/// quantum, 4 096, when its request cut in) has fallen by it — not only by the ~520-token
/// estimate the stream was admitted at. (The bound allows the
/// bucket's refill for up to 26 s of streaming, so a slow machine does not fail it.)
#[tokio::test]
async fn a_long_streams_cost_is_seen_while_it_runs() {
    let mock = mock().await;
    let proxy = Conf::new(&mock.base_url())
        .tenant("b", "tokens_per_minute", 3000)
        .start()
        .await;
    let req = post(
        proxy.addr,
        "/v1/chat/completions",
        Some(KEY_B),
        &stream_body(),
        &[
            ("x-mock-output-tokens", "4000"),
            ("x-mock-token-delay-ms", "1"),
        ],
    );
    let res = client().request(req).await.unwrap();
    assert_eq!(res.status(), 200);
    let mut body = res.into_body();
    let mut seen = 0usize;
    let read = async {
        while seen < 2000 {
            let Some(Ok(frame)) = body.frame().await else {
                break;
            };
            if let Ok(data) = frame.into_data() {
                seen += String::from_utf8_lossy(&data)
                    .matches("\"content\"")
                    .count();
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(20), read)
        .await
        .expect("2 000 tokens within the safety timeout");
    assert!(seen >= 2000, "{seen}");
    // Mid-stream: the fair queue already charged the tenant for what streamed.
    let credit = proxy.pools[0].credit(&TenantId::new("b")).unwrap();
    assert!(
        credit < 4096 - 520 - 1500,
        "credit {credit} after {seen} streamed tokens"
    );
    // And the token bucket (3 000, refilling 50 a second): a small request sees what is left
    // after ~2 000 streamed tokens (plus the refill), not after the ~520 estimate: without the
    // metering it would see 2 480 or more.
    let r = send(post(
        proxy.addr,
        "/v1/chat/completions",
        Some(KEY_B),
        r#"{"model":"gpt-4o-mini","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#,
        &[],
    ))
    .await;
    assert_eq!(r.status, 200);
    let remaining: u64 = r.headers["x-ratelimit-remaining-tokens"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    eprintln!(
        "mid-stream after {seen} tokens: fair-queue credit {credit}, bucket remaining {remaining} of 3000"
    );
    assert!(remaining < 2_300, "remaining {remaining} mid-stream");
    drop(body);
}
