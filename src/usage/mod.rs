//! Usage stage (reconcile): observes a 2xx response body as it streams to the client, reads
//! what it cost (the provider's `usage`, in JSON or in SSE events), and writes the context's
//! `usage` when the body ends or is dropped; the learned output estimate and the
//! estimate-error statistics are updated then too. The stages that settle a charge read the
//! context's `usage` when their guard on the body drops: the fair-queue permit (the tenant's
//! credit) and admission (the tenant's token buckets).
//!
//! Sits between `admission` and `queue`, so its body wraps the body the permit is attached
//! to: the usage is always written before the permit is released.
//!
//! Invariants:
//! - No buffering, no added latency: every frame is forwarded as soon as it arrives. JSON bodies
//!   are copied aside as they pass, up to [`MAX_JSON_BYTES`], and parsed once at the end; SSE is
//!   scanned line by line (`sse`), holding back at most the current partial line, and only when
//!   a usage chunk must be removed. SSE events are skimmed, never parsed whole (`skim`: only a
//!   `usage` object on its path is; an event shaped like the last one is compared with it, not
//!   walked), and a stream's output is counted with the tokenizer while
//!   it passes only when a meter enforces a limit on it (`Meter::exact`).
//! - Reconciliation happens exactly once — at end of stream, on an error frame, or on drop
//!   (client gone, upstream abort) — and always before the guards of the body below (the
//!   permit) are released.
//! - Any `Content-Encoding` (gzip, deflate, br, zstd): the provider's bytes go to the client
//!   unchanged and a decoded copy is observed as frames pass (`decode`); the estimate stage asks
//!   the provider for `identity` only when a stream must be edited (strip mode).
//! - Actual cost = usage (input, output) with the estimator's weights; without usage, the stated
//!   fallback of `observe` (counted text, or bytes / 4, or the admission charge — never 0
//!   output), and the reason in the context's `usage.unread`. More than
//!   [`INLINE_MAX_BYTES`](crate::estimate::INLINE_MAX_BYTES) of text is counted on the blocking
//!   pool, which keeps the body's guards — the permit — until it is done.
//! - Responses that are not 2xx are not observed.

pub mod decode;
pub mod extract;
mod flat;
mod keys;
pub mod meta;
mod observe;
pub mod skim;
pub mod sse;

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};

use crate::context::Ctx;
use crate::estimate::{Estimate, Estimator};
use crate::response::{BoxError, Guard, Handoff, ResponseBody};
use decode::Coding;
use observe::{Observer, Work};

/// JSON response bodies larger than this (decoded) are not parsed for usage.
pub const MAX_JSON_BYTES: usize = 4 << 20;

pin_project_lite::pin_project! {
    /// Wraps a response body; see the module docs.
    pub struct Body {
        #[pin]
        inner: ResponseBody,
        obs: Observer,
        ended: bool,
        // SSE whose bytes reach the client as the provider sent them (identity): it can be
        // ended with an event of fairgate's own.
        cuttable: bool,
        // The bytes forwarded so far ended at an SSE event boundary.
        at_boundary: bool,
        ctx: Ctx,
    }
    impl PinnedDrop for Body {
        fn drop(this: Pin<&mut Self>) {
            // hyper may drop a body once its content-length is written, without polling its
            // end. Runs before the fields drop: the usage is written before the inner body's
            // guards (the permit) go.
            let mut this = this.project();
            let (_, work) = this.obs.end(false);
            finish(work, this.inner.as_mut());
        }
    }
}

/// What the client of a stream cut for its limits is told, in its last event (in OpenAI's
/// error shape, like every refusal: [`crate::error::openai_json`]).
#[derive(Debug, thiserror::Error)]
#[error(
    "The stream was ended: it passed this tenant's streamed output limit \
     (max_stream_output_tokens) or its remaining token budget."
)]
pub struct StreamCut;

impl crate::error::ApiError for StreamCut {
    fn status(&self) -> http::StatusCode {
        http::StatusCode::OK
    }
    fn kind(&self) -> &'static str {
        "tokens"
    }
    fn code(&self) -> &'static str {
        "stream_budget_exceeded"
    }
    fn reason(&self) -> crate::error::Reason {
        crate::error::Reason::StreamBudget
    }
}

/// The bytes that end a cut stream: `out` up to its last complete event (or all of it, closed
/// by a blank line, when none ends in it and the stream so far did not end at a boundary), then
/// an error event in OpenAI's shape and `[DONE]`.
fn cut(out: Bytes, at_boundary: bool) -> Bytes {
    let end = out.windows(2).rposition(|w| w == b"\n\n").map(|i| i + 2);
    let mut buf = Vec::with_capacity(out.len() + 256);
    match end {
        Some(end) => buf.extend_from_slice(&out[..end]),
        None if !at_boundary => {
            buf.extend_from_slice(&out);
            buf.extend_from_slice(b"\n\n");
        }
        None => {}
    }
    buf.extend_from_slice(b"data: ");
    buf.extend_from_slice(&crate::error::openai_json(&StreamCut));
    buf.extend_from_slice(b"\n\ndata: [DONE]\n\n");
    Bytes::from(buf)
}

/// Runs `work` on the blocking pool, holding `inner`'s guards until it is done.
fn finish(work: Option<Work>, inner: Pin<&mut ResponseBody>) {
    let Some(work) = work else {
        return;
    };
    let guards: Vec<Guard> = inner.take_guards();
    let job = move || {
        work();
        drop(guards);
    };
    match tokio::runtime::Handle::try_current() {
        Ok(h) => drop(h.spawn_blocking(job)),
        Err(_) => job(),
    }
}

