//! One 429 vocabulary: fairgate's own rate refusals say OpenAI's `type` (`requests` / `tokens`)
//! and `code` (`rate_limit_exceeded`), and a wait longer than the 60 s the OpenAI SDKs honour
//! also says `x-should-retry: false` (an SDK would otherwise retry early, in vain). The official
//! client (async-openai, which retries a 429 up to three times after its `Retry-After`) gets
//! through a short rate refusal by waiting what fairgate said, sending nothing in between.

use std::time::Duration;

use crate::support::*;

#[tokio::test]
async fn the_official_client_waits_out_a_rate_refusal_as_retry_after_says() {
    let mock = mock().await;
    // One request a second, a bucket of one: the second request at once is refused with
    // Retry-After: 1 (type requests, code rate_limit_exceeded).
    let proxy = Conf::new(&mock.base_url())
        .tenant("b", "requests_per_minute", 60)
        .tenant("b", "burst", 1.0 / 60.0)
        .start()
        .await;
    let raw = send(post(
        proxy.addr,
        "/v1/chat/completions",
        Some(KEY_B),
        &chat("gpt-4o-mini"),
        &[],
    ))
    .await;
    assert_eq!(raw.status, 200);
    let refused = send(post(
        proxy.addr,
        "/v1/chat/completions",
        Some(KEY_B),
        &chat("gpt-4o-mini"),
        &[],
    ))
    .await;
    refused.assert_error(429, "rate_limit_exceeded");
    assert_eq!(refused.json()["error"]["type"], "requests");
    assert_eq!(refused.headers["retry-after"], "1");
    assert!(
        !refused.headers.contains_key("x-should-retry"),
        "a 1 s wait is worth retrying"
    );
    let client = official::client(proxy.addr, KEY_B);
    let req = official::hello("gpt-4o-mini", Some(5));
    // The bucket is empty again after `refused`'s neighbour: the client's first attempt is
    // refused, it sleeps the Retry-After, and its retry is answered.
    let answer = client
        .chat()
        .create(req)
        .await
        .expect("answered after the wait");
    assert!(answer.usage.is_some());
    assert_eq!(
        mock.stats.requests(),
        2,
        "refused attempts never reached the provider"
    );
    let scrape = scrape(proxy.addr).await;
    let refusals: f64 = scrape
        .lines()
        .filter(|l| l.starts_with("fairgate_rejected_total{") && l.contains("tenant=\"b\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(
        refusals >= 2.0,
        "the raw refusal and the client's first attempt: {refusals}"
    );
}

#[tokio::test]
async fn a_debt_wait_past_sixty_seconds_says_do_not_retry() {
    let mock = mock().await;
    let proxy = Conf::new(&mock.base_url())
        .tenant("b", "tokens_per_minute", 100)
        // A bucket of 1 000 tokens (ten minutes of refill), so the first request fits.
        .tenant("b", "burst", 10.0)
        .start()
        .await;
    let small =
        r#"{"model":"gpt-4o-mini","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#;
    // Estimated at ~520 tokens, it uses 5 000: the debt takes ~45 minutes of refill.
    let r = send(post(
        proxy.addr,
        "/v1/chat/completions",
        Some(KEY_B),
        &chat("gpt-4o-mini"),
        &[("x-mock-output-tokens", "5000")],
    ))
    .await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let mut refused = None;
    for _ in 0..100 {
        let r = send(post(
            proxy.addr,
            "/v1/chat/completions",
            Some(KEY_B),
            small,
            &[],
        ))
        .await;
        if r.status == 429 {
            refused = Some(r);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let r = refused.expect("the debt is settled and the next request refused");
    r.assert_error(429, "rate_limit_exceeded");
    assert_eq!(r.json()["error"]["type"], "tokens");
    let wait: u64 = r.headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!(wait > 60, "Retry-After {wait}");
    assert_eq!(r.headers["x-should-retry"], "false");
    // Another tenant's answers are untouched.
    let a = send(post(
        proxy.addr,
        "/v1/chat/completions",
        Some(KEY_A),
        small,
        &[],
    ))
    .await;
    assert_eq!(a.status, 200);
    assert!(!a.headers.contains_key("x-should-retry"));
}
