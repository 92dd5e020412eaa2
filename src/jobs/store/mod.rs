//! The job store: jobs (async requests and batch lines), files and batches, behind the trait
//! [`Store`] (async methods, held as `Arc<dyn Store>`) with two backends:
//!
//! - [`sqlite`]: one embedded SQLite file (`[jobs] path`), a single replica. Every call runs on
//!   tokio's blocking pool (`spawn_blocking`), never on an async worker thread. Claims hold
//!   while the process lives ([`Store::lease`] is `None`).
//! - [`redis`]: with `[cluster]`, the shared Redis of the replicas (`[jobs] path` is ignored).
//!   Any replica answers any job; a claimed job holds a lease (`[jobs] lease_ms`, Redis time)
//!   under a fencing token, renewed by its runner, reclaimed by any replica once expired.
//!
//! The runner asks the store, never the backend, whether claims are leases to renew.
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

/// What the jobs subsystem asks of a store, implemented by both backends ([`Sqlite`],
/// [`RedisStore`]) and checked against both by one contract test (`contract`). Held as
/// `Arc<dyn Store>`: the backend is chosen by the configuration at startup, so the methods are
/// object safe (`async_trait`: one boxed `Send` future a call, beside a blocking-pool hop or a
/// Redis round trip; the chat path never calls the store).
#[async_trait::async_trait]
pub trait Store: Send + Sync + std::fmt::Debug {
    /// How long a claim holds unless renewed ([`Store::renew`]); `None`: a claim holds as long
    /// as the process (SQLite: one process owns every claim, and what it ran when it died is
    /// queued again at the next open).
    fn lease(&self) -> Option<std::time::Duration>;

    /// (jobs queued or running, bytes stored) of `tenant`.
    async fn usage(&self, tenant: &TenantId) -> Result<(u64, u64)>;

    /// Inserts `jobs` of `tenant` at once, and the batch `(id, doc)` if any.
    async fn insert(
        &self,
        tenant: &TenantId,
        jobs: Vec<NewJob>,
        batch: Option<(String, String)>,
    ) -> Result<()>;

    /// The job `id` of `tenant` (not a batch line).
    async fn job(&self, tenant: &TenantId, id: &str) -> Result<Option<Job>>;

    /// Cancels the queued job `id` of `tenant`; its state after (`None`: no such job).
    async fn cancel(&self, tenant: &TenantId, id: &str) -> Result<Option<JobState>>;

    /// Tenants with queued jobs.
    async fn queued_tenants(&self) -> Result<Vec<TenantId>>;

    /// Claims up to `n` of `tenant`'s oldest queued jobs (each now `running` under a token).
    async fn claim(&self, tenant: &TenantId, n: usize) -> Result<Vec<Claimed>>;

    /// Extends the leases of the running `(id, token)` claims; how many were lost to a
    /// reclaim (finished ones are not counted; without leases, [`Store::lease`] `None`: 0).
    async fn renew(&self, claims: &[(String, u64)]) -> Result<usize>;

    /// Queues again the jobs whose lease expired (their replica died or stalled), after
    /// renewing the caller's `own` running claims in the same step (a replica never reclaims
    /// what it still runs); how many (without leases: 0, done once at open).
    async fn reclaim(&self, own: &[(String, u64)]) -> Result<usize>;

    /// Puts the job `id`, running under `token`, back in the queue (a transient refusal).
    async fn requeue(&self, id: &str, token: u64) -> Result<()>;

    /// Records the answer of job `id` if it is still running under `token`; whether it was
    /// recorded (`false`: a late completion, discarded).
    async fn finish(
        &self,
        id: &str,
        token: u64,
        status: u16,
        resp_type: Option<&str>,
        body: &[u8],
    ) -> Result<bool>;

    /// Stores chunk `seq` (of [`CHUNK_BYTES`]) of the file `id` being uploaded.
    async fn put_chunk(&self, id: &str, seq: u32, data: bytes::Bytes) -> Result<()>;

