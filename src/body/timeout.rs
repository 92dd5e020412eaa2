//! `[server] client_body_timeout_ms`: a request body that makes no progress for that long fails.
//!
//! [`TimedBody`] wraps the body hyper hands the service (nginx's `client_body_timeout`): the
//! clock starts when the body is first polled (a request whose body nobody reads costs no
//! timer), restarts at every frame, and when it runs out the body yields a [`BodyTimeout`]
//! error, which the body stage answers with 408.
//!
//! The gap is measured by the same mechanism as the upstream's idle timeout
//! ([`crate::response::idle::IdleTimeout`], started at the first poll here); see its invariants.

use std::time::Duration;

use crate::response::idle::IdleTimeout;

/// The request body made no progress for the configured time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the request body made no progress for {} ms", .0.as_millis())]
pub struct BodyTimeout(pub Duration);

/// A request body that fails with [`BodyTimeout`] after `timeout` without a frame.
pub type TimedBody<B> = IdleTimeout<B>;

/// Wraps `inner` in the client body timeout.
pub fn timed<B>(inner: B, timeout: Duration) -> TimedBody<B> {
    IdleTimeout::from_first_poll(inner, timeout, |d| Box::new(BodyTimeout(d)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use bytes::Bytes;
    use http_body::Frame;
    use http_body_util::{BodyExt, StreamBody};
    use tokio::sync::mpsc;
    use tokio::time::Instant;

    type Chunk = Result<Frame<Bytes>, std::convert::Infallible>;

    fn channel() -> (mpsc::Sender<Chunk>, TimedBody<StreamBody<ReceiverStream>>) {
        let (tx, rx) = mpsc::channel(4);
        let body = StreamBody::new(ReceiverStream(rx));
        (tx, timed(body, Duration::from_secs(10)))
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
