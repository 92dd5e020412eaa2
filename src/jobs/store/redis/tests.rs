//! The Redis job store's scripts against a real `redis-server` (started on a free port, killed
//! on drop): fencing of late completions, reclaim of expired leases, exactly-once batch
//! finalization, per-tenant reads and limits, retention. Without `redis-server` on PATH these
//! fail naming the package, unless `FAIRGATE_SKIP_REDIS=1` (then they pass as skipped).

use super::test_server::{plain, server, Server};
use super::*;
use crate::config::JobsConfig;

async fn store(s: &Server, lease_ms: u64) -> RedisStore {
    let config = JobsConfig {
        lease_ms,
        max_queued_jobs_per_tenant: 3,
        ..JobsConfig::default()
    };
    RedisStore::new(plain(s).await, &config)
}

fn t(id: &str) -> TenantId {
    TenantId::new(id)
}

fn job(id: &str, batch: Option<(&str, u32)>) -> NewJob {
    NewJob {
        id: id.to_owned(),
        batch: batch.map(|(b, l)| (b.to_owned(), l, format!("c{l}"))),
        method: "POST".into(),
        path: "/v1/chat/completions".into(),
        body: b"{}".to_vec(),
    }
}

#[tokio::test]
async fn a_late_completion_of_a_reclaimed_claim_is_not_recorded() {
    let Some(srv) = server() else { return };
    // Lease 0: every claim is expired the moment it is made (no waiting on a clock).
    let mut s = store(&srv, 0).await;
    s.insert(&t("a"), vec![job("j1", None)], None)
        .await
        .unwrap();
    let first = s.claim(&t("a"), 5).await.unwrap();
    assert_eq!(first.len(), 1);
    let t1 = first[0].token;
    assert_eq!(
        s.reclaim(&[]).await.unwrap(),
        1,
        "the expired lease is reclaimed"
    );
    assert!(
        !s.finish("j1", t1, 200, None, b"late").await.unwrap(),
        "a reclaimed claim's answer is refused"
    );
    assert_eq!(
        s.renew(&[("j1".into(), t1)]).await.unwrap(),
        1,
        "t1 is lost"
    );
    s.lease_ms = 60_000;
    let second = s.claim(&t("a"), 5).await.unwrap();
    assert_eq!(second.len(), 1);
    let t2 = second[0].token;
    assert_ne!(t1, t2, "a fresh fencing token per claim");
    assert_eq!(s.reclaim(&[]).await.unwrap(), 0, "t2's lease holds");
    assert!(
        !s.finish("j1", t1, 200, None, b"late").await.unwrap(),
        "the completion under the reclaimed claim is discarded"
    );
    assert_eq!(
        s.job(&t("a"), "j1").await.unwrap().unwrap().state,
        JobState::Running
    );
    assert!(s.finish("j1", t2, 200, None, b"ok").await.unwrap());
    assert!(
        !s.finish("j1", t2, 200, None, b"again").await.unwrap(),
        "recorded once"
    );
    assert_eq!(
        s.renew(&[("j1".into(), t2)]).await.unwrap(),
        0,
        "a claim that finished is not counted as lost"
    );
    let j = s.job(&t("a"), "j1").await.unwrap().unwrap();
    assert_eq!((j.state.as_str(), j.status), ("completed", Some(200)));
    assert_eq!(j.response.as_deref(), Some(&b"ok"[..]));
    assert_eq!(s.usage(&t("a")).await.unwrap(), (0, 4), "body + one answer");
    let states = s.states().await.unwrap();
    assert_eq!(states, [("a".into(), JobState::Completed, 1)]);
}

