//! Usage stage: observes a response body as it streams to the client, reads what it cost (the
//! provider's `usage`, in JSON or in SSE events), and reconciles when the body ends or is
//! dropped: the permit's actual cost (so the scheduler corrects the tenant's credit), the learned
//! output estimate, and the estimate-error statistics.
//!
//! Invariants:
//! - No buffering, no added latency: every frame is forwarded as soon as it arrives. JSON bodies
//!   are copied aside as they pass, up to [`MAX_JSON_BYTES`], and parsed once at the end; SSE is
//!   scanned line by line (`sse`), holding back at most the current partial line, and only when
//!   a usage chunk must be removed.
//! - Reconciliation happens exactly once — at end of stream, on an error frame, or in `Drop`
//!   (client gone, upstream abort) — and always before the permit is released, so the release
//!   reconciles the tenant's credit with the actual cost.
//! - Actual cost = usage (input, output) with the estimator's weights; without usage, the counted
//!   input and the generated text counted with the model's encoding (bounded like input counting;
//!   more than [`INLINE_MAX_BYTES`] of text is counted on the blocking pool, which then releases
//!   the permit). A JSON body without usage or text (over the cap, cut short) falls back to its
//!   bytes / 4.
//! - Responses that are not 2xx are not observed (the queue stage keeps the plain permit).

pub mod extract;
pub mod sse;

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};

use crate::admission::ActualTokens;
use crate::domain::Weight;
use crate::estimate::{Encoding, Endpoint, Estimate, Estimator, OutputKey, INLINE_MAX_BYTES};
use crate::queue::Permit;
use crate::response::{BoxError, ResponseBody};
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
    permit: Permit,
    /// Admission's record of the actual tokens (input + output), for the rate-limit ledger.
    actual_tokens: Option<ActualTokens>,
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
}

/// The observing state; reconciles in `Drop` if the body did not end.
struct Observer {
    mode: Mode,
    tally: Tally,
    strip: bool,
    ledger: Option<Ledger>,
}

impl Drop for Observer {
    fn drop(&mut self) {
        // hyper may drop a body once its content-length is written, without polling its end.
        self.end();
    }
}

impl Body {
    /// Observes `inner`, the 2xx response to a request with `estimate`; reconciles `permit`.
    pub fn new(
        inner: ResponseBody,
        estimate: &Estimate,
        estimator: Arc<Estimator>,
        permit: Permit,
        sse: bool,
        actual_tokens: Option<ActualTokens>,
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
                permit,
                actual_tokens,
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

    /// Ends observation: returns bytes still held back (strip mode), reconciles. Idempotent.
    fn end(&mut self) -> Bytes {
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
        self.reconcile();
        held
    }

    fn reconcile(&mut self) {
        let Some(l) = self.ledger.take() else {
            return;
        };
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
        match tokio::runtime::Handle::try_current() {
            Ok(h) if big => drop(h.spawn_blocking(work)),
            _ => work(),
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
    mut l: Ledger,
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
    l.permit.set_actual(actual);
    if let Some(a) = &l.actual_tokens {
        a.set(input, output);
    }
    if l.endpoint != Endpoint::Embeddings {
        l.estimator.record_output(&l.key, output);
    }
    let charged = l.permit.charged();
    l.estimator
        .record_error(&l.key.tenant, charged, actual, had_usage);
    drop(l.permit);
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
                    this.obs.end();
                    *this.ended = true;
                    Poll::Ready(Some(Err(e)))
                }
                Poll::Ready(None) => {
                    let held = this.obs.end();
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
