//! Spend budgets end to end (`budgets = [...]`, `[prices]`, `[store]`, `GET /admin/usage`),
//! over real sockets against the bundled mock, with raw HTTP and the official client:
//! - a spent budget is `429` `insufficient_quota` (type and code), `x-fairgate-limit: budget`,
//!   `x-should-retry: false`, `Retry-After` = seconds until the period resets, and what is left
//!   in `x-fairgate-budget-remaining-*`; the official client does not retry it;
//! - requests at the budget's edge, concurrently, never jointly pass it (estimates are the
//!   output cap, an upper bound).

use crate::support::conf::Val;
use crate::support::*;
use toml::Table;

/// A chat request whose estimate is its counted input plus `max_tokens`.
fn capped(max_tokens: u32) -> String {
    format!(
        r#"{{"model":"gpt-4o-mini","max_tokens":{max_tokens},"messages":[{{"role":"user","content":"hello"}}]}}"#
    )
}

fn budget(period: &str, unit: &str, amount: impl Val) -> Table {
    let mut t = entry("period", period);
    t.insert(unit.to_owned(), amount.val());
    t
}

/// Seconds from now until the next UTC midnight.
fn until_midnight() -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    86_400 - now % 86_400
}

/// Input + output tokens the provider reported in a chat answer.
fn used(r: &Collected) -> u64 {
    let u = &r.json()["usage"];
    u["prompt_tokens"].as_u64().unwrap() + u["completion_tokens"].as_u64().unwrap()
}

#[tokio::test]
async fn a_spent_budget_is_429_insufficient_quota_until_the_period_resets() {
    let mock = mock().await;
    let proxy = Conf::new(&mock.base_url())
        .tenant("a", "budgets", vec![budget("day", "tokens", 200)])
        .start()
        .await;
    let out = [("x-mock-output-tokens", "10")];
    let (mut spent, mut refused) = (0, None);
    for _ in 0..40 {
        let r = send(post(
            proxy.addr,
            "/v1/chat/completions",
            Some(KEY_A),
            &capped(30),
            &out,
        ))
        .await;
        if r.status == 200 {
            spent += used(&r);
            let left: u64 = r.headers["x-fairgate-budget-remaining-tokens"]
                .to_str()
                .unwrap()
                .parse()
                .unwrap();
            assert!(left <= 200 - spent, "{left} left after {spent}");
            continue;
        }
        refused = Some(r);
        break;
    }
    let r = refused.expect("the budget runs out within 40 requests");
    r.assert_error(429, "insufficient_quota");
    assert_eq!(r.json()["error"]["type"], "insufficient_quota");
    assert_eq!(r.headers["x-fairgate-limit"], "budget");
    assert_eq!(r.headers["x-should-retry"], "false");
    let retry: u64 = r.headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!(retry.abs_diff(until_midnight()) <= 5, "Retry-After {retry}");
    assert!(r.headers.contains_key("x-fairgate-budget-remaining-tokens"));
    assert!(spent <= 200, "spent {spent} of 200");
    let left = value(
        &scrape(proxy.addr).await,
        "fairgate_budget_remaining",
        &[("tenant", "a"), ("period", "day"), ("unit", "tokens")],
    );
    assert_eq!(
        left,
        Some((200 - spent) as f64),
        "the gauge shows what is left"
    );
    assert!(
        spent > 200 - 60,
        "refused only when the estimate no longer fits: {spent}"
    );
    // Another tenant (no budget) is not affected.
    let b = send(post(
        proxy.addr,
        "/v1/chat/completions",
        Some(KEY_B),
        &capped(30),
        &out,
    ))
    .await;
    assert_eq!(b.status, 200);
    assert!(!b.headers.contains_key("x-fairgate-budget-remaining-tokens"));
}

#[tokio::test]
async fn the_official_client_sees_insufficient_quota_and_does_not_retry() {
    let mock = mock().await;
    let proxy = Conf::new(&mock.base_url())
        .tenant("a", "budgets", vec![budget("month", "tokens", 5)])
        .start()
        .await;
    let client = official::client(proxy.addr, KEY_A);
    let req = official::hello("gpt-4o-mini", Some(50));
    let started = std::time::Instant::now();
    let err = client.chat().create(req).await.unwrap_err();
    let text = format!("{err:?}");
    assert!(text.contains("insufficient_quota"), "{text}");
    assert_eq!(mock.stats.requests(), 0, "refused before the provider");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(10),
        "not retried with backoff"
    );
}

#[tokio::test]
async fn concurrent_requests_at_the_edge_never_jointly_pass_the_budget() {
    let mock = mock().await;
    let proxy = Conf::new(&mock.base_url())
        .upstream("max_concurrency", 4)
        .tenant("a", "budgets", vec![budget("day", "tokens", 1000)])
        .start()
        .await;
    let out = [("x-mock-output-tokens", "40"), ("x-mock-delay-ms", "20")];
    let sends = (0..48).map(|_| {
        send(post(
            proxy.addr,
            "/v1/chat/completions",
            Some(KEY_A),
            &capped(40),
            &out,
        ))
    });
    let answers = futures_util::future::join_all(sends).await;
    let mut spent = 0;
    let mut refused = 0;
    for r in &answers {
        match r.status {
            200 => spent += used(r),
            429 => {
                r.assert_error(429, "insufficient_quota");
                refused += 1;
            }
            s => panic!("unexpected {s}"),
        }
    }
    assert!(spent <= 1000, "spent {spent} of 1000");
    assert!(
        refused > 0 && spent > 600,
        "spent {spent}, refused {refused}"
    );
}

