//! Lingering close (nginx's `lingering_close`): a request body that the proxy stops reading
//! early — a 413 over `max_body_bytes`, a 401 before the body is read — is read and discarded in
//! the background, up to `[server] linger_max_bytes` and for at most `linger_timeout_ms`, so the
//! client, still sending, reads the early answer instead of a connection reset. Past either
//! bound the body is dropped and hyper closes the connection; a body drained to its end leaves
//! the connection usable.
//!
//! [`Linger`] wraps the body hyper hands the service. When it is dropped before its end it
//! hands the rest to a spawned task that reads and discards it.
//!
//! Invariants: HTTP/1 only (h2 ends a stream without touching the connection); a body that
//! ended, failed (the `client_body_timeout_ms` 408, a reset) or that the client has not begun to
//! send (`Expect: 100-continue`, never polled) is not drained; at most one drain per connection
//! (hyper reads no next request before the body is gone), each bounded in bytes and time.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;

use crate::response::BoxError;

/// How much of an abandoned body is discarded, and for how long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// `[server] linger_max_bytes`.
    pub max_bytes: u64,
    /// `[server] linger_timeout_ms`.
    pub max_time: Duration,
}

/// A request body drained in the background when dropped early; see the module docs.
pub struct Linger<B> {
    inner: Option<B>,
    /// The drain for this body type (`None`: never drain this body).
    drain: Option<fn(B, Bounds)>,
    bounds: Bounds,
    /// `Expect: 100-continue`: the client waits for the first read before sending.
    expect_continue: bool,
    polled: bool,
    ended: bool,
}

impl<B> Linger<B>
where
    B: Body<Data = Bytes> + Unpin + Send + 'static,
    B::Error: Into<BoxError>,
{
    /// Wraps the body of `req` (its head is only read).
    pub fn new<T>(inner: B, bounds: Bounds, req: &http::Request<T>) -> Self {
        let h1 = req.version() < http::Version::HTTP_2;
        let expect_continue = req
            .headers()
            .get(http::header::EXPECT)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
        Self {
            inner: Some(inner),
            drain: (h1 && bounds.max_bytes > 0).then_some(drain::<B> as fn(B, Bounds)),
            bounds,
            expect_continue,
            polled: false,
            ended: false,
        }
    }
}

/// Reads and discards `body` up to its bounds, on the current runtime.
fn drain<B>(mut body: B, bounds: Bounds)
where
    B: Body<Data = Bytes> + Unpin + Send + 'static,
    B::Error: Into<BoxError>,
{
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    rt.spawn(async move {
        let mut left = bounds.max_bytes;
        let read = async {
            while let Some(Ok(frame)) = body.frame().await {
                let n = frame.data_ref().map_or(0, |d| d.len() as u64);
                match left.checked_sub(n) {
                    Some(l) => left = l,
                    None => return,
                }
            }
        };
        let _ = tokio::time::timeout(bounds.max_time, read).await;
    });
}

impl<B> Drop for Linger<B> {
    fn drop(&mut self) {
        if self.ended || (self.expect_continue && !self.polled) {
            return;
        }
        if let (Some(body), Some(drain)) = (self.inner.take(), self.drain) {
            drain(body, self.bounds);
        }
    }
}

impl<B> Body for Linger<B>
where
    B: Body + Unpin,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        this.polled = true;
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(None);
        };
        let polled = Pin::new(inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) {
            this.ended = true;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(|b| b.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), |b| b.size_hint())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::StreamBody;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    /// A body of `n` 1 KiB frames that counts what was read from it.
    fn counted(
        n: usize,
        read: Arc<AtomicU64>,
    ) -> impl Body<Data = Bytes, Error = std::convert::Infallible> + Unpin + Send + 'static {
        let frames = futures_util::stream::iter((0..n).map(move |_| {
            read.fetch_add(1024, Ordering::Relaxed);
            Ok::<_, std::convert::Infallible>(Frame::data(Bytes::from(vec![0u8; 1024])))
        }));
        StreamBody::new(frames)
    }

    const BOUNDS: Bounds = Bounds {
        max_bytes: 10 * 1024,
        max_time: Duration::from_secs(5),
    };

    fn req(version: http::Version, expect: bool) -> http::Request<()> {
        let mut b = http::Request::builder().version(version);
        if expect {
            b = b.header(http::header::EXPECT, "100-continue");
        }
        b.body(()).unwrap()
    }

    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn an_abandoned_body_is_drained_up_to_its_bound() {
        let read = Arc::new(AtomicU64::new(0));
        let h = req(http::Version::HTTP_11, false);
        drop(Linger::new(counted(100, read.clone()), BOUNDS, &h));
        settle().await;
        // Up to the bound (plus the frame that crossed it), not the whole 100 KiB.
        assert_eq!(read.load(Ordering::Relaxed), 11 * 1024);
        let read = Arc::new(AtomicU64::new(0));
        drop(Linger::new(counted(3, read.clone()), BOUNDS, &h));
        settle().await;
        assert_eq!(read.load(Ordering::Relaxed), 3 * 1024);
    }

    #[tokio::test]
    async fn no_drain_for_h2_an_ended_body_or_an_unsent_expect_continue_body() {
        let read = Arc::new(AtomicU64::new(0));
        let h2 = req(http::Version::HTTP_2, false);
        drop(Linger::new(counted(4, read.clone()), BOUNDS, &h2));
        let expect = req(http::Version::HTTP_11, true);
        drop(Linger::new(counted(4, read.clone()), BOUNDS, &expect));
        settle().await;
        assert_eq!(read.load(Ordering::Relaxed), 0);
        let h = req(http::Version::HTTP_11, false);
        let mut done = Linger::new(counted(2, read.clone()), BOUNDS, &h);
        while done.frame().await.is_some() {}
        drop(done);
        settle().await;
        assert_eq!(read.load(Ordering::Relaxed), 2048);
    }
}
