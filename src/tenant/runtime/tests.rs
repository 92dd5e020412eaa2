use std::sync::Arc;

use serde_json::{json, Map, Value};

use super::record::{Change, KeyRecord};
use super::sqlite::Sqlite;
use super::{Counters, Error, Registry, Store};
use crate::config::Config;
use crate::domain::digest;

const FILE: &str = "[[upstreams]]\nname = \"u\"\nbase_url = \"http://h/v1\"\n\
                    [plans.gold]\nweight = 4.0\n\
                    [[tenants]]\nid = \"file\"\napi_keys = [\"kf\"]\n";

fn temp() -> std::path::PathBuf {
    std::env::temp_dir().join(format!("fg-registry-{:x}.db", rand::random::<u64>()))
}

fn open(path: &std::path::Path) -> Arc<Registry> {
    let r = Registry::new(
        Store::Sqlite(Arc::new(Sqlite::open(path).unwrap())),
        Counters::default(),
        super::control::DEFAULT_MAX_QUEUED_WRITES,
    )
    .unwrap();
    r.merge(Config::from_toml_str(FILE).unwrap());
    r
}

fn spec(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => unreachable!(),
    }
}

#[tokio::test]
async fn create_use_rotate_revoke_and_reopen() {
    let path = temp();
    let r = open(&path);
    let t = r
        .create_tenant("acme".into(), spec(json!({"plan": "gold"})))
        .await
        .unwrap();
    assert_eq!(t.id, "acme");
    let merged = r.merge(Config::from_toml_str(FILE).unwrap());
    let ids: Vec<&str> = merged.tenants.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(ids, ["file", "acme"], "the file's tenants first");
    let (k, key) = r.create_key("acme", Some("ci".into()), None).await.unwrap();
    assert_eq!(r.lookup(&digest(key.as_bytes())).as_deref(), Some("acme"));
    // Rotation: both keys work during the overlap; the old one expires after it.
    let (k2, key2, old) = r.rotate_key("acme", &k.id, 3600, None).await.unwrap();
    assert_eq!(old.id, k.id);
    assert!(old.expires_at.is_some());
    assert_eq!(k2.label.as_deref(), Some("ci"));
    assert!(r.lookup(&digest(key.as_bytes())).is_some());
    assert!(r.lookup(&digest(key2.as_bytes())).is_some());
    r.revoke_key("acme", &k.id).await.unwrap();
    assert!(r.lookup(&digest(key.as_bytes())).is_none());
    assert!(matches!(
        r.revoke_key("acme", &k.id).await,
        Err(Error::NoKey(_))
    ));
    drop(r);
    // A restart keeps the tenant and its live key, not the revoked one.
    let r = open(&path);
    assert!(r.tenant("acme").is_some());
    assert!(r.lookup(&digest(key.as_bytes())).is_none());
    assert_eq!(r.lookup(&digest(key2.as_bytes())).as_deref(), Some("acme"));
    assert_eq!(r.keys_of("acme").len(), 1);
    // Deleting the tenant revokes its keys; re-creating the id brings none back.
    r.delete_tenant("acme").await.unwrap();
    assert!(r.lookup(&digest(key2.as_bytes())).is_none());
    r.create_tenant("acme".into(), Map::new()).await.unwrap();
    assert!(r.lookup(&digest(key2.as_bytes())).is_none());
    drop(r);
    let r = open(&path);
    assert!(r.lookup(&digest(key2.as_bytes())).is_none());
    let _ = std::fs::remove_file(&path);
}

#[tokio::test]
async fn config_tenants_are_read_only_and_never_shadowed() {
    let path = temp();
    let r = open(&path);
    for e in [
        r.create_tenant("file".into(), Map::new())
            .await
            .unwrap_err(),
        r.update_tenant("file", Map::new()).await.unwrap_err(),
        r.delete_tenant("file").await.unwrap_err(),
        r.create_key("file", None, None)
            .await
            .map(|_| ())
            .unwrap_err(),
    ] {
        assert!(
            matches!(e, Error::ConfigTenant(ref id) if id == "file"),
            "{e}"
        );
    }
    // An API tenant the file later defines is hidden, and its keys are refused.
    r.create_tenant("late".into(), Map::new()).await.unwrap();
    let (_, key) = r.create_key("late", None, None).await.unwrap();
    let text = format!("{FILE}[[tenants]]\nid = \"late\"\napi_keys = [\"kl\"]\n");
    let merged = r.merge(Config::from_toml_str(&text).unwrap());
    assert_eq!(merged.tenants.iter().filter(|t| t.id == "late").count(), 1);
    assert!(merged
        .tenants
        .iter()
        .any(|t| t.id == "late" && t.api_keys == ["kl"]));
    assert!(r.lookup(&digest(key.as_bytes())).is_none());
    let _ = std::fs::remove_file(&path);
}

