//! The runner: feeds queued jobs, at most `[jobs] max_inflight_per_tenant` per tenant at once,
//! through the whole stack (`Dispatch`, built by `server` over the generation in force) as the
//! job's tenant in the batch class (`context::JobRun`), and records each answer.
//!
//! Invariants: a job refused by fairgate itself for a reason that passes (429/503/504 never
//! sent to the provider: a full queue, a rate limit, a deadline) goes back to the queue after
//! a pause, holding its in-flight slot meanwhile (no hot loop); any other answer — the
//! provider's, or a final refusal such as a 400 — is the job's result, committed before the
//! slot is released. The in-flight count per tenant is a guard released on drop.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http::{header, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};

use super::store::Claimed;
use super::{batch, Jobs};
use crate::context::JobRun;
use crate::domain::TenantId;
use crate::response::ResponseBody;

/// How the runner sends a request through the stack (built by `server`).
pub type Dispatch = Arc<
    dyn Fn(Request<Full<Bytes>>) -> Pin<Box<dyn Future<Output = Response<ResponseBody>> + Send>>
        + Send
        + Sync,
>;

/// Largest answer stored for a job (a bigger one is stored as a 502 saying so).
const MAX_RESULT_BYTES: usize = 64 << 20;

/// Pause before a job refused for a passing reason is queued again.
const RETRY_PAUSE: Duration = Duration::from_millis(500);

/// How often the runner looks for work without being woken, and cleans up.
const TICK: Duration = Duration::from_secs(1);

type Inflight = Arc<Mutex<HashMap<String, usize>>>;

/// Releases a tenant's in-flight slot on drop and wakes the runner.
struct Slot {
    inflight: Inflight,
    tenant: String,
    jobs: Jobs,
}

impl Drop for Slot {
    fn drop(&mut self) {
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
    if let Ok(open) = jobs.store().open_batches() {
        for id in open {
            let _ = batch::finalize_if_done(&jobs, &id);
        }
    }
    let inflight: Inflight = Arc::default();
    let mut last_cleanup = tokio::time::Instant::now() - Duration::from_secs(3600);
    loop {
        if *stop.borrow() {
            return;
        }
        if last_cleanup.elapsed() >= Duration::from_secs(60) {
            last_cleanup = tokio::time::Instant::now();
            let hours = jobs.config().retention_hours;
            let before = super::store::now().saturating_sub(hours.saturating_mul(3600));
            if let Err(e) = jobs.store().cleanup(before) {
                tracing::warn!(error = %e, "jobs: retention cleanup failed");
            }
        }
        if let Some(m) = jobs.meter() {
            if let (Ok(states), Ok(oldest)) = (jobs.store().states(), jobs.store().oldest_queued())
            {
                m.jobs(&states);
                m.oldest(oldest);
            }
        }
        if let Err(e) = feed(&jobs, &dispatch, &inflight) {
            tracing::warn!(error = %e, "jobs: cannot read the job store");
        }
        tokio::select! {
            _ = jobs.0.wake.notified() => {}
            _ = tokio::time::sleep(TICK) => {}
            _ = stop.changed() => {}
        }
    }
}

/// Claims what each tenant's free slots allow and spawns those jobs.
fn feed(jobs: &Jobs, dispatch: &Dispatch, inflight: &Inflight) -> Result<(), rusqlite::Error> {
    let max = jobs.config().max_inflight_per_tenant;
    for tenant in jobs.store().queued_tenants()? {
        let free = {
            let m = inflight.lock().unwrap_or_else(|p| p.into_inner());
            max.saturating_sub(m.get(&tenant).copied().unwrap_or(0))
        };
        if free == 0 {
            continue;
        }
        for job in jobs.store().claim(&tenant, free)? {
            *inflight
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .entry(tenant.clone())
                .or_insert(0) += 1;
            let slot = Slot {
                inflight: inflight.clone(),
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
        tenant: TenantId::new(job.tenant.as_str()),
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
            .finish(&job.id, 400, None, b"invalid stored request");
        return;
    };
    let res = dispatch(req).await;
    let passing = refused.get().is_some_and(|(status, _)| {
        matches!(
            *status,
            StatusCode::TOO_MANY_REQUESTS
                | StatusCode::SERVICE_UNAVAILABLE
                | StatusCode::GATEWAY_TIMEOUT
        )
    });
    if passing {
        drop(res);
        tokio::time::sleep(RETRY_PAUSE).await;
        if let Err(e) = jobs.store().requeue(&job.id) {
            tracing::warn!(error = %e, "jobs: cannot requeue");
        }
        if let (Some(m), Some(_)) = (jobs.meter(), &job.batch) {
            m.line(&job.tenant, "retried");
        }
        drop(slot);
        return;
    }
    let status = res.status().as_u16();
    let content_type = res
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let (status, body) = match Limited::new(res.into_body(), MAX_RESULT_BYTES)
        .collect()
        .await
    {
        Ok(b) => (status, b.to_bytes()),
        Err(_) => (
            502,
            Bytes::from_static(b"{\"error\":{\"message\":\"the answer could not be read whole\",\"type\":\"server_error\",\"code\":\"job_result_unreadable\"}}"),
        ),
    };
    if let Err(e) = jobs
        .store()
        .finish(&job.id, status, content_type.as_deref(), &body)
    {
        tracing::warn!(error = %e, "jobs: cannot record a result");
    }
    if let Some(b) = &job.batch {
        if let Some(m) = jobs.meter() {
            let ok = (200..300).contains(&status);
            m.line(&job.tenant, if ok { "completed" } else { "failed" });
        }
        if let Err(e) = batch::finalize_if_done(&jobs, b) {
            tracing::warn!(error = %e, "jobs: cannot finalize a batch");
        }
    }
    drop(slot);
}
