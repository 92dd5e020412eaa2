//! The job store: jobs (async requests and batch lines), files and batches, behind one
//! [`Store`] with async methods and two backends:
//!
//! - [`sqlite`]: one embedded SQLite file (`[jobs] path`), a single replica. Every call runs on
//!   tokio's blocking pool (`spawn_blocking`), never on an async worker thread.
//! - [`redis`]: with `[cluster]`, the shared Redis of the replicas (`[jobs] path` is ignored).
//!   Any replica answers any job; a claimed job holds a lease (`[jobs] lease_ms`, Redis time)
//!   under a fencing token, renewed by its runner, reclaimed by any replica once expired.
//!
//! Invariants (both backends): every read by id filters on the tenant (another tenant's id
//! reads as absent); a job moves `queued → running → completed | failed` (or `cancelled` from
//! `queued`, or back to `queued` when its runner gave up or its lease expired); an answer is
//! recorded only while the job is `running` under the token it was claimed with, so a late
//! completion (a replica whose lease expired, a process that crashed) is discarded, never
//! recorded twice; a batch is finalized (its output and error files written) by one
//! compare-and-set on its status, exactly once whichever replica finishes its last line.

#[cfg(test)]
mod contract;
pub mod redis;
pub mod sqlite;

use std::sync::Arc;

use crate::domain::TenantId;

pub use self::redis::{Redis, RedisStore};
pub use sqlite::Sqlite;

/// Why a store call failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The SQLite file refused the call.
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// Redis was unreachable, too slow, or refused the script (logged by the link).
    #[error("the shared job store (Redis) did not answer")]
    Redis,
    /// A reply of an unexpected shape (a script and its caller disagree).
    #[error("the shared job store answered in an unexpected shape")]
    Shape,
    /// A tenant limit checked inside the store (Redis: atomically, cluster-wide).
    #[error("{what} limit reached ({limit})")]
    Limit {
        /// Which limit.
        what: &'static str,
        /// Its value.
        limit: u64,
    },
    /// The blocking task running the call panicked or was cancelled.
    #[error("job store task failed")]
    Task,
}

/// Bytes of one stored file chunk (and of the buffer an upload fills before writing one).
pub const CHUNK_BYTES: usize = 256 * 1024;

/// Store results.
pub type Result<T> = std::result::Result<T, StoreError>;

/// Most batches one [`Store::due_batches`] call returns.
pub const DUE_BATCHES: usize = 1000;

/// The state a job is in (stored by its name, [`JobState::as_str`]; a stored name that is
/// none of these is a corrupt record: an error, never a default).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum JobState {
    /// Waiting for a runner.
    Queued,
    /// Claimed by a runner and sent through the stack.
    Running,
    /// Answered 2xx.
    Completed,
    /// Answered anything else.
    Failed,
    /// Cancelled before it ran.
    Cancelled,
}

impl JobState {
    /// Every state, in the order `fairgate_jobs` lists them.
    pub const ALL: [JobState; 5] = [
        JobState::Queued,
        JobState::Running,
        JobState::Completed,
        JobState::Failed,
        JobState::Cancelled,
    ];

    /// The stored (and shown) name.
    pub const fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Running => "running",
            JobState::Completed => "completed",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
        }
    }

    /// The state named `name`, if any.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == name)
    }

    /// The state a job's answer with HTTP `status` leaves it in.
    pub fn answered(status: u16) -> Self {
        if (200..300).contains(&status) {
            JobState::Completed
        } else {
            JobState::Failed
        }
    }

    /// Whether the job has its answer (completed or failed).
    pub fn answered_yet(self) -> bool {
        matches!(self, JobState::Completed | JobState::Failed)
    }
}

impl std::fmt::Display for JobState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl rusqlite::types::FromSql for JobState {
    fn column_result(v: rusqlite::types::ValueRef<'_>) -> rusqlite::types::FromSqlResult<Self> {
        let name = v.as_str()?;
        JobState::parse(name).ok_or_else(|| {
            rusqlite::types::FromSqlError::Other(format!("no job state {name:?}").into())
        })
    }
}

