//! Replica identity: a `replica_id` already live in the cluster is refused at startup, and a
//! replica restarted under its id continues its sync sequence (every key in one hash slot).

use super::*;

/// Two live replicas with one `replica_id` would renew and release each other's leases: the
/// second is refused at startup with an error naming the key (not the Redis URL); another id
/// starts; once the first stops (its claim released), the id can be used again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_id_already_live_in_the_cluster_is_refused_at_startup() {
    let Some(redis) = Redis::start() else { return };
    let mock = slow_mock(0).await;
    let conf = |i| replica(&redis, &mock.base_url(), i, 4).add_tenants(&["a"]);
    let start = |conf: Conf| async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        fairgate::server::start(conf.config(), listener).await
    };
    let first = start(conf(0)).await.expect("the first r0 starts");
    let e = start(conf(0))
        .await
        .expect_err("a second r0 is refused")
        .to_string();
    assert!(e.starts_with("cluster.replica_id"), "{e}");
    assert!(e.contains("\"r0\"") && !e.contains("redis://"), "{e}");
    let other = start(conf(1)).await.expect("r1 starts beside r0");
    first.shutdown();
    let mut again = None;
    for _ in 0..100 {
        if let Ok(h) = start(conf(0)).await {
            again = Some(h);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(again.is_some(), "r0 is free again once its replica stopped");
    drop(other);
}

/// Starts a replica from `conf`, retrying while its id is still claimed by one that stopped.
async fn start_when_free(conf: &Conf) -> ServerHandle {
    for _ in 0..200 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        if let Ok(h) = fairgate::server::start(conf.config(), listener).await {
            return h;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the replica id never became free");
}

/// A replica restarted under a fixed `replica_id` continues its sync sequence: its batches are
/// applied (its service reaches the shared hash), none is skipped or reported unapplied; every
/// key carries the `{fairgate}` hash tag (one Redis Cluster slot).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_replica_resumes_its_sync_sequence() {
    let Some(redis) = Redis::start() else { return };
    let mock = slow_mock(0).await;
    let conf = replica(&redis, &mock.base_url(), 0, 4).add_tenants(&["a"]);
    let conn = redis.conn().await;
    let seq = || {
        let mut c = conn.clone();
        async move {
            redis::cmd("HGET")
                .arg("{fairgate}:service-seq")
                .arg("r0")
                .query_async::<Option<u64>>(&mut c)
                .await
                .unwrap()
                .unwrap_or(0)
        }
    };
    let served = || {
        let mut c = conn.clone();
        async move {
            redis::cmd("HGET")
                .arg("{fairgate}:service")
                .arg("mock\u{1f}a")
                .query_async::<Option<f64>>(&mut c)
                .await
                .unwrap()
                .unwrap_or(0.0)
        }
    };
    let first = start_when_free(&conf).await;
    for _ in 0..3 {
        assert_eq!(chat(first.addr, "a", 8, &[]).await, 200);
    }
    assert!(until(250, || async { seq().await >= 10 && served().await > 0.0 }).await);
    first.shutdown();
    drop(first);
    let second = start_when_free(&conf).await;
    let (last, before) = (seq().await, served().await);
    for _ in 0..3 {
        assert_eq!(chat(second.addr, "a", 8, &[]).await, 200);
    }
    assert!(
        until(250, || async { seq().await >= last + 10 }).await,
        "the sequence continues past {last}"
    );
    assert!(
        until(250, || async { served().await > before }).await,
        "the restarted replica's service reached Redis"
    );
    let unapplied = metric(second.addr, "fairgate_cluster_sync_unapplied_total").await;
    assert_eq!(unapplied.unwrap_or(0.0), 0.0, "no batch was refused");
    let mut c = conn.clone();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut c)
        .await
        .unwrap();
    assert!(!keys.is_empty());
    for k in &keys {
        assert!(k.starts_with("{fairgate}:"), "{k} has no hash tag");
    }
    drop(second);
}