/// `GET /admin/usage` with the admin token, as JSON (or CSV).
async fn bill(addr: std::net::SocketAddr, token: &str, query: &str, accept: &str) -> Collected {
    let req = http::Request::get(format!("http://{addr}/admin/usage{query}"))
        .header("authorization", format!("Bearer {token}"))
        .header("accept", accept)
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    send(req).await
}

#[tokio::test]
async fn the_bill_equals_what_the_provider_reported_priced_and_a_restart_keeps_the_budget() {
    let dir = std::env::temp_dir().join(format!("fg-budgets-{}", rand::random::<u64>()));
    std::fs::create_dir_all(&dir).unwrap();
    let store = dir.join("store.sqlite");
    let var = unique_env("ADMIN");
    let token = "admin-token-budgets";
    // The `rough` profile reports cached input tokens (half the prompt).
    let mock = mock_profile(fairgate_mock::Profile::Rough).await;
    let conf = Conf::new(&mock.base_url())
        .set("admin.token_env", &var)
        .set("store.path", store.to_str().unwrap())
        .set("store.flush_ms", 50)
        .set("prices.gpt-4o-mini.input", 0.15)
        .set("prices.gpt-4o-mini.output", 0.60)
        .set("prices.gpt-4o-mini.cached_input", 0.075)
        .tenant("a", "budgets", vec![budget("day", "tokens", 400)]);
    let proxy = conf.start_with_env(&[(&var, token)]).await;
    let body = r#"{"model":"gpt-4o-mini","max_tokens":30,"messages":[{"role":"user","content":"a prompt long enough to have a cached part: hello hello hello hello"}]}"#;
    let out = [("x-mock-output-tokens", "20")];
    let (mut reported, mut ok) = ((0u64, 0u64, 0u64), 0u64);
    for _ in 0..5 {
        let r = send(post(
            proxy.addr,
            "/v1/chat/completions",
            Some(KEY_A),
            body,
            &out,
        ))
        .await;
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        let u = &r.json()["usage"];
        reported.0 += u["prompt_tokens"].as_u64().unwrap();
        reported.1 += u["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0);
        reported.2 += u["completion_tokens"].as_u64().unwrap();
        ok += 1;
    }
    assert!(reported.1 > 0, "the rough profile reports cached tokens");
    let r = bill(proxy.addr, token, "?tenant=a", "application/json").await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    assert_eq!(v["object"], "list");
    let row = &v["data"][0];
    assert_eq!(
        (row["tenant"].as_str(), row["model"].as_str()),
        (Some("a"), Some("gpt-4o-mini"))
    );
    assert_eq!(row["requests"], ok);
    assert_eq!(row["input_tokens"], reported.0);
    assert_eq!(row["cached_input_tokens"], reported.1);
    assert_eq!(row["output_tokens"], reported.2);
    let cost = ((reported.0 - reported.1) as f64 * 0.15
        + reported.1 as f64 * 0.075
        + reported.2 as f64 * 0.60)
        / 1e6;
    let billed = row["cost_usd"].as_f64().unwrap();
    assert!(
        (billed - cost).abs() < 1e-12,
        "billed {billed}, priced {cost}"
    );
    let csv = bill(proxy.addr, token, "", "text/csv").await;
    let text = String::from_utf8_lossy(&csv.body).to_string();
    assert!(text.starts_with("tenant,day,model,requests,"), "{text}");
    assert_eq!(text.lines().count(), 2, "{text}");
    bill(proxy.addr, token, "?from=yesterday", "application/json")
        .await
        .assert_error(400, "invalid_date");
    // Spend until refused, then restart on the same store: still refused, same spend.
    let mut refused = false;
    for _ in 0..20 {
        let r = send(post(
            proxy.addr,
            "/v1/chat/completions",
            Some(KEY_A),
            body,
            &out,
        ))
        .await;
        if r.status == 429 {
            r.assert_error(429, "insufficient_quota");
            refused = true;
            break;
        }
    }
    assert!(refused, "the day budget of 400 tokens runs out");
    let before = bill(proxy.addr, token, "?tenant=a", "application/json")
        .await
        .json();
    proxy.shutdown();
    proxy.join().await.unwrap();
    let proxy = conf.start_with_env(&[(&var, token)]).await;
    let after = bill(proxy.addr, token, "?tenant=a", "application/json")
        .await
        .json();
    assert_eq!(before, after, "the ledger survives a restart");
    send(post(
        proxy.addr,
        "/v1/chat/completions",
        Some(KEY_A),
        body,
        &out,
    ))
    .await
    .assert_error(429, "insufficient_quota");
    let _ = std::fs::remove_dir_all(dir);
}
