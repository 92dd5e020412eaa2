//! One contract, both backends: [`run`] is generic over the [`Store`] trait and runs the same
//! operations against SQLite (`sqlite_keeps_the_contract`, through `Arc<dyn Store>` as the jobs
//! subsystem holds a store) and against a real `redis-server`
//! (`redis::tests::redis_keeps_the_contract`, on its own type): per-tenant reads, the job life
//! cycle with its typed states, a running claim renewed and never reclaimed from its holder,
//! files in chunks, batches finalized once, and a corrupt stored state read as an error, never
//! as a default.

use crate::domain::TenantId;

use super::{File, JobState, NewJob, Store, StoreError, CHUNK_BYTES};

fn job(id: &str, batch: Option<(&str, u32)>) -> NewJob {
    NewJob {
        id: id.to_owned(),
        batch: batch.map(|(b, l)| (b.to_owned(), l, format!("c{l}"))),
        method: "POST".into(),
        path: "/v1/chat/completions".into(),
        body: b"{}".to_vec(),
    }
}

fn file(id: &str, bytes: usize) -> File {
    File {
        id: id.to_owned(),
        purpose: "batch".into(),
        filename: format!("{id}.jsonl"),
        bytes: bytes as u64,
        created: super::now(),
    }
}

/// Runs the contract on `s` (an empty store of either backend). `corrupt` writes a state that
/// is no [`JobState`] into the stored job `id`, by the backend's own means.
pub(super) async fn run<S, F, Fut>(s: &S, corrupt: F)
where
    S: Store + ?Sized,
    F: FnOnce(String) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let (a, b) = (TenantId::new("a"), TenantId::new("b"));
    // Jobs: per tenant, queued → running → completed, typed.
    s.insert(&a, vec![job("j1", None), job("j2", None)], None)
        .await
        .unwrap();
    assert_eq!(s.usage(&a).await.unwrap(), (2, 4));
    assert!(
        s.job(&b, "j1").await.unwrap().is_none(),
        "another tenant's id"
    );
    assert_eq!(
        s.job(&a, "j1").await.unwrap().unwrap().state,
        JobState::Queued
    );
    assert_eq!(s.queued_tenants().await.unwrap(), std::slice::from_ref(&a));
    let claimed = s.claim(&a, 1).await.unwrap();
    assert_eq!(
        (claimed.len(), claimed[0].id.as_str()),
        (1, "j1"),
        "oldest first"
    );
    assert_eq!(
        s.job(&a, "j1").await.unwrap().unwrap().state,
        JobState::Running
    );
    let c = &claimed[0];
    let own = [(c.id.clone(), c.token)];
    assert_eq!(s.renew(&own).await.unwrap(), 0, "a held claim is not lost");
    assert_eq!(
        s.reclaim(&own).await.unwrap(),
        0,
        "nor reclaimed from its holder"
    );
    assert_eq!(
        s.job(&a, "j1").await.unwrap().unwrap().state,
        JobState::Running
    );
    assert!(s
        .finish(&c.id, c.token, 201, Some("application/json"), b"ok")
        .await
        .unwrap());
    assert!(
        !s.finish(&c.id, c.token, 200, None, b"again").await.unwrap(),
        "recorded once"
    );
    let j = s.job(&a, "j1").await.unwrap().unwrap();
    assert_eq!((j.state, j.status), (JobState::Completed, Some(201)));
    assert_eq!(j.resp_type.as_deref(), Some("application/json"));
    assert_eq!(j.response.as_deref(), Some(&b"ok"[..]));
    assert_eq!(
        s.cancel(&b, "j2").await.unwrap(),
        None,
        "another tenant's id"
    );
    assert_eq!(s.cancel(&a, "j2").await.unwrap(), Some(JobState::Cancelled));
    assert_eq!(
        s.cancel(&a, "j1").await.unwrap(),
        Some(JobState::Completed),
        "too late"
    );
    let mut states = s.states().await.unwrap();
    states.retain(|(_, _, n)| *n > 0);
    states.sort_by_key(|(_, st, _)| st.as_str());
    assert_eq!(
        states,
        [
            ("a".to_owned(), JobState::Cancelled, 1),
            ("a".to_owned(), JobState::Completed, 1)
        ]
    );

    // Files: in chunks, invisible until committed, per tenant.
    let content: Vec<u8> = (0..CHUNK_BYTES + 3)
        .map(|i| b'a' + (i % 26) as u8)
        .collect();
    for (seq, part) in content.chunks(CHUNK_BYTES).enumerate() {
        s.put_chunk("f1", seq as u32, bytes::Bytes::copy_from_slice(part))
            .await
            .unwrap();
    }
    assert!(
        s.file(&a, "f1").await.unwrap().is_none(),
        "not yet committed"
    );
    s.commit_file(&a, &file("f1", content.len())).await.unwrap();
    let mut back = Vec::new();
    let mut seq = 0;
    while let Some(c) = s.file_chunk(&a, "f1", seq).await.unwrap() {
        back.extend_from_slice(&c);
        seq += 1;
    }
    assert_eq!((seq, back == content), (2, true));
    assert!(s.file_chunk(&b, "f1", 0).await.unwrap().is_none());
    assert_eq!(s.files(&a, None, 10, None).await.unwrap().len(), 1);
    assert!(s.files(&b, None, 10, None).await.unwrap().is_empty());
    s.put_chunk("f2", 0, bytes::Bytes::from_static(b"{}"))
        .await
        .unwrap();
    s.abort_file("f2").await.unwrap();
    assert!(s.file_chunk(&a, "f2", 0).await.unwrap().is_none());
    assert!(!s.delete_file(&b, "f1").await.unwrap());
    assert!(s.delete_file(&a, "f1").await.unwrap());
    assert!(s.file(&a, "f1").await.unwrap().is_none());

    // A batch: its lines in order, counts, finalized exactly once.
    let doc = r#"{"id":"b1","status":"in_progress"}"#;
    s.insert(
        &a,
        vec![job("l0", Some(("b1", 0))), job("l1", Some(("b1", 1)))],
        Some(("b1".into(), doc.into())),
    )
    .await
    .unwrap();
    assert_eq!(s.batch_tenant("b1").await.unwrap().as_deref(), Some("a"));
    assert!(s.batch(&b, "b1").await.unwrap().is_none());
    for c in s.claim(&a, 5).await.unwrap() {
        let status = if c.id == "l0" { 200 } else { 500 };
        assert!(s.finish(&c.id, c.token, status, None, b"{}").await.unwrap());
    }
    let counts = s.counts("b1").await.unwrap();
    assert_eq!((counts.total, counts.completed, counts.failed), (2, 1, 1));
    assert!(!s.unfinished("b1").await.unwrap());
    let lines = s.lines("b1").await.unwrap();
    let got: Vec<_> = lines
        .iter()
        .map(|l| (l.custom_id.as_str(), l.state))
        .collect();
    assert_eq!(got, [("c0", JobState::Completed), ("c1", JobState::Failed)]);
    let out = vec![(file("out1", 3), b"out".to_vec())];
    let done = r#"{"id":"b1","status":"completed"}"#;
    assert!(s
        .finalize("b1", "in_progress", done, "completed", out.clone())
        .await
        .unwrap());
    assert!(
        !s.finalize("b1", "in_progress", done, "completed", out)
            .await
            .unwrap(),
        "once"
    );
    assert_eq!(s.batch(&a, "b1").await.unwrap().as_deref(), Some(done));
    assert_eq!(
        s.file_chunk(&a, "out1", 0).await.unwrap().as_deref(),
        Some(&b"out"[..]),
        "the output file reads as an upload does"
    );

    // A stored state that is no state is an error, not a default.
    s.insert(&a, vec![job("bad", None)], None).await.unwrap();
    corrupt("bad".to_owned()).await;
    assert!(
        matches!(
            s.job(&a, "bad").await,
            Err(StoreError::Shape | StoreError::Sqlite(_))
        ),
        "a corrupt state is an error"
    );
}

#[tokio::test]
async fn sqlite_keeps_the_contract() {
    let path = std::env::temp_dir().join(format!("fg-contract-{:x}.sqlite", rand::random::<u64>()));
    let s: std::sync::Arc<dyn Store> = std::sync::Arc::new(super::Sqlite::open(&path).unwrap());
    assert_eq!(s.lease(), None, "claims hold while the process lives");
    let p = path.clone();
    run(&*s, |id| async move {
        let c = rusqlite::Connection::open(&p).unwrap();
        c.execute("UPDATE jobs SET state = 'bogus' WHERE id = ?1", [id])
            .unwrap();
    })
    .await;
    let _ = std::fs::remove_file(&path);
}
