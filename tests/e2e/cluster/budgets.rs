//! Spend budgets across three replicas (one budget in Redis, not three): spent through any
//! replica, refused on every one with the exact 429; concurrent requests at the edge on all
//! three never jointly pass it; the bill from `/admin/usage` (the ledger in Redis) is what the
//! mock reported, on every replica; Redis down → budgeted requests fail closed (503), the
//! others go on.

use super::*;
use crate::support::conf::Val;
use toml::Table;

fn budget(period: &str, unit: &str, amount: impl Val) -> Table {
    let mut t = entry("period", period);
    t.insert(unit.to_owned(), amount.val());
    t
}

/// Adds a 200's reported usage to (requests, input, cached, output).
fn count(r: &crate::support::Collected, to: &mut (u64, u64, u64, u64)) {
    let u = &r.json()["usage"];
    to.0 += 1;
    to.1 += u["prompt_tokens"].as_u64().unwrap();
    to.2 += u["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0);
    to.3 += u["completion_tokens"].as_u64().unwrap();
}

/// Seconds from now until the next UTC midnight.
fn until_midnight() -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    86_400 - now % 86_400
}

const TOKEN: &str = "admin-token-cluster-budgets";

/// Replica `i` with tenants `a` (a day budget of `tokens`) and `b` (none), the ledger flushed
/// every 50 ms, gpt-4o-mini priced.
fn budgeted(redis: &Redis, base_url: &str, i: usize, tokens: u64, var: &str) -> Conf {
    replica(redis, base_url, i, 6)
        .add_tenants(&["a", "b"])
        .tenant("a", "budgets", vec![budget("day", "tokens", tokens)])
        .set("admin.token_env", var)
        .set("store.flush_ms", 50)
        .set("prices.gpt-4o-mini.input", 0.15)
        .set("prices.gpt-4o-mini.output", 0.60)
        .set("prices.gpt-4o-mini.cached_input", 0.075)
}

async fn start(conf: impl Fn(usize) -> Conf, var: &str) -> Vec<ServerHandle> {
    let mut v = Vec::new();
    for i in 0..3 {
        v.push(conf(i).start_with_env(&[(var, TOKEN)]).await);
    }
    v
}

/// Waits until no replica has ledger rows pending, then a few flushes more (so the
/// reservations settled with them are released in Redis too).
async fn settled(rs: &[ServerHandle]) {
    let idle = || {
        rs.iter()
            .all(|r| r.state().admission.budgets.spending().pending_rows() == 0)
    };
    assert!(eventually(idle).await, "the ledger is flushed");
    tokio::time::sleep(Duration::from_millis(250)).await;
}

async fn bill(addr: SocketAddr) -> serde_json::Value {
    let req = http::Request::get(format!("http://{addr}/admin/usage?tenant=a"))
        .header("authorization", format!("Bearer {TOKEN}"))
        .body(http_body_util::Full::default())
        .unwrap();
    let r = send(req).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    r.json()
}

