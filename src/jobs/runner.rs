//! The runner: feeds queued jobs, at most `[jobs] max_inflight_per_tenant` per tenant at once,
//! through the whole stack as the job's tenant in the batch class (`context::JobRun`), and
//! records each answer. [`Dispatch`] is `server`'s: each job runs on a connection worker in
//! turn (so its request uses that worker's upstream lane, on the runtime its connections live
//! on), through the stack of the generation in force (built once per generation), and is read
//! whole there ([`Answer::read`]); the store calls stay on the runner's runtime.
//!
//! Invariants: a job refused by fairgate itself for a reason that passes (429/503/504 never
//! sent to the provider: a full queue, a rate limit, a deadline) goes back to the queue after
//! a pause, holding its in-flight slot meanwhile (no hot loop); any other answer — the
//! provider's, or a final refusal such as a 400 — is the job's result, committed before the
//! slot is released. The in-flight count per tenant is a guard released on drop.
//!
//! When the store's claims are leases (`Store::lease`: the Redis store's), the runner renews
//! the leases of the jobs it runs every `lease / 3` (a claim in the renewal set is removed by
//! the same guard, only under its own token), and every tick it queues again jobs whose lease
//! expired, renewing its own in the same script first: a replica that stalled past its leases
//! (a loaded host) does not reclaim and send again lines it still runs; only another replica
//! takes them, once expired. An answer recorded after this replica's claim was reclaimed is
//! discarded by the store (`fairgate_jobs_late_total`).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http::{header, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};

use super::store::{Claimed, StoreError};
use super::{batch, Jobs};
use crate::context::JobRun;
use crate::domain::TenantId;
use crate::response::ResponseBody;

/// How the runner sends a job through the stack (built by `server`: on a connection worker,
/// through the generation in force's stack, the answer read there with [`Answer::read`]);
/// `None` when the server is stopping and the job was not run to its end.
pub type Dispatch = Arc<
    dyn Fn(Request<Full<Bytes>>) -> Pin<Box<dyn Future<Output = Option<Answer>> + Send>>
        + Send
        + Sync,
>;

/// A job's answer, read whole.
#[derive(Debug)]
pub struct Answer {
    /// Its HTTP status.
    pub status: u16,
    /// Its content type.
    pub content_type: Option<String>,
    /// Its body (at most 64 MiB).
    pub body: Bytes,
}

impl Answer {
    /// Reads the stack's response `res` whole; one larger than 64 MiB, or whose body fails,
    /// is a 502 saying so (`jobs::Error::Unreadable`).
    pub async fn read(res: Response<ResponseBody>) -> Self {
        let status = res.status().as_u16();
        let content_type = res
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        match Limited::new(res.into_body(), MAX_RESULT_BYTES)
            .collect()
            .await
        {
            Ok(b) => Self {
                status,
                content_type,
                body: b.to_bytes(),
            },
            Err(_) => {
                let e = super::Error::Unreadable;
                Self {
                    status: crate::error::ApiError::status(&e).as_u16(),
                    content_type,
                    body: Bytes::from(crate::error::openai_json(&e)),
                }
            }
        }
    }
}

/// Largest answer stored for a job (a bigger one is stored as a 502 saying so).
const MAX_RESULT_BYTES: usize = 64 << 20;

/// Pause before a job refused for a passing reason is queued again.
const RETRY_PAUSE: Duration = Duration::from_millis(500);

/// How often the runner looks for work without being woken, and cleans up.
const TICK: Duration = Duration::from_secs(1);

/// How often open batches are checked against their completion window.
const EXPIRY_CHECK: Duration = Duration::from_secs(2);

type Inflight = Arc<Mutex<HashMap<TenantId, usize>>>;

/// The claims this runner holds: job id → fencing token (renewed while present).
type Held = Arc<Mutex<HashMap<String, u64>>>;

