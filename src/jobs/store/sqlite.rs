//! The SQLite backend: jobs (async requests and batch lines), files and batches in one embedded
//! file (`[jobs] path`, created on first use, WAL journal), for a single replica.
//!
//! Invariants: every row carries its tenant and every read by id filters on it (another
//! tenant's id reads as absent); a job moves `queued → running → completed | failed` (or
//! `cancelled` from `queued`), and a `running` job found at open (the process died while it
//! was in flight) goes back to `queued`: at-least-once for a line in flight at a crash, never
//! again for a finished one (its result is committed before it counts as finished). Calls are
//! short synchronous transactions under one mutex ([`Db`]); [`Sqlite`], the backend's
//! [`super::Store`], runs each on tokio's blocking pool ([`blocking`]), so neither the mutex nor
//! the disk ever blocks an async worker.
//!
//! Write transactions are `IMMEDIATE` (the write lock before the first read): the file may be
//! `[store] path`, shared with the usage ledger and the runtime tenants on their own
//! connections, and a deferred transaction that read first fails `database is locked` at once
//! when another connection committed meanwhile, where an immediate one waits (`busy_timeout`).

mod blocking;

pub use blocking::Sqlite;

use std::path::Path;
use std::sync::Mutex;

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use super::{now, Claimed, Counts, File, Job, JobState, Line, NewJob, CHUNK_BYTES};

/// SQLite errors.
pub type Result<T> = std::result::Result<T, rusqlite::Error>;

/// Schema, created on first use.
const SCHEMA: &str = "
PRAGMA journal_mode = WAL;
PRAGMA synchronous = NORMAL;
CREATE TABLE IF NOT EXISTS jobs(
  id TEXT PRIMARY KEY, tenant TEXT NOT NULL, batch TEXT, line INTEGER, custom_id TEXT,
  method TEXT NOT NULL, path TEXT NOT NULL, body BLOB NOT NULL, state TEXT NOT NULL,
  status INTEGER, resp_type TEXT, response BLOB, created INTEGER NOT NULL, finished INTEGER);
CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state, tenant);
CREATE INDEX IF NOT EXISTS jobs_batch ON jobs(batch, line);
CREATE INDEX IF NOT EXISTS jobs_batch_state ON jobs(batch, state);
CREATE TABLE IF NOT EXISTS files(
  id TEXT PRIMARY KEY, tenant TEXT NOT NULL, purpose TEXT NOT NULL, filename TEXT NOT NULL,
  bytes INTEGER NOT NULL, created INTEGER NOT NULL, content BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS files_tenant ON files(tenant);
CREATE TABLE IF NOT EXISTS file_chunks(
  file TEXT NOT NULL, seq INTEGER NOT NULL, data BLOB NOT NULL, PRIMARY KEY(file, seq));
CREATE TABLE IF NOT EXISTS batches(
  id TEXT PRIMARY KEY, tenant TEXT NOT NULL, doc TEXT NOT NULL, status TEXT NOT NULL,
  created INTEGER NOT NULL, finished INTEGER);
CREATE INDEX IF NOT EXISTS batches_due ON batches(json_extract(doc, '$.expires_at'))
  WHERE status = 'in_progress';
";

/// The SQLite file's calls, synchronous (one connection behind a mutex).
#[derive(Debug)]
pub struct Db {
    conn: Mutex<Connection>,
}

impl Db {
    /// Opens (creating if absent) the store at `path`; jobs left `running` by a previous
    /// process go back to `queued`.
    pub fn open(path: &Path) -> Result<Self> {
        let conn = Connection::open(path)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        conn.execute_batch(SCHEMA)?;
        let requeued = conn.execute(
            "UPDATE jobs SET state = 'queued' WHERE state = 'running'",
            [],
        )?;
        if requeued > 0 {
            tracing::warn!(
                requeued,
                "jobs in flight when the previous process stopped are queued again"
            );
        }
        // Chunks of uploads the previous process did not finish storing.
        conn.execute(
            "DELETE FROM file_chunks WHERE file NOT IN (SELECT id FROM files)",
            [],
        )?;
        Ok(Self {
            conn: Mutex::new(conn),
        })
    }

    fn with<T>(&self, f: impl FnOnce(&mut Connection) -> Result<T>) -> Result<T> {
        let mut c = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut c)
    }

    /// (jobs queued or running, bytes stored) of `tenant`.
    pub fn usage(&self, tenant: &str) -> Result<(u64, u64)> {
        self.with(|c| {
            let jobs: i64 = c.query_row(
                "SELECT COUNT(*) FROM jobs WHERE tenant = ?1 AND state IN ('queued','running')",
                [tenant],
                |r| r.get(0),
            )?;
            let bytes: i64 = c.query_row(
                "SELECT (SELECT COALESCE(SUM(LENGTH(body) + COALESCE(LENGTH(response), 0)), 0) \
                 FROM jobs WHERE tenant = ?1) + \
                 (SELECT COALESCE(SUM(bytes), 0) FROM files WHERE tenant = ?1)",
                [tenant],
                |r| r.get(0),
            )?;
            Ok((jobs.max(0) as u64, bytes.max(0) as u64))
        })
    }

    /// Inserts `jobs` of `tenant` (one transaction), and the batch document if any.
    pub fn insert(&self, tenant: &str, jobs: &[NewJob], batch: Option<(&str, &str)>) -> Result<()> {
        let t = now() as i64;
        self.with(|c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            if let Some((id, doc)) = batch {
                tx.execute(
                    "INSERT INTO batches(id, tenant, doc, status, created) VALUES (?1,?2,?3,'in_progress',?4)",
                    params![id, tenant, doc, t],
                )?;
            }
            {
                let mut st = tx.prepare(
                    "INSERT INTO jobs(id, tenant, batch, line, custom_id, method, path, body, state, created) \
                     VALUES (?1,?2,?3,?4,?5,?6,?7,?8,'queued',?9)",
                )?;
                for j in jobs {
                    let (b, l, cid) = match &j.batch {
                        Some((b, l, cid)) => (Some(b.as_str()), Some(*l), Some(cid.as_str())),
                        None => (None, None, None),
                    };
                    st.execute(params![j.id, tenant, b, l, cid, j.method, j.path, j.body, t])?;
                }
            }
            tx.commit()
        })
    }

    /// The job `id` of `tenant`.
    pub fn job(&self, tenant: &str, id: &str) -> Result<Option<Job>> {
        self.with(|c| {
            c.query_row(
                "SELECT state, status, resp_type, response FROM jobs WHERE id = ?1 AND tenant = ?2 AND batch IS NULL",
                [id, tenant],
                |r| {
                    Ok(Job {
                        state: r.get(0)?,
                        status: r.get(1)?,
                        resp_type: r.get(2)?,
                        response: r.get(3)?,
                    })
                },
            )
            .optional()
        })
    }

    /// Cancels the queued job `id` of `tenant`; its state after (`None`: no such job).
    pub fn cancel(&self, tenant: &str, id: &str) -> Result<Option<JobState>> {
        self.with(|c| {
            c.execute(
                "UPDATE jobs SET state = 'cancelled', finished = ?3 WHERE id = ?1 AND tenant = ?2 AND state = 'queued'",
                params![id, tenant, now() as i64],
            )?;
            c.query_row(
                "SELECT state FROM jobs WHERE id = ?1 AND tenant = ?2 AND batch IS NULL",
                [id, tenant],
                |r| r.get(0),
            )
            .optional()
        })
    }

    /// Tenants with queued jobs.
    pub fn queued_tenants(&self) -> Result<Vec<String>> {
        self.with(|c| {
            // A skip scan of `jobs_state (state, tenant)`: one probe per tenant, where DISTINCT
            // read every queued row (a 5,000-line batch read 5,000 rows per line dispatched).
            let mut st = c.prepare(
                "WITH RECURSIVE t(x) AS (\
                   SELECT MIN(tenant) FROM jobs WHERE state = 'queued' \
                   UNION ALL SELECT (SELECT MIN(tenant) FROM jobs \
                     WHERE state = 'queued' AND tenant > t.x) FROM t WHERE t.x IS NOT NULL) \
                 SELECT x FROM t WHERE x IS NOT NULL",
            )?;
            let rows = st.query_map([], |r| r.get(0))?;
            rows.collect()
        })
    }

    /// Claims up to `n` of `tenant`'s oldest queued jobs (marks them running).
    pub fn claim(&self, tenant: &str, n: usize) -> Result<Vec<Claimed>> {
        self.with(|c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let claimed: Vec<Claimed> = {
                let mut st = tx.prepare(
                    "SELECT id, tenant, batch, method, path, body FROM jobs \
                     WHERE state = 'queued' AND tenant = ?1 ORDER BY rowid LIMIT ?2",
                )?;
                let rows = st.query_map(params![tenant, n as i64], |r| {
                    Ok(Claimed {
                        id: r.get(0)?,
                        token: 0,
                        tenant: crate::domain::TenantId::new(r.get::<_, String>(1)?),
                        batch: r.get(2)?,
                        method: r.get(3)?,
                        path: r.get(4)?,
                        body: r.get(5)?,
                    })
                })?;
                rows.collect::<Result<_>>()?
            };
            for j in &claimed {
                tx.execute("UPDATE jobs SET state = 'running' WHERE id = ?1", [&j.id])?;
            }
            tx.commit()?;
            Ok(claimed)
        })
    }

    /// Puts a running job back in the queue (a transient refusal).
    pub fn requeue(&self, id: &str) -> Result<()> {
        self.with(|c| {
            c.execute(
                "UPDATE jobs SET state = 'queued' WHERE id = ?1 AND state = 'running'",
                [id],
            )
            .map(drop)
        })
    }

    /// Records a running job's answer.
    pub fn finish(
        &self,
        id: &str,
        status: u16,
        resp_type: Option<&str>,
        body: &[u8],
    ) -> Result<bool> {
        let st = JobState::answered(status).as_str();
        self.with(|c| {
            c.execute(
                "UPDATE jobs SET state = ?2, status = ?3, resp_type = ?4, response = ?5, finished = ?6 \
                 WHERE id = ?1 AND state = 'running'",
                params![id, st, status, resp_type, body, now() as i64],
            )
            .map(|n| n > 0)
        })
    }

    /// Stores chunk `seq` of the file `id` being uploaded (not visible until
    /// [`Db::commit_file`]).
    pub fn put_chunk(&self, id: &str, seq: u32, data: &[u8]) -> Result<()> {
        self.with(|c| {
            c.execute(
                "INSERT OR REPLACE INTO file_chunks(file, seq, data) VALUES (?1, ?2, ?3)",
                params![id, seq, data],
            )
            .map(drop)
        })
    }

    /// Makes the uploaded file `f` (its chunks already stored) one of `tenant`'s files.
    pub fn commit_file(&self, tenant: &str, f: &File) -> Result<()> {
        self.with(|c| {
            c.execute(
                "INSERT INTO files(id, tenant, purpose, filename, bytes, created, content) VALUES (?1,?2,?3,?4,?5,?6,x'')",
                params![f.id, tenant, f.purpose, f.filename, f.bytes as i64, f.created as i64],
            )
            .map(drop)
        })
    }

    /// Drops the chunks of an upload that will not be committed.
    pub fn abort_file(&self, id: &str) -> Result<()> {
        self.with(|c| {
            c.execute("DELETE FROM file_chunks WHERE file = ?1", [id])
                .map(drop)
        })
    }

    /// Chunk `seq` of file `id` of `tenant` (`None` past its end, or no such file). A file
    /// stored whole (before chunks) is its one chunk 0.
    pub fn file_chunk(&self, tenant: &str, id: &str, seq: u32) -> Result<Option<Vec<u8>>> {
        self.with(|c| {
            let chunk: Option<Vec<u8>> = c
                .query_row(
                    "SELECT k.data FROM file_chunks k JOIN files f ON f.id = k.file \
                     WHERE k.file = ?1 AND k.seq = ?2 AND f.tenant = ?3",
                    params![id, seq, tenant],
                    |r| r.get(0),
                )
                .optional()?;
            if chunk.is_some() || seq > 0 {
                return Ok(chunk);
            }
            c.query_row(
                "SELECT content FROM files WHERE id = ?1 AND tenant = ?2",
                [id, tenant],
                |r| r.get(0),
            )
            .optional()
        })
    }

    /// The file `id` of `tenant`.
    pub fn file(&self, tenant: &str, id: &str) -> Result<Option<File>> {
        self.with(|c| {
            c.query_row(
                "SELECT id, purpose, filename, bytes, created FROM files WHERE id = ?1 AND tenant = ?2",
                [id, tenant],
                file_row,
            )
            .optional()
        })
    }

    /// Deletes file `id` of `tenant` and its chunks; whether it existed.
    pub fn delete_file(&self, tenant: &str, id: &str) -> Result<bool> {
        self.with(|c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let n = tx.execute(
                "DELETE FROM files WHERE id = ?1 AND tenant = ?2",
                [id, tenant],
            )?;
            if n > 0 {
                tx.execute("DELETE FROM file_chunks WHERE file = ?1", [id])?;
            }
            tx.commit()?;
            Ok(n > 0)
        })
    }

    /// The batch document `id` of `tenant`.
    pub fn batch(&self, tenant: &str, id: &str) -> Result<Option<String>> {
        self.with(|c| {
            c.query_row(
                "SELECT doc FROM batches WHERE id = ?1 AND tenant = ?2",
                [id, tenant],
                |r| r.get(0),
            )
            .optional()
        })
    }

    /// Batch documents of `tenant`, newest first, after the batch `after`, at most `limit`.
    pub fn batches(&self, tenant: &str, after: Option<&str>, limit: usize) -> Result<Vec<String>> {
        self.with(|c| {
            let mut st = c.prepare(
                "SELECT doc FROM batches WHERE tenant = ?1 AND (?2 IS NULL OR rowid < \
                 (SELECT rowid FROM batches WHERE id = ?2 AND tenant = ?1)) ORDER BY rowid DESC LIMIT ?3",
            )?;
            let rows = st.query_map(params![tenant, after, limit as i64], |r| r.get(0))?;
            rows.collect()
        })
    }

    /// `in_progress` → `cancelling` (document `doc`) and the queued lines cancelled, in one
    /// transaction; whether the batch was in progress.
    pub fn cancel_batch(&self, tenant: &str, id: &str, doc: &str) -> Result<bool> {
        self.with(|c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let n = tx.execute(
                "UPDATE batches SET doc = ?3, status = 'cancelling' \
                 WHERE id = ?1 AND tenant = ?2 AND status = 'in_progress'",
                params![id, tenant, doc],
            )?;
            if n > 0 {
                tx.execute(
                    "UPDATE jobs SET state = 'cancelled', finished = ?2 \
                     WHERE batch = ?1 AND state = 'queued'",
                    params![id, now() as i64],
                )?;
            }
            tx.commit()?;
            Ok(n > 0)
        })
    }

    /// Finalizes batch `id` (see [`super::Store::finalize`]) in one transaction.
    pub fn finalize(
        &self,
        id: &str,
        expected: &str,
        doc: &str,
        status: &str,
        files: &[(File, Vec<u8>)],
    ) -> Result<bool> {
        let t = now() as i64;
        self.with(|c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let open: bool = tx.query_row(
                "SELECT NOT EXISTS(SELECT 1 FROM jobs WHERE batch = ?1 AND state IN \
                 ('queued','running'))",
                [id],
                |r| r.get(0),
            )?;
            let tenant: Option<String> = tx
                .query_row(
                    "SELECT tenant FROM batches WHERE id = ?1 AND status = ?2",
                    [id, expected],
                    |r| r.get(0),
                )
                .optional()?;
            let Some(tenant) = tenant.filter(|_| open) else {
                return Ok(false);
            };
            for (f, content) in files {
                put_file(&tx, &tenant, f, content)?;
            }
            tx.execute(
                "UPDATE batches SET doc = ?2, status = ?3, finished = ?4 WHERE id = ?1",
                params![id, doc, status, t],
            )?;
            tx.commit()?;
            Ok(true)
        })
    }

    /// Stores a batch that failed validation (no lines).
    pub fn insert_failed_batch(&self, tenant: &str, id: &str, doc: &str) -> Result<()> {
        self.with(|c| {
            c.execute(
                "INSERT INTO batches(id, tenant, doc, status, created, finished) VALUES (?1,?2,?3,'failed',?4,?4)",
                params![id, tenant, doc, now() as i64],
            )
            .map(drop)
        })
    }

    /// `tenant`'s files newest first, after file `after`, of `purpose`, at most `limit`.
    pub fn files(
        &self,
        tenant: &str,
        after: Option<&str>,
        limit: usize,
        purpose: Option<&str>,
    ) -> Result<Vec<File>> {
        self.with(|c| {
            let mut st = c.prepare(
                "SELECT id, purpose, filename, bytes, created FROM files WHERE tenant = ?1 \
                 AND (?2 IS NULL OR rowid < (SELECT rowid FROM files WHERE id = ?2 AND tenant = ?1)) \
                 AND (?3 IS NULL OR purpose = ?3) ORDER BY rowid DESC LIMIT ?4",
            )?;
            let rows = st.query_map(params![tenant, after, purpose, limit as i64], file_row)?;
            rows.collect()
        })
    }

    /// Whether a line of batch `id` is queued or running (an index probe on `jobs_batch_state`).
    pub fn unfinished(&self, id: &str) -> Result<bool> {
        self.with(|c| {
            c.query_row(
                "SELECT EXISTS(SELECT 1 FROM jobs WHERE batch = ?1 AND state IN ('queued','running'))",
                [id],
                |r| r.get(0),
            )
        })
    }

    /// The line counts of batch `id`.
    pub fn counts(&self, id: &str) -> Result<Counts> {
        self.with(|c| {
            c.query_row(
                "SELECT COUNT(*), \
                 COALESCE(SUM(state = 'completed'), 0), COALESCE(SUM(state = 'failed'), 0), \
                 COALESCE(SUM(state IN ('queued','running')), 0) FROM jobs WHERE batch = ?1",
                [id],
                |r| {
                    let g = |i| r.get::<_, i64>(i).map(|v| v.max(0) as u64);
                    Ok(Counts {
                        total: g(0)?,
                        completed: g(1)?,
                        failed: g(2)?,
                        unfinished: g(3)?,
                    })
                },
            )
        })
    }

    /// The lines of batch `id` in input order.
    pub fn lines(&self, id: &str) -> Result<Vec<Line>> {
        self.with(|c| {
            let mut st = c.prepare(
                "SELECT id, custom_id, state, status, response FROM jobs WHERE batch = ?1 ORDER BY line",
            )?;
            let rows = st.query_map([id], |r| {
                Ok(Line {
                    id: r.get(0)?,
                    custom_id: r.get(1)?,
                    state: r.get(2)?,
                    status: r.get(3)?,
                    response: r.get(4)?,
                })
            })?;
            rows.collect()
        })
    }

    /// The tenant of batch `id`.
    pub fn batch_tenant(&self, id: &str) -> Result<Option<String>> {
        self.with(|c| {
            c.query_row("SELECT tenant FROM batches WHERE id = ?1", [id], |r| {
                r.get(0)
            })
            .optional()
        })
    }

    /// See [`super::Store::due_batches`]; `batches_due` indexes the `in_progress` ones by expiry.
    pub fn due_batches(&self, now: u64) -> Result<Vec<(String, String, String)>> {
        self.with(|c| {
            let mut st = c.prepare(
                "SELECT tenant, id, doc FROM batches WHERE status = 'in_progress' \
                 AND json_extract(doc, '$.expires_at') <= ?1 LIMIT ?2",
            )?;
            let rows = st.query_map(params![now as i64, super::DUE_BATCHES as i64], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })?;
            rows.collect()
        })
    }

    /// Batches not yet in a final status whose lines all finished: those to finalize after a
    /// crash (one query; batches still running are not read).
    pub fn settled_batches(&self) -> Result<Vec<String>> {
        self.with(|c| {
            let mut st = c.prepare(
                "SELECT id FROM batches b WHERE finished IS NULL AND NOT EXISTS \
                 (SELECT 1 FROM jobs WHERE batch = b.id AND state IN ('queued','running'))",
            )?;
            let rows = st.query_map([], |r| r.get(0))?;
            rows.collect()
        })
    }

    /// Deletes what finished (files: were created) before `before` (unix seconds); rows deleted.
    pub fn cleanup(&self, before: u64) -> Result<usize> {
        let b = before as i64;
        self.with(|c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let mut n = tx.execute(
                "DELETE FROM jobs WHERE finished IS NOT NULL AND finished < ?1 AND \
                 (batch IS NULL OR batch IN (SELECT id FROM batches WHERE finished IS NOT NULL AND finished < ?1))",
                [b],
            )?;
            n += tx.execute(
                "DELETE FROM batches WHERE finished IS NOT NULL AND finished < ?1",
                [b],
            )?;
            tx.execute(
                "DELETE FROM file_chunks WHERE file IN (SELECT id FROM files WHERE created < ?1)",
                [b],
            )?;
            n += tx.execute("DELETE FROM files WHERE created < ?1", [b])?;
            tx.commit()?;
            Ok(n)
        })
    }

    /// Seconds the oldest queued job has waited (0: none queued).
    pub fn oldest_queued(&self) -> Result<u64> {
        self.with(|c| {
            let t: Option<i64> = c.query_row(
                "SELECT MIN(created) FROM jobs WHERE state = 'queued'",
                [],
                |r| r.get(0),
            )?;
            Ok(t.map_or(0, |t| now().saturating_sub(t.max(0) as u64)))
        })
    }

    /// Jobs by (tenant, state), for `fairgate_jobs`.
    pub fn states(&self) -> Result<Vec<(String, JobState, u64)>> {
        self.with(|c| {
            let mut st =
                c.prepare("SELECT tenant, state, COUNT(*) FROM jobs GROUP BY tenant, state")?;
            let rows = st.query_map([], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get::<_, i64>(2)?.max(0) as u64))
            })?;
            rows.collect()
        })
    }
}

