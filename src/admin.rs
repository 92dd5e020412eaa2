//! The admin API, answered before tenant authentication and protected by its own bearer token
//! (read at startup from the env var named by `[admin] token_env`):
//! `GET /admin/tenants` — live per-tenant state of every pool (queued, in flight, credit,
//! weight, served share vs entitled share, estimate error).
//!
//! Invariants: without a configured token every `/admin/` path is 404 (the API does not exist);
//! a missing or wrong token is 401 and reveals nothing; the token is compared in constant time
//! and never logged.

use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::future::{ready, Either, Ready};
use http::{header, HeaderValue, Method, Request, Response, StatusCode};

use crate::error::{render, Error};
use crate::estimate::Estimator;
use crate::metrics::Metrics;
use crate::queue::FairQueue;
use crate::response::ResponseBody;

/// What the admin API reads; cloning shares it.
#[derive(Clone)]
pub struct Layer {
    /// The bearer token; `None`: the admin API is off.
    pub token: Option<Arc<str>>,
    /// Pool names, indexed like `pools`.
    pub pool_names: Arc<[String]>,
    /// The pools.
    pub pools: Arc<[Arc<FairQueue>]>,
    /// Estimate-error statistics.
    pub estimator: Arc<Estimator>,
    /// Served tokens per pool and tenant.
    pub metrics: Arc<Metrics>,
}

impl<S> tower::Layer<S> for Layer {
    type Service = Service<S>;
    fn layer(&self, inner: S) -> Service<S> {
        Service {
            admin: self.clone(),
            inner,
        }
    }
}

/// Tower service of the admin API.
#[derive(Clone)]
pub struct Service<S> {
    admin: Layer,
    inner: S,
}

/// Equal bytes, in time independent of where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Layer {
    fn authorized<B>(&self, token: &str, req: &Request<B>) -> bool {
        req.headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
            .is_some_and(|t| same(t, token.as_bytes()))
    }

    /// The `/admin/tenants` document.
    pub fn tenants(&self) -> serde_json::Value {
        let mut out = Vec::new();
        for (i, pool) in self.pools.iter().enumerate() {
            let snap = pool.snapshot();
            let total_weight: f64 = snap.iter().map(|(t, _)| t.weight.get()).sum();
            let served: Vec<u64> = snap
                .iter()
                .map(|(t, _)| self.metrics.served_total(i, &t.id))
                .collect();
            let total_served: u64 = served.iter().sum();
            for ((t, age), served) in snap.into_iter().zip(served) {
                let stats = self.estimator.stats().tenant(&t.id).unwrap_or_default();
                out.push(serde_json::json!({
                    "tenant": t.id.as_str(),
                    "pool": self.pool_names.get(i),
                    "weight": t.weight.get(),
                    "queued": t.queued,
                    "in_flight": t.in_flight,
                    "credit": t.credit,
                    "oldest_queued_ms": age.map(|a| a.as_millis() as u64),
                    "served_tokens": served,
                    "served_share": (total_served > 0)
                        .then(|| served as f64 / total_served as f64),
                    "entitled_share": t.weight.get() / total_weight,
                    "estimate_error_mean": stats.mean_ratio(),
                    "reconciled": stats.count,
                }));
            }
        }
        serde_json::json!({ "tenants": out })
    }
}

type Res = Result<Response<ResponseBody>, Error>;

impl<S, B> tower::Service<Request<B>> for Service<S>
where
    S: tower::Service<Request<B>, Response = Response<ResponseBody>, Error = Error>,
{
    type Response = Response<ResponseBody>;
    type Error = Error;
    type Future = Either<Ready<Res>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let path = req.uri().path();
        if !path.starts_with("/admin/") {
            return Either::Right(self.inner.call(req));
        }
        let a = &self.admin;
        let res = match &a.token {
            None => render(
                StatusCode::NOT_FOUND,
                "not found",
                "invalid_request_error",
                "not_found",
            ),
            Some(t) if !a.authorized(t, &req) => render(
                StatusCode::UNAUTHORIZED,
                "a valid admin bearer token is required",
                "invalid_request_error",
                "invalid_admin_token",
            ),
            Some(_) => match (req.method(), path) {
                (&Method::GET, "/admin/tenants") => {
                    let body = serde_json::to_vec(&a.tenants()).unwrap_or_default();
                    let mut res = Response::new(ResponseBody::full(body));
                    res.headers_mut().insert(
                        header::CONTENT_TYPE,
                        HeaderValue::from_static("application/json"),
                    );
                    res
                }
                (_, "/admin/tenants") => render(
                    StatusCode::METHOD_NOT_ALLOWED,
                    "method not allowed",
                    "invalid_request_error",
                    "method_not_allowed",
                ),
                _ => render(
                    StatusCode::NOT_FOUND,
                    "not found",
                    "invalid_request_error",
                    "not_found",
                ),
            },
        };
        Either::Left(ready(Ok(res)))
    }
}

#[cfg(test)]
mod tests {
    use super::same;

    #[test]
    fn constant_time_compare() {
        assert!(same(b"abc", b"abc"));
        assert!(!same(b"abc", b"abd"));
        assert!(!same(b"abc", b"ab"));
    }
}
