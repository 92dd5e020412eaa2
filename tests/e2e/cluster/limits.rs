//! Tenant rate limits across replicas: a request rate holds over three replicas (one shared
//! bucket), token refunds reconciled on one replica are admissible on every one, and an admission
//! retried with its idempotency key is charged once.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limits_hold_across_replicas() {
    let Some(redis) = Redis::start() else { return };
    let mock = slow_mock(0).await;
    let rs = replicas(|i| {
        replica(&redis, &mock.base_url(), i, 6)
            .add_tenants(&["a"])
            .tenant("a", "requests_per_minute", 10)
    })
    .await;
    // 30 requests spread over three replicas against a shared bucket of 10 (one minute's worth):
    // 10 pass, not 30 (each replica counting alone would let all of them through).
    let mut ok = 0;
    let mut limited = 0;
    for i in 0..30 {
        let r = send(post(
            rs[i % 3].addr,
            "/v1/chat/completions",
            Some("key-a"),
            &body(8),
            &[],
        ))
        .await;
        match r.status {
            200 => ok += 1,
            429 => {
                assert_eq!(r.headers["x-fairgate-limit"], "tenant");
                limited += 1;
            }
            s => panic!("unexpected status {s}"),
        }
    }
    eprintln!("requests_per_minute = 10 over 3 replicas: {ok} admitted, {limited} limited");
    // One cell may refill during the run (one every 6 s).
    assert!((10..=11).contains(&ok), "{ok} admitted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_refunds_reconcile_across_replicas() {
    let Some(redis) = Redis::start() else { return };
    let mock = slow_mock(0).await;
    // Two tenants with the same budget of 6000 tokens a minute (one bucket, 100 tokens/s
    // refill). Each request is estimated at ~500 tokens (max_tokens 500): "exact" really uses
    // them, "cheap" gets 1 output token back, so its reconciled refunds (flushed by whichever
    // replica served it) make later requests admissible on every replica.
    let rs = replicas(|i| {
        replica(&redis, &mock.base_url(), i, 6)
            .add_tenants(&["exact", "cheap"])
            .tenant("exact", "tokens_per_minute", 6000)
            .tenant("cheap", "tokens_per_minute", 6000)
    })
    .await;
    // (corrections recorded, applied in Redis) summed over the replicas.
    let corrections = |rs: &[ServerHandle]| {
        rs.iter()
            .map(|r| r.state().cluster.as_ref().unwrap().corrections())
            .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
    };
    let (mut exact, mut cheap) = (0, 0);
    for i in 0..30 {
        let addr = rs[i % 3].addr;
        let before = corrections(&rs).0;
        let mut refunded = false;
        for (tenant, out, count) in [("exact", "500", &mut exact), ("cheap", "1", &mut cheap)] {
            match chat(addr, tenant, 500, &[("x-mock-output-tokens", out)]).await {
                200 => {
                    *count += 1;
                    refunded |= tenant == "cheap";
                }
                429 => {}
                s => panic!("unexpected status {s}"),
            }
        }
        // An admitted cheap request records a refund; wait (for that event, not for a time)
        // until it, and every correction recorded so far, is applied in Redis by a sync flush.
        if refunded {
            assert!(
                eventually(|| {
                    let (recorded, applied) = corrections(&rs);
                    recorded > before && recorded == applied
                })
                .await,
                "corrections flushed: {:?}",
                corrections(&rs)
            );
        }
    }
    eprintln!(
        "tokens_per_minute = 6000 over 3 replicas, 30 requests of ~500 estimated tokens each: \
         {exact} admitted when the actual use is the estimate, {cheap} when it is 1 token"
    );
    // About 12 (one bucket) plus the refill: the estimate is charged across the replicas.
    assert!(
        (10..=18).contains(&exact),
        "{exact} admitted at the estimate"
    );
    // The refunds came back: (nearly) every request admitted, well beyond the bucket.
    assert!(cheap >= 27, "{cheap} admitted with refunds");
    assert!(cheap >= exact + 10);
}

/// An admission sent twice with its idempotency key (a retry after a timeout whose script did
/// run) is charged once and gets the first answer back; a new admission is charged again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_rate_admission_is_charged_once() {
    let Some(redis) = Redis::start() else { return };
    let mut conn = redis.conn().await;
    let tat = "{fairgate}:rate:t:tokens";
    let shared = conn.clone();
    let admit = |once: &'static str| {
        let mut c = shared.clone();
        async move {
            fairgate::cluster::scripts::RATE_ADMIT
                .key(tat)
                .key("{fairgate}:rate:t:requests")
                .key(once)
                .arg(100)
                .arg(60_000.0) // 1 000 tokens a minute: 60 ms a token
                .arg(1000)
                .arg(0.0)
                .arg(0)
                .arg(10_000)
                .invoke_async::<Vec<i64>>(&mut c)
                .await
                .unwrap()
        }
    };
    let first = admit("{fairgate}:adm:r0:x:1").await;
    assert_eq!(first[0], 0, "admitted");
    let level: String = redis::cmd("GET")
        .arg(tat)
        .query_async(&mut conn)
        .await
        .unwrap();
    let again = admit("{fairgate}:adm:r0:x:1").await;
    assert_eq!(again, first, "the retry gets the first answer");
    let after: String = redis::cmd("GET")
        .arg(tat)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(after, level, "and is not charged again");
    let other = admit("{fairgate}:adm:r0:x:2").await;
    assert_eq!(other[0], 0);
    // 100 more tokens: the bucket's TAT moved ahead by 6 s (less the time between the calls).
    assert!(other[2] > first[2] + 5_000_000, "{other:?} vs {first:?}");
}
