//! The request-metrics stage (just below `tenant` and its rate headers): counts every outcome of
//! a known tenant by status (and refusals by reason), times it to the first body byte and to
//! the end of the body, and writes one structured log line per request when its body is done.
//!
//! Everything it records is read from the request's context (model, estimate, dispatch, usage)
//! and from the outcome: a response, or a stage's [`Error`] (its status, `reason()` and
//! `limit()` — no stage's variants are matched here; errors pass up unrendered to `render`).
//! The dispatch itself (served share, queue wait, admitted cost) is recorded when the grant is
//! made: [`Metrics`] is the fair queue's [`crate::queue::Observer`].
//!
//! Invariants: the log line carries the request id, tenant id, model, token counts, timings,
//! status, the connection worker that served it and the limit that refused the request — never
//! a key, a header value, a prompt or a completion; its one client-chosen string, the model, is
//! the bounded label of `TenantMetrics::model_label`.

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use tokio::time::Instant;

use super::{Metrics, Outcome, TenantMetrics};
use crate::context::Ctx;
use crate::error::{Error, Limit, Reason};
use crate::response::{BoxError, ResponseBody};

/// The request-metrics stage: the generation's metrics registry.
#[derive(Clone)]
pub struct Recording(Arc<Metrics>);

impl From<Arc<Metrics>> for Recording {
    fn from(metrics: Arc<Metrics>) -> Self {
        Self(metrics)
    }
}

/// Tower layer of the request-metrics stage.
pub type Layer = crate::stage::Layer<Recording>;

/// A dispatched request that waited at least this long in the queue counts as deferred.
const DEFERRED: Duration = Duration::from_millis(1);

/// One request's metrics record: what it reads from the context, recorded once.
struct Record {
    tenant: Arc<TenantMetrics>,
    live: Option<Arc<super::live::TenantLive>>,
    ctx: Ctx,
    start: Instant,
    otel: Option<Arc<crate::otel::Exporter>>,
    genai: Arc<super::genai::GenAi>,
    method: http::Method,
}

impl Record {
    /// Admission's charge of the request in raw tokens, once estimated.
    fn estimated(&self) -> Option<u64> {
        self.ctx.estimate_if_counted().map(|e| e.charge.total().0)
    }

    /// Counts the outcome.
    fn outcome(&mut self, status: StatusCode, refused: Option<Reason>) {
        if let Some(r) = refused {
            self.tenant.rejected(r);
            if let Some(live) = &self.live {
                live.refused(r);
            }
            if let Some(e) = self.estimated() {
                self.tenant.cost(Outcome::Rejected, e);
            }
        }
        self.tenant.request(status.as_u16());
    }
}

impl crate::queue::Observer for Metrics {
    fn dispatched(&self, ctx: &crate::context::Context, d: &crate::context::Dispatch) {
        let Ok(id) = ctx.identity() else {
            return;
        };
        let Some(tenant) = self.tenant(&id.tenant.id) else {
            return;
        };
        tenant.queue_wait(id.class, d.waited);
        if let Some(live) = self.live(&id.tenant.id) {
            live.waited(d.waited);
        }
        self.served(d.pool, &id.tenant.id, d.charged.0);
        if let Some(e) = ctx.estimate_if_counted().map(|e| e.charge.total().0) {
            tenant.cost(Outcome::Admitted, e);
            if d.waited >= DEFERRED {
                tenant.cost(Outcome::Deferred, e);
            }
        }
    }
}