/// Releases a tenant's in-flight slot and the job's claim on drop and wakes the runner.
struct Slot {
    inflight: Inflight,
    held: Held,
    id: String,
    token: u64,
    tenant: TenantId,
    jobs: Jobs,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        // Only this claim's entry: a job queued again (a passing refusal) may already be
        // claimed anew by this runner under another token, which must go on being renewed.
        if held.get(&self.id) == Some(&self.token) {
            held.remove(&self.id);
        }
        drop(held);
        let mut m = self.inflight.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = m.get_mut(&self.tenant) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                m.remove(&self.tenant);
            }
        }
        drop(m);
        self.jobs.wake();
    }
}

/// Runs jobs until `stop` turns true. Finalizes, first, batches whose lines all finished
/// before a restart.
pub async fn run(jobs: Jobs, dispatch: Dispatch, mut stop: tokio::sync::watch::Receiver<bool>) {
    let inflight: Inflight = Arc::default();
    let held: Held = Arc::default();
    // Claims that are leases (the Redis store's) are renewed while they run, and expired ones
    // looked for a few times per lease.
    let lease = jobs.store().lease();
    if let Some(lease) = lease {
        tokio::spawn(renew(jobs.clone(), lease, held.clone(), stop.clone()));
    }
    let tick = lease.map_or(TICK, |l| TICK.min(l.max(Duration::from_millis(30)) / 3));
    let mut last_cleanup = tokio::time::Instant::now() - Duration::from_secs(3600);
    let mut last_expiry = last_cleanup;
    loop {
        if *stop.borrow() {
            return;
        }
        if last_cleanup.elapsed() >= Duration::from_secs(60) {
            last_cleanup = tokio::time::Instant::now();
            housekeeping(&jobs).await;
        }
        if last_expiry.elapsed() >= EXPIRY_CHECK {
            last_expiry = tokio::time::Instant::now();
            match batch::expire_due(&jobs).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(batches = n, "jobs: completion window ended"),
                Err(e) => tracing::warn!(error = %e, "jobs: cannot expire batches"),
            }
        }
        if lease.is_some() {
            match jobs.store().reclaim(&claims(&held)).await {
                Ok(0) => {}
                Ok(n) => tracing::warn!(jobs = n, "jobs: leases expired, queued again"),
                Err(e) => tracing::warn!(error = %e, "jobs: cannot reclaim expired leases"),
            }
        }
        if let Some(m) = jobs.meter() {
            let store = jobs.store();
            if let (Ok(states), Ok(oldest)) = (store.states().await, store.oldest_queued().await) {
                m.jobs(&states);
                m.oldest(oldest);
            }
        }
        if let Err(e) = feed(&jobs, &dispatch, &inflight, &held).await {
            tracing::warn!(error = %e, "jobs: cannot read the job store");
        }
        tokio::select! {
            _ = jobs.0.wake.notified() => {}
            _ = tokio::time::sleep(tick) => {}
            _ = stop.changed() => {}
        }
    }
}

/// Once a minute (and at start): finalizes batches whose lines all finished but which no one
/// finalized (a crash, or a replica that died right after its last line), and deletes what
/// is past `retention_hours`.
async fn housekeeping(jobs: &Jobs) {
    if let Ok(open) = jobs.store().settled_batches().await {
        for id in open {
            if let Err(e) = batch::finalize_if_done(jobs, &id).await {
                tracing::warn!(error = %e, "jobs: cannot finalize a batch");
            }
        }
    }
    let hours = jobs.config().retention_hours;
    let before = super::store::now().saturating_sub(hours.saturating_mul(3600));
    if let Err(e) = jobs.store().cleanup(before).await {
        tracing::warn!(error = %e, "jobs: retention cleanup failed");
    }
}

/// The `(id, token)` claims this runner holds now.
fn claims(held: &Held) -> Vec<(String, u64)> {
    held.lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .map(|(id, token)| (id.clone(), *token))
        .collect()
}

/// Renews the leases (of `lease`) of the claims this runner holds, every `lease / 3`, until
/// `stop`.
async fn renew(
    jobs: Jobs,
    lease: Duration,
    held: Held,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let every = (lease / 3).max(Duration::from_millis(10));
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.changed() => {}
        }
        if *stop.borrow() {
            return;
        }
        match jobs.store().renew(&claims(&held)).await {
            Ok(0) => {}
            Ok(lost) => tracing::warn!(lost, "jobs: leases lost before renewal (reclaimed)"),
            Err(e) => tracing::warn!(error = %e, "jobs: cannot renew leases"),
        }
    }
}

