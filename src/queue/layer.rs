//! The fair-queue stage of the tower stack: waits for a permit of the routed pool, records the
//! time queued (`x-fairgate-queue-ms`), and ties the permit to the response body.
//!
//! Invariants: the permit is acquired after routing (the queue is per pool) and before the
//! upstream call; it is released when the response body ends or is dropped, or when the request
//! fails or is cancelled before a response exists. A 2xx response to an estimated request hands
//! the permit to the `usage` observer, which sets its actual cost before releasing it. A client that disconnects while queued drops
//! this future, which removes the request without charge.

use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::{header, HeaderValue, Request, Response, StatusCode};

use super::fair::{CostInputs, FairQueue, QueueError};
use super::permit::Permit;
use crate::admission::{
    ActualTokens, Deadline, Error as AdmissionError, Estimate as AdmissionEstimate,
};
use crate::body::Parsed;
use crate::error::{ApiError, Error};
use crate::estimate::{Estimate, Estimator};
use crate::metrics::{Dispatch, RequestLog};
use crate::response::ResponseBody;
use crate::route::Route;
use crate::tenant::Identity;
use crate::upstream::QueueMs;
use crate::usage;

/// Holds the pools' queues, indexed like `[[upstreams]]`, and the estimator that reconciles.
#[derive(Clone)]
pub struct Layer {
    /// One queue per pool.
    pub pools: Arc<[Arc<FairQueue>]>,
    /// Reconciles completed requests (learned estimates, statistics).
    pub estimator: Arc<Estimator>,
}

impl<S> tower::Layer<S> for Layer {
    type Service = Service<S>;
    fn layer(&self, inner: S) -> Self::Service {
        Service {
            pools: self.pools.clone(),
            estimator: self.estimator.clone(),
            inner,
        }
    }
}

/// See the module docs.
#[derive(Clone)]
pub struct Service<S> {
    pools: Arc<[Arc<FairQueue>]>,
    estimator: Arc<Estimator>,
    inner: S,
}

impl<S> tower::Service<Request<Bytes>> for Service<S>
where
    S: tower::Service<Request<Bytes>, Response = Response<ResponseBody>, Error = Error>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = Response<ResponseBody>;
    type Error = Error;
    type Future = BoxFuture<'static, Result<Self::Response, Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<Bytes>) -> Self::Future {
        // The ready clone goes into the future; a fresh clone stays for the next call.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let pools = self.pools.clone();
        let estimator = self.estimator.clone();
        Box::pin(async move {
            let ext = req.extensions();
            let (Some(id), Some(route)) = (ext.get::<Identity>(), ext.get::<Route>()) else {
                // Not a routed request (e.g. /v1/models): nothing to queue.
                return inner.call(req).await;
            };
            let pool = pools
                .get(route.index)
                .ok_or(Error::Internal("no queue for the routed pool"))?
                .clone();
            let estimate = ext.get::<Estimate>().cloned();
            let cost = match &estimate {
                Some(e) => e.cost_inputs(),
                None => cost_inputs(req.body(), ext.get::<Parsed>()),
            };
            let tenant = id.tenant.id.clone();
            let (route_index, class) = (route.index, id.class);
            let acquire = pool.acquire(&tenant, id.class, id.recovery, cost);
            // A deadline removes the request from the queue when it passes (the cancel guard of
            // `acquire` uncharges it) and answers 504.
            let permit = match ext.get::<Deadline>().copied() {
                None => acquire.await?,
                Some(d) => tokio::time::timeout_at(d.at, acquire)
                    .await
                    .map_err(|_| AdmissionError::DeadlineExceeded { budget: d.budget })??,
            };
            req.extensions_mut()
                .insert(QueueMs(permit.waited().as_millis() as u64));
            req.extensions_mut().insert(permit.surcharge());
            let actual = req.extensions().get::<ActualTokens>().cloned();
            if let Some(log) = req.extensions().get::<Arc<RequestLog>>() {
                let ext = req.extensions();
                log.dispatched(Dispatch {
                    pool: route_index,
                    class,
                    waited: permit.waited(),
                    charged: permit.charged(),
                    model: ext.get::<Parsed>().map(|p| p.model.as_str()),
                    estimated: ext.get::<AdmissionEstimate>().map(|e| e.total.0),
                    actual: actual.clone(),
                });
            }
            let res = inner.call(req).await?;
            Ok(match estimate {
                Some(e) if res.status().is_success() => {
                    observe(res, &e, &estimator, permit, actual)
                }
                _ => {
                    let mut res = res;
                    res.body_mut().attach(Box::new(permit));
                    res
                }
            })
        })
    }
}

/// Without an estimate (a request the estimate stage did not count): ~4 bytes per input token,
/// plus the request's output cap (or the default, applied at dispatch).
fn cost_inputs(body: &Bytes, parsed: Option<&Parsed>) -> CostInputs {
    CostInputs {
        input_tokens: (body.len() as u64).div_ceil(4),
        max_output_tokens: parsed.and_then(|p| p.max_tokens),
        ..CostInputs::default()
    }
}

/// Wraps a 2xx response body in the usage observer, which owns the permit and reconciles it.
fn observe(
    res: Response<ResponseBody>,
    estimate: &Estimate,
    estimator: &Arc<Estimator>,
    permit: Permit,
    actual: Option<ActualTokens>,
) -> Response<ResponseBody> {
    let (mut head, body) = res.into_parts();
    let sse = head
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if sse && estimate.strip_usage {
        // Removing a chunk changes the length.
        head.headers.remove(header::CONTENT_LENGTH);
    }
    let body = usage::Body::new(body, estimate, estimator.clone(), permit, sse, actual);
    Response::from_parts(head, ResponseBody::boxed(body))
}

impl ApiError for QueueError {
    fn status(&self) -> StatusCode {
        match self {
            QueueError::UnknownTenant => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::TOO_MANY_REQUESTS,
        }
    }
    fn kind(&self) -> &'static str {
        match self {
            QueueError::UnknownTenant => "server_error",
            _ => "requests",
        }
    }
    fn code(&self) -> &'static str {
        match self {
            QueueError::UnknownTenant => "tenant_not_ready",
            _ => "rate_limit_exceeded",
        }
    }
    fn headers(&self) -> Vec<(header::HeaderName, HeaderValue)> {
        let retry_after = match self {
            QueueError::TenantFull { retry_after } | QueueError::PoolFull { retry_after } => {
                retry_after
            }
            QueueError::UnknownTenant => return Vec::new(),
        };
        vec![
            (
                header::RETRY_AFTER,
                HeaderValue::from(retry_after.as_secs()),
            ),
            (
                header::HeaderName::from_static("x-fairgate-limit"),
                HeaderValue::from_static("queue"),
            ),
        ]
    }
}
