//! Health endpoints, answered before authentication: `/healthz` is 200 while the process runs;
//! `/readyz` is 200 once the server listens with a valid config and 503 while it drains.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::future::{ready, Either, Ready};
use http::{Request, Response, StatusCode};

use crate::response::ResponseBody;

/// Tower layer of the health endpoints; holds the shared readiness flag.
#[derive(Clone)]
pub struct Layer(pub Arc<AtomicBool>);

impl<S> tower::Layer<S> for Layer {
    type Service = Service<S>;
    fn layer(&self, inner: S) -> Service<S> {
        Service {
            ready: self.0.clone(),
            inner,
        }
    }
}

/// Tower service of the health endpoints.
#[derive(Clone)]
pub struct Service<S> {
    ready: Arc<AtomicBool>,
    inner: S,
}

type Res = Result<Response<ResponseBody>, crate::Error>;

impl<S, B> tower::Service<Request<B>> for Service<S>
where
    S: tower::Service<Request<B>, Response = Response<ResponseBody>, Error = crate::Error>,
{
    type Response = Response<ResponseBody>;
    type Error = crate::Error;
    type Future = Either<Ready<Res>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), crate::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let status = match req.uri().path() {
            "/healthz" => StatusCode::OK,
            "/readyz" if self.ready.load(Ordering::Acquire) => StatusCode::OK,
            "/readyz" => StatusCode::SERVICE_UNAVAILABLE,
            _ => return Either::Right(self.inner.call(req)),
        };
        let mut res = Response::new(ResponseBody::full(if status.is_success() {
            "ok\n"
        } else {
            "not ready\n"
        }));
        *res.status_mut() = status;
        Either::Left(ready(Ok(res)))
    }
}
