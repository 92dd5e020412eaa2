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
//!   a usage chunk must be removed.
//! - Reconciliation happens exactly once — at end of stream, on an error frame, or on drop
//!   (client gone, upstream abort) — and always before the guards of the body below (the
//!   permit) are released.
//! - Actual cost = usage (input, output) with the estimator's weights; without usage, the counted
//!   input and the generated text counted with the model's encoding (bounded like input counting;
//!   more than [`INLINE_MAX_BYTES`] of text is counted on the blocking pool, which keeps the
//!   body's guards — the permit — until it is done). A JSON body without usage or text (over the
//!   cap, cut short) falls back to its bytes / 4.
//! - Responses that are not 2xx are not observed.

pub mod extract;
pub mod sse;

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};

use crate::context::{Ctx, Usage};
use crate::domain::{Charge, Weight};
use crate::estimate::{Encoding, Endpoint, Estimate, Estimator, OutputKey, INLINE_MAX_BYTES};
use crate::response::{BoxError, Guard, ResponseBody};
use extract::Tally;
use sse::Scanner;

/// JSON response bodies larger than this are not parsed for usage.
pub const MAX_JSON_BYTES: usize = 4 << 20;

/// What a completed request is reconciled with.
#[derive(Debug)]
struct Ledger {
    estimator: Arc<Estimator>,
    key: OutputKey,
    endpoint: Endpoint,
    encoding: Encoding,
    input: u64,
    model_weight: Weight,
    ctx: Ctx,
}

enum Mode {
    Json {
        buf: Vec<u8>,
        total: u64,
        over: bool,
    },
    Sse(Scanner),
}

pin_project_lite::pin_project! {
    /// Wraps a response body; see the module docs.
    pub struct Body {
        #[pin]
        inner: ResponseBody,
        obs: Observer,
        ended: bool,
    }
    impl PinnedDrop for Body {
        fn drop(this: Pin<&mut Self>) {
            // hyper may drop a body once its content-length is written, without polling its
            // end. Runs before the fields drop: the usage is written before the inner body's
            // guards (the permit) go.
            let mut this = this.project();
            let (_, work) = this.obs.end();
            finish(work, this.inner.as_mut());
        }
    }
}

/// The observing state.
struct Observer {
    mode: Mode,
    tally: Tally,
    strip: bool,
    ledger: Option<Ledger>,
}

/// Reconciliation too large to run inline.
type Work = Box<dyn FnOnce() + Send>;

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
    /// Observes `inner`, the 2xx response to the request of `ctx` with `estimate`.
    pub fn new(
        inner: ResponseBody,
        estimate: &Estimate,
        estimator: Arc<Estimator>,
        ctx: Ctx,
        sse: bool,
    ) -> Self {
        let strip = sse && estimate.strip_usage;
        let max_text = estimator.config().max_exact_bytes;
        let obs = Observer {
            mode: if sse {
                Mode::Sse(Scanner::new(strip))
            } else {
                Mode::Json {
                    buf: Vec::new(),
                    total: 0,
                    over: false,
                }
            },
            tally: Tally::new(max_text),
            strip,
            ledger: Some(Ledger {
                estimator,
                key: estimate.key.clone(),
                endpoint: estimate.endpoint,
                encoding: estimate.encoding,
                input: estimate.input.tokens,
                model_weight: estimate.model_weight,
                ctx,
            }),
        };
        Self {
            inner,
            obs,
            ended: false,
        }
    }
}

impl Observer {
    fn see(&mut self, data: Bytes) -> Bytes {
        match &mut self.mode {
            Mode::Json { buf, total, over } => {
                *total += data.len() as u64;
                if !*over && buf.len() + data.len() <= MAX_JSON_BYTES {
                    buf.extend_from_slice(&data);
                } else {
                    *over = true;
                    *buf = Vec::new();
                }
                data
            }
            Mode::Sse(scanner) => {
                let (tally, strip) = (&mut self.tally, self.strip);
                scanner.feed(data, &mut |p| keep(tally, strip, p))
            }
        }
    }

