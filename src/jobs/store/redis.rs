//! The Redis backend (with `[cluster]`): jobs, files and batches in the replicas' shared Redis,
//! so any replica answers any job and runs any queued line.
//!
//! A claim moves a job from its tenant's queue to the running set with a fresh fencing token
//! (a counter) and a lease expiring at Redis time + `[jobs] lease_ms`; the claiming runner
//! renews its leases every `lease_ms / 3`, and again in the same script that reclaims, so a
//! replica never reclaims its own running lines; any replica's runner queues again the jobs
//! whose lease expired on another (it died, stalled past the lease, or lost Redis). An answer
//! is recorded only while the job is running under the token it was claimed with: a late
//! completion of a claim that was reclaimed is discarded (and counted,
//! `fairgate_jobs_late_total`), never recorded twice.
//!
//! Invariants: every multi-key update is one Lua script ([`scripts`]), using Redis `TIME` for
//! leases (never a replica's clock); the per-tenant counters behind
//! `max_queued_jobs_per_tenant` and `max_stored_bytes_per_tenant` live in Redis and are checked
//! inside the inserting script, so the limits hold across replicas; a batch is finalized by
//! one compare-and-set on its status. The store reaches Redis only through [`Redis`] (the
//! cluster's link implements it), so this stage imports nothing from `cluster`.
//!
//! Durability is Redis's: what Redis loses on a crash (without AOF `appendfsync always`, the
//! last second or the writes since the last RDB snapshot) jobs lose too; see docs/jobs.md.

pub mod scripts;
#[cfg(test)]
pub(crate) mod test_server;
#[cfg(test)]
mod tests;

use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use redis::{Script, ScriptInvocation, Value};

use bytes::Bytes;

use super::{now, Claimed, Counts, File, Job, JobState, Line, NewJob, Result, Store, StoreError};
use crate::domain::TenantId;

/// Seconds an upload's chunks live without a new one before it is committed (a replica that
/// died mid-upload leaves them at most this long).
const UPLOAD_TTL_S: u64 = 3600;

/// Reclaimed jobs per call (a dead replica's claims come back over a few ticks).
const RECLAIM_BATCH: usize = 1000;

/// Retention entries deleted per cleanup script.
const CLEANUP_BATCH: usize = 1000;

/// Cleanup scripts per housekeeping round (once a minute per replica): up to 100,000 entries.
const CLEANUP_STEPS: usize = 100;

/// A connection to Redis that runs scripts (implemented by `cluster::Link`, with its timeouts
/// and degraded mode).
pub trait Redis: Send + Sync + Debug {
    /// A key under the cluster's hash-tagged prefix.
    fn key(&self, parts: &[&str]) -> String;
    /// Runs a script; `None` when Redis did not answer or refused (the link logs why).
    fn eval<'a>(
        &'a self,
        inv: &'a ScriptInvocation<'a>,
    ) -> Pin<Box<dyn Future<Output = Option<Value>> + Send + 'a>>;
    /// Runs a script on the request path (`cluster::Link`: within `[cluster] timeout_ms`, not
    /// the job store's longer timeout); by default as [`Redis::eval`].
    fn eval_fast<'a>(
        &'a self,
        inv: &'a ScriptInvocation<'a>,
    ) -> Pin<Box<dyn Future<Output = Option<Value>> + Send + 'a>> {
        self.eval(inv)
    }
}

/// The Redis job store (cheap to clone).
#[derive(Debug, Clone)]
pub struct RedisStore {
    redis: Arc<dyn Redis>,
    base: String,
    lease_ms: u64,
    max_inflight: usize,
    max_jobs: u64,
    max_bytes: u64,
}

/// One script argument.
fn a(v: impl ToString) -> Vec<u8> {
    v.to_string().into_bytes()
}

fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        Value::SimpleString(s) => s.parse().ok(),
        _ => None,
    }
}

fn uint(v: &Value) -> u64 {
    int(v).unwrap_or(0).max(0) as u64
}

fn bytes(v: Value) -> Option<Vec<u8>> {
    match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.into_bytes()),
        _ => None,
    }
}

fn string(v: Value) -> Option<String> {
    bytes(v).and_then(|b| String::from_utf8(b).ok())
}

/// A string that is absent when empty (the scripts store `None` as '').
fn opt(v: Value) -> Option<String> {
    string(v).filter(|s| !s.is_empty())
}

fn array(v: Value) -> Result<Vec<Value>> {
    match v {
        Value::Array(a) => Ok(a),
        Value::Nil => Ok(Vec::new()),
        _ => Err(StoreError::Shape),
    }
}

/// The `n` fields of an array reply (missing ones `Nil`).
fn fields<const N: usize>(v: Value) -> Result<[Value; N]> {
    let mut a = array(v)?;
    a.resize(N, Value::Nil);
    a.try_into().map_err(|_| StoreError::Shape)
}

