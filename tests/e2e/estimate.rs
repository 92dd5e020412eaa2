//! Cost estimation and reconciliation end to end over HTTP with the mock upstream: cost variance
//! and chronic under-estimates are served equal tokens, a stream without include_usage gets none
//! while the upstream was asked for it, and aborted streams are still reconciled. Assertions are
//! on counts and ordering, never on wall-clock durations.

use std::sync::{Arc, Mutex};

use crate::support::*;
use fairgate::domain::TenantId;
use fairgate::estimate::OutputKey;
use fairgate::server::ServerHandle;
use fairgate_mock::MockConfig;

const MODEL: &str = "gpt-4o-mini";

/// One pool of one slot, tenants `a`, `b` and `z` (the blocker), weights 1 in and out so that
/// served cost equals usage tokens.
fn config(base_url: &str) -> Conf {
    Conf::bare()
        .set("scheduler.quantum", 1000)
        .set("estimate.input_weight", 1.0)
        .set("estimate.output_weight", 1.0)
        .add_upstream("mock", base_url)
        .upstream("max_concurrency", 1)
        .add_tenants(&["a", "b", "z"])
}

/// A chat body whose prompt the mock (text bytes / 4 = 21) and tiktoken (3 + 1 + 14 + 3 = 21)
/// count alike, so that only the output side is estimated wrongly.
fn chat_body(max_tokens: Option<u32>) -> String {
    let max = max_tokens.map_or(String::new(), |m| format!(r#""max_tokens":{m},"#));
    let content = vec!["hello"; 14].join(" ");
    format!(r#"{{"model":"{MODEL}",{max}"messages":[{{"role":"user","content":"{content}"}}]}}"#)
}

async fn request(proxy: &ServerHandle, tenant: &str, body: &str, out: &str) -> u64 {
    let key = format!("key-{tenant}");
    let r = send(post(
        proxy.addr,
        "/v1/chat/completions",
        Some(&key),
        body,
        &[("x-mock-output-tokens", out)],
    ))
    .await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let u = &r.json()["usage"];
    u["prompt_tokens"].as_u64().unwrap() + u["completion_tokens"].as_u64().unwrap()
}

/// Holds the only slot, queues `n_a` requests of `a` and `n_b` of `b`, releases, and returns
/// (tenant, tokens) in completion order (= dispatch order with one slot).
async fn backlog(
    proxy: &ServerHandle,
    (n_a, body_a, out_a): (usize, String, &'static str),
    (n_b, body_b, out_b): (usize, String, &'static str),
) -> Vec<(&'static str, u64)> {
    let addr = proxy.addr;
    // A slow stream holds the only slot until its response is dropped.
    let blocker = client()
        .request(post(
            addr,
            "/v1/chat/completions",
            Some("key-z"),
            r#"{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"hi"}]}"#,
            &[
                ("x-mock-output-tokens", "1000"),
                ("x-mock-token-delay-ms", "1000"),
            ],
        ))
        .await
        .unwrap();
    assert_eq!(blocker.status(), 200);
    assert_eq!(proxy.pools[0].load().1, 1);
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    let jobs = (0..n_a.max(n_b)).flat_map(|i| {
        let a = (i < n_a).then(|| ("a", body_a.clone(), out_a));
        let b = (i < n_b).then(|| ("b", body_b.clone(), out_b));
        [a, b].into_iter().flatten()
    });
    for (tenant, body, out) in jobs {
        let order = order.clone();
        tasks.push(tokio::spawn(async move {
            let key = format!("key-{tenant}");
            let r = send(post(
                addr,
                "/v1/chat/completions",
                Some(&key),
                &body,
                &[("x-mock-output-tokens", out)],
            ))
            .await;
            assert_eq!(r.status, 200);
            let u = &r.json()["usage"];
            let t = u["prompt_tokens"].as_u64().unwrap() + u["completion_tokens"].as_u64().unwrap();
            order.lock().unwrap().push((tenant, t));
        }));
    }
    assert!(eventually(|| proxy.pools[0].load().0 >= n_a + n_b).await);
    drop(blocker);
    for t in tasks {
        t.await.unwrap();
    }
    assert!(eventually(|| proxy.pools[0].load() == (0, 0)).await);
    let order = order.lock().unwrap().clone();
    order
}

/// Tokens and requests per tenant over the prefix in which both tenants were still backlogged.
fn shares(order: &[(&str, u64)], n_a: usize, n_b: usize) -> ((u64, usize), (u64, usize)) {
    let (mut a, mut b) = ((0, 0), (0, 0));
    for (tenant, tokens) in order {
        if a.1 == n_a || b.1 == n_b {
            break;
        }
        let s = if *tenant == "a" { &mut a } else { &mut b };
        s.0 += tokens;
        s.1 += 1;
    }
    (a, b)
}

fn assert_equal_tokens(a: (u64, usize), b: (u64, usize)) {
    let (ta, tb) = (a.0 as f64, b.0 as f64);
    assert!(
        (ta - tb).abs() / ta.max(tb) <= 0.10,
        "served tokens a={} b={} (requests a={} b={})",
        a.0,
        b.0,
        a.1,
        b.1
    );
    let ratio = b.1 as f64 / a.1.max(1) as f64;
    assert!(
        (12.0..=30.0).contains(&ratio),
        "request ratio b/a = {ratio}"
    );
}

#[tokio::test]
async fn cost_variance_is_served_in_equal_tokens_not_requests() {
    let mock = mock_with(MockConfig::default()).await;
    let proxy = config(&mock.base_url()).start().await;
    let (n_a, n_b) = (20, 400);
    let order = backlog(
        &proxy,
        (n_a, chat_body(Some(1000)), "1000"),
        (n_b, chat_body(Some(50)), "50"),
    )
    .await;
    let (a, b) = shares(&order, n_a, n_b);
    assert_equal_tokens(a, b);
}

#[tokio::test]
async fn chronic_under_estimates_are_served_equal_tokens_once_learned() {
    let mock = mock_with(MockConfig::default()).await;
    let proxy = config(&mock.base_url()).start().await;
    // History: neither sends max_tokens; a's outputs are 20× b's.
    for _ in 0..3 {
        request(&proxy, "a", &chat_body(None), "1000").await;
        request(&proxy, "b", &chat_body(None), "50").await;
    }
    let key = |t: &str| OutputKey::new(TenantId::new(t), MODEL);
    let history = proxy.estimator.history();
    assert!(
        eventually(|| history.samples(&key("a")) == 3 && history.samples(&key("b")) == 3).await
    );
    assert_eq!(history.p90(&key("a")), Some(1000));
    assert_eq!(history.p90(&key("b")), Some(50));
    let (n_a, n_b) = (20, 400);
    let order = backlog(
        &proxy,
        (n_a, chat_body(None), "1000"),
        (n_b, chat_body(None), "50"),
    )
    .await;
    let (a, b) = shares(&order, n_a, n_b);
    assert_equal_tokens(a, b);
    let stats = proxy.estimator.stats().tenant(&TenantId::new("a")).unwrap();
    assert!(stats.count >= 23, "{stats:?}");
}

const STREAM: &str = r#"{"model":"gpt-4o-mini","stream":true,"max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#;

#[tokio::test]
async fn a_stream_without_include_usage_sees_no_usage_but_upstream_was_asked() {
    let mock = mock().await;
    let proxy = config(&mock.base_url()).start().await;
    let r = send(post(
        proxy.addr,
        "/v1/chat/completions",
        Some("key-a"),
        STREAM,
        &[],
    ))
    .await;
    assert_eq!(r.status, 200);
    let text = String::from_utf8_lossy(&r.body);
    assert!(!text.contains("usage"), "{text}");
    assert!(
        text.contains("tok ") && text.ends_with("data: [DONE]\n\n"),
        "{text}"
    );
    let seen = mock.stats.seen_bodies();
    assert_eq!(
        seen.last().unwrap()["stream_options"]["include_usage"],
        true
    );
    // Reconciled from the usage the client never saw.
    let key = OutputKey::new(TenantId::new("a"), MODEL);
    assert!(eventually(|| proxy.estimator.history().samples(&key) == 1).await);
    assert_eq!(proxy.estimator.history().p90(&key), Some(5));

    // A client that asked for usage gets it.
    let asked = STREAM.replace(
        r#""stream":true"#,
        r#""stream":true,"stream_options":{"include_usage":true}"#,
    );
    let r = send(post(
        proxy.addr,
        "/v1/chat/completions",
        Some("key-a"),
        &asked,
        &[],
    ))
    .await;
    let text = String::from_utf8_lossy(&r.body);
    assert!(text.contains(r#""completion_tokens":5"#), "{text}");
}

#[tokio::test]
async fn an_aborted_stream_is_still_reconciled() {
    let mock = mock().await;
    let proxy = config(&mock.base_url()).start().await;
    let body = STREAM.replace(r#""max_tokens":5"#, r#""max_tokens":50"#);
    let res = client()
        .request(post(
            proxy.addr,
            "/v1/chat/completions",
            Some("key-b"),
            &body,
            &[("x-mock-output-tokens", "20"), ("x-mock-abort-after", "3")],
        ))
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    use http_body_util::BodyExt;
    assert!(
        res.into_body().collect().await.is_err(),
        "the stream was cut"
    );
    assert!(eventually(|| proxy.pools[0].load() == (0, 0)).await);
    let b = TenantId::new("b");
    assert!(eventually(|| proxy.estimator.stats().tenant(&b).is_some()).await);
    let stats = proxy.estimator.stats().tenant(&b).unwrap();
    assert_eq!((stats.count, stats.without_usage), (1, 1));
    let key = OutputKey::new(b, MODEL);
    assert_eq!(proxy.estimator.history().samples(&key), 1);
    // Counted from the streamed text: 3 chunks of "tok " (o200k: 2 tokens each).
    let p90 = proxy.estimator.history().p90(&key).unwrap();
    assert!((3..=6).contains(&p90), "{p90}");
}
