//! [`PermitBody`]: a response body that holds the request's permit until the body ends (or is
//! dropped), so the pool slot lives exactly as long as the stream.

use std::pin::Pin;
use std::task::{Context, Poll};

use http_body::{Body, Frame, SizeHint};

use super::permit::Permit;

pin_project_lite::pin_project! {
    /// Wraps `B`, releasing the permit at end of stream, on error, or on drop.
    pub struct PermitBody<B> {
        #[pin]
        inner: B,
        permit: Option<Permit>,
    }
}

impl<B> PermitBody<B> {
    /// Ties `permit` to `inner`'s lifetime.
    pub fn new(inner: B, permit: Permit) -> Self {
        Self {
            inner,
            permit: Some(permit),
        }
    }

    /// The permit, while the body is still streaming.
    pub fn permit_mut(&mut self) -> Option<&mut Permit> {
        self.permit.as_mut()
    }
}

impl<B: Body> Body for PermitBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let polled = this.inner.poll_frame(cx);
        if matches!(polled, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) {
            this.permit.take();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