fn assert_budget_429(r: &crate::support::Collected) {
    r.assert_error(429, "insufficient_quota");
    assert_eq!(r.json()["error"]["type"], "insufficient_quota");
    assert_eq!(r.headers["x-fairgate-limit"], "budget");
    assert_eq!(r.headers["x-should-retry"], "false");
    let retry: u64 = r.headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!(retry.abs_diff(until_midnight()) <= 5, "Retry-After {retry}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_spent_across_three_replicas_is_refused_on_all_and_billed_exactly() {
    let Some(redis) = Redis::start() else { return };
    // The `rough` profile reports cached input tokens.
    let mock = mock_profile(fairgate_mock::Profile::Rough).await;
    let var = unique_env("ADMIN");
    let rs = start(|i| budgeted(&redis, &mock.base_url(), i, 600, &var), &var).await;
    let body = r#"{"model":"gpt-4o-mini","max_tokens":30,"messages":[{"role":"user","content":"a prompt long enough to have a cached part: hello hello hello"}]}"#;
    let out = [("x-mock-output-tokens", "10")];
    // (requests, input, cached, output) as the mock reported them.
    let mut reported = (0u64, 0u64, 0u64, 0u64);
    let mut refusals = Vec::new();
    let mut i = 0;
    // Round robin over the replicas until all three refuse in one round, with the ledger
    // settled before each round of retries (a reservation counts at its estimate until then).
    'spend: for _round in 0..10 {
        for _ in 0..60 {
            let r = send(post(
                rs[i % 3].addr,
                "/v1/chat/completions",
                Some("key-a"),
                body,
                &out,
            ))
            .await;
            i += 1;
            match r.status {
                200 => count(&r, &mut reported),
                429 => break,
                s => panic!("unexpected {s}: {}", String::from_utf8_lossy(&r.body)),
            }
        }
        settled(&rs).await;
        refusals.clear();
        for r in &rs {
            let a = send(post(
                r.addr,
                "/v1/chat/completions",
                Some("key-a"),
                body,
                &out,
            ))
            .await;
            if a.status == 200 {
                count(&a, &mut reported);
                continue 'spend;
            }
            refusals.push(a);
        }
        break;
    }
    assert_eq!(refusals.len(), 3, "every replica refuses the spent budget");
    for r in &refusals {
        assert_budget_429(r);
        assert!(r.headers.contains_key("x-fairgate-budget-remaining-tokens"));
    }
    let spent = reported.1 + reported.3;
    eprintln!(
        "a day budget of 600 tokens over 3 replicas: {} requests, {spent} tokens spent",
        reported.0
    );
    assert!(spent <= 600, "spent {spent} of 600");
    // Refused only once the next estimate (~15 input + 30 output) no longer fits.
    assert!(spent > 600 - 60, "spent {spent}: refused too early");
    // Another tenant (no budget) is not affected.
    let b = send(post(
        rs[0].addr,
        "/v1/chat/completions",
        Some("key-b"),
        body,
        &out,
    ))
    .await;
    assert_eq!(b.status, 200);
    assert!(!b.headers.contains_key("x-fairgate-budget-remaining-tokens"));
    settled(&rs).await;
    // The bill, from the ledger in Redis, is the same on every replica and is what the mock
    // reported, priced.
    let cost = ((reported.1 - reported.2) as f64 * 0.15
        + reported.2 as f64 * 0.075
        + reported.3 as f64 * 0.60)
        / 1e6;
    for r in &rs {
        let v = bill(r.addr).await;
        let rows = v["data"].as_array().unwrap();
        assert_eq!(rows.len(), 1, "{v}");
        let row = &rows[0];
        assert_eq!(row["model"], "gpt-4o-mini");
        assert_eq!(row["requests"], reported.0);
        assert_eq!(row["input_tokens"], reported.1);
        assert_eq!(row["cached_input_tokens"], reported.2);
        assert_eq!(row["output_tokens"], reported.3);
        let billed = row["cost_usd"].as_f64().unwrap();
        assert!(
            (billed - cost).abs() < 1e-12,
            "billed {billed}, priced {cost}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_on_three_replicas_never_jointly_pass_the_budget() {
    let Some(redis) = Redis::start() else { return };
    let mock = slow_mock(0).await;
    let var = unique_env("ADMIN");
    let rs = start(|i| budgeted(&redis, &mock.base_url(), i, 1000, &var), &var).await;
    // The estimate (counted input + max_tokens) is an upper bound of the use here (the mock
    // answers max_tokens), so the estimate error is 0 and the budget is never passed at all.
    let out = [("x-mock-output-tokens", "40"), ("x-mock-delay-ms", "20")];
    let sends = (0..48).map(|i| {
        send(post(
            rs[i % 3].addr,
            "/v1/chat/completions",
            Some("key-a"),
            &body(40),
            &out,
        ))
    });
    let answers = futures_util::future::join_all(sends).await;
    let (mut spent, mut refused, mut ok) = (0, 0, 0);
    for r in &answers {
        match r.status {
            200 => {
                let u = &r.json()["usage"];
                spent +=
                    u["prompt_tokens"].as_u64().unwrap() + u["completion_tokens"].as_u64().unwrap();
                ok += 1;
            }
            429 => {
                r.assert_error(429, "insufficient_quota");
                refused += 1;
            }
            s => panic!("unexpected {s}: {}", String::from_utf8_lossy(&r.body)),
        }
    }
    eprintln!("48 concurrent requests over 3 replicas at a 1000-token budget: {ok} admitted, {refused} refused, {spent} tokens spent");
    assert!(spent <= 1000, "spent {spent} of 1000");
    assert!(
        refused > 0 && spent > 600,
        "spent {spent}, refused {refused}"
    );
    settled(&rs).await;
    let v = bill(rs[1].addr).await;
    let row = &v["data"][0];
    assert_eq!(row["requests"], ok);
    assert_eq!(
        row["input_tokens"].as_u64().unwrap() + row["output_tokens"].as_u64().unwrap(),
        spent
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_down_budgets_fail_closed_and_others_are_served() {
    let Some(mut redis) = Redis::start() else {
        return;
    };
    let mock = slow_mock(0).await;
    let var = unique_env("ADMIN");
    let rs = start(
        |i| budgeted(&redis, &mock.base_url(), i, 100_000, &var),
        &var,
    )
    .await;
    for r in &rs {
        assert_eq!(chat(r.addr, "a", 8, &[]).await, 200);
    }
    redis.kill();
    for r in &rs {
        let a = send(post(
            r.addr,
            "/v1/chat/completions",
            Some("key-a"),
            &body(8),
            &[],
        ))
        .await;
        a.assert_error(503, "budget_store_unavailable");
        assert_eq!(a.headers["x-fairgate-limit"], "budget");
        assert_eq!(a.headers["retry-after"], "1");
    }
    // A tenant without a budget is served on the replicas' local allowance.
    let mut served = false;
    for _ in 0..50 {
        if chat(rs[0].addr, "b", 8, &[]).await == 200 {
            served = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(served, "an unbudgeted tenant is served while Redis is down");
    // Redis back (empty: it kept nothing): budgets are enforced again.
    assert!(redis.spawn());
    assert!(
        until(250, || async { chat(rs[2].addr, "a", 8, &[]).await == 200 }).await,
        "budgeted requests pass again once Redis answers"
    );
}
