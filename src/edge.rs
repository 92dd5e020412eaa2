//! The outermost layer: turns every stage error into its OpenAI-shaped response (via
//! [`crate::Error::into_response`]), turns a panic into a 500 instead of a dropped connection,
//! and makes sure every response carries `x-fairgate-queue-ms`.
//!
//! Invariant: its service never fails (`Error = Infallible`), so hyper only ever sees responses.

use std::convert::Infallible;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_util::future::CatchUnwind;
use futures_util::FutureExt;
use http::{HeaderValue, Response};

use crate::response::ResponseBody;
use crate::upstream::QUEUE_MS_HEADER;

/// Tower layer of the edge.
#[derive(Clone, Copy, Default)]
pub struct Layer;

impl<S> tower::Layer<S> for Layer {
    type Service = Service<S>;
    fn layer(&self, inner: S) -> Service<S> {
        Service { inner }
    }
}

/// Tower service of the edge.
#[derive(Clone)]
pub struct Service<S> {
    inner: S,
}

impl<S, R> tower::Service<R> for Service<S>
where
    S: tower::Service<R, Response = Response<ResponseBody>, Error = crate::Error>,
{
    type Response = Response<ResponseBody>;
    type Error = Infallible;
    type Future = EdgeFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // Inner readiness errors are rendered by `call`'s future instead; readiness is the
        // inner's, and the stages below are always ready or report readiness via the future.
        match self.inner.poll_ready(cx) {
            Poll::Ready(Ok(())) => Poll::Ready(Ok(())),
            Poll::Ready(Err(e)) => {
                tracing::error!(error = %e, "service not ready");
                Poll::Ready(Ok(()))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn call(&mut self, req: R) -> Self::Future {
        match std::panic::catch_unwind(AssertUnwindSafe(|| self.inner.call(req))) {
            Ok(fut) => EdgeFuture::Running {
                fut: AssertUnwindSafe(fut).catch_unwind(),
            },
            Err(_) => EdgeFuture::Panicked,
        }
    }
}

pin_project_lite::pin_project! {
    /// Future of the edge service.
    #[project = EdgeProj]
    pub enum EdgeFuture<F> {
        /// The inner future.
        Running { #[pin] fut: CatchUnwind<AssertUnwindSafe<F>> },
        /// `call` itself panicked.
        Panicked,
    }
}

fn finish(
    result: std::thread::Result<Result<Response<ResponseBody>, crate::Error>>,
) -> Response<ResponseBody> {
    let mut res = match result {
        Ok(Ok(res)) => res,
        Ok(Err(e)) => {
            tracing::debug!(status = e.status().as_u16(), error = %e, "request rejected");
            e.into_response()
        }
        Err(_) => {
            tracing::error!("a request handler panicked");
            crate::Error::Internal("request handler panicked").into_response()
        }
    };
    res.headers_mut()
        .entry(QUEUE_MS_HEADER)
        .or_insert(HeaderValue::from_static("0"));
    res
}

impl<F> Future for EdgeFuture<F>
where
    F: Future<Output = Result<Response<ResponseBody>, crate::Error>>,
{
    type Output = Result<Response<ResponseBody>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            EdgeProj::Running { fut } => fut.poll(cx).map(|r| Ok(finish(r))),
            EdgeProj::Panicked => Poll::Ready(Ok(finish(Err(Box::new("panic"))))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::{Service as _, ServiceExt};

    #[tokio::test]
    async fn errors_and_panics_become_responses() {
        let failing = tower::service_fn(|_: ()| async {
            Err::<Response<ResponseBody>, _>(crate::Error::Internal("x"))
        });
        let res = tower::Layer::layer(&Layer, failing)
            .oneshot(())
            .await
            .unwrap();
        assert_eq!(res.status(), 500);
        assert_eq!(res.headers()[QUEUE_MS_HEADER], "0");

        let panicking = tower::service_fn(|flag: bool| async move {
            if flag {
                panic!("boom");
            }
            Ok::<_, crate::Error>(Response::new(ResponseBody::empty()))
        });
        let mut svc = tower::Layer::layer(&Layer, panicking);
        let res = svc.ready().await.unwrap().call(true).await.unwrap();
        assert_eq!(res.status(), 500);
        let res = svc.ready().await.unwrap().call(false).await.unwrap();
        assert_eq!(res.status(), 200);
    }
}
