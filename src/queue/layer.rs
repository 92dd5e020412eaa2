//! The fair-queue stage of the tower stack: waits for a permit of the routed pool, writes the
//! grant to the context's `dispatch` (the time queued reaches `x-fairgate-queue-ms` from there),
//! and ties the permit to the response body.
//!
//! Invariants: the permit is acquired after routing (the queue is per pool) and before the
//! upstream call, in the `call` future (its cost and pool depend on the request, which
//! `poll_ready` cannot see); it is released when the response body ends or is dropped, or when
//! the request fails or is cancelled before a response exists. On release the tenant's credit
//! is reconciled with the context's `usage` (written by the `usage` stage, whose body wraps
//! this one and ends first) plus one dispatch cost per retried attempt (the context's
//! `retries`). A client that disconnects while queued drops this future, which removes the
//! request without charge; a deadline that passes while queued does the same and answers 504.

use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode};

use super::fair::{FairQueue, QueueError};
use super::permit::Permit;
use crate::context::{Context, Ctx, Dispatch};
use crate::error::{ApiError, Error, Limit, Reason};
use crate::response::ResponseBody;

/// Told of every grant as it is made (metrics: served share, queue wait), so what is shown
/// while a request is in flight includes it. Implemented above the queue; the queue imports
/// no observer.
pub trait Observer: Send + Sync {
    /// The request of `ctx` was granted `dispatch` (already in `ctx`).
    fn dispatched(&self, ctx: &Context, dispatch: &Dispatch);
}

/// The fair-queue stage: holds the pools' queues, indexed like `[[upstreams]]`, and the grant
/// observer.
#[derive(Clone)]
pub struct Queueing {
    /// One queue per pool.
    pub pools: Arc<[Arc<FairQueue>]>,
    /// Told of every grant.
    pub observer: Arc<dyn Observer>,
}

/// The fair-queue layer (`Layer::new(Queueing { .. })`).
pub type Layer = crate::stage::Layer<Queueing>;

/// A granted permit, settled from the context when the response body is done.
struct Held {
    permit: Permit,
    ctx: Ctx,
}

impl crate::response::Meter for Held {
    /// A stream's counted cost, charged to the tenant's credit in steps as it passes what
    /// dispatch charged: the fair queue sees a long stream's cost while it runs.
    fn progress(&mut self, p: crate::response::Progress) -> bool {
        let charged = self.permit.charged().0;
        if p.cost > charged {
            self.permit
                .charge_running(crate::domain::Tokens(p.cost - charged));
        }
        true
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let actual = self.ctx.usage().map(|u| u.cost);
        self.permit.settle(actual, self.ctx.retries());
    }
}

impl<S> crate::stage::Stage<Request<Bytes>, S> for Queueing
where
    S: crate::stage::Below<Request<Bytes>, Response<ResponseBody>, Error>,
{
    type Down = Request<Bytes>;

    async fn call(
        self,
        req: Request<Bytes>,
        mut inner: S,
    ) -> Result<Response<ResponseBody>, Error> {
        let layer = self;
        let pools = &layer.pools;
        let ctx = crate::context::of(&req)?;
        let id = ctx.identity()?;
        let route = *ctx.route()?;
        let cost = ctx.estimate()?.cost_inputs();
        let deadline = ctx.admitted()?.deadline;
        let pool = pools
            .get(route.pool)
            .ok_or_else(|| Error::internal("no queue for the routed pool"))?
            .clone();
        let acquire = pool.acquire(&id.tenant.id, id.class, id.recovery, cost);
        // A deadline removes the request from the queue when it passes (the cancel guard of
        // `acquire` uncharges it) and answers 504.
        let permit = match deadline {
            None => acquire.await?,
            Some(d) => tokio::time::timeout_at(d.at, acquire)
                .await
                .map_err(|_| QueueError::DeadlineExceeded { budget: d.budget })??,
        };
        let dispatch = Dispatch {
            pool: route.pool,
            waited: permit.waited(),
            charged: permit.charged(),
            at: permit.granted_at(),
        };
        ctx.set_dispatch(dispatch);
        layer.observer.dispatched(&ctx, &dispatch);
        let held = Held {
            permit,
            ctx: ctx.clone(),
        };
        let mut res = inner.call(req).await?;
        res.body_mut().attach_meter(Box::new(held));
        Ok(res)
    }
}

impl ApiError for QueueError {
    fn status(&self) -> StatusCode {
        match self {
            QueueError::UnknownTenant => StatusCode::SERVICE_UNAVAILABLE,
            QueueError::DeadlineExceeded { .. } => StatusCode::GATEWAY_TIMEOUT,
            _ => StatusCode::TOO_MANY_REQUESTS,
        }
    }
    fn kind(&self) -> &'static str {
        match self {
            QueueError::UnknownTenant | QueueError::DeadlineExceeded { .. } => "server_error",
            _ => "requests",
        }
    }
    fn code(&self) -> &'static str {
        match self {
            QueueError::UnknownTenant => "tenant_not_ready",
            QueueError::DeadlineExceeded { .. } => "deadline_exceeded",
            _ => "rate_limit_exceeded",
        }
    }
    fn limit(&self) -> Option<Limit> {
        match self {
            QueueError::TenantFull { .. }
            | QueueError::PoolFull { .. }
            | QueueError::TenantBytes { .. }
            | QueueError::PoolBytes { .. } => Some(Limit::Queue),
            _ => None,
        }
    }
    fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            QueueError::TenantFull { retry_after }
            | QueueError::PoolFull { retry_after }
            | QueueError::TenantBytes { retry_after }
            | QueueError::PoolBytes { retry_after } => Some(*retry_after),
            _ => None,
        }
    }
    fn reason(&self) -> Reason {
        match self {
            QueueError::TenantFull { .. } => Reason::TenantQueueFull,
            QueueError::PoolFull { .. } => Reason::PoolQueueFull,
            QueueError::TenantBytes { .. } => Reason::TenantQueueBytes,
            QueueError::PoolBytes { .. } => Reason::PoolQueueBytes,
            QueueError::UnknownTenant => Reason::UnknownTenant,
            QueueError::DeadlineExceeded { .. } => Reason::DeadlineExceeded,
        }
    }
    fn never_sent(&self) -> bool {
        true
    }
}
