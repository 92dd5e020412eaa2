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
        Service {
            inner,
            not_ready: None,
        }
    }
}

/// Tower service of the edge.
pub struct Service<S> {
    inner: S,
    not_ready: Option<crate::Error>,
}

impl<S: Clone> Clone for Service<S> {
    fn clone(&self) -> Self {
        Service {
            inner: self.inner.clone(),
            not_ready: None,
        }
    }
}

impl<S, R> tower::Service<R> for Service<S>
where
    S: tower::Service<R, Response = Response<ResponseBody>, Error = crate::Error>,
{
    type Response = Response<ResponseBody>;
    type Error = Infallible;
    type Future = EdgeFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // A readiness error of the stack below is kept and rendered as the next call's
        // response (without calling the inner service), so the edge itself never fails.
        match self.inner.poll_ready(cx) {
            Poll::Ready(Ok(())) => Poll::Ready(Ok(())),
            Poll::Ready(Err(e)) => {
                self.not_ready = Some(e);
                Poll::Ready(Ok(()))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn call(&mut self, req: R) -> Self::Future {
        if let Some(e) = self.not_ready.take() {
            return EdgeFuture::Failed { error: Some(e) };
        }
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
        /// The inner service reported a readiness error.
        Failed { error: Option<crate::Error> },
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
            EdgeProj::Failed { error } => {
                let e = error
                    .take()
                    .unwrap_or(crate::Error::Internal("polled after completion"));
                Poll::Ready(Ok(finish(Ok(Err(e)))))
            }
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