#[tokio::test]
async fn a_replica_that_stalled_past_its_leases_does_not_reclaim_its_own_lines() {
    let Some(srv) = server() else { return };
    let s = store(&srv, 50).await;
    s.insert(&t("a"), vec![job("j1", None), job("j2", None)], None)
        .await
        .unwrap();
    let claims = s.claim(&t("a"), 5).await.unwrap();
    assert_eq!(claims.len(), 2);
    let own: Vec<(String, u64)> = claims.iter().map(|c| (c.id.clone(), c.token)).collect();
    // The stall: both leases run out before any renewal.
    tokio::time::sleep(std::time::Duration::from_millis(120)).await;
    assert_eq!(
        s.reclaim(&own).await.unwrap(),
        0,
        "the replica's own running claims are renewed, not reclaimed (they would be sent twice)"
    );
    assert!(
        s.finish("j1", own[0].1, 200, None, b"ok").await.unwrap(),
        "its answer records"
    );
    // Expired and not reclaimed yet: no other claim exists, so the answer still records.
    tokio::time::sleep(std::time::Duration::from_millis(120)).await;
    assert!(
        s.finish("j2", own[1].1, 200, None, b"ok").await.unwrap(),
        "an expired claim nobody reclaimed still records (discarding it would send it again)"
    );
    // Another replica (no own claims) takes what expired on a replica that is gone.
    s.insert(&t("a"), vec![job("j3", None)], None)
        .await
        .unwrap();
    let c = s.claim(&t("a"), 5).await.unwrap();
    assert_eq!(c.len(), 1);
    tokio::time::sleep(std::time::Duration::from_millis(120)).await;
    assert_eq!(s.reclaim(&own).await.unwrap(), 1, "j3 was not among own");
}

#[tokio::test]
async fn a_batch_is_finalized_once_and_reads_are_per_tenant() {
    let Some(srv) = server() else { return };
    let s = store(&srv, 60_000).await;
    let lines = vec![job("l0", Some(("b1", 0))), job("l1", Some(("b1", 1)))];
    let batch = Some(("b1".to_owned(), "{\"status\":\"in_progress\"}".to_owned()));
    s.insert(&t("a"), lines, batch).await.unwrap();
    assert!(
        s.job(&t("a"), "l0").await.unwrap().is_none(),
        "a line is no job"
    );
    assert!(
        s.batch(&t("b"), "b1").await.unwrap().is_none(),
        "another tenant"
    );
    assert_eq!(s.batch_tenant("b1").await.unwrap().as_deref(), Some("a"));
    let more = vec![job("j2", None), job("j3", None)];
    let over = s.insert(&t("a"), more, None).await;
    assert!(matches!(over, Err(StoreError::Limit { .. })), "3 jobs max");
    let claimed = s.claim(&t("a"), 5).await.unwrap();
    assert_eq!(claimed.len(), 2);
    assert_eq!(claimed[0].batch.as_deref(), Some("b1"));
    assert!(
        !s.finalize("b1", "in_progress", "{}", "completed", Vec::new())
            .await
            .unwrap(),
        "lines unfinished"
    );
    for c in &claimed {
        assert!(s.finish(&c.id, c.token, 200, None, b"x").await.unwrap());
    }
    let counts = s.counts("b1").await.unwrap();
    assert_eq!(
        (counts.total, counts.completed, counts.unfinished),
        (2, 2, 0)
    );
    let file = |id: &str| {
        let f = File {
            id: id.to_owned(),
            purpose: "batch_output".into(),
            filename: "out.jsonl".into(),
            bytes: 3,
            created: now(),
        };
        vec![(f, b"out".to_vec())]
    };
    let (f1, f2) = (file("f1"), file("f2"));
    let (x, y) = tokio::join!(
        s.finalize("b1", "in_progress", "{\"n\":1}", "completed", f1),
        s.finalize("b1", "in_progress", "{\"n\":2}", "completed", f2),
    );
    assert_eq!(
        u8::from(x.unwrap()) + u8::from(y.unwrap()),
        1,
        "exactly one finalization"
    );
    let stored = [
        s.file(&t("a"), "f1").await.unwrap(),
        s.file(&t("a"), "f2").await.unwrap(),
    ];
    assert_eq!(stored.iter().flatten().count(), 1, "one output file");
    let out = if stored[0].is_some() { "f1" } else { "f2" };
    assert_eq!(
        s.file_chunk(&t("a"), out, 0).await.unwrap().as_deref(),
        Some(&b"out"[..]),
        "the output file is stored in chunks, read as an upload is"
    );
    assert!(s.settled_batches().await.unwrap().is_empty());
    let lines = s.lines("b1").await.unwrap();
    let ids: Vec<_> = lines.iter().map(|l| l.custom_id.as_str()).collect();
    assert_eq!(ids, ["c0", "c1"]);
    assert_eq!(s.batches(&t("a"), None, 10).await.unwrap().len(), 1);
    assert!(s.cleanup(now() + 10).await.unwrap() >= 2);
    assert!(s.batch(&t("a"), "b1").await.unwrap().is_none(), "retention");
    assert_eq!(s.usage(&t("a")).await.unwrap(), (0, 0), "bytes given back");
}

