//! The request path as one tower stack ([`stack`]), outermost layer first, one comment per
//! layer saying why it sits where it does.

use std::convert::Infallible;
use std::sync::Arc;

use http::{HeaderName, Request, Response};
use tower::ServiceBuilder;

use super::{ops, State};
use crate::response::{BoxError, ResponseBody};
use crate::upstream::Upstream;
use crate::{
    admission, body, estimate, health, metrics, queue, ratelimit, render, route, tenant, upstream,
    usage,
};

/// The whole request path, outermost first.
///
/// Every stage below `render` reads and writes the one per-request context (`crate::context`)
/// that `render` creates; a stage placed above the writer of a field it needs answers 500
/// (tested). Permits (the fair queue's grant, a rate admission) are taken in the stage's `call`
/// future, not in `poll_ready`: what they cost and which pool they come from depend on the
/// request — its tenant, model and estimate — which `poll_ready` cannot see; and a grant made
/// in `poll_ready` would be held by an idle connection that sends nothing. The stages keep
/// `poll_ready` a pass-through, and the permit lives in the response body, released on `Drop`.
pub fn stack<B>(
    state: &State,
) -> impl tower::Service<
    Request<B>,
    Response = Response<ResponseBody>,
    Error = Infallible,
    Future: Send + 'static,
> + Clone
       + Send
       + 'static
where
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    #[cfg(test)]
    BUILT.with(|n| n.set(n.get() + 1));
    let tenant_header: Option<HeaderName> = state.tenants.tenant_header().cloned();
    let on_main = state.config.admin.listen.is_none();
    let upstreams: Arc<[Arc<Upstream>]> = state.upstreams.iter().cloned().collect();
    ServiceBuilder::new()
        // Outermost: creates the request context, and renders every stage error (in OpenAI's
        // shape) and any panic once; writes x-fairgate-queue-ms on every response.
        .layer(render::Layer)
        // Before authentication: probes carry no key, and must not cost a body read.
        .layer(health::Layer(state.ready.clone()))
        // `/metrics` and the admin API, also before authentication (a scraper carries no tenant
        // key; the admin API has its own token), unless they have their own listener. Here,
        // where tenants connect, a scrape needs the admin token or a trusted peer.
        .option_layer(on_main.then(|| ops::scrape(state, true)))
        .option_layer(on_main.then(|| ops::admin(state)))
        // Who is calling, before reading a byte of the body: unknown callers cost a header hash.
        .layer(tenant::Layer(state.tenants.clone()))
        // The tenant's x-ratelimit-* headers, on every outcome of a limited tenant: right below
        // `tenant` so that every refusal of every stage below (413 body, 400, 429, 504) and every
        // upstream answer passes through it.
        .layer(ratelimit::headers::Layer::new(
            state.admission.store.clone(),
        ))
        // Request metrics and the per-request log line, as soon as the tenant is known: every
        // outcome below (success or refusal, with its reason) is counted under its tenant.
        .layer(metrics::Layer::new(state.metrics.clone()))
        // Read the (bounded) body once and parse it once; estimation and routing need it.
        .layer(body::Layer::new(body::Reading {
            max_body_bytes: state.config.server.max_body_bytes,
            budget: state.tenant_bytes.clone(),
        }))
        // Jobs: the identity is known and the body read and parsed, so a `respond-async`
        // request is stored here as a job (202) before admission could refuse it; the jobs and
        // batches endpoints are answered here; a job re-entering the stack from the runner
        // passes through to every stage below, in its tenant's batch class.
        // Its files and batches calls take a request of the tenant's request bucket, as
        // admission charges a chat request (`JobRequests`: this stage imports no `ratelimit`).
        .layer(crate::jobs::Layer::new(crate::jobs::Deferring::new(
            state.jobs.clone(),
            Arc::new(JobRequests(state.admission.store.clone())),
        )))
        // Pick the upstream pool from the model: the fair queue below is per pool.
        .layer(route::Layer::new(state.router.clone()))
        // Memory bounded in bytes: as soon as the pool is known (the body is read and parsed),
        // before any counting, the request's bytes are reserved against the pool's and the
        // tenant's `max_queued_bytes`; the reservation lives in the response body.
        .layer(queue::bytes::Layer(state.pools.clone()))
        // Count input tokens (after routing: an unroutable model costs no counting) and ask for
        // usage on a stream's behalf; admission and the queue below price the request from it.
        .layer(estimate::Layer::new(state.estimator.clone()))
        // Admission: size caps, deadline feasibility and the tenant's rate limits, after routing
        // (the wait is predicted from the routed pool's queue) and estimation (the charge is the
        // estimate), before queueing, so nothing that must be refused takes a queue slot.
        .layer(admission::Layer::new(state.admission.clone()))
        // Reconcile: observes a 2xx body for `usage` and writes the actual cost to the context
        // when it ends or is dropped. Above the queue, so its body wraps the one the permit is
        // attached to: the usage is known before the permit (and admission's ledger) settles.
        .layer(usage::Layer(state.estimator.clone()))
        // The fair queue of the routed pool: waits for a permit (weighted DRR in tokens) and
        // ties it to the response body so the pool slot lives exactly as long as the stream.
        // After routing (queues are per pool), before upstream.
        .layer(queue::Layer::new(queue::Queueing {
            pools: state.pools.clone(),
            observer: state.metrics.clone(),
        }))
        // Which of the provider's answer headers reach the tenant (an allowlist: never the
        // operator's organization, project, cookies or the shared key's x-ratelimit-*): right
        // above feedback, which reads them all, so it applies to the answer finally passed on.
        .layer(upstream::answer::Layer)
        // Upstream feedback and retries, inside the permit: every answer teaches the pool's
        // learned capacity, and a 429/502/503 with nothing yet sent to the client is retried
        // while the request keeps its slot (so a retry never jumps the fair queue).
        .layer(state.admission.retry_layer())
        // Innermost: forward to the provider and stream the answer back.
        .service(
            upstream::Service::new(upstreams, tenant_header)
                .propagate_trace(state.metrics.otel().is_some()),
        )
}

/// The request bucket the jobs stage's files and batches calls take from: the generation's rate
/// store, one request, no tokens.
struct JobRequests(Arc<dyn ratelimit::RateStore>);

impl crate::jobs::rate::Requests for JobRequests {
    fn take<'a>(
        &'a self,
        tenant: &'a crate::domain::TenantId,
    ) -> futures_util::future::BoxFuture<'a, Result<(), std::time::Duration>> {
        Box::pin(async move {
            match self.0.admit_request(tenant).await {
                Ok(_) => Ok(()),
                Err(ratelimit::Refusal::Requests { retry_after, .. })
                | Err(ratelimit::Refusal::Tokens { retry_after, .. }) => Err(retry_after),
                // A part of no tokens is never larger than a bucket.
                Err(ratelimit::Refusal::TooLarge { .. }) => Ok(()),
            }
        })
    }
}

#[cfg(test)]
thread_local! {
    /// Stacks built on this thread (tests: `server::jobs` checks a job builds none).
    static BUILT: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// How many stacks were built on this thread.
#[cfg(test)]
pub(super) fn built_here() -> usize {
    BUILT.with(std::cell::Cell::get)
}
