//! The SQLite backend of the runtime tenants (`[store] path`, one replica): two tables of JSON
//! documents, `runtime_tenants` and `runtime_keys`, in the same file as the other durable state
//! (its own connection; WAL journal, so readers and the jobs store never block each other).
//!
//! Invariants: every write is one short transaction that checks its precondition (a tenant
//! created is new or deleted, one updated is live, a key is added to a live tenant) in the same
//! transaction; a tenant's deletion revokes its keys in that transaction; a revoked key is
//! never written again. Calls are synchronous under one mutex: [`super::Store`] runs them on
//! tokio's blocking pool.
//!
//! Every write transaction is `IMMEDIATE`: it takes the file's write lock before its first read,
//! so beside the other writers of the file (the usage ledger's flush, the jobs) it waits
//! (`busy_timeout`, 5 s) instead of failing. A deferred one read first, and could then not take
//! the lock once another connection had committed since: `database is locked` at once, which
//! answered a key creation beside a busy ledger `503` (`examples/runtime_tenants`, 1,000 keys).

use std::path::Path;
use std::sync::Mutex;

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use super::record::{Change, KeyRecord, TenantRecord, Versioned};
use super::StoreError;

const SCHEMA: &str = "
PRAGMA journal_mode = WAL;
PRAGMA synchronous = NORMAL;
CREATE TABLE IF NOT EXISTS runtime_tenants(
  id TEXT PRIMARY KEY, version INTEGER NOT NULL, doc TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runtime_keys(
  id TEXT PRIMARY KEY, tenant TEXT NOT NULL, version INTEGER NOT NULL, doc TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS runtime_keys_tenant ON runtime_keys(tenant);
CREATE INDEX IF NOT EXISTS runtime_tenants_version ON runtime_tenants(version);
CREATE INDEX IF NOT EXISTS runtime_keys_version ON runtime_keys(version);
";

type Result<T> = std::result::Result<T, StoreError>;

/// The SQLite runtime store (one connection behind a mutex).
#[derive(Debug)]
pub struct Sqlite {
    conn: Mutex<Connection>,
}

fn doc<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

/// The next version: one more than any record's.
fn next_version(tx: &Connection) -> Result<u64> {
    let v: i64 = tx.query_row(
        "SELECT MAX((SELECT COALESCE(MAX(version), 0) FROM runtime_tenants), \
                    (SELECT COALESCE(MAX(version), 0) FROM runtime_keys))",
        [],
        |r| r.get(0),
    )?;
    Ok(v.max(0) as u64 + 1)
}

fn tenant(tx: &Connection, id: &str) -> Result<Option<TenantRecord>> {
    let doc: Option<String> = tx
        .query_row("SELECT doc FROM runtime_tenants WHERE id = ?1", [id], |r| {
            r.get(0)
        })
        .optional()?;
    Ok(doc.and_then(|d| serde_json::from_str(&d).ok()))
}

impl Sqlite {
    /// Opens (creating if absent) the store at `path`.
    pub fn open(path: &Path) -> Result<Self> {
        let conn = Connection::open(path)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        conn.execute_batch(SCHEMA)?;
        Ok(Self {
            conn: Mutex::new(conn),
        })
    }

    fn with<T>(&self, f: impl FnOnce(&mut Connection) -> Result<T>) -> Result<T> {
        let mut c = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut c)
    }

    /// Every live tenant and live key.
    pub fn load(&self) -> Result<Vec<Versioned>> {
        self.with(|c| {
            let mut out = Vec::new();
            let mut st = c.prepare("SELECT version, doc FROM runtime_tenants")?;
            let rows = st.query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?)))?;
            for row in rows {
                let (v, d) = row?;
                if let Ok(t) = serde_json::from_str::<TenantRecord>(&d) {
                    if !t.deleted {
                        out.push((v.max(0) as u64, Change::Tenant(t)));
                    }
                }
            }
            let mut st = c.prepare("SELECT version, doc FROM runtime_keys")?;
            let rows = st.query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?)))?;
            for row in rows {
                let (v, d) = row?;
                if let Ok(k) = serde_json::from_str::<KeyRecord>(&d) {
                    if k.revoked_at.is_none() {
                        out.push((v.max(0) as u64, Change::Key(k)));
                    }
                }
            }
            Ok(out)
        })
    }

    /// Writes `t`: `create` needs the id new (or deleted), else it must be live.
    pub fn put_tenant(&self, t: &TenantRecord, create: bool) -> Result<u64> {
        self.with(|c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let live = tenant(&tx, &t.id)?.is_some_and(|o| !o.deleted);
            match (create, live) {
                (true, true) => return Err(StoreError::Exists),
                (false, false) => return Err(StoreError::Missing),
                _ => {}
            }
            let v = next_version(&tx)?;
            tx.execute(
                "INSERT INTO runtime_tenants(id, version, doc) VALUES (?1, ?2, ?3) \
                 ON CONFLICT(id) DO UPDATE SET version = excluded.version, doc = excluded.doc",
                params![t.id, v as i64, doc(t)],
            )?;
            tx.commit()?;
            Ok(v)
        })
    }

    /// Deletes the live tenant `id` at `at` (a tombstone) and revokes its keys.
    pub fn delete_tenant(&self, id: &str, at: u64) -> Result<u64> {
        self.with(|c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let Some(mut t) = tenant(&tx, id)?.filter(|t| !t.deleted) else {
                return Err(StoreError::Missing);
            };
            t.deleted = true;
            t.updated_at = at;
            let v = next_version(&tx)?;
            tx.execute(
                "UPDATE runtime_tenants SET version = ?2, doc = ?3 WHERE id = ?1",
                params![id, v as i64, doc(&t)],
            )?;
            let keys: Vec<(String, String)> = {
                let mut st = tx.prepare("SELECT id, doc FROM runtime_keys WHERE tenant = ?1")?;
                let rows = st.query_map([id], |r| Ok((r.get(0)?, r.get(1)?)))?;
                rows.collect::<std::result::Result<_, _>>()?
            };
            for (key_id, d) in keys {
                let Ok(mut k) = serde_json::from_str::<KeyRecord>(&d) else {
                    continue;
                };
                if k.revoked_at.is_none() {
                    k.revoked_at = Some(at);
                    tx.execute(
                        "UPDATE runtime_keys SET version = ?2, doc = ?3 WHERE id = ?1",
                        params![key_id, v as i64, doc(&k)],
                    )?;
                }
            }
            tx.commit()?;
            Ok(v)
        })
    }

    /// Writes `k`: `create` needs its tenant live and the id new; else the key must exist and
    /// not be revoked.
    pub fn put_key(&self, k: &KeyRecord, create: bool) -> Result<u64> {
        self.with(|c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            if tenant(&tx, &k.tenant)?.is_none_or(|t| t.deleted) {
                return Err(StoreError::Missing);
            }
            let old: Option<String> = tx
                .query_row(
                    "SELECT doc FROM runtime_keys WHERE id = ?1 AND tenant = ?2",
                    params![k.id, k.tenant],
                    |r| r.get(0),
                )
                .optional()?;
            let old = old.and_then(|d| serde_json::from_str::<KeyRecord>(&d).ok());
            match (create, old) {
                (true, Some(_)) => return Err(StoreError::Exists),
                (false, None) => return Err(StoreError::Missing),
                (false, Some(o)) if o.revoked_at.is_some() => return Err(StoreError::Missing),
                _ => {}
            }
            let v = next_version(&tx)?;
            tx.execute(
                "INSERT INTO runtime_keys(id, tenant, version, doc) VALUES (?1, ?2, ?3, ?4) \
                 ON CONFLICT(id) DO UPDATE SET version = excluded.version, doc = excluded.doc",
                params![k.id, k.tenant, v as i64, doc(k)],
            )?;
            tx.commit()?;
            Ok(v)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tenant::runtime::record::new_key;

    fn t(id: &str) -> TenantRecord {
        TenantRecord {
            id: id.into(),
            spec: serde_json::Map::new(),
            created_at: 1,
            updated_at: 1,
            deleted: false,
        }
    }

    #[test]
    fn writes_check_their_preconditions_and_deletion_revokes_for_good() {
        let path = std::env::temp_dir().join(format!("fg-runtime-{:x}.db", rand::random::<u64>()));
        let s = Sqlite::open(&path).unwrap();
        s.put_tenant(&t("a"), true).unwrap();
        assert!(matches!(
            s.put_tenant(&t("a"), true),
            Err(StoreError::Exists)
        ));
        assert!(matches!(
            s.put_tenant(&t("b"), false),
            Err(StoreError::Missing)
        ));
        let (k, _) = new_key("a", None, None);
        s.put_key(&k, true).unwrap();
        let (orphan, _) = new_key("b", None, None);
        assert!(matches!(s.put_key(&orphan, true), Err(StoreError::Missing)));
        s.delete_tenant("a", 9).unwrap();
        // Re-created, the tenant gets none of its old keys back, and they stay revoked.
        s.put_tenant(&t("a"), true).unwrap();
        assert!(matches!(s.put_key(&k, false), Err(StoreError::Missing)));
        drop(s);
        let loaded = Sqlite::open(&path).unwrap().load().unwrap();
        assert_eq!(loaded.len(), 1);
        assert_eq!(loaded[0].1, Change::Tenant(t("a")));
        let _ = std::fs::remove_file(&path);
    }
}
