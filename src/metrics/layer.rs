//! The request-metrics stage (just below `tenant`): counts every answer of a known tenant by
//! status (and refusals by reason), times it to the first body byte and to the end of the body,
//! and writes one structured log line per request when its body is done.
//!
//! Invariants: the log line carries the tenant id, model, token counts, timings, status and the
//! limit that refused the request — never a key, a header value, a prompt or a completion. An
//! error of a stage below is rendered here (by [`crate::Error::into_response`], the one place
//! errors become HTTP) so its status and `x-fairgate-limit` are counted; the edge passes the
//! response through.

use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::{BoxFuture, Either};
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use tokio::time::Instant;

use super::{Metrics, Outcome, TenantMetrics};
use crate::admission::rate::Budget;
use crate::admission::{ActualTokens, Error as AdmissionError, LIMIT_HEADER};
use crate::domain::{Class, TenantId, Tokens};
use crate::error::Error;
use crate::queue::QueueError;
use crate::response::{BoxError, ResponseBody};
use crate::tenant::Identity;

/// Tower layer of the request-metrics stage.
#[derive(Clone)]
pub struct Layer(pub Arc<Metrics>);

impl<S> tower::Layer<S> for Layer {
    type Service = Service<S>;
    fn layer(&self, inner: S) -> Service<S> {
        Service {
            metrics: self.0.clone(),
            inner,
        }
    }
}

/// Tower service of the request-metrics stage.
#[derive(Clone)]
pub struct Service<S> {
    metrics: Arc<Metrics>,
    inner: S,
}

/// A dispatched request that waited at least this long in the queue counts as deferred.
const DEFERRED: Duration = Duration::from_millis(1);

/// What the stages below learn about a request, for its metrics and log line; in the request's
/// extensions as `Arc<RequestLog>`.
pub struct RequestLog {
    metrics: Arc<Metrics>,
    tenant: Arc<TenantMetrics>,
    id: TenantId,
    fields: Mutex<Fields>,
}

#[derive(Default)]
struct Fields {
    model: Option<String>,
    estimated: Option<u64>,
    actual: Option<ActualTokens>,
    queued: Option<Duration>,
    dispatched_at: Option<Instant>,
}

/// A dispatched request, as the queue stage reports it.
pub struct Dispatch<'a> {
    /// The pool's index.
    pub pool: usize,
    /// The request's class.
    pub class: Class,
    /// Time queued.
    pub waited: Duration,
    /// Cost charged at dispatch (share ratio, Jain's index).
    pub charged: Tokens,
    /// Requested model.
    pub model: Option<&'a str>,
    /// Admission's estimate in raw tokens.
    pub estimated: Option<u64>,
    /// Where the usage stage records the actual tokens.
    pub actual: Option<ActualTokens>,
}

impl RequestLog {
    /// Records admission's estimate (raw tokens), before admission decides.
    pub fn estimated(&self, tokens: Tokens) {
        self.lock().estimated = Some(tokens.0);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Fields> {
        self.fields.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records the dispatch of the request (called once by the queue stage).
    pub fn dispatched(&self, d: Dispatch<'_>) {
        self.tenant.queue_wait(d.class, d.waited);
        self.metrics.served(d.pool, &self.id, d.charged.0);
        let mut f = self.lock();
        f.estimated = d.estimated.or(f.estimated);
        if let Some(e) = f.estimated {
            self.tenant.cost(Outcome::Admitted, e);
            if d.waited >= DEFERRED {
                self.tenant.cost(Outcome::Deferred, e);
            }
        }
        f.model = d.model.map(str::to_owned);
        f.actual = d.actual;
        f.queued = Some(d.waited);
        f.dispatched_at = Some(Instant::now());
    }
}

/// Why a request was refused, as a `reason` label.
pub fn reason(e: &Error) -> &'static str {
    match e {
        Error::Tenant(_) => "auth",
        Error::Body(_) | Error::Estimate(_) => "bad_request",
        Error::Route(_) => "no_route",
        Error::Admission(a) => match a {
            AdmissionError::RequestRate { .. } => "request_rate",
            AdmissionError::TokenRate { budget, .. } => match budget {
                Budget::Tokens => "token_rate",
                Budget::Input => "input_token_rate",
                Budget::Output => "output_token_rate",
            },
            AdmissionError::TokenBurst { .. } => "token_burst",
            AdmissionError::InputTooLarge { .. } => "input_too_large",
            AdmissionError::OutputTooLarge { .. } => "output_too_large",
            AdmissionError::BadDeadline => "bad_request",
            AdmissionError::DeadlineInfeasible { .. } => "deadline_infeasible",
            AdmissionError::DeadlineExceeded { .. } => "deadline_exceeded",
        },
        Error::Queue(q) => match q {
            QueueError::TenantFull { .. } => "tenant_queue_full",
            QueueError::PoolFull { .. } => "pool_queue_full",
            QueueError::UnknownTenant => "unknown_tenant",
        },
        Error::Upstream(_) => "upstream_error",
        Error::Internal(_) => "internal",
    }
}

/// The `x-fairgate-limit` value of a response, as a static label.
fn limit_of(res: &Response<ResponseBody>) -> Option<&'static str> {
    let v = res.headers().get(LIMIT_HEADER)?;
    ["tenant", "queue", "upstream"]
        .into_iter()
        .find(|l| v.as_bytes() == l.as_bytes())
}

