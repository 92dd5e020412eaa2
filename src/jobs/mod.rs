//! Jobs: asynchronous completion (`Prefer: respond-async`, RFC 7240) and the OpenAI Batch API
//! (`/v1/files`, `/v1/batches`) for any provider, stored in an embedded SQLite file
//! (`[jobs] path`) or, with `[cluster]`, in the replicas' shared Redis ([`store`]), and run on
//! the tenant's batch class through the same stack as every other request.
//!
//! The stage sits right below `body` (the identity is known, the body is read and parsed) and
//! above `route`: it answers the jobs endpoints itself, turns a proxied `POST` that prefers
//! `respond-async` into a job (`202 Accepted` + `Location`), and lets everything else through.
//! The [`runner`] re-enters the whole stack (`server::stack`) with a [`context::JobRun`] in the
//! request's extensions: the tenant stage identifies it as the job's tenant in the `batch`
//! class, so weights, budgets, caps and the fair queue apply to every line.
//!
//! Invariants: a job is visible only to its tenant (another tenant's id is a 404); ids carry
//! 128 random bits; a tenant has at most `max_inflight_per_tenant` jobs in the stack at once,
//! at most `max_queued_jobs_per_tenant` queued and at most `max_stored_bytes_per_tenant` stored
//! (429 `x-fairgate-limit: tenant` beyond); a finished job's answer is committed before it
//! counts as finished, so after a crash only lines that were in flight run again
//! (at-least-once for those, exactly once in the output file). With `[cluster]`, a line
//! claimed by a replica that died is run by another after `[jobs] lease_ms`, and the dead
//! replica's late answer (if it comes) is discarded by the fencing token; the queued, stored
//! and in-flight (`max_inflight_per_tenant`) limits hold across replicas. Every files and
//! batches call takes one request of the tenant's request bucket, and file transfers are
//! paced by its byte rate ([`rate`]).
//!
//! [`context::JobRun`]: crate::context::JobRun

pub mod api;
pub mod batch;
pub mod error;
pub mod files;
pub mod layer;
pub mod rate;
pub mod runner;
pub mod store;
pub mod transfer;

use crate::domain::TenantId;
use std::sync::Arc;

use crate::config::JobsConfig;
pub use error::Error;
pub use layer::{Deferring, Layer};
pub use runner::Dispatch;
use store::Store;

/// Path prefix of an async job's status (`Location`).
pub const JOBS_PATH: &str = "/v1/fairgate/jobs/";

/// Response header: a finished job's outcome (`completed` or `failed`).
pub const JOB_STATUS_HEADER: &str = "x-fairgate-job-status";

/// Where the jobs subsystem reports (implemented by `metrics::Metrics`; labels bounded the same
/// way as every per-tenant series).
pub trait Meter: Send + Sync + std::fmt::Debug {
    /// `fairgate_jobs{tenant,state}`: jobs by (tenant id, state) now (every state of
    /// `store::JobState` not listed for a tenant is 0).
    fn jobs(&self, counts: &[(String, store::JobState, u64)]);
    /// `fairgate_batch_lines_total{tenant,outcome}`: a batch line of `tenant` finished
    /// (`completed`, `failed`) or was queued again after a passing refusal (`retried`).
    fn line(&self, tenant: &TenantId, outcome: &'static str);
    /// `fairgate_jobs_oldest_queued_seconds`: age of the oldest queued job.
    fn oldest(&self, seconds: u64);
    /// `fairgate_jobs_late_total`: an answer of `tenant`'s job discarded because this replica's
    /// claim no longer held (its lease expired and the job was reclaimed, or it finished
    /// elsewhere).
    fn late(&self, tenant: &TenantId);
}

/// The jobs subsystem: the store, its limits and the runner's wake-up (cheap to clone).
#[derive(Clone, Debug)]
pub struct Jobs(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    store: Arc<dyn Store>,
    config: JobsConfig,
    wake: tokio::sync::Notify,
    meter: Option<Arc<dyn Meter>>,
    transfers: Arc<transfer::Transfers>,
    /// The tenants' byte rate of file transfers.
    bytes: rate::ByteRate,
    /// The longest line an uploaded file may have (`[server] max_body_bytes`: a line is a
    /// request body).
    max_line: std::sync::atomic::AtomicUsize,
}

impl Jobs {
    /// Opens (or creates) the SQLite store at `config.path`.
    pub fn open(
        config: &JobsConfig,
        meter: Option<Arc<dyn Meter>>,
    ) -> Result<Self, rusqlite::Error> {
        let store = store::Sqlite::open(&config.path)?;
        Ok(Self::with_store(Arc::new(store), config, meter))
    }

