//! `GET /metrics`, answered before authentication (a scraper carries no tenant key): refreshes
//! the scrape-time gauges and renders the server's registry in the Prometheus text format.

use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::future::{Either, Ready};
use http::{Request, Response};

use super::Metrics;
use crate::admission::Admission;
use crate::error::Error;
use crate::queue::FairQueue;
use crate::response::ResponseBody;

/// Tower layer answering `GET /metrics` (before authentication, like the health endpoints).
#[derive(Clone)]
pub struct Scrape {
    /// The registry.
    pub metrics: Arc<Metrics>,
    /// The pools (gauges).
    pub pools: Arc<[Arc<FairQueue>]>,
    /// Admission (learned limits, retries).
    pub admission: Arc<Admission>,
}

impl<S> tower::Layer<S> for Scrape {
    type Service = ScrapeService<S>;
    fn layer(&self, inner: S) -> ScrapeService<S> {
        ScrapeService {
            scrape: self.clone(),
            inner,
        }
    }
}

/// Tower service of [`Scrape`].
#[derive(Clone)]
pub struct ScrapeService<S> {
    scrape: Scrape,
    inner: S,
}

impl<S, B> tower::Service<Request<B>> for ScrapeService<S>
where
    S: tower::Service<Request<B>, Response = Response<ResponseBody>, Error = Error>,
{
    type Response = Response<ResponseBody>;
    type Error = Error;
    type Future = Either<Ready<Result<Self::Response, Error>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        if req.uri().path() != "/metrics" {
            return Either::Right(self.inner.call(req));
        }
        let s = &self.scrape;
        let text = s.metrics.render(&s.pools, &s.admission);
        let mut res = Response::new(ResponseBody::full(text));
        res.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("text/plain; version=0.0.4"),
        );
        Either::Left(futures_util::future::ready(Ok(res)))
    }
}
