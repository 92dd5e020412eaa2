//! The one response body type that flows out of every stage: [`ResponseBody`]. A leaf: it
//! imports no other module of the crate.
//!
//! It is either a small in-memory body (errors, `/v1/models`, health) or the upstream's body
//! streamed frame by frame, never collected, with an idle timeout between frames. Any stage may
//! [`ResponseBody::attach`] a guard (e.g. a fair-queue permit) that lives exactly as long as the
//! body: it is dropped when the body ends, errors, or the client goes away.
//!
//! Invariants: the upstream body is polled only when the client polls (backpressure); dropping
//! this body drops the upstream body, which cancels the upstream request.

use std::any::Any;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::UnsyncBoxBody;

pub mod idle;
mod json;

use idle::IdleTimeout;
pub use json::{json, json_bytes};

/// Boxed error type of response bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A guard whose lifetime is tied to a response body.
pub type Guard = Box<dyn Any + Send + Sync>;

/// What a streamed response has produced so far, counted as its chunks pass (`usage`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    /// Output tokens so far.
    pub output: u64,
    /// Their cost with the request's input, in the fair queue's weighted tokens.
    pub cost: u64,
}

/// A guard that also follows a streamed response's cost while it runs: the fair queue's permit
/// (credit charged in steps) and admission's ledger guard (the token buckets debited in steps).
pub trait Meter: Send + Sync + 'static {
    /// The response has produced `progress` so far (it only grows). `false`: the stream passed
    /// a limit this meter enforces and should be ended.
    fn progress(&mut self, progress: Progress) -> bool;

    /// Whether this meter enforces a limit on the output (it may end the stream), so the
    /// output it is told must be counted exactly; else an estimate from the text's bytes does
    /// (the final usage settles it).
    fn exact(&self) -> bool {
        false
    }
}

/// Meters a stage hands down, in the request's extensions, to be attached by a stage below to
/// the body *it* returns: a guard that must settle after something the stage below writes
/// (admission's ledger reconcile after `usage`, which may be written off-thread once the body
/// above is gone) travels with the inner body. A meter never taken drops with the request.
#[derive(Clone, Default)]
pub struct Handoff(std::sync::Arc<std::sync::Mutex<Vec<Box<dyn Meter>>>>);

impl Handoff {
    /// Hands `meter` down.
    pub fn push(&self, meter: Box<dyn Meter>) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push(meter);
    }

    /// Takes the meters handed down so far.
    pub fn take(&self) -> Vec<Box<dyn Meter>> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

impl std::fmt::Debug for Handoff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handoff").finish_non_exhaustive()
    }
}

pin_project_lite::pin_project! {
    /// The response body of every stage; see the module docs.
    pub struct ResponseBody {
        #[pin]
        inner: Inner,
        guards: Vec<Guard>,
        meters: Vec<Box<dyn Meter>>,
    }
}

pin_project_lite::pin_project! {
    #[project = InnerProj]
    enum Inner {
        Full { data: Option<Bytes> },
        Upstream { #[pin] body: IdleTimeout<hyper::body::Incoming> },
        Boxed { #[pin] body: UnsyncBoxBody<Bytes, BoxError> },
    }
}

impl ResponseBody {
    /// A complete in-memory body.
    pub fn full(data: impl Into<Bytes>) -> Self {
        let data: Bytes = data.into();
        Self::new(Inner::Full {
            data: (!data.is_empty()).then_some(data),
        })
    }

    /// An empty body.
    pub fn empty() -> Self {
        Self::new(Inner::Full { data: None })
    }

    /// The upstream's streamed body, failing if no frame arrives within its idle timeout.
    pub fn upstream(body: IdleTimeout<hyper::body::Incoming>) -> Self {
        Self::new(Inner::Upstream { body })
    }

    /// Any other body (e.g. a wrapper that observes frames), boxed once.
    pub fn boxed<B>(body: B) -> Self
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        use http_body_util::BodyExt;
        Self::new(Inner::Boxed {
            body: body.map_err(Into::into).boxed_unsync(),
        })
    }

    fn new(inner: Inner) -> Self {
        Self {
            inner,
            guards: Vec::new(),
            meters: Vec::new(),
        }
    }

    /// Keeps `guard` alive until this body is dropped (end of stream, error or disconnect).
    pub fn attach(&mut self, guard: Guard) {
        self.guards.push(guard);
    }

    /// Keeps `meter` alive until this body is dropped, and tells it the stream's progress.
    pub fn attach_meter(&mut self, meter: Box<dyn Meter>) {
        self.meters.push(meter);
    }

    /// Tells every meter the stream's progress; `false` if one says the stream must end.
    pub fn progress(self: Pin<&mut Self>, progress: Progress) -> bool {
        let mut go_on = true;
        for m in self.project().meters.iter_mut() {
            go_on &= m.progress(progress);
        }
        go_on
    }

    /// Whether a meter needs the output counted exactly ([`Meter::exact`]).
    pub fn exact_progress(&self) -> bool {
        self.meters.iter().any(|m| m.exact())
    }

    /// Takes the guards (and meters) attached so far, for a wrapper that must keep them alive
    /// past this body (e.g. `usage` counting a finished stream's text off-thread before the
    /// permit goes).
    pub fn take_guards(self: Pin<&mut Self>) -> Vec<Guard> {
        let this = self.project();
        let mut guards = std::mem::take(this.guards);
        guards.extend(
            std::mem::take(this.meters)
                .into_iter()
                .map(|m| Box::new(m) as Guard),
        );
        guards
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.project().inner.project() {
            InnerProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            InnerProj::Upstream { body } => body.poll_frame(cx),
            InnerProj::Boxed { body } => body.poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Inner::Full { data } => data.is_none(),
            Inner::Upstream { body } => body.is_end_stream(),
            Inner::Boxed { body } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Inner::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            Inner::Upstream { body } => body.size_hint(),
            Inner::Boxed { body } => body.size_hint(),
        }
    }
}

impl std::fmt::Debug for ResponseBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseBody").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    struct Flag(Arc<AtomicBool>);
    impl Drop for Flag {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    #[tokio::test]
    async fn guard_lives_as_long_as_body() {
        let dropped = Arc::new(AtomicBool::new(false));
        let mut body = ResponseBody::full("hello");
        body.attach(Box::new(Flag(dropped.clone())));
        assert!(!dropped.load(Ordering::SeqCst));
        let bytes = body.collect().await.unwrap().to_bytes();
        assert_eq!(&bytes[..], b"hello");
        assert!(dropped.load(Ordering::SeqCst));
    }
}
