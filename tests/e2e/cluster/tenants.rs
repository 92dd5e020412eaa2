//! Tenants and keys at runtime across replicas (Redis): a tenant and key created on one replica
//! are used on the other, a key revoked on one is refused on the other within a sync interval
//! (the measured delay is printed), a restarted replica reads them back, and with Redis down a
//! change is refused (503) while the known keys keep working. An API tenant's rate limit holds
//! across the replicas together (one shared bucket) and its weight, patched on one replica, is
//! the weight the other schedules and charges remote service at.

use std::time::Instant;

use super::*;
use crate::tenants::{admin, chat_status, new_key, TOKEN};
use http::Method;
use serde_json::{json, Value};

/// Polls `addr` with `key` (every 5 ms, at most 1,000 times) until it is accepted (`true`:
/// anything but 401; its first answer may wait for the replica's first lease) or refused
/// (`false`: 401): the time until the request that showed it was sent, or `None`.
async fn until_known(addr: SocketAddr, key: &str, known: bool) -> Option<Duration> {
    let start = Instant::now();
    for _ in 0..1000 {
        let sent = start.elapsed();
        if (chat_status(addr, key).await != 401) == known {
            return Some(sent);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    None
}

fn with_admin(c: Conf, var: &str) -> Conf {
    c.set("admin.token_env", var)
        .add_tenant("file", "key-file")
        .set("cluster.sync_interval_ms", 100)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn created_on_one_replica_used_and_revoked_on_the_other() {
    let Some(mut redis) = Redis::start() else {
        return;
    };
    let mock = mock().await;
    let var = unique_env("RT_CLUSTER");
    let conf = |i| with_admin(replica(&redis, &mock.base_url(), i, 8), &var);
    let env = [(var.as_str(), TOKEN)];
    let (r0, r1) = (
        conf(0).start_with_env(&env).await,
        conf(1).start_with_env(&env).await,
    );
    let r = admin(
        r0.addr,
        Method::POST,
        "/admin/tenants",
        json!({"id": "acme", "weight": 2}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    // Config tenants are read-only on every replica.
    admin(r1.addr, Method::DELETE, "/admin/tenants/file", Value::Null)
        .await
        .assert_error(409, "config_tenant");
    let (key_id, key) = new_key(r0.addr, "acme").await;
    let seen = until_known(r1.addr, &key, true)
        .await
        .expect("the key works on r1");
    assert_eq!(chat_status(r1.addr, &key).await, 200);
    // The other replica knows the tenant (its weight in the live rows too).
    let t = admin(r1.addr, Method::GET, "/admin/tenants/acme", Value::Null)
        .await
        .json();
    assert_eq!(t["keys"][0]["id"], key_id.as_str());
    let path = format!("/admin/tenants/acme/keys/{key_id}");
    assert_eq!(
        admin(r0.addr, Method::DELETE, &path, Value::Null)
            .await
            .status,
        204
    );
    assert_eq!(
        chat_status(r0.addr, &key).await,
        401,
        "refused where revoked, at once"
    );
    let refused = until_known(r1.addr, &key, false)
        .await
        .expect("refused on r1");
    eprintln!(
        "key created on r0 usable on r1 after {} ms; revoked on r0, refused on r1 after {} ms \
         (sync_interval_ms = 100)",
        seen.as_millis(),
        refused.as_millis()
    );
    // A restarted replica reads the runtime tenants back from Redis before serving.
    let (_, key2) = new_key(r1.addr, "acme").await;
    r1.shutdown();
    r1.join().await.unwrap();
    let r1 = conf(1).start_with_env(&env).await;
    assert_eq!(chat_status(r1.addr, &key2).await, 200);
    assert_eq!(chat_status(r1.addr, &key).await, 401);

    assert!(until_known(r0.addr, &key2, true).await.is_some());

    // Redis down: changes are refused, what each replica knows keeps serving.
    redis.kill();
    let r = admin(
        r0.addr,
        Method::POST,
        "/admin/tenants",
        json!({"id": "late"}),
    )
    .await;
    r.assert_error(503, "store_unavailable");
    let r = admin(r1.addr, Method::POST, "/admin/tenants/acme/keys", json!({})).await;
    r.assert_error(503, "store_unavailable");
    for addr in [r0.addr, r1.addr] {
        assert_eq!(chat_status(addr, &key2).await, 200);
        assert_eq!(chat_status(addr, &key).await, 401, "never valid again");
    }
    // Back (empty: this test's Redis keeps nothing): new changes apply on every replica again.
    assert!(redis.spawn());
    let mut created = None;
    for _ in 0..100 {
        let r = admin(
            r0.addr,
            Method::POST,
            "/admin/tenants",
            json!({"id": "late"}),
        )
        .await;
        if r.status == 201 {
            created = Some(new_key(r0.addr, "late").await.1);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let late = created.expect("Redis is back");
    assert!(until_known(r1.addr, &late, true).await.is_some());
}

/// The weight `tenant` has in `r`'s pool now.
fn pool_weight(r: &ServerHandle, tenant: &str) -> Option<f64> {
    let snapshot = r.state().pools[0].snapshot();
    let t = snapshot.iter().find(|(t, _)| t.id.as_str() == tenant)?;
    Some(t.0.weight.get())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_tenants_limits_and_weight_hold_on_every_replica() {
    let Some(redis) = Redis::start() else {
        return;
    };
    let mock = slow_mock(0).await;
    let var = unique_env("RT_CLUSTER_LIMITS");
    let conf = |i| with_admin(replica(&redis, &mock.base_url(), i, 8), &var);
    let env = [(var.as_str(), TOKEN)];
    let (r0, r1) = (
        conf(0).start_with_env(&env).await,
        conf(1).start_with_env(&env).await,
    );
    // 6000 tokens a minute (one bucket, 100 tokens/s refill), created on r0 only.
    let r = admin(
        r0.addr,
        Method::POST,
        "/admin/tenants",
        json!({"id": "metered", "tokens_per_minute": 6000}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let (_, key) = new_key(r0.addr, "metered").await;
    assert!(until_known(r1.addr, &key, true).await.is_some());
    // 30 requests of ~500 tokens each (estimated and used), alternating r0 and r1: about
    // one bucket's worth (12) plus the refill pass over both together; per-replica buckets
    // would admit twice that, no shared limit all 30.
    let (mut ok, mut limited) = (0, 0);
    for i in 0..30 {
        let addr = [r0.addr, r1.addr][i % 2];
        let r = send(post(
            addr,
            "/v1/chat/completions",
            Some(&key),
            &body(500),
            &[("x-mock-output-tokens", "500")],
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
    eprintln!(
        "API tenant, tokens_per_minute = 6000 over 2 replicas, 30 requests of ~500 tokens: \
         {ok} admitted, {limited} limited"
    );
    assert!((10..=18).contains(&ok), "{ok} admitted");

    // A weight patched on r0 is r1's weight for the tenant within the sync bound.
    assert_eq!(pool_weight(&r1, "metered"), Some(1.0));
    let start = Instant::now();
    let r = admin(
        r0.addr,
        Method::PATCH,
        "/admin/tenants/metered",
        json!({"weight": 3}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(
        pool_weight(&r0, "metered"),
        Some(3.0),
        "at once where patched"
    );
    assert!(
        eventually(|| pool_weight(&r1, "metered") == Some(3.0)).await,
        "r1 never took the weight"
    );
    eprintln!(
        "weight patched on r0, in force on r1 after {} ms (sync_interval_ms = 100)",
        start.elapsed().as_millis()
    );
    let t = admin(r1.addr, Method::GET, "/admin/tenants/metered", Value::Null)
        .await
        .json();
    assert_eq!(t["weight"], 3.0, "{t}");
}