/// A stored job state; a name that is no state is a corrupt record.
fn job_state(v: Value) -> Result<JobState> {
    string(v)
        .as_deref()
        .and_then(JobState::parse)
        .ok_or(StoreError::Shape)
}

fn strings(v: Value) -> Result<Vec<String>> {
    Ok(array(v)?.into_iter().filter_map(string).collect())
}

impl RedisStore {
    /// The store on `redis` (keys under `{prefix}:jobs`), leases of `lease_ms`, the tenant
    /// limits of `config`.
    pub fn new(redis: Arc<dyn Redis>, config: &crate::config::JobsConfig) -> Self {
        let base = redis.key(&["jobs"]);
        Self {
            redis,
            base,
            lease_ms: config.lease_ms,
            max_inflight: config.max_inflight_per_tenant,
            max_jobs: config.max_queued_jobs_per_tenant,
            max_bytes: config.max_stored_bytes_per_tenant,
        }
    }

    async fn call(&self, script: &Script, args: &[Vec<u8>]) -> Result<Value> {
        let mut inv = script.key(&self.base);
        for arg in args {
            inv.arg(arg.as_slice());
        }
        self.redis.eval(&inv).await.ok_or(StoreError::Redis)
    }
}

#[async_trait::async_trait]
impl Store for RedisStore {
    fn lease(&self) -> Option<std::time::Duration> {
        Some(std::time::Duration::from_millis(self.lease_ms))
    }

    async fn usage(&self, tenant: &TenantId) -> Result<(u64, u64)> {
        let [n, b] = fields(self.call(&scripts::USAGE, &[a(tenant)]).await?)?;
        Ok((uint(&n), uint(&b)))
    }

    async fn insert(
        &self,
        tenant: &TenantId,
        jobs: Vec<NewJob>,
        batch: Option<(String, String)>,
    ) -> Result<()> {
        let (bid, doc) = batch.unwrap_or_default();
        let mut args = vec![
            a(tenant),
            a(now()),
            a(bid),
            a(doc),
            a(self.max_jobs),
            a(self.max_bytes),
        ];
        for j in jobs {
            let (line, cid) = match &j.batch {
                Some((_, l, cid)) => (a(l), a(cid)),
                None => (Vec::new(), Vec::new()),
            };
            args.extend([a(&j.id), line, cid, a(&j.method), a(&j.path), j.body]);
        }
        match int(&self.call(&scripts::INSERT, &args).await?) {
            Some(-1) => Err(StoreError::Limit {
                what: "queued jobs (max_queued_jobs_per_tenant)",
                limit: self.max_jobs,
            }),
            Some(-2) => Err(StoreError::Limit {
                what: "stored bytes (max_stored_bytes_per_tenant)",
                limit: self.max_bytes,
            }),
            Some(_) => Ok(()),
            None => Err(StoreError::Shape),
        }
    }

    async fn job(&self, tenant: &TenantId, id: &str) -> Result<Option<Job>> {
        let v = self.call(&scripts::JOB, &[a(tenant), a(id)]).await?;
        if v == Value::Nil {
            return Ok(None);
        }
        let [state, status, resp_type, response] = fields(v)?;
        Ok(Some(Job {
            state: job_state(state)?,
            status: int(&status).map(|s| s as u16),
            resp_type: opt(resp_type),
            response: bytes(response),
        }))
    }

    async fn cancel(&self, tenant: &TenantId, id: &str) -> Result<Option<JobState>> {
        let args = [a(tenant), a(id), a(now())];
        match self.call(&scripts::CANCEL, &args).await? {
            Value::Nil => Ok(None),
            v => job_state(v).map(Some),
        }
    }

    async fn queued_tenants(&self) -> Result<Vec<TenantId>> {
        let names = strings(self.call(&scripts::TENANTS, &[]).await?)?;
        Ok(names.into_iter().map(TenantId::new).collect())
    }

    async fn claim(&self, tenant: &TenantId, n: usize) -> Result<Vec<Claimed>> {
        let args = [a(tenant), a(n), a(self.lease_ms), a(self.max_inflight)];
        let rows = array(self.call(&scripts::CLAIM, &args).await?)?;
        rows.into_iter()
            .map(|row| {
                let [id, token, batch, method, path, body] = fields(row)?;
                Ok(Claimed {
                    id: string(id).ok_or(StoreError::Shape)?,
                    token: uint(&token),
                    tenant: tenant.clone(),
                    batch: opt(batch),
                    method: string(method).ok_or(StoreError::Shape)?,
                    path: string(path).ok_or(StoreError::Shape)?,
                    body: bytes(body).unwrap_or_default(),
                })
            })
            .collect()
    }

