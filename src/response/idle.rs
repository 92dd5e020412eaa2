//! A body wrapper that fails the stream when no frame arrives within the idle timeout.
//!
//! Invariants: the timer restarts on every frame; after the timeout fires the stream yields one
//! error and then ends; the inner body is polled only when this body is polled (backpressure).

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
        #[pin]
        sleep: Sleep,
        timeout: Duration,
        done: bool,
    }
}

impl<B> IdleTimeout<B> {
    /// Wraps `body`; the first frame must arrive within `timeout` from now.
    pub fn new(body: B, timeout: Duration) -> Self {
        Self {
            body,
            sleep: tokio::time::sleep(timeout),
            timeout,
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
        let mut this = self.project();
        if *this.done {
            return Poll::Ready(None);
        }
        match this.body.poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                this.sleep.as_mut().reset(Instant::now() + *this.timeout);
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                *this.done = true;
                Poll::Ready(Some(Err(e.into())))
            }
            Poll::Ready(None) => {
                *this.done = true;
                Poll::Ready(None)
            }
            Poll::Pending => match this.sleep.poll(cx) {
                Poll::Ready(()) => {
                    *this.done = true;
                    Poll::Ready(Some(Err(Box::new(IdleTimeoutError(*this.timeout)))))
                }
                Poll::Pending => Poll::Pending,
            },
        }
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