    /// Makes the uploaded file `f`, its chunks stored, one of `tenant`'s files.
    async fn commit_file(&self, tenant: &TenantId, f: &File) -> Result<()>;

    /// Drops the chunks of an upload that failed.
    async fn abort_file(&self, id: &str) -> Result<()>;

    /// Chunk `seq` of file `id` of `tenant` (`None`: past its end, or no such file). A file
    /// stored whole by an earlier version is its one chunk 0.
    async fn file_chunk(
        &self,
        tenant: &TenantId,
        id: &str,
        seq: u32,
    ) -> Result<Option<bytes::Bytes>>;

    /// The file `id` of `tenant`.
    async fn file(&self, tenant: &TenantId, id: &str) -> Result<Option<File>>;

    /// Deletes file `id` of `tenant`; whether it existed.
    async fn delete_file(&self, tenant: &TenantId, id: &str) -> Result<bool>;

    /// The batch document `id` of `tenant`.
    async fn batch(&self, tenant: &TenantId, id: &str) -> Result<Option<String>>;

    /// Batch documents of `tenant`, newest first, after the batch `after`, at most `limit`.
    async fn batches(
        &self,
        tenant: &TenantId,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<String>>;

    /// Moves batch `id` of `tenant` from `in_progress` to `cancelling` (document `doc`) and
    /// cancels its queued lines, at once; whether it was in progress.
    async fn cancel_batch(&self, tenant: &TenantId, id: &str, doc: &str) -> Result<bool>;

    /// Stores a batch that failed validation (no lines).
    async fn insert_failed_batch(&self, tenant: &TenantId, id: &str, doc: &str) -> Result<()>;

    /// The line counts of batch `id`.
    async fn counts(&self, id: &str) -> Result<Counts>;

    /// `tenant`'s files, newest first, after file `after`, of `purpose`, at most `limit`.
    async fn files(
        &self,
        tenant: &TenantId,
        after: Option<&str>,
        limit: usize,
        purpose: Option<&str>,
    ) -> Result<Vec<File>>;

    /// Whether a line of batch `id` is still queued or running (what finalizing waits for;
    /// one index probe where the backend has one, where [`Store::counts`] reads every line).
    async fn unfinished(&self, id: &str) -> Result<bool>;

    /// The lines of batch `id` in input order.
    async fn lines(&self, id: &str) -> Result<Vec<Line>>;

    /// The tenant of batch `id`.
    async fn batch_tenant(&self, id: &str) -> Result<Option<String>>;

    /// (tenant, id, doc) of `in_progress` batches whose `expires_at` is at or before `now`, at
    /// most [`DUE_BATCHES`] a call: one query by expiry, not a read of every open batch.
    async fn due_batches(&self, now: u64) -> Result<Vec<(String, String, String)>>;

    /// Batches not yet in a final status whose lines all finished (what a crash or a dead
    /// replica left unfinalized).
    async fn settled_batches(&self) -> Result<Vec<String>>;

    /// Finalizes batch `id` if its status is still `expected` and no line is unfinished: stores
    /// `files` (of the batch's tenant) and the final `doc` with `status`, atomically; whether
    /// this call did it (`false`: another call or replica did, or a line is unfinished).
    async fn finalize(
        &self,
        id: &str,
        expected: &str,
        doc: &str,
        status: &str,
        files: Vec<(File, Vec<u8>)>,
    ) -> Result<bool>;

    /// Deletes what finished (files: were created) before `before` (unix seconds).
    async fn cleanup(&self, before: u64) -> Result<usize>;

    /// Seconds the oldest queued job has waited (0: none queued).
    async fn oldest_queued(&self) -> Result<u64>;

    /// Jobs by (tenant, state), for `fairgate_jobs`.
    async fn states(&self) -> Result<Vec<(String, JobState, u64)>>;
}