impl<S, B> crate::stage::Stage<Request<B>, S> for Recording
where
    S: crate::stage::Below<Request<B>, Response<ResponseBody>, Error>,
    B: Send + 'static,
{
    type Down = Request<B>;

    /// A tenant added by a reload that the metrics registry of this generation does not know:
    /// served, not counted (the next generation counts it), unboxed.
    fn pass(&self, req: Request<B>) -> Result<Request<B>, Request<B>> {
        let unknown = crate::context::of(&req)
            .and_then(|ctx| Ok(self.0.tenant(&ctx.identity()?.tenant.id).is_none()))
            .unwrap_or(false);
        if unknown {
            Ok(req)
        } else {
            Err(req)
        }
    }

    /// A plain function returning the future, so that the future holds only the record and
    /// the call below (not `req` nor the service below: a queued request's bytes).
    fn call(
        self,
        req: Request<B>,
        mut next: S,
    ) -> impl Future<Output = Result<Response<ResponseBody>, Error>> + Send + 'static {
        let record = self.record(&req);
        let called = record.map(|record| (record, next.call(req)));
        async move {
            match called? {
                (Some(record), below) => recorded(record, below.await),
                (None, below) => below.await,
            }
        }
    }
}

impl Recording {
    /// The record of `req`'s tenant (`None`: one this registry does not know, see
    /// [`Recording::pass`]); the sampler decides once, here: the stages below read it
    /// (`usage` captures the answer's id and model, `upstream` sends the sampled flag), the
    /// spans need it.
    fn record<B>(&self, req: &Request<B>) -> Result<Option<Record>, Error> {
        let ctx = crate::context::of(req)?;
        let id = ctx.identity()?;
        let Some(tenant) = self.0.tenant(&id.tenant.id).cloned() else {
            return Ok(None);
        };
        let record = Record {
            tenant,
            live: self.0.live(&id.tenant.id).cloned(),
            ctx,
            start: Instant::now(),
            otel: self.0.otel().cloned(),
            genai: self.0.genai().clone(),
            method: req.method().clone(),
        };
        if let Some(otel) = &record.otel {
            record.ctx.set_recorded(otel.sample(record.ctx.trace()));
        }
        Ok(Some(record))
    }
}

/// Counts the outcome `res` of `record`'s request; a response's body is timed and writes the
/// log line when done, a refusal's line is written now.
fn recorded(
    mut record: Record,
    res: Result<Response<ResponseBody>, Error>,
) -> Result<Response<ResponseBody>, Error> {
    let (res, refused, limit) = match res {
        Ok(res) => {
            let refused =
                (res.status() == StatusCode::TOO_MANY_REQUESTS).then_some(Reason::Upstream429);
            let limit = Limit::of(res.headers());
            (Ok(res), refused, limit)
        }
        Err(e) => {
            let (refused, limit) = (Some(e.reason()), e.limit());
            (Err(e), refused, limit)
        }
    };
    let status = match &res {
        Ok(r) => r.status(),
        Err(e) => e.status(),
    };
    record.outcome(status, refused);
    let done = Done {
        record,
        first_byte: None,
        status,
        limit,
        refused,
    };
    match res {
        // The log line is written when the body is done.
        Ok(res) => {
            let (head, body) = res.into_parts();
            let body = Timed { inner: body, done };
            Ok(Response::from_parts(head, ResponseBody::boxed(body)))
        }
        // A refusal has no body of its own yet: its line is written now.
        Err(e) => {
            drop(done);
            Err(e)
        }
    }
}

pin_project_lite::pin_project! {
    /// The response body, timed to its first byte and its end.
    struct Timed {
        #[pin]
        inner: ResponseBody,
        done: Done,
    }
}

/// Records the duration and writes the log line when dropped.
struct Done {
    record: Record,
    first_byte: Option<Duration>,
    status: StatusCode,
    limit: Option<Limit>,
    refused: Option<Reason>,
}