/// A job to insert.
#[derive(Debug, Clone)]
pub struct NewJob {
    /// Its id.
    pub id: String,
    /// Batch and line (0-based) and custom id, for a batch line.
    pub batch: Option<(String, u32, String)>,
    /// `POST`.
    pub method: String,
    /// The proxied path.
    pub path: String,
    /// The JSON body.
    pub body: Vec<u8>,
}

/// A stored job.
#[derive(Debug, Clone)]
pub struct Job {
    /// Its state.
    pub state: JobState,
    /// The answer's status, once finished.
    pub status: Option<u16>,
    /// The answer's content type.
    pub resp_type: Option<String>,
    /// The answer's body.
    pub response: Option<Vec<u8>>,
}

/// A job a runner has claimed.
#[derive(Debug, Clone)]
pub struct Claimed {
    /// Its id.
    pub id: String,
    /// The fencing token of this claim (SQLite: 0, one process owns every claim).
    pub token: u64,
    /// Its tenant.
    pub tenant: TenantId,
    /// Its batch, if a batch line.
    pub batch: Option<String>,
    /// Method.
    pub method: String,
    /// Path.
    pub path: String,
    /// Body.
    pub body: Vec<u8>,
}

/// A stored file's metadata.
#[derive(Debug, Clone)]
pub struct File {
    /// Id.
    pub id: String,
    /// Purpose.
    pub purpose: String,
    /// Name.
    pub filename: String,
    /// Size.
    pub bytes: u64,
    /// Created (unix seconds).
    pub created: u64,
}

/// A batch line's outcome, for the output and error files.
#[derive(Debug, Clone)]
pub struct Line {
    /// Job id.
    pub id: String,
    /// The client's `custom_id`.
    pub custom_id: String,
    /// State.
    pub state: JobState,
    /// Status.
    pub status: Option<u16>,
    /// Body.
    pub response: Option<Vec<u8>>,
}

/// A batch's line counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Lines.
    pub total: u64,
    /// Answered 2xx.
    pub completed: u64,
    /// Answered otherwise.
    pub failed: u64,
    /// Queued or running.
    pub unfinished: u64,
}

/// Unix seconds now (this replica's clock: creation and retention stamps only; leases use
/// Redis time).
pub fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The store: one of the two backends.
#[derive(Debug, Clone)]
pub enum Store {
    /// The embedded SQLite file.
    Sqlite(Arc<Sqlite>),
    /// The cluster's Redis.
    Redis(RedisStore),
}

/// Runs `f` on the SQLite store on the blocking pool.
async fn blocking<T: Send + 'static>(
    s: &Arc<Sqlite>,
    f: impl FnOnce(&Sqlite) -> rusqlite::Result<T> + Send + 'static,
) -> Result<T> {
    let s = s.clone();
    match tokio::task::spawn_blocking(move || f(&s)).await {
        Ok(r) => r.map_err(StoreError::from),
        Err(_) => Err(StoreError::Task),
    }
}

/// Dispatches one call to the backend: `$s` is bound to the SQLite store (inside a blocking
/// task, arguments moved in) or to the Redis store.
macro_rules! dispatch {
    ($self:ident, |$s:ident| $sq:expr, |$r:ident| $re:expr) => {
        match $self {
            Store::Sqlite(db) => blocking(db, move |$s| $sq).await,
            Store::Redis($r) => $re.await,
        }
    };
}

impl Store {
    /// (jobs queued or running, bytes stored) of `tenant`.
    pub async fn usage(&self, tenant: &TenantId) -> Result<(u64, u64)> {
        let t = tenant.as_str().to_owned();
        dispatch!(self, |s| s.usage(&t), |r| r.usage(tenant.as_str()))
    }