impl Body {
    /// Observes `inner`, the 2xx response to the request of `ctx` with `estimate`: SSE when
    /// `sse`, else JSON; coded with `coding` (`None`: a coding fairgate cannot decode).
    pub fn new(
        inner: ResponseBody,
        estimate: &Estimate,
        estimator: Arc<Estimator>,
        ctx: Ctx,
        sse: bool,
        coding: Option<Coding>,
    ) -> Self {
        Self {
            inner,
            obs: Observer::new(estimate, estimator, ctx.clone(), sse, coding),
            ended: false,
            cuttable: sse && coding == Some(Coding::Identity),
            at_boundary: true,
            ctx,
        }
    }
}

impl HttpBody for Body {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut this = self.project();
        if *this.ended {
            return Poll::Ready(None);
        }
        loop {
            return match this.inner.as_mut().poll_frame(cx) {
                Poll::Pending => Poll::Pending,
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => {
                        let out = this.obs.see(data);
                        let exact = this.inner.exact_progress();
                        let go_on = match this.obs.progress(exact) {
                            Some(p) => this.inner.as_mut().progress(p),
                            None => true,
                        };
                        if !go_on && *this.cuttable {
                            // Past a stream limit: usage is written now (from the text counted
                            // so far), the upstream body is dropped (the provider's request is
                            // cancelled, the guards settle), and the client gets a final error
                            // event and `[DONE]`.
                            this.ctx.set_cut(crate::error::ApiError::reason(&StreamCut));
                            let out = cut(out, *this.at_boundary);
                            let (_, work) = this.obs.end(false);
                            finish(work, this.inner.as_mut());
                            this.inner.set(ResponseBody::empty());
                            *this.ended = true;
                            return Poll::Ready(Some(Ok(Frame::data(out))));
                        }
                        if out.is_empty() {
                            continue;
                        }
                        *this.at_boundary = out.ends_with(b"\n\n") || out.ends_with(b"\r\n\r\n");
                        Poll::Ready(Some(Ok(Frame::data(out))))
                    }
                    Err(frame) => Poll::Ready(Some(Ok(frame))),
                },
                Poll::Ready(Some(Err(e))) => {
                    let (_, work) = this.obs.end(false);
                    finish(work, this.inner.as_mut());
                    *this.ended = true;
                    Poll::Ready(Some(Err(e)))
                }
                Poll::Ready(None) => {
                    let (held, work) = this.obs.end(true);
                    finish(work, this.inner.as_mut());
                    *this.ended = true;
                    if held.is_empty() {
                        Poll::Ready(None)
                    } else {
                        Poll::Ready(Some(Ok(Frame::data(held))))
                    }
                }
            };
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended
    }

    fn size_hint(&self) -> SizeHint {
        if self.obs.strips() {
            SizeHint::default()
        } else {
            self.inner.size_hint()
        }
    }
}

/// Tower layer of the usage stage: holds the estimator it reconciles into.
#[derive(Clone)]
pub struct Layer(pub Arc<Estimator>);

impl<S> tower::Layer<S> for Layer {
    type Service = Service<S>;
    fn layer(&self, inner: S) -> Service<S> {
        Service {
            estimator: self.0.clone(),
            inner,
        }
    }
}

/// Tower service of the usage stage: wraps each 2xx response body in a [`Body`].
#[derive(Clone)]
pub struct Service<S> {
    estimator: Arc<Estimator>,
    inner: S,
}

impl<S> tower::Service<http::Request<Bytes>> for Service<S>
where
    S: tower::Service<
            http::Request<Bytes>,
            Response = http::Response<ResponseBody>,
            Error = crate::Error,
        > + Send,
    S::Future: Send + 'static,
{
    type Response = http::Response<ResponseBody>;
    type Error = crate::Error;
    type Future = crate::stage::BoxFuture<Result<Self::Response, crate::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), crate::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Bytes>) -> Self::Future {
        let ctx = match crate::context::of(&req) {
            Ok(ctx) => ctx,
            Err(e) => return Box::pin(std::future::ready(Err(e))),
        };
        if let Err(e) = ctx.estimate() {
            return Box::pin(std::future::ready(Err(e)));
        }
        let estimator = self.estimator.clone();
        // Guards that settle from the usage (admission's ledger) go on the body observed, so
        // they drop after the usage is written, on- or off-thread.
        let handed = req
            .extensions()
            .get::<Handoff>()
            .map(Handoff::take)
            .unwrap_or_default();
        let fut = self.inner.call(req);
        Box::pin(async move {
            let mut res = fut.await?;
            for meter in handed {
                res.body_mut().attach_meter(meter);
            }
            if !res.status().is_success() {
                return Ok(res);
            }
            let estimate = ctx.estimate()?.clone();
            Ok(observe(res, &estimate, estimator, ctx))
        })
    }
}

/// Wraps a 2xx response body in the usage observer.
fn observe(
    res: http::Response<ResponseBody>,
    estimate: &Estimate,
    estimator: Arc<Estimator>,
    ctx: Ctx,
) -> http::Response<ResponseBody> {
    let (mut head, body) = res.into_parts();
    let sse = head
        .headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let coding = Coding::of(&head.headers).ok();
    if sse && estimate.strip_usage && coding == Some(Coding::Identity) {
        // Removing a chunk changes the length.
        head.headers.remove(http::header::CONTENT_LENGTH);
    }
    let body = Body::new(body, estimate, estimator, ctx, sse, coding);
    http::Response::from_parts(head, ResponseBody::boxed(body))
}
