//! `[server] client_body_timeout_ms`: a request body that makes no progress for that long fails.
//!
//! [`TimedBody`] wraps the body hyper hands the service (nginx's `client_body_timeout`): the
//! clock starts when the body is first polled (a request whose body nobody reads costs no
//! timer), restarts at every frame, and when it runs out the body yields a [`BodyTimeout`]
//! error, which the body stage answers with 408.
//!
//! Invariants: the timeout measures the gap between frames, never the whole upload (a large
//! body that keeps arriving is never cut); one timer per body at most, armed only while the
//! body is pending and re-armed only when it fires (a frame costs a clock read, not a timer
//! update); after the error the body ends.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

use crate::response::BoxError;

/// The request body made no progress for the configured time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the request body made no progress for {} ms", .0.as_millis())]
pub struct BodyTimeout(pub Duration);

pin_project_lite::pin_project! {
    /// A body that fails with [`BodyTimeout`] after `timeout` without a frame.
    pub struct TimedBody<B> {
        #[pin]
        inner: B,
        timeout: Duration,
        last: Option<Instant>,
        sleep: Option<Pin<Box<Sleep>>>,
        failed: bool,
    }
}

impl<B> TimedBody<B> {
    /// Wraps `inner`.
    pub fn new(inner: B, timeout: Duration) -> Self {
        Self {
            inner,
            timeout,
            last: None,
            sleep: None,
            failed: false,
        }
    }
}

impl<B> Body for TimedBody<B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    type Data = B::Data;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        if *this.failed {
            return Poll::Ready(None);
        }
        let last = *this.last.get_or_insert_with(Instant::now);
        match this.inner.poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                *this.last = Some(Instant::now());
                return Poll::Ready(Some(Ok(frame)));
            }
            Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => {
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
                *this.failed = true;
                *this.sleep = None;
                return Poll::Ready(Some(Err(Box::new(BodyTimeout(*this.timeout)))));
            }
            sleep.as_mut().reset(deadline);
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.failed || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http_body_util::{BodyExt, StreamBody};
    use tokio::sync::mpsc;

    type Chunk = Result<Frame<Bytes>, std::convert::Infallible>;

    fn channel() -> (mpsc::Sender<Chunk>, TimedBody<StreamBody<ReceiverStream>>) {
        let (tx, rx) = mpsc::channel(4);
        let body = StreamBody::new(ReceiverStream(rx));
        (tx, TimedBody::new(body, Duration::from_secs(10)))
    }

    struct ReceiverStream(mpsc::Receiver<Chunk>);
    impl futures_util::Stream for ReceiverStream {
        type Item = Chunk;
        fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Chunk>> {
            self.0.poll_recv(cx)
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_body_fails_after_the_timeout_and_then_ends() {
        let (tx, mut body) = channel();
        tx.send(Ok(Frame::data(Bytes::from_static(b"a"))))
            .await
            .unwrap();
        assert!(body.frame().await.unwrap().is_ok());
        let start = Instant::now();
        let err = body.frame().await.unwrap().unwrap_err();
        assert_eq!(
            err.downcast_ref::<BodyTimeout>(),
            Some(&BodyTimeout(Duration::from_secs(10)))
        );
        assert_eq!(start.elapsed(), Duration::from_secs(10));
        assert!(body.frame().await.is_none());
        drop(tx);
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_keeps_arriving_is_never_cut() {
        let (tx, body) = channel();
        tokio::spawn(async move {
            for _ in 0..10 {
                tokio::time::sleep(Duration::from_secs(9)).await;
                let frame = Frame::data(Bytes::from_static(b"chunk"));
                if tx.send(Ok(frame)).await.is_err() {
                    return;
                }
            }
        });
        let collected = body.collect().await.unwrap().to_bytes();
        assert_eq!(collected.len(), 50);
    }
}