    /// Inserts `jobs` of `tenant` at once, and the batch `(id, doc)` if any.
    pub async fn insert(
        &self,
        tenant: &TenantId,
        jobs: Vec<NewJob>,
        batch: Option<(String, String)>,
    ) -> Result<()> {
        let t = tenant.as_str().to_owned();
        match self {
            Store::Sqlite(db) => {
                blocking(db, move |s| {
                    let b = batch.as_ref().map(|(i, d)| (i.as_str(), d.as_str()));
                    s.insert(&t, &jobs, b)
                })
                .await
            }
            Store::Redis(r) => r.insert(tenant.as_str(), &jobs, batch).await,
        }
    }

    /// The job `id` of `tenant` (not a batch line).
    pub async fn job(&self, tenant: &TenantId, id: &str) -> Result<Option<Job>> {
        let (t, i) = (tenant.as_str().to_owned(), id.to_owned());
        dispatch!(self, |s| s.job(&t, &i), |r| r.job(tenant.as_str(), id))
    }

    /// Cancels the queued job `id` of `tenant`; its state after (`None`: no such job).
    pub async fn cancel(&self, tenant: &TenantId, id: &str) -> Result<Option<JobState>> {
        let (t, i) = (tenant.as_str().to_owned(), id.to_owned());
        dispatch!(self, |s| s.cancel(&t, &i), |r| r
            .cancel(tenant.as_str(), id))
    }

    /// Tenants with queued jobs.
    pub async fn queued_tenants(&self) -> Result<Vec<TenantId>> {
        let names: Vec<String> = dispatch!(self, |s| s.queued_tenants(), |r| r.queued_tenants())?;
        Ok(names.into_iter().map(TenantId::new).collect())
    }

    /// Claims up to `n` of `tenant`'s oldest queued jobs (each now `running` under a token).
    pub async fn claim(&self, tenant: &TenantId, n: usize) -> Result<Vec<Claimed>> {
        let t = tenant.as_str().to_owned();
        dispatch!(self, |s| s.claim(&t, n), |r| r.claim(tenant.as_str(), n))
    }

    /// Extends the leases of the running `(id, token)` claims; how many were lost to a
    /// reclaim (finished ones are not counted; SQLite: claims hold until the process ends, 0).
    pub async fn renew(&self, claims: &[(String, u64)]) -> Result<usize> {
        match self {
            Store::Sqlite(_) => Ok(0),
            Store::Redis(r) => r.renew(claims).await,
        }
    }

    /// Queues again the jobs whose lease expired (their replica died or stalled), after
    /// renewing the caller's `own` running claims in the same step (a replica never reclaims
    /// what it still runs); how many (SQLite: done once at open, 0).
    pub async fn reclaim(&self, own: &[(String, u64)]) -> Result<usize> {
        match self {
            Store::Sqlite(_) => Ok(0),
            Store::Redis(r) => r.reclaim(own).await,
        }
    }

    /// Puts the job `id`, running under `token`, back in the queue (a transient refusal).
    pub async fn requeue(&self, id: &str, token: u64) -> Result<()> {
        let i = id.to_owned();
        dispatch!(self, |s| s.requeue(&i), |r| r.requeue(id, token))
    }

    /// Records the answer of job `id` if it is still running under `token`; whether it was
    /// recorded (`false`: a late completion, discarded).
    pub async fn finish(
        &self,
        id: &str,
        token: u64,
        status: u16,
        resp_type: Option<&str>,
        body: &[u8],
    ) -> Result<bool> {
        match self {
            Store::Sqlite(db) => {
                let (i, t, b) = (id.to_owned(), resp_type.map(str::to_owned), body.to_vec());
                blocking(db, move |s| s.finish(&i, status, t.as_deref(), &b)).await
            }
            Store::Redis(r) => r.finish(id, token, status, resp_type, body).await,
        }
    }

    /// Stores chunk `seq` (of [`CHUNK_BYTES`]) of the file `id` being uploaded.
    pub async fn put_chunk(&self, id: &str, seq: u32, data: bytes::Bytes) -> Result<()> {
        let i = id.to_owned();
        match self {
            Store::Sqlite(db) => blocking(db, move |s| s.put_chunk(&i, seq, &data)).await,
            Store::Redis(r) => r.put_chunk(id, seq, &data).await,
        }
    }