#[tokio::test]
async fn validation_names_the_field() {
    let path = temp();
    let r = open(&path);
    let field = |e: Error| match e {
        Error::Invalid { field, .. } => field,
        other => panic!("{other}"),
    };
    let cases = [
        (json!({"weight": -1.0}), "weight"),
        (json!({"plan": "platinum"}), "plan"),
        (json!({"wieght": 2}), "wieght"),
        (json!({"max_concurrency": "many"}), "max_concurrency"),
        (json!({"api_keys": ["k"]}), "api_keys"),
        (
            json!({"upstream_api_key_env": "HOME"}),
            "upstream_api_key_env",
        ),
        (json!({"max_concurrency": 0}), "max_concurrency"),
    ];
    for (body, name) in cases {
        let e = r
            .create_tenant("t".into(), spec(body.clone()))
            .await
            .unwrap_err();
        assert_eq!(field(e), name, "{body}");
    }
    let e = r
        .create_tenant("bad id!".into(), Map::new())
        .await
        .unwrap_err();
    assert_eq!(field(e), "id");
    assert!(r.tenant("t").is_none(), "nothing invalid was stored");
    r.create_tenant("t".into(), spec(json!({"weight": 2.0})))
        .await
        .unwrap();
    let e = r
        .update_tenant("t", spec(json!({"weight": 0})))
        .await
        .unwrap_err();
    assert_eq!(field(e), "weight");
    let t = r
        .update_tenant("t", spec(json!({"weight": null, "plan": "gold"})))
        .await
        .unwrap();
    assert_eq!(Value::Object(t.spec), json!({"plan": "gold"}));
    let _ = std::fs::remove_file(&path);
}

#[test]
fn a_late_read_of_an_older_write_never_revives_a_revoked_key() {
    let mut index = super::Index::default();
    let (k, key) = super::record::new_key("a", None, None);
    let revoked = KeyRecord {
        revoked_at: Some(1),
        ..k.clone()
    };
    index.apply(7, Change::Key(revoked));
    index.apply(5, Change::Key(k));
    assert!(!index.by_digest.contains_key(&digest(key.as_bytes())));
}

/// The store shares its file with the usage ledger and the jobs (`[store] path`), each on its
/// own connection: a write here while another connection commits must wait for it, never fail
/// "database is locked" (a deferred transaction that read first cannot take the write lock
/// once another writer committed after its read began; the wait of `busy_timeout` does not
/// apply to that case). Bounded: 200 writes here beside at most 5,000 commits there.
#[test]
fn writes_beside_another_writer_of_the_file_wait_instead_of_failing() {
    let path = temp();
    let store = Sqlite::open(&path).unwrap();
    let t = super::record::TenantRecord {
        id: "t".into(),
        spec: Map::new(),
        created_at: 0,
        updated_at: 0,
        deleted: false,
    };
    store.put_tenant(&t, true).unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let other = {
        let (path, stop) = (path.clone(), stop.clone());
        std::thread::spawn(move || {
            let c = rusqlite::Connection::open(&path).unwrap();
            c.busy_timeout(std::time::Duration::from_secs(5)).unwrap();
            c.execute_batch("CREATE TABLE IF NOT EXISTS other(n INTEGER)")
                .unwrap();
            // A flush-like writer: short commits 2 ms apart (the ledger flushes once a second; a
            // writer that never pauses starves SQLite's polling busy handler past its timeout
            // on a loaded host). The deferred transactions failed 88 of 200 beside it.
            for n in 0..5_000 {
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                c.execute("INSERT INTO other(n) VALUES (?1)", [n]).unwrap();
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
        })
    };
    let mut failed = Vec::new();
    for _ in 0..200 {
        let (k, _) = super::record::new_key("t", None, None);
        if let Err(e) = store.put_key(&k, true) {
            failed.push(e.to_string());
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    other.join().unwrap();
    let _ = std::fs::remove_file(&path);
    assert!(
        failed.is_empty(),
        "{} of 200 failed: {:?}",
        failed.len(),
        failed.first()
    );
}

/// Admin writes are bounded (`[admin] max_queued_writes`): one more than the bound is refused
/// at once, 503 `admin_writes_busy` with a `Retry-After`, and changes nothing; a write done
/// frees its place.
#[tokio::test]
async fn a_write_past_the_queue_bound_is_refused_with_a_retry_after() {
    let path = temp();
    let r = Registry::new(
        Store::Sqlite(Arc::new(Sqlite::open(&path).unwrap())),
        Counters::default(),
        1,
    )
    .unwrap();
    r.merge(Config::from_toml_str(FILE).unwrap());
    r.create_tenant("acme".into(), Map::new()).await.unwrap();
    let held = r.control.admit().unwrap();
    let e = r
        .create_key("acme", None, None)
        .await
        .map(drop)
        .unwrap_err();
    assert!(matches!(e, Error::Busy(_)), "{e}");
    let e = crate::error::Error::from(e);
    assert_eq!(e.status(), http::StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(e.api().code(), "admin_writes_busy");
    let headers = e.all_headers();
    let retry = headers.iter().find(|(k, _)| k == http::header::RETRY_AFTER);
    assert_eq!(retry.map(|(_, v)| v.to_str().unwrap()), Some("1"));
    assert!(matches!(
        r.create_tenant("other".into(), Map::new()).await,
        Err(Error::Busy(_))
    ));
    assert!(r.tenant("other").is_none() && r.keys_of("acme").is_empty());
    drop(held);
    r.create_key("acme", None, None).await.unwrap();
    assert_eq!(r.keys_of("acme").len(), 1);
    let _ = std::fs::remove_file(&path);
}