#[tokio::test]
async fn max_inflight_per_tenant_holds_across_replicas() {
    let Some(srv) = server() else { return };
    let (mut a, mut b) = (store(&srv, 60_000).await, store(&srv, 60_000).await);
    a.max_inflight = 2;
    b.max_inflight = 2;
    let jobs = vec![job("j1", None), job("j2", None), job("j3", None)];
    a.insert(&t("t"), jobs, None).await.unwrap();
    let on_a = a.claim(&t("t"), 2).await.unwrap();
    assert_eq!(on_a.len(), 2);
    assert!(
        b.claim(&t("t"), 2).await.unwrap().is_empty(),
        "replica B would run a third job of the tenant at once"
    );
    assert!(a
        .finish(&on_a[0].id, on_a[0].token, 200, None, b"ok")
        .await
        .unwrap());
    assert_eq!(
        b.claim(&t("t"), 2).await.unwrap().len(),
        1,
        "one slot freed"
    );
}

#[tokio::test]
async fn files_are_listed_per_tenant_newest_first_and_deleted_from_the_listing() {
    let Some(srv) = server() else { return };
    let s = store(&srv, 60_000).await;
    let file = |id: &str, purpose: &str| File {
        id: id.to_owned(),
        purpose: purpose.to_owned(),
        filename: format!("{id}.jsonl"),
        bytes: 2,
        created: 1,
    };
    for (t, id, p) in [
        ("a", "f1", "batch"),
        ("a", "f2", "batch"),
        ("b", "g1", "batch"),
    ] {
        put_file(&s, t, &file(id, p), b"{}").await;
    }
    put_file(&s, "a", &file("f3", "batch_output"), b"{}").await;
    let ids = |v: Vec<File>| v.into_iter().map(|f| f.id).collect::<Vec<_>>();
    assert_eq!(
        ids(s.files(&t("a"), None, 10, None).await.unwrap()),
        ["f3", "f2", "f1"]
    );
    assert_eq!(
        ids(s.files(&t("a"), None, 10, Some("batch")).await.unwrap()),
        ["f2", "f1"]
    );
    assert_eq!(
        ids(s.files(&t("a"), Some("f3"), 1, None).await.unwrap()),
        ["f2"]
    );
    assert_eq!(ids(s.files(&t("b"), None, 10, None).await.unwrap()), ["g1"]);
    assert!(s.delete_file(&t("a"), "f2").await.unwrap());
    assert_eq!(
        ids(s.files(&t("a"), None, 10, None).await.unwrap()),
        ["f3", "f1"]
    );
    // Retention removes a file from the listing too.
    assert!(s.cleanup(now() + 10).await.unwrap() >= 3);
    assert!(s.files(&t("a"), None, 10, None).await.unwrap().is_empty());
}