impl Drop for Done {
    fn drop(&mut self) {
        if self.record.ctx.stalled() && self.refused.is_none() {
            // The client stopped reading: the response was cut (see `server::stall`).
            self.refused = Some(Reason::ClientStalled);
            self.record.tenant.rejected(Reason::ClientStalled);
            if let Some(live) = &self.record.live {
                live.refused(Reason::ClientStalled);
            }
        }
        if let (Some(reason), None) = (self.record.ctx.cut(), self.refused) {
            // fairgate ended the stream at the tenant's stream limit (`usage`).
            self.refused = Some(reason);
            self.record.tenant.rejected(reason);
        }
        let r = &self.record;
        let total = r.start.elapsed();
        let t = &r.tenant;
        t.timings(total, self.first_byte);
        let ctx = &r.ctx;
        let dispatch = ctx.dispatch();
        let model = ctx.request_if_parsed().map(|p| p.model.as_str());
        let estimate = ctx.estimate_if_counted();
        let estimated = r.estimated();
        let usage = ctx.usage();
        let actual = usage.map(|u| u.tokens.total().0);
        if let Some(reason) = usage.and_then(|u| u.unread) {
            t.usage_unread(reason);
        }
        if let (Some(model), Some(e), Some(_)) = (model, estimate, dispatch) {
            t.tokens(model, e.charge, usage.map(|u| u.tokens));
        }
        // Client-chosen: logged as it is labelled (cut, past the tenant's count `other`).
        let model = model.map(|m| t.model_label(m));
        // The endpoint of the pool that answered (the first, before any answer).
        let sent_to = ctx.endpoint().map_or(0, |e| e.index);
        // `error.type`: why fairgate refused or cut it, else the failing status passed on.
        let error = self.refused.map(Reason::as_str).or_else(|| {
            (self.status.as_u16() >= 400).then(|| super::genai::status_error(self.status.as_u16()))
        });
        if let (Some(d), Some(e), Some(m)) = (dispatch, estimate, model.as_deref()) {
            r.genai.record(&super::genai::Call {
                endpoint: e.endpoint,
                pool: d.pool,
                endpoint_index: sent_to,
                model: m,
                duration: d.at.elapsed(),
                error,
                usage: usage.filter(|u| u.reported).map(|u| u.tokens),
            });
        }
        if let Some(otel) = &r.otel {
            otel.emit(
                ctx,
                &crate::otel::Ending {
                    at: Instant::now(),
                    status: self.status.as_u16(),
                    limit: self.limit.map(Limit::as_str),
                    refused: self.refused.map(Reason::as_str),
                    model: model.as_deref(),
                    estimated,
                    actual,
                    endpoint: estimate.map(|e| e.endpoint),
                    method: &r.method,
                    error,
                    peer: dispatch.and_then(|d| r.genai.peer(d.pool, sent_to)),
                },
            );
        }
        let tenant = ctx.identity_if_known().map(|i| i.tenant.id.as_str());
        let request_id = ctx.request_id().to_str().unwrap_or_default();
        let endpoint = ctx.endpoint();
        // Joins the line to the request's trace (the client's, continued, or a new one).
        let mut hex = [0u8; 32];
        let trace_id = ctx.trace().trace_id_hex(&mut hex);
        tracing::info!(
            target: "fairgate::request",
            request_id,
            trace_id,
            tenant,
            model = model.as_deref(),
            endpoint = endpoint.as_ref().map(|e| &*e.name),
            status = self.status.as_u16(),
            estimated_tokens = estimated,
            actual_tokens = actual,
            queue_ms = dispatch.map(|d| d.waited.as_millis() as u64),
            upstream_ms = dispatch.map(|d| d.at.elapsed().as_millis() as u64),
            total_ms = total.as_millis() as u64,
            limit = self.limit.map(Limit::as_str),
            refused = self.refused.map(Reason::as_str),
            worker = crate::worker::current(),
            "request"
        );
    }
}

impl Body for Timed {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.project();
        let polled = this.inner.poll_frame(cx);
        if this.done.first_byte.is_none() {
            if let Poll::Ready(Some(Ok(f))) = &polled {
                if f.is_data() {
                    this.done.first_byte = Some(this.done.record.start.elapsed());
                }
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
