//! A body wrapper that fails the stream when no frame arrives within a gap: the upstream's
//! `idle_timeout_ms` (clock from creation, [`IdleTimeoutError`]) and the request body's
//! `client_body_timeout_ms` (clock from the first poll, see `body::timeout`) are both this one
//! mechanism.
//!
//! Invariants: the gap is measured from the last frame (a body that keeps arriving is never
//! cut); one timer per body at most, armed only while the body is pending and re-armed only
//! when it fires (a frame costs a clock read, not a timer update); after the error the stream
//! ends; the inner body is polled only when this body is polled (backpressure).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

use crate::response::BoxError;

/// The upstream went silent for longer than `idle_timeout_ms`.
#[derive(Debug, thiserror::Error)]
#[error("upstream sent nothing for {0:?}")]
pub struct IdleTimeoutError(pub Duration);

pin_project_lite::pin_project! {
    /// See the module docs.
    pub struct IdleTimeout<B> {
        #[pin]
        body: B,
        timeout: Duration,
        // The last frame (or the start); `None` until the first poll.
        last: Option<Instant>,
        sleep: Option<Pin<Box<Sleep>>>,
        error: fn(Duration) -> BoxError,
        done: bool,
    }
}

impl<B> IdleTimeout<B> {
    /// Wraps `body`; the first frame must arrive within `timeout` from now.
    pub fn new(body: B, timeout: Duration) -> Self {
        let mut t = Self::from_first_poll(body, timeout, |d| Box::new(IdleTimeoutError(d)));
        t.last = Some(Instant::now());
        t
    }

    /// Wraps `body`; the clock starts at its first poll (a body nobody reads costs no timer),
    /// and a gap of `timeout` fails the stream with `error(timeout)`.
    pub fn from_first_poll(body: B, timeout: Duration, error: fn(Duration) -> BoxError) -> Self {
        Self {
            body,
            timeout,
            last: None,
            sleep: None,
            error,
            done: false,
        }
    }
}

impl<B> Body for IdleTimeout<B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    type Data = B::Data;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, BoxError>>> {
        let this = self.project();
        if *this.done {
            return Poll::Ready(None);
        }
        let last = *this.last.get_or_insert_with(Instant::now);
        match this.body.poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                *this.last = Some(Instant::now());
                return Poll::Ready(Some(Ok(frame)));
            }
            Poll::Ready(Some(Err(e))) => {
                *this.done = true;
                *this.sleep = None;
                return Poll::Ready(Some(Err(e.into())));
            }
            Poll::Ready(None) => {
                *this.done = true;
                *this.sleep = None;
                return Poll::Ready(None);
            }
            Poll::Pending => {}
        }
        // The timer may be armed at an earlier deadline (frames arrived since): when it fires
        // early it is moved to the current one, and only then.
        let deadline = last + *this.timeout;
        let sleep = this
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        while sleep.as_mut().poll(cx).is_ready() {
            if Instant::now() >= deadline {
                *this.done = true;
                *this.sleep = None;
                return Poll::Ready(Some(Err((this.error)(*this.timeout))));
            }
            sleep.as_mut().reset(deadline);
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.done || self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http_body_util::{BodyExt, StreamBody};

    #[tokio::test(start_paused = true)]
    async fn silent_body_times_out_then_ends() {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, BoxError>>(1);
        let stream =
            futures_util::stream::unfold(
                rx,
                |mut rx| async move { rx.recv().await.map(|f| (f, rx)) },
            );
        let mut body = std::pin::pin!(IdleTimeout::new(
            StreamBody::new(stream),
            Duration::from_secs(5)
        ));
        tx.send(Ok(Frame::data(Bytes::from_static(b"a"))))
            .await
            .unwrap();
        let first = body.frame().await.unwrap().unwrap();
        assert_eq!(first.into_data().unwrap(), Bytes::from_static(b"a"));
        let err = body.frame().await.unwrap().unwrap_err();
        assert!(err.is::<IdleTimeoutError>());
        assert!(body.frame().await.is_none());
        drop(tx);
    }
}