    /// Makes the uploaded file `f`, its chunks stored, one of `tenant`'s files.
    pub async fn commit_file(&self, tenant: &TenantId, f: &File) -> Result<()> {
        let (t, f) = (tenant.as_str().to_owned(), f.clone());
        match self {
            Store::Sqlite(db) => blocking(db, move |s| s.commit_file(&t, &f)).await,
            Store::Redis(r) => r.commit_file(tenant.as_str(), &f).await,
        }
    }

    /// Drops the chunks of an upload that failed.
    pub async fn abort_file(&self, id: &str) -> Result<()> {
        let i = id.to_owned();
        match self {
            Store::Sqlite(db) => blocking(db, move |s| s.abort_file(&i)).await,
            Store::Redis(r) => r.abort_file(id).await,
        }
    }

    /// Chunk `seq` of file `id` of `tenant` (`None`: past its end, or no such file). A file
    /// stored whole by an earlier version is its one chunk 0.
    pub async fn file_chunk(
        &self,
        tenant: &TenantId,
        id: &str,
        seq: u32,
    ) -> Result<Option<bytes::Bytes>> {
        let (t, i) = (tenant.as_str().to_owned(), id.to_owned());
        let chunk = dispatch!(self, |s| s.file_chunk(&t, &i, seq), |r| r.file_chunk(
            tenant.as_str(),
            id,
            seq
        ))?;
        Ok(chunk.map(bytes::Bytes::from))
    }

    /// The file `id` of `tenant`.
    pub async fn file(&self, tenant: &TenantId, id: &str) -> Result<Option<File>> {
        let (t, i) = (tenant.as_str().to_owned(), id.to_owned());
        dispatch!(self, |s| s.file(&t, &i), |r| r.file(tenant.as_str(), id))
    }

    /// Deletes file `id` of `tenant`; whether it existed.
    pub async fn delete_file(&self, tenant: &TenantId, id: &str) -> Result<bool> {
        let (t, i) = (tenant.as_str().to_owned(), id.to_owned());
        dispatch!(self, |s| s.delete_file(&t, &i), |r| r
            .delete_file(tenant.as_str(), id))
    }

    /// The batch document `id` of `tenant`.
    pub async fn batch(&self, tenant: &TenantId, id: &str) -> Result<Option<String>> {
        let (t, i) = (tenant.as_str().to_owned(), id.to_owned());
        dispatch!(self, |s| s.batch(&t, &i), |r| r.batch(tenant.as_str(), id))
    }

