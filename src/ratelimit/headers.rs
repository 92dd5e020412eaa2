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

use std::future::Future;
use std::sync::Arc;

use http::{HeaderName, HeaderValue, Request, Response};

use super::{BucketState, Budget, RateState, RateStore};
use crate::error::Error;
use crate::response::ResponseBody;

/// The rate-headers stage: the generation's rate store.
#[derive(Clone)]
pub struct Headers(Arc<dyn RateStore>);

impl From<Arc<dyn RateStore>> for Headers {
    fn from(store: Arc<dyn RateStore>) -> Self {
        Self(store)
    }
}

/// Tower layer of the rate-headers stage.
pub type Layer = crate::stage::Layer<Headers>;

impl<S, B> crate::stage::Stage<Request<B>, S> for Headers
where
    S: crate::stage::Below<Request<B>, Response<ResponseBody>, Error>,
    B: Send + 'static,
{
    type Down = Request<B>;

    /// A tenant without limits passes on, unboxed: one map probe.
    fn pass(&self, req: Request<B>) -> Result<Request<B>, Request<B>> {
        let unlimited = crate::context::of(&req)
            .and_then(|ctx| ctx.identity().map(|id| !self.0.limited(&id.tenant.id)))
            .unwrap_or(false);
        if unlimited {
            Ok(req)
        } else {
            Err(req)
        }
    }

    /// A plain function returning the future, so that the future holds only what it uses
    /// after the call below (not `req` nor the service below: a queued request's bytes).
    fn call(
        self,
        req: Request<B>,
        mut next: S,
    ) -> impl Future<Output = Result<Response<ResponseBody>, Error>> + Send + 'static {
        let called = crate::context::of(&req)
            .and_then(|ctx| Ok((ctx.identity()?.tenant.id.clone(), ctx)))
            .map(|known| (known, next.call(req)));
        async move {
            let ((tenant, ctx), below) = called?;
            let result = below.await;
            let state = ctx.rate().unwrap_or_else(|| self.0.state(&tenant));
            match result {
                Ok(mut res) => {
                    replace(res.headers_mut(), &state);
                    Ok(res)
                }
                Err(e) => Err(e.with_headers(rate_headers(&state))),
            }
        }
    }
}

/// Replaces the provider's `x-ratelimit-*` headers (its shared key's budget) by the tenant's.
fn replace(headers: &mut http::HeaderMap, state: &RateState) {
    let theirs: Vec<HeaderName> = headers
        .keys()
        .filter(|k| k.as_str().starts_with("x-ratelimit-"))
        .cloned()
        .collect();
    for k in theirs {
        headers.remove(k);
    }
    headers.extend(rate_headers(state));
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