/// Claims what each tenant's free slots allow and spawns those jobs.
async fn feed(
    jobs: &Jobs,
    dispatch: &Dispatch,
    inflight: &Inflight,
    held: &Held,
) -> Result<(), StoreError> {
    let max = jobs.config().max_inflight_per_tenant;
    for tenant in jobs.store().queued_tenants().await? {
        let free = {
            let m = inflight.lock().unwrap_or_else(|p| p.into_inner());
            max.saturating_sub(m.get(&tenant).copied().unwrap_or(0))
        };
        if free == 0 {
            continue;
        }
        for job in jobs.store().claim(&tenant, free).await? {
            held.lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(job.id.clone(), job.token);
            *inflight
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .entry(tenant.clone())
                .or_insert(0) += 1;
            let slot = Slot {
                inflight: inflight.clone(),
                held: held.clone(),
                id: job.id.clone(),
                token: job.token,
                tenant: tenant.clone(),
                jobs: jobs.clone(),
            };
            tokio::spawn(one(jobs.clone(), dispatch.clone(), job, slot));
        }
    }
    Ok(())
}

/// Sends one job through the stack and records its answer.
async fn one(jobs: Jobs, dispatch: Dispatch, job: Claimed, slot: Slot) {
    let refused = Arc::new(OnceLock::new());
    let run = JobRun {
        tenant: job.tenant.clone(),
        refused: refused.clone(),
    };
    let req = Request::builder()
        .method(job.method.as_str())
        .uri(job.path.as_str())
        .header(header::CONTENT_TYPE, "application/json")
        .extension(run)
        .body(Full::new(Bytes::from(job.body)));
    let Ok(req) = req else {
        let _ = jobs
            .store()
            .finish(&job.id, job.token, 400, None, b"invalid stored request")
            .await;
        return;
    };
    let Some(answer) = dispatch(req).await else {
        // The server is stopping (the worker that ran the job is gone): not the job's answer.
        if let Err(e) = jobs.store().requeue(&job.id, job.token).await {
            tracing::warn!(error = %e, "jobs: cannot requeue");
        }
        drop(slot);
        return;
    };
    let passing = refused.get().is_some_and(|(status, _)| {
        matches!(
            *status,
            StatusCode::TOO_MANY_REQUESTS
                | StatusCode::SERVICE_UNAVAILABLE
                | StatusCode::GATEWAY_TIMEOUT
        )
    });
    if passing {
        drop(answer);
        tokio::time::sleep(RETRY_PAUSE).await;
        if let Err(e) = jobs.store().requeue(&job.id, job.token).await {
            tracing::warn!(error = %e, "jobs: cannot requeue");
        }
        if let (Some(m), Some(_)) = (jobs.meter(), &job.batch) {
            m.line(&job.tenant, "retried");
        }
        drop(slot);
        return;
    }
    let Answer {
        status,
        content_type,
        body,
    } = answer;
    let store = jobs.store();
    match store
        .finish(&job.id, job.token, status, content_type.as_deref(), &body)
        .await
    {
        Ok(true) => {}
        Ok(false) => {
            // Seed 2's "workers completing after leases expire": the job was reclaimed (or
            // finished elsewhere); its recorded answer, if any, is another claim's.
            tracing::warn!(job = %job.id, "jobs: late answer discarded (lease no longer held)");
            if let Some(m) = jobs.meter() {
                m.late(&job.tenant);
            }
            drop(slot);
            return;
        }
        Err(e) => tracing::warn!(error = %e, "jobs: cannot record a result"),
    }
    if let Some(b) = &job.batch {
        if let Some(m) = jobs.meter() {
            let ok = (200..300).contains(&status);
            m.line(&job.tenant, if ok { "completed" } else { "failed" });
        }
        if let Err(e) = batch::finalize_if_done(&jobs, b).await {
            tracing::warn!(error = %e, "jobs: cannot finalize a batch");
        }
    }
    drop(slot);
}