    /// Batch documents of `tenant`, newest first, after the batch `after`, at most `limit`.
    pub async fn batches(
        &self,
        tenant: &TenantId,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<String>> {
        let (t, a) = (tenant.as_str().to_owned(), after.map(str::to_owned));
        dispatch!(self, |s| s.batches(&t, a.as_deref(), limit), |r| r.batches(
            tenant.as_str(),
            after,
            limit
        ))
    }

    /// Moves batch `id` of `tenant` from `in_progress` to `cancelling` (document `doc`) and
    /// cancels its queued lines, at once; whether it was in progress.
    pub async fn cancel_batch(&self, tenant: &TenantId, id: &str, doc: &str) -> Result<bool> {
        let (t, i, d) = (tenant.as_str().to_owned(), id.to_owned(), doc.to_owned());
        dispatch!(self, |s| s.cancel_batch(&t, &i, &d), |r| r.cancel_batch(
            tenant.as_str(),
            id,
            doc
        ))
    }

    /// Stores a batch that failed validation (no lines).
    pub async fn insert_failed_batch(&self, tenant: &TenantId, id: &str, doc: &str) -> Result<()> {
        let (t, i, d) = (tenant.as_str().to_owned(), id.to_owned(), doc.to_owned());
        dispatch!(self, |s| s.insert_failed_batch(&t, &i, &d), |r| r
            .insert_failed_batch(tenant.as_str(), id, doc))
    }

    /// The line counts of batch `id`.
    pub async fn counts(&self, id: &str) -> Result<Counts> {
        let i = id.to_owned();
        dispatch!(self, |s| s.counts(&i), |r| r.counts(id))
    }

    /// `tenant`'s files, newest first, after file `after`, of `purpose`, at most `limit`.
    pub async fn files(
        &self,
        tenant: &TenantId,
        after: Option<&str>,
        limit: usize,
        purpose: Option<&str>,
    ) -> Result<Vec<File>> {
        let (t, a, p) = (
            tenant.as_str().to_owned(),
            after.map(str::to_owned),
            purpose.map(str::to_owned),
        );
        dispatch!(
            self,
            |s| s.files(&t, a.as_deref(), limit, p.as_deref()),
            |r| r.files(tenant.as_str(), after, limit, purpose)
        )
    }

    /// Whether a line of batch `id` is still queued or running (what finalizing waits for;
    /// one index probe, where [`Store::counts`] reads every line of the batch).
    pub async fn unfinished(&self, id: &str) -> Result<bool> {
        let i = id.to_owned();
        dispatch!(self, |s| s.unfinished(&i), |r| async {
            Ok::<_, StoreError>(r.counts(id).await?.unfinished > 0)
        })
    }

    /// The lines of batch `id` in input order.
    pub async fn lines(&self, id: &str) -> Result<Vec<Line>> {
        let i = id.to_owned();
        dispatch!(self, |s| s.lines(&i), |r| r.lines(id))
    }

    /// The tenant of batch `id`.
    pub async fn batch_tenant(&self, id: &str) -> Result<Option<String>> {
        let i = id.to_owned();
        dispatch!(self, |s| s.batch_tenant(&i), |r| r.batch_tenant(id))
    }

    /// (tenant, id, doc) of `in_progress` batches whose `expires_at` is at or before `now`, at
    /// most [`DUE_BATCHES`] a call: one query by expiry, not a read of every open batch.
    pub async fn due_batches(&self, now: u64) -> Result<Vec<(String, String, String)>> {
        dispatch!(self, |s| s.due_batches(now), |r| r.due_batches(now))
    }

    /// Batches not yet in a final status whose lines all finished (what a crash or a dead
    /// replica left unfinalized).
    pub async fn settled_batches(&self) -> Result<Vec<String>> {
        dispatch!(self, |s| s.settled_batches(), |r| r.settled_batches())
    }

    /// Finalizes batch `id` if its status is still `expected` and no line is unfinished: stores
    /// `files` (of the batch's tenant) and the final `doc` with `status`, atomically; whether
    /// this call did it (`false`: another call or replica did, or a line is unfinished).
    pub async fn finalize(
        &self,
        id: &str,
        expected: &str,
        doc: &str,
        status: &str,
        files: Vec<(File, Vec<u8>)>,
    ) -> Result<bool> {
        match self {
            Store::Sqlite(db) => {
                let (i, e, d, st) = (
                    id.to_owned(),
                    expected.to_owned(),
                    doc.to_owned(),
                    status.to_owned(),
                );
                blocking(db, move |s| s.finalize(&i, &e, &d, &st, &files)).await
            }
            Store::Redis(r) => r.finalize(id, expected, doc, status, &files).await,
        }
    }

    /// Deletes what finished (files: were created) before `before` (unix seconds).
    pub async fn cleanup(&self, before: u64) -> Result<usize> {
        dispatch!(self, |s| s.cleanup(before), |r| r.cleanup(before))
    }

    /// Seconds the oldest queued job has waited (0: none queued).
    pub async fn oldest_queued(&self) -> Result<u64> {
        dispatch!(self, |s| s.oldest_queued(), |r| r.oldest_queued())
    }

    /// Jobs by (tenant, state), for `fairgate_jobs`.
    pub async fn states(&self) -> Result<Vec<(String, JobState, u64)>> {
        dispatch!(self, |s| s.states(), |r| r.states())
    }
}
