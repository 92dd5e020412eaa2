//! The `x-ratelimit-*` headers of limited tenants, added in exactly one place: this stage sits
//! just below `tenant`, so it sees the outcome of *every* request of a known tenant — a
//! success, an upstream error, and any refusal of a stage below: body too large (413),
//! malformed or oversize request (400), deadline (429 / 504), rate limit (429), queue full
//! (429). A refusal passes up as an [`Error`] carrying the headers; `render` writes them.
//!
//! The state shown is the one admission charged the request against, or refused it with, when
//! admission ran (the context's `rate`); otherwise (refused before admission, or before it
//! charged anything) the buckets as they are now ([`RateStore::state`], no charge).
//!
//! Invariants: a tenant without limits gets no `x-ratelimit-*` header from fairgate, and costs
//! one map probe; for a limited tenant any `x-ratelimit-*` header of the provider (its shared
//! key's budget, not the tenant's) is replaced by the tenant's own.

use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::future::{BoxFuture, Either};
use http::{HeaderName, HeaderValue, Request, Response};

use super::{BucketState, Budget, RateState, RateStore};
use crate::error::Error;
use crate::response::ResponseBody;

/// Tower layer of the rate-headers stage.
#[derive(Clone)]
pub struct Layer(pub Arc<dyn RateStore>);

impl<S> tower::Layer<S> for Layer {
    type Service = Service<S>;
    fn layer(&self, inner: S) -> Service<S> {
        Service {
            store: self.0.clone(),
            inner,
        }
    }
}

/// Tower service of the rate-headers stage; see the module docs.
#[derive(Clone)]
pub struct Service<S> {
    store: Arc<dyn RateStore>,
    inner: S,
}

impl<S, B> tower::Service<Request<B>> for Service<S>
where
    S: tower::Service<Request<B>, Response = Response<ResponseBody>, Error = Error>,
    S::Future: Send + 'static,
{
    type Response = Response<ResponseBody>;
    type Error = Error;
    type Future = Either<S::Future, BoxFuture<'static, Result<Self::Response, Error>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let ctx = match crate::context::of(&req) {
            Ok(ctx) => ctx,
            Err(e) => return Either::Right(Box::pin(std::future::ready(Err(e)))),
        };
        let tenant = match ctx.identity() {
            Ok(id) if self.store.limited(&id.tenant.id) => id.tenant.id.clone(),
            Ok(_) => return Either::Left(self.inner.call(req)),
            Err(e) => return Either::Right(Box::pin(std::future::ready(Err(e)))),
        };
        let fut = self.inner.call(req);
        let store = self.store.clone();
        Either::Right(Box::pin(async move {
            let result = fut.await;
            let state = ctx.rate().unwrap_or_else(|| store.state(&tenant));
            match result {
                Ok(mut res) => {
                    let headers = res.headers_mut();
                    let theirs: Vec<HeaderName> = headers
                        .keys()
                        .filter(|k| k.as_str().starts_with("x-ratelimit-"))
                        .cloned()
                        .collect();
                    for k in theirs {
                        headers.remove(k);
                    }
                    headers.extend(rate_headers(&state));
                    Ok(res)
                }
                Err(e) => Err(e.with_headers(rate_headers(&state))),
            }
        }))
    }
}

/// OpenAI's `x-ratelimit-{limit,remaining,reset}-{requests,tokens}` for the configured buckets,
/// and the same trio for `input-tokens` and `output-tokens` when those budgets are configured.
pub fn rate_headers(state: &RateState) -> Vec<(HeaderName, HeaderValue)> {
    let mut h = Vec::with_capacity(12);
    let tokens = Budget::ALL.map(|b| (b.header_name(), state.budget(b)));
    for (kind, bucket) in std::iter::once(("requests", state.requests)).chain(tokens) {
        let Some(BucketState {
            limit,
            remaining,
            reset,
        }) = bucket
        else {
            continue;
        };
        let name = |what: &str| {
            HeaderName::from_bytes(format!("x-ratelimit-{what}-{kind}").as_bytes())
                .expect("static header name")
        };
        h.push((name("limit"), HeaderValue::from(limit)));
        h.push((name("remaining"), HeaderValue::from(remaining)));
        let reset = crate::domain::go_duration(reset);
        h.push((name("reset"), HeaderValue::from_str(&reset).expect("ascii")));
    }
    h
}
