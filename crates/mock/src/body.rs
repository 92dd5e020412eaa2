//! [`MockBody`]: the one response body type of the mock (a full buffer or a paced SSE stream).
//!
//! Invariants:
//! - An admitted request's [`InFlightGuard`] lives inside its body: it is marked completed when the
//!   last frame is handed to hyper, aborted when the mock cuts the stream, and otherwise counted as
//!   cancelled when hyper drops the body (client gone mid-stream).
//! - `is_end_stream` turns true exactly when the last frame has been handed out, so hyper never
//!   drops a finished body before the guard learned it was complete.
//! - An encoded (compressed) stream compresses each frame as it is handed out and writes the
//!   coding's trailer with the last one; a stream cut on purpose never gets a trailer.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use super::encoding::{encode_all, Encoder, Encoding};
use super::sse::{SseStream, Step};
use super::stats::InFlightGuard;

/// A mock response body.
#[derive(Debug)]
pub struct MockBody {
    kind: Kind,
    guard: Option<InFlightGuard>,
    /// Whether hyper was given one chance to flush before an abort (see `abort`).
    flushed: bool,
    /// Compresses an SSE stream frame by frame (see [`MockBody::encode`]).
    encoder: Option<Box<Encoder>>,
}

#[derive(Debug)]
enum Kind {
    /// A whole body; `abort` cuts the response right after its head.
    Full {
        data: Option<Bytes>,
        abort: bool,
    },
    Sse(Box<SseStream>),
}

impl MockBody {
    /// A complete body sent at once.
    pub(crate) fn full(data: impl Into<Bytes>, guard: Option<InFlightGuard>) -> Self {
        MockBody {
            kind: Kind::Full {
                data: Some(data.into()),
                abort: false,
            },
            guard,
            flushed: false,
            encoder: None,
        }
    }

    /// A head followed by a broken body (for `x-mock-abort-after` on non-streaming requests).
    pub(crate) fn aborted(guard: Option<InFlightGuard>) -> Self {
        MockBody {
            kind: Kind::Full {
                data: None,
                abort: true,
            },
            guard,
            flushed: false,
            encoder: None,
        }
    }

    /// A paced SSE stream.
    pub(crate) fn sse(stream: SseStream, guard: Option<InFlightGuard>) -> Self {
        MockBody {
            kind: Kind::Sse(Box::new(stream)),
            guard,
            flushed: false,
            encoder: None,
        }
    }

    /// Compresses this body with `encoding`; false (and unchanged) for a body cut on purpose.
    pub(crate) fn encode(&mut self, encoding: Encoding) -> bool {
        match &mut self.kind {
            Kind::Full {
                data: Some(data),
                abort: false,
            } => {
                *data = encode_all(encoding, data);
                true
            }
            Kind::Sse(_) => {
                self.encoder = Some(Box::new(Encoder::new(encoding)));
                true
            }
            Kind::Full { .. } => false,
        }
    }

    fn complete(&mut self) {
        if let Some(guard) = self.guard.take() {
            guard.complete();
        }
    }

    /// Cuts the stream; first yields once (waking itself) so hyper flushes what was already sent,
    /// otherwise the head and earlier chunks could be lost with the connection.
    fn abort(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        if !self.flushed {
            self.flushed = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        if let Some(guard) = self.guard.take() {
            guard.abort();
        }
        Poll::Ready(Some(Err(std::io::Error::new(
            std::io::ErrorKind::ConnectionAborted,
            "x-mock-abort-after: stream cut on purpose",
        ))))
    }
}

impl Body for MockBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        match &mut this.kind {
            Kind::Full { abort: true, .. } => {
                if this.flushed {
                    this.kind = Kind::Full {
                        data: None,
                        abort: false,
                    };
                }
                this.abort(cx)
            }
            Kind::Full { data, .. } => {
                let data = data.take();
                this.complete();
                Poll::Ready(data.map(|d| Ok(Frame::data(d))))
            }
            Kind::Sse(stream) => match stream.poll_next(cx) {
                Poll::Pending => Poll::Pending,
                Poll::Ready(Some(Step::Frame { data, last })) => {
                    let data = match (last, this.encoder.take()) {
                        (_, None) => data,
                        (true, Some(encoder)) => encoder.finish(&data),
                        (false, Some(mut encoder)) => {
                            let chunk = encoder.chunk(&data);
                            this.encoder = Some(encoder);
                            chunk
                        }
                    };
                    if last {
                        this.complete();
                    }
                    Poll::Ready(Some(Ok(Frame::data(data))))
                }
                Poll::Ready(Some(Step::Abort)) => this.abort(cx),
                Poll::Ready(None) => {
                    this.complete();
                    Poll::Ready(None)
                }
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Full { data, abort } => data.is_none() && !abort,
            Kind::Sse(stream) => stream.is_done(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Full {
                data: Some(d),
                abort: false,
            } => SizeHint::with_exact(d.len() as u64),
            Kind::Full {
                data: None,
                abort: false,
            } => SizeHint::with_exact(0),
            _ => SizeHint::default(),
        }
    }
}
