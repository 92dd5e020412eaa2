//! The outermost layer: creates the request's [`Ctx`], and turns every outcome into exactly one
//! response — a stage's [`Error`] into OpenAI's error shape (here and nowhere else), a panic
//! into a 500 instead of a dropped connection — and writes `x-fairgate-queue-ms` (time queued,
//! from the context; 0 for requests that were never queued) and `x-request-id` (the client's,
//! else the provider's, else one generated at arrival) on every response.
//!
//! Invariant: its service never fails (`Error = Infallible`), so hyper only ever sees responses.

use std::convert::Infallible;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_util::future::CatchUnwind;
use futures_util::FutureExt;
use http::{HeaderValue, Request, Response, StatusCode};

use crate::context::{Ctx, REQUEST_ID_HEADER};
use crate::error::Error;
use crate::response::ResponseBody;

/// Response header: milliseconds the request spent queued.
pub const QUEUE_MS_HEADER: http::HeaderName = http::HeaderName::from_static("x-fairgate-queue-ms");

/// Renders `e` in OpenAI's error shape `{"error":{"message","type","code","param"}}` with its
/// status and headers.
pub fn error(e: &Error) -> Response<ResponseBody> {
    let api = e.api();
    let mut res = crate::response::json_bytes(api.status(), crate::error::openai_json(api));
    res.headers_mut().extend(e.all_headers());
    res
}

/// Tower layer of the renderer.
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

/// Tower service of the renderer.
pub struct Service<S> {
    inner: S,
    not_ready: Option<Error>,
}

impl<S: Clone> Clone for Service<S> {
    fn clone(&self) -> Self {
        Service {
            inner: self.inner.clone(),
            not_ready: None,
        }
    }
}

impl<S, B> tower::Service<Request<B>> for Service<S>
where
    S: tower::Service<Request<B>, Response = Response<ResponseBody>, Error = Error>,
{
    type Response = Response<ResponseBody>;
    type Error = Infallible;
    type Future = RenderFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // A readiness error of the stack below is kept and rendered as the next call's
        // response (without calling the inner service), so this layer itself never fails.
        match self.inner.poll_ready(cx) {
            Poll::Ready(Ok(())) => Poll::Ready(Ok(())),
            Poll::Ready(Err(e)) => {
                self.not_ready = Some(e);
                Poll::Ready(Ok(()))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let ctx = Ctx::with_ids(
            req.headers().get(REQUEST_ID_HEADER),
            req.headers().get(crate::context::TRACEPARENT),
        );
        req.extensions_mut().insert(ctx.clone());
        if let Some(e) = self.not_ready.take() {
            return RenderFuture::Failed {
                error: Some(e),
                ctx,
            };
        }
        match std::panic::catch_unwind(AssertUnwindSafe(|| self.inner.call(req))) {
            Ok(fut) => RenderFuture::Running {
                fut: AssertUnwindSafe(fut).catch_unwind(),
                ctx,
            },
            Err(_) => RenderFuture::Panicked { ctx },
        }
    }
}

pin_project_lite::pin_project! {
    /// Future of the renderer.
    #[project = RenderProj]
    pub enum RenderFuture<F> {
        /// The inner future.
        Running { #[pin] fut: CatchUnwind<AssertUnwindSafe<F>>, ctx: Ctx },
        /// `call` itself panicked.
        Panicked { ctx: Ctx },
        /// The inner service reported a readiness error.
        Failed { error: Option<Error>, ctx: Ctx },
    }
}

fn finish(
    result: std::thread::Result<Result<Response<ResponseBody>, Error>>,
    ctx: &Ctx,
) -> Response<ResponseBody> {
    let mut res = match result {
        Ok(Ok(res)) => res,
        Ok(Err(e)) => {
            tracing::debug!(status = e.status().as_u16(), error = %e, "request refused");
            error(&e)
        }
        Err(_) => {
            tracing::error!("a request handler panicked");
            let mut res = error(&Error::internal("request handler panicked"));
            *res.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
            res
        }
    };
    let queued = ctx.dispatch().map_or(0, |d| d.waited.as_millis() as u64);
    let h = res.headers_mut();
    h.insert(QUEUE_MS_HEADER, HeaderValue::from(queued));
    h.insert(REQUEST_ID_HEADER, ctx.request_id().clone());
    // The connection's write watchdog (`server::stall`) marks a stalled response in it.
    res.extensions_mut().insert(ctx.clone());
    res
}

impl<F> Future for RenderFuture<F>
where
    F: Future<Output = Result<Response<ResponseBody>, Error>>,
{
    type Output = Result<Response<ResponseBody>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            RenderProj::Running { fut, ctx } => fut.poll(cx).map(|r| Ok(finish(r, ctx))),
            RenderProj::Panicked { ctx } => Poll::Ready(Ok(finish(Err(Box::new("panic")), ctx))),
            RenderProj::Failed { error, ctx } => {
                let e = error
                    .take()
                    .unwrap_or_else(|| Error::internal("polled after completion"));
                Poll::Ready(Ok(finish(Ok(Err(e)), ctx)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use tower::{Service as _, ServiceExt};

    #[tokio::test]
    async fn errors_and_panics_become_responses() {
        let failing = tower::service_fn(|_: Request<()>| async {
            Err::<Response<ResponseBody>, _>(Error::internal("x"))
        });
        let res = tower::Layer::layer(&Layer, failing)
            .oneshot(Request::new(()))
            .await
            .unwrap();
        assert_eq!(res.status(), 500);
        assert_eq!(res.headers()[QUEUE_MS_HEADER], "0");
        let body = res.into_body().collect().await.unwrap().to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["error"]["code"], "internal_error");
        assert_eq!(v["error"]["type"], "server_error");
        assert!(v["error"]["param"].is_null());

        let panicking = tower::service_fn(|req: Request<bool>| async move {
            if *req.body() {
                panic!("boom");
            }
            Ok::<_, Error>(Response::new(ResponseBody::empty()))
        });
        let mut svc = tower::Layer::layer(&Layer, panicking);
        let res = svc
            .ready()
            .await
            .unwrap()
            .call(Request::new(true))
            .await
            .unwrap();
        assert_eq!(res.status(), 500);
        let res = svc
            .ready()
            .await
            .unwrap()
            .call(Request::new(false))
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
    }

    #[tokio::test]
    async fn every_request_gets_a_context_and_its_queue_wait() {
        let inner = tower::service_fn(|req: Request<()>| async move {
            let ctx = crate::context::of(&req)?;
            ctx.set_dispatch(crate::context::Dispatch {
                pool: 0,
                waited: std::time::Duration::from_millis(42),
                charged: crate::domain::Tokens(1),
                at: tokio::time::Instant::now(),
            });
            Ok::<_, Error>(Response::new(ResponseBody::empty()))
        });
        let res = tower::Layer::layer(&Layer, inner)
            .oneshot(Request::new(()))
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
        assert_eq!(res.headers()[QUEUE_MS_HEADER], "42");
        assert!(res.headers()[REQUEST_ID_HEADER]
            .to_str()
            .unwrap()
            .starts_with("fg-"));
    }
}
