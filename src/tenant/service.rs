//! The tenant stage as a tower layer: identifies the caller with [`Directory::identify`] and
//! writes the context's `identity`; a caller that cannot be identified never reaches the inner
//! service.

use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::future::{ready, Either, Ready};
use http::{Request, Response};

use super::Directory;
use crate::response::ResponseBody;

/// Tower layer of the tenant stage; holds only an `Arc` to the directory.
#[derive(Clone)]
pub struct Layer(pub Arc<Directory>);

impl<S> tower::Layer<S> for Layer {
    type Service = Service<S>;
    fn layer(&self, inner: S) -> Service<S> {
        Service {
            dir: self.0.clone(),
            inner,
        }
    }
}

/// Tower service of the tenant stage.
#[derive(Clone)]
pub struct Service<S> {
    dir: Arc<Directory>,
    inner: S,
}

impl<S, B> tower::Service<Request<B>> for Service<S>
where
    S: tower::Service<Request<B>, Response = Response<ResponseBody>, Error = crate::Error>,
{
    type Response = Response<ResponseBody>;
    type Error = crate::Error;
    type Future = Either<Ready<Result<Self::Response, crate::Error>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), crate::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let ctx = match crate::context::of(&req) {
            Ok(ctx) => ctx,
            Err(e) => return Either::Left(ready(Err(e))),
        };
        let peer = req
            .extensions()
            .get::<crate::context::PeerAddr>()
            .map(|p| p.0);
        // A job re-entering the stack was authenticated when it was submitted.
        let identity = match req.extensions().get::<crate::context::JobRun>() {
            Some(run) => self.dir.job(&run.tenant),
            None => self.dir.identify(req.headers(), peer),
        };
        match identity {
            Ok(identity) => {
                ctx.set_identity(identity);
                Either::Right(self.inner.call(req))
            }
            Err(e) => Either::Left(ready(Err(e.into()))),
        }
    }
}