    /// The jobs subsystem on the cluster's Redis (`config.path` is not used).
    pub fn shared(
        redis: Arc<dyn store::Redis>,
        config: &JobsConfig,
        meter: Option<Arc<dyn Meter>>,
    ) -> Self {
        let store = store::RedisStore::new(redis, config);
        Self::with_store(Arc::new(store), config, meter)
    }

    fn with_store(
        store: Arc<dyn Store>,
        config: &JobsConfig,
        meter: Option<Arc<dyn Meter>>,
    ) -> Self {
        Self(Arc::new(Inner {
            store,
            config: config.clone(),
            wake: tokio::sync::Notify::new(),
            meter,
            transfers: transfer::Transfers::new(config.max_transfers_per_tenant),
            bytes: rate::ByteRate::new(config.transfer_bytes_per_second_per_tenant),
            max_line: std::sync::atomic::AtomicUsize::new(8 << 20),
        }))
    }

    /// The meter, if any.
    pub fn meter(&self) -> Option<&dyn Meter> {
        self.0.meter.as_deref()
    }

    /// The store (whichever backend).
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.0.store
    }

    /// The `[jobs]` settings in force (fixed at startup).
    pub fn config(&self) -> &JobsConfig {
        &self.0.config
    }

    /// The tenants' open file transfers.
    pub fn transfers(&self) -> &Arc<transfer::Transfers> {
        &self.0.transfers
    }

    /// The tenants' byte rate of file uploads and downloads.
    pub fn bytes(&self) -> &rate::ByteRate {
        &self.0.bytes
    }

    /// Sets the longest line of an uploaded file (`[server] max_body_bytes`).
    pub fn with_max_line(self, bytes: usize) -> Self {
        self.0
            .max_line
            .store(bytes, std::sync::atomic::Ordering::Relaxed);
        self
    }

    /// The longest line of an uploaded file.
    pub fn max_line(&self) -> usize {
        self.0.max_line.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Tells the runner there is work.
    pub fn wake(&self) {
        self.0.wake.notify_one();
    }

    /// Refuses `adding` more jobs of `bytes` for `tenant` beyond its limits (the Redis store
    /// checks them again atomically as it inserts).
    pub async fn check_limits(
        &self,
        tenant: &TenantId,
        adding: u64,
        bytes: u64,
    ) -> Result<(), Error> {
        let (queued, stored) = self.store().usage(tenant).await?;
        let c = self.config();
        if queued.saturating_add(adding) > c.max_queued_jobs_per_tenant {
            return Err(Error::Limit {
                what: "queued jobs (max_queued_jobs_per_tenant)",
                limit: c.max_queued_jobs_per_tenant,
            });
        }
        if stored.saturating_add(bytes) > c.max_stored_bytes_per_tenant {
            return Err(Error::Limit {
                what: "stored bytes (max_stored_bytes_per_tenant)",
                limit: c.max_stored_bytes_per_tenant,
            });
        }
        Ok(())
    }
}

/// A fresh id: `prefix` and 128 random bits in hex.
pub fn new_id(prefix: &str) -> String {
    format!("{prefix}{:032x}", rand::random::<u128>())
}