#[tokio::test]
async fn due_batches_are_found_by_expiry_and_only_while_in_progress() {
    let Some(srv) = server() else { return };
    let s = store(&srv, 60_000).await;
    let batch = |id: &str, expires: u64| {
        Some((
            id.to_owned(),
            format!(r#"{{"id":"{id}","expires_at":{expires}}}"#),
        ))
    };
    s.insert(&t("a"), vec![job("j1", Some(("b1", 0)))], batch("b1", 5))
        .await
        .unwrap();
    s.insert(&t("a"), vec![job("j2", Some(("b2", 0)))], batch("b2", 50))
        .await
        .unwrap();
    let due = s.due_batches(10).await.unwrap();
    assert_eq!(due.len(), 1);
    assert_eq!((due[0].0.as_str(), due[0].1.as_str()), ("a", "b1"));
    assert!(s.cancel_batch(&t("a"), "b1", "{}").await.unwrap());
    assert!(
        s.due_batches(10).await.unwrap().is_empty(),
        "no longer in progress"
    );
    assert_eq!(s.due_batches(60).await.unwrap().len(), 1);
}

/// Stores `content` as the file `f` of `tenant`, chunk by chunk, as an upload does.
async fn put_file(s: &RedisStore, tenant: &str, f: &File, content: &[u8]) {
    for (seq, c) in content.chunks(crate::jobs::store::CHUNK_BYTES).enumerate() {
        let c = Bytes::copy_from_slice(c);
        s.put_chunk(&f.id, seq as u32, c).await.unwrap();
    }
    s.commit_file(&t(tenant), f).await.unwrap();
}

#[tokio::test]
async fn files_are_stored_and_read_in_chunks_and_an_abandoned_upload_leaves_none() {
    let Some(srv) = server() else { return };
    let s = store(&srv, 60_000).await;
    let ch = crate::jobs::store::CHUNK_BYTES;
    let content: Vec<u8> = (0..2 * ch + 10).map(|i| b'a' + (i % 26) as u8).collect();
    let f = File {
        id: "f1".into(),
        purpose: "batch".into(),
        filename: "in.jsonl".into(),
        bytes: content.len() as u64,
        created: 1,
    };
    // Uploaded chunks are invisible until committed.
    s.put_chunk("f1", 0, Bytes::copy_from_slice(&content[..ch]))
        .await
        .unwrap();
    assert_eq!(s.file_chunk(&t("a"), "f1", 0).await.unwrap(), None);
    s.put_chunk("f1", 1, Bytes::copy_from_slice(&content[ch..2 * ch]))
        .await
        .unwrap();
    s.put_chunk("f1", 2, Bytes::copy_from_slice(&content[2 * ch..]))
        .await
        .unwrap();
    s.commit_file(&t("a"), &f).await.unwrap();
    let mut back = Vec::new();
    let mut seq = 0;
    while let Some(c) = s.file_chunk(&t("a"), "f1", seq).await.unwrap() {
        assert!(c.len() <= ch, "one chunk a read, never the file");
        back.extend_from_slice(&c);
        seq += 1;
    }
    assert_eq!(
        (seq, back == content),
        (3, true),
        "three chunks, byte for byte"
    );
    assert_eq!(
        s.file_chunk(&t("b"), "f1", 0).await.unwrap(),
        None,
        "per tenant"
    );
    assert_eq!(s.usage(&t("a")).await.unwrap().1, content.len() as u64);
    // An abandoned upload's chunks go; a committed file's stay.
    s.put_chunk("f2", 0, Bytes::from_static(b"{}"))
        .await
        .unwrap();
    s.abort_file("f2").await.unwrap();
    s.abort_file("f1").await.unwrap();
    let mut conn = redis::Client::open(format!("redis://127.0.0.1:{}", srv.port))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let probe = conn.clone();
    let exists = |key: &'static str| {
        let mut c = probe.clone();
        async move {
            redis::cmd("EXISTS")
                .arg(format!("{{fgtest}}:jobs:fc:{key}"))
                .query_async::<i64>(&mut c)
                .await
                .unwrap()
        }
    };
    assert_eq!(
        exists("f2").await,
        0,
        "the aborted upload's chunks are gone"
    );
    assert_eq!(exists("f1").await, 1);
    // An uncommitted upload's chunks expire (a replica that died mid-upload).
    s.put_chunk("f3", 0, Bytes::from_static(b"{}"))
        .await
        .unwrap();
    let ttl: i64 = redis::cmd("TTL")
        .arg("{fgtest}:jobs:fc:f3")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(ttl > 0, "pending chunks expire: ttl {ttl}");
    let ttl: i64 = redis::cmd("TTL")
        .arg("{fgtest}:jobs:fc:f1")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(ttl, -1, "a committed file's chunks do not");
    // A file stored whole by an earlier version reads as its one chunk 0.
    let _: () = redis::cmd("HSET")
        .arg("{fgtest}:jobs:f:old")
        .arg(&[
            "tenant", "a", "purpose", "batch", "filename", "o", "bytes", "2", "created", "1",
        ])
        .arg(&["content", "{}"])
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        s.file_chunk(&t("a"), "old", 0).await.unwrap().as_deref(),
        Some(&b"{}"[..])
    );
    assert_eq!(s.file_chunk(&t("a"), "old", 1).await.unwrap(), None);
    // Deleting the file deletes its chunks.
    assert!(s.delete_file(&t("a"), "f1").await.unwrap());
    assert_eq!(exists("f1").await, 0);
    assert_eq!(s.usage(&t("a")).await.unwrap().1, 0);
}

#[tokio::test]
async fn redis_keeps_the_contract() {
    let Some(srv) = server() else { return };
    let s = store(&srv, 60_000).await;
    assert_eq!(s.lease(), Some(std::time::Duration::from_secs(60)));
    let port = srv.port;
    super::super::contract::run(&s, |id| async move {
        let mut c = redis::Client::open(format!("redis://127.0.0.1:{port}"))
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let _: () = redis::cmd("HSET")
            .arg(format!("{{fgtest}}:jobs:j:{id}"))
            .arg(&["state", "bogus"])
            .query_async(&mut c)
            .await
            .unwrap();
    })
    .await;
}
