//! `GET /metrics`, answered before tenant authentication (a scraper carries no tenant key):
//! refreshes the scrape-time gauges and renders the server's registry in the Prometheus text
//! format.
//!
//! Operations data is not served to tenants: on the main listener, where tenants connect, a
//! scrape is answered only to the admin token's bearer or a peer in `[server] trusted_sources`
//! (default loopback) — anyone else, with no credential or with a tenant's key, gets `401`
//! and no figure ([`Guard`]). The operations listener (`[admin] listen`) answers whoever reaches
//! it (its network is the operator's to restrict).

use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::future::{Either, Ready};
use http::{Request, Response};

use super::Metrics;
use crate::admission::Admission;
use crate::config::Cidr;
use crate::context::PeerAddr;
use crate::error::{ApiError, Error};
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
    /// Who may scrape (on the main listener); `None`: whoever reaches the listener.
    pub guard: Option<Guard>,
}

/// Who may scrape `/metrics` on the main listener: the admin token's bearer, or a peer in
/// `[server] trusted_sources`.
#[derive(Clone, Debug)]
pub struct Guard {
    /// The admin bearer token, if one is configured.
    pub token: Option<Arc<str>>,
    /// Trusted peers.
    pub trusted: Arc<[Cidr]>,
}

impl Guard {
    /// Whether `req` may read the metrics.
    pub fn allows<B>(&self, req: &Request<B>) -> bool {
        let peer = req.extensions().get::<PeerAddr>().map(|p| p.0);
        if peer.is_some_and(|ip| self.trusted.iter().any(|c| c.contains(ip))) {
            return true;
        }
        let Some(token) = &self.token else {
            return false;
        };
        req.headers()
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
            .is_some_and(|t| same(t, token.as_bytes()))
    }
}

/// Equal bytes, in time independent of where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A scrape refused on the main listener.
#[derive(Debug, thiserror::Error)]
#[error(
    "/metrics on this listener needs the admin bearer token or a peer in [server] trusted_sources"
)]
pub struct Forbidden;

impl ApiError for Forbidden {
    fn status(&self) -> http::StatusCode {
        http::StatusCode::UNAUTHORIZED
    }
    fn kind(&self) -> &'static str {
        "invalid_request_error"
    }
    fn code(&self) -> &'static str {
        "invalid_admin_token"
    }
    fn reason(&self) -> crate::error::Reason {
        crate::error::Reason::Admin
    }
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
        if s.guard.as_ref().is_some_and(|g| !g.allows(&req)) {
            return Either::Left(futures_util::future::ready(Err(Forbidden.into())));
        }
        let text = s.metrics.render(&s.pools, &s.admission);
        let mut res = Response::new(ResponseBody::full(text));
        res.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("text/plain; version=0.0.4"),
        );
        Either::Left(futures_util::future::ready(Ok(res)))
    }
}