    async fn renew(&self, claims: &[(String, u64)]) -> Result<usize> {
        if claims.is_empty() {
            return Ok(0);
        }
        let mut args = vec![a(self.lease_ms)];
        for (id, token) in claims {
            args.extend([a(id), a(token)]);
        }
        Ok(uint(&self.call(&scripts::RENEW, &args).await?) as usize)
    }

    async fn reclaim(&self, own: &[(String, u64)]) -> Result<usize> {
        let mut args = vec![a(RECLAIM_BATCH), a(self.lease_ms)];
        for (id, token) in own {
            args.extend([a(id), a(token)]);
        }
        let v = self.call(&scripts::RECLAIM, &args).await?;
        Ok(uint(&v) as usize)
    }

    async fn requeue(&self, id: &str, token: u64) -> Result<()> {
        self.call(&scripts::REQUEUE, &[a(id), a(token)]).await?;
        Ok(())
    }

    async fn finish(
        &self,
        id: &str,
        token: u64,
        status: u16,
        resp_type: Option<&str>,
        body: &[u8],
    ) -> Result<bool> {
        let st = JobState::answered(status).as_str();
        let args = [
            a(id),
            a(token),
            a(status),
            a(st),
            a(resp_type.unwrap_or("")),
            body.to_vec(),
            a(now()),
        ];
        Ok(int(&self.call(&scripts::FINISH, &args).await?) == Some(1))
    }

    async fn put_chunk(&self, id: &str, seq: u32, data: Bytes) -> Result<()> {
        let args = [a(id), a(seq), data.to_vec(), a(UPLOAD_TTL_S)];
        self.call(&scripts::CHUNK_PUT, &args).await?;
        Ok(())
    }

    async fn commit_file(&self, tenant: &TenantId, f: &File) -> Result<()> {
        let args = [
            a(tenant),
            a(&f.id),
            a(&f.purpose),
            a(&f.filename),
            a(f.bytes),
            a(f.created),
            a(self.max_bytes),
        ];
        match int(&self.call(&scripts::FILE_COMMIT, &args).await?) {
            Some(-2) => Err(StoreError::Limit {
                what: "stored bytes (max_stored_bytes_per_tenant)",
                limit: self.max_bytes,
            }),
            _ => Ok(()),
        }
    }

    async fn abort_file(&self, id: &str) -> Result<()> {
        self.call(&scripts::CHUNK_ABORT, &[a(id)]).await?;
        Ok(())
    }

    async fn file_chunk(&self, tenant: &TenantId, id: &str, seq: u32) -> Result<Option<Bytes>> {
        let v = self
            .call(&scripts::CHUNK_GET, &[a(tenant), a(id), a(seq)])
            .await?;
        Ok(array(v)?
            .into_iter()
            .next()
            .and_then(bytes)
            .map(Bytes::from))
    }

    async fn file(&self, tenant: &TenantId, id: &str) -> Result<Option<File>> {
        let v = self.call(&scripts::FILE_GET, &[a(tenant), a(id)]).await?;
        if v == Value::Nil {
            return Ok(None);
        }
        let [purpose, filename, size, created] = fields(v)?;
        Ok(Some(File {
            id: id.to_owned(),
            purpose: string(purpose).unwrap_or_default(),
            filename: string(filename).unwrap_or_default(),
            bytes: uint(&size),
            created: uint(&created),
        }))
    }

    async fn files(
        &self,
        tenant: &TenantId,
        after: Option<&str>,
        limit: usize,
        purpose: Option<&str>,
    ) -> Result<Vec<File>> {
        let args = [
            a(tenant),
            a(after.unwrap_or("")),
            a(limit),
            a(purpose.unwrap_or("")),
        ];
        array(self.call(&scripts::FILES, &args).await?)?
            .into_iter()
            .map(|row| {
                let [id, purpose, filename, size, created] = fields(row)?;
                Ok(File {
                    id: string(id).ok_or(StoreError::Shape)?,
                    purpose: string(purpose).unwrap_or_default(),
                    filename: string(filename).unwrap_or_default(),
                    bytes: uint(&size),
                    created: uint(&created),
                })
            })
            .collect()
    }

    async fn delete_file(&self, tenant: &TenantId, id: &str) -> Result<bool> {
        let v = self
            .call(&scripts::FILE_DELETE, &[a(tenant), a(id)])
            .await?;
        Ok(int(&v) == Some(1))
    }

    async fn batch(&self, tenant: &TenantId, id: &str) -> Result<Option<String>> {
        Ok(string(
            self.call(&scripts::BATCH, &[a(tenant), a(id)]).await?,
        ))
    }

    async fn batch_tenant(&self, id: &str) -> Result<Option<String>> {
        Ok(string(self.call(&scripts::BATCH, &[a(""), a(id)]).await?))
    }