impl<S, B> tower::Service<Request<B>> for Service<S>
where
    S: tower::Service<Request<B>, Response = Response<ResponseBody>, Error = Error>,
    S::Future: Send + 'static,
{
    type Response = Response<ResponseBody>;
    type Error = Error;
    type Future = Either<S::Future, BoxFuture<'static, Result<Self::Response, Error>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let Some(id) = req.extensions().get::<Identity>() else {
            return Either::Left(self.inner.call(req));
        };
        let Some(tenant) = self.metrics.tenant(&id.tenant.id).cloned() else {
            return Either::Left(self.inner.call(req));
        };
        let log = Arc::new(RequestLog {
            metrics: self.metrics.clone(),
            tenant,
            id: id.tenant.id.clone(),
            fields: Mutex::default(),
        });
        req.extensions_mut().insert(log.clone());
        let start = Instant::now();
        let fut = self.inner.call(req);
        Either::Right(Box::pin(async move {
            let mut refused = None;
            let res = match fut.await {
                Ok(res) => res,
                Err(e) => {
                    refused = Some(reason(&e));
                    e.into_response()
                }
            };
            let status = res.status();
            let limit = limit_of(&res);
            if status == StatusCode::TOO_MANY_REQUESTS && refused.is_none() {
                refused = Some("upstream_429");
            }
            if let Some(r) = refused {
                log.tenant.rejected(r);
                if let Some(e) = log.lock().estimated {
                    log.tenant.cost(Outcome::Rejected, e);
                }
            }
            log.tenant.request(status.as_u16());
            let (head, body) = res.into_parts();
            let body = Timed {
                inner: body,
                done: Done {
                    log,
                    start,
                    first_byte: None,
                    status,
                    limit,
                    refused,
                },
            };
            Ok(Response::from_parts(head, ResponseBody::boxed(body)))
        }))
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

/// Records the duration and writes the log line when the body is dropped.
struct Done {
    log: Arc<RequestLog>,
    start: Instant,
    first_byte: Option<Duration>,
    status: StatusCode,
    limit: Option<&'static str>,
    refused: Option<&'static str>,
}

impl Drop for Done {
    fn drop(&mut self) {
        let total = self.start.elapsed();
        let t = &self.log.tenant;
        t.timings(total, self.first_byte);
        let f = self.log.fields.lock().unwrap_or_else(|p| p.into_inner());
        let actual = f.actual.as_ref().and_then(ActualTokens::get).map(|a| a.0);
        if let (Some(model), Some(estimated)) = (&f.model, f.estimated) {
            t.tokens(model, estimated, actual);
        }
        let upstream_ms = f.dispatched_at.map(|d| d.elapsed().as_millis() as u64);
        tracing::info!(
            target: "fairgate::request",
            tenant = self.log.id.as_str(),
            model = f.model.as_deref(),
            status = self.status.as_u16(),
            estimated_tokens = f.estimated,
            actual_tokens = actual,
            queue_ms = f.queued.map(|q| q.as_millis() as u64),
            upstream_ms,
            total_ms = total.as_millis() as u64,
            limit = self.limit,
            refused = self.refused,
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
                    this.done.first_byte = Some(this.done.start.elapsed());
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