    /// Ends observation: returns bytes still held back (strip mode), and reconciles (inline, or
    /// the returned work for the blocking pool). Idempotent.
    fn end(&mut self) -> (Bytes, Option<Work>) {
        let held = match &mut self.mode {
            Mode::Json { buf, over, .. } => {
                let buf = std::mem::take(buf);
                if !*over && !buf.is_empty() {
                    self.tally.observe_body(&buf);
                }
                Bytes::new()
            }
            Mode::Sse(scanner) => {
                let (tally, strip) = (&mut self.tally, self.strip);
                scanner.finish(&mut |p| keep(tally, strip, p))
            }
        };
        (held, self.reconcile())
    }

    fn reconcile(&mut self) -> Option<Work> {
        let l = self.ledger.take()?;
        let usage = self.tally.usage;
        let json_bytes = match &self.mode {
            Mode::Json {
                total, over: true, ..
            } => Some(*total),
            _ => None,
        };
        let text = std::mem::take(&mut self.tally.text);
        let extra = self.tally.extra_bytes;
        let big = usage.is_none() && text.len() > INLINE_MAX_BYTES;
        let work = move || reconcile(l, usage, text, extra, json_bytes);
        if big {
            Some(Box::new(work))
        } else {
            work();
            None
        }
    }
}

/// The SSE payload filter: observe, and drop the usage-only chunk in strip mode.
fn keep(tally: &mut Tally, strip: bool, payload: &[u8]) -> bool {
    if payload.first() != Some(&b'{') {
        return true;
    }
    let seen = tally.observe(payload);
    !(strip && seen.usage_only)
}

fn reconcile(
    l: Ledger,
    usage: Option<extract::Usage>,
    text: String,
    extra_bytes: u64,
    json_bytes: Option<u64>,
) {
    let had_usage =
        usage.is_some_and(|u| u.completion_tokens.is_some() || l.endpoint == Endpoint::Embeddings);
    let input = usage.and_then(|u| u.prompt_tokens).unwrap_or(l.input);
    let output = if l.endpoint == Endpoint::Embeddings {
        0
    } else if let Some(out) = usage.and_then(|u| u.completion_tokens) {
        out
    } else if let Some(bytes) = json_bytes {
        bytes.div_ceil(4)
    } else {
        let counted = l.estimator.count_text(l.encoding, &text);
        let ratio = if counted.tokens > 0 {
            text.len() as f64 / counted.tokens as f64
        } else {
            4.0
        };
        counted.tokens + (extra_bytes as f64 / ratio.max(1.0)).ceil() as u64
    };
    let actual = l.estimator.actual_cost(input, output, l.model_weight);
    l.ctx.set_usage(Usage {
        tokens: Charge { input, output },
        cost: actual,
        reported: had_usage,
    });
    if l.endpoint != Endpoint::Embeddings {
        l.estimator.record_output(&l.key, output);
    }
    if let Some(d) = l.ctx.dispatch() {
        l.estimator
            .record_error(&l.key.tenant, d.charged, actual, had_usage);
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
                        if out.is_empty() {
                            continue;
                        }
                        Poll::Ready(Some(Ok(Frame::data(out))))
                    }
                    Err(frame) => Poll::Ready(Some(Ok(frame))),
                },
                Poll::Ready(Some(Err(e))) => {
                    let (_, work) = this.obs.end();
                    finish(work, this.inner.as_mut());
                    *this.ended = true;
                    Poll::Ready(Some(Err(e)))
                }
                Poll::Ready(None) => {
                    let (held, work) = this.obs.end();
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
        if self.obs.strip {
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
    type Future = futures_util::future::BoxFuture<'static, Result<Self::Response, crate::Error>>;

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
        let fut = self.inner.call(req);
        Box::pin(async move {
            let res = fut.await?;
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
    if sse && estimate.strip_usage {
        // Removing a chunk changes the length.
        head.headers.remove(http::header::CONTENT_LENGTH);
    }
    let body = Body::new(body, estimate, estimator, ctx, sse);
    http::Response::from_parts(head, ResponseBody::boxed(body))
}