    async fn batches(
        &self,
        tenant: &TenantId,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<String>> {
        let args = [a(tenant), a(after.unwrap_or("")), a(limit)];
        strings(self.call(&scripts::BATCHES, &args).await?)
    }

    async fn cancel_batch(&self, tenant: &TenantId, id: &str, doc: &str) -> Result<bool> {
        let args = [a(tenant), a(id), a(doc), a(now())];
        Ok(int(&self.call(&scripts::BATCH_CANCEL, &args).await?) == Some(1))
    }

    async fn insert_failed_batch(&self, tenant: &TenantId, id: &str, doc: &str) -> Result<()> {
        let args = [a(tenant), a(id), a(doc), a(now())];
        self.call(&scripts::BATCH_FAILED, &args).await?;
        Ok(())
    }

    async fn counts(&self, id: &str) -> Result<Counts> {
        let [total, completed, failed, unfinished] =
            fields(self.call(&scripts::COUNTS, &[a(id)]).await?)?;
        Ok(Counts {
            total: uint(&total),
            completed: uint(&completed),
            failed: uint(&failed),
            unfinished: uint(&unfinished),
        })
    }

    /// Redis reads the batch's counters (no per-line index to probe).
    async fn unfinished(&self, id: &str) -> Result<bool> {
        Ok(self.counts(id).await?.unfinished > 0)
    }

    async fn lines(&self, id: &str) -> Result<Vec<Line>> {
        let rows = array(self.call(&scripts::LINES, &[a(id)]).await?)?;
        rows.into_iter()
            .map(|row| {
                let [id, custom_id, state, status, response] = fields(row)?;
                Ok(Line {
                    id: string(id).ok_or(StoreError::Shape)?,
                    custom_id: string(custom_id).unwrap_or_default(),
                    state: job_state(state)?,
                    status: int(&status).map(|s| s as u16),
                    response: bytes(response),
                })
            })
            .collect()
    }

    async fn due_batches(&self, now: u64) -> Result<Vec<(String, String, String)>> {
        let args = [a(now), a(super::DUE_BATCHES)];
        array(self.call(&scripts::DUE, &args).await?)?
            .into_iter()
            .map(|row| {
                let [tenant, id, doc] = fields(row)?;
                Ok((
                    string(tenant).ok_or(StoreError::Shape)?,
                    string(id).ok_or(StoreError::Shape)?,
                    string(doc).ok_or(StoreError::Shape)?,
                ))
            })
            .collect()
    }

    async fn settled_batches(&self) -> Result<Vec<String>> {
        strings(self.call(&scripts::OPEN, &[]).await?)
    }

    async fn finalize(
        &self,
        id: &str,
        expected: &str,
        doc: &str,
        status: &str,
        files: Vec<(File, Vec<u8>)>,
    ) -> Result<bool> {
        let mut args = vec![
            a(id),
            a(expected),
            a(doc),
            a(status),
            a(now()),
            a(super::CHUNK_BYTES),
        ];
        for (f, content) in files {
            args.extend([
                a(&f.id),
                a(&f.purpose),
                a(&f.filename),
                a(f.bytes),
                a(f.created),
                content,
            ]);
        }
        Ok(int(&self.call(&scripts::FINALIZE, &args).await?) == Some(1))
    }

    /// Deletes in steps of [`CLEANUP_BATCH`] (each step one short script, so Redis is never
    /// blocked long), at most [`CLEANUP_STEPS`] steps a call.
    async fn cleanup(&self, before: u64) -> Result<usize> {
        let mut total = 0;
        for _ in 0..CLEANUP_STEPS {
            let v = self
                .call(&scripts::CLEANUP, &[a(before), a(CLEANUP_BATCH)])
                .await?;
            let n = uint(&v) as usize;
            total += n;
            if n < CLEANUP_BATCH {
                break;
            }
        }
        Ok(total)
    }

    async fn oldest_queued(&self) -> Result<u64> {
        let v = self.call(&scripts::OLDEST, &[]).await?;
        Ok(int(&v).map_or(0, |t| now().saturating_sub(t.max(0) as u64)))
    }

    async fn states(&self) -> Result<Vec<(String, JobState, u64)>> {
        let flat = array(self.call(&scripts::STATES, &[]).await?)?;
        let mut out = Vec::new();
        let mut it = flat.into_iter();
        while let (Some(k), Some(n)) = (it.next(), it.next()) {
            let n = uint(&n);
            let Some((tenant, st)) = string(k).and_then(|k| {
                k.split_once('\n')
                    .map(|(t, s)| (t.to_owned(), s.to_owned()))
            }) else {
                continue;
            };
            let st = JobState::parse(&st).ok_or(StoreError::Shape)?;
            if n > 0 {
                out.push((tenant, st, n));
            }
        }
        Ok(out)
    }
}