/// A file from a row of `id, purpose, filename, bytes, created`.
/// Inserts file `f` of `tenant` with `content` in chunks of [`CHUNK_BYTES`].
fn put_file(tx: &rusqlite::Transaction<'_>, tenant: &str, f: &File, content: &[u8]) -> Result<()> {
    tx.execute(
        "INSERT INTO files(id, tenant, purpose, filename, bytes, created, content) VALUES (?1,?2,?3,?4,?5,?6,x'')",
        params![f.id, tenant, f.purpose, f.filename, f.bytes as i64, f.created as i64],
    )?;
    for (seq, chunk) in content.chunks(CHUNK_BYTES).enumerate() {
        tx.execute(
            "INSERT INTO file_chunks(file, seq, data) VALUES (?1, ?2, ?3)",
            params![f.id, seq as i64, chunk],
        )?;
    }
    Ok(())
}

fn file_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<File> {
    Ok(File {
        id: r.get(0)?,
        purpose: r.get(1)?,
        filename: r.get(2)?,
        bytes: r.get::<_, i64>(3)?.max(0) as u64,
        created: r.get::<_, i64>(4)?.max(0) as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(id: &str) -> NewJob {
        NewJob {
            id: id.to_owned(),
            batch: None,
            method: "POST".into(),
            path: "/v1/chat/completions".into(),
            body: b"{}".to_vec(),
        }
    }

    #[test]
    fn reads_are_per_tenant_and_a_crash_requeues_what_was_running() {
        let dir = std::env::temp_dir().join(format!("fg-store-{:x}", rand::random::<u64>()));
        let path = dir.with_extension("sqlite");
        let s = Db::open(&path).unwrap();
        s.insert("a", &[job("j1"), job("j2")], None).unwrap();
        assert!(s.job("a", "j1").unwrap().is_some());
        assert!(s.job("b", "j1").unwrap().is_none(), "another tenant's id");
        assert_eq!(s.cancel("b", "j1").unwrap(), None);
        let claimed = s.claim("a", 1).unwrap();
        assert_eq!(claimed.len(), 1);
        assert!(s.finish(&claimed[0].id, 200, None, b"ok").unwrap());
        assert!(!s.finish(&claimed[0].id, 200, None, b"ok").unwrap(), "once");
        let running = s.claim("a", 5).unwrap();
        assert_eq!(running.len(), 1);
        drop(s);
        // Reopened: the finished job stays finished, the running one is queued again.
        let s = Db::open(&path).unwrap();
        assert_eq!(
            s.job("a", &claimed[0].id).unwrap().unwrap().state,
            JobState::Completed
        );
        assert_eq!(
            s.job("a", &running[0].id).unwrap().unwrap().state,
            JobState::Queued
        );
        assert_eq!(s.usage("a").unwrap().0, 1);
        assert!(s.cleanup(now() + 10).unwrap() >= 1);
        assert!(s.job("a", &claimed[0].id).unwrap().is_none(), "retention");
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn queued_tenants_and_unfinished_read_the_indexes_right() {
        let path =
            std::env::temp_dir().join(format!("fg-store-{:x}.sqlite", rand::random::<u64>()));
        let s = Db::open(&path).unwrap();
        let line = |id: &str, n: u32| NewJob {
            batch: Some(("b1".into(), n, id.into())),
            ..job(id)
        };
        s.insert("c", &[job("c1"), job("c2")], None).unwrap();
        s.insert("a", &[line("a1", 0), line("a2", 1)], None)
            .unwrap();
        s.insert("b", &[job("b1")], None).unwrap();
        assert_eq!(s.queued_tenants().unwrap(), ["a", "b", "c"]);
        let b = s.claim("b", 5).unwrap();
        assert_eq!(s.queued_tenants().unwrap(), ["a", "c"], "b has none queued");
        assert!(s.finish(&b[0].id, 200, None, b"ok").unwrap());
        assert!(s.unfinished("b1").unwrap());
        let a = s.claim("a", 5).unwrap();
        assert_eq!(s.queued_tenants().unwrap(), ["c"]);
        assert!(s.unfinished("b1").unwrap(), "running lines are unfinished");
        for j in &a {
            assert!(s.finish(&j.id, 200, None, b"ok").unwrap());
        }
        assert!(!s.unfinished("b1").unwrap());
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn only_batches_whose_lines_all_finished_are_settled() {
        let path =
            std::env::temp_dir().join(format!("fg-store-{:x}.sqlite", rand::random::<u64>()));
        let s = Db::open(&path).unwrap();
        let line = |id: &str, n: u32| NewJob {
            batch: Some(("b1".into(), n, id.into())),
            ..job(id)
        };
        let doc = Some(("b1", "{}"));
        s.insert("a", &[line("l1", 0), line("l2", 1)], doc).unwrap();
        assert!(s.settled_batches().unwrap().is_empty(), "two lines queued");
        let running = s.claim("a", 1).unwrap();
        assert!(s.finish(&running[0].id, 200, None, b"ok").unwrap());
        assert!(
            s.settled_batches().unwrap().is_empty(),
            "one line still queued"
        );
        let last = s.claim("a", 1).unwrap();
        assert!(s.settled_batches().unwrap().is_empty(), "one line running");
        assert!(s.finish(&last[0].id, 200, None, b"ok").unwrap());
        assert_eq!(s.settled_batches().unwrap(), ["b1"]);
        let _ = std::fs::remove_file(&path);
    }
}
