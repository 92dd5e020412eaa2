//! The `x-ratelimit-*` headers of limited tenants, added in exactly one place: this stage sits
//! just below `tenant` (above `metrics`, which renders stage errors), so it sees the final
//! response of *every* request of a known tenant — a success, an upstream error, and any refusal
//! of a stage below: body too large (413), malformed or oversize request (400), deadline (429 /
//! 504), rate limit (429), queue full (429).
//!
//! The state shown is the one admission charged the request against, or refused it with, when
//! admission ran ([`RateSlot`], filled by the admission stage); otherwise (refused before
//! admission, or before it charged anything) the buckets as they are now
//! ([`RateStore::state`], no charge).
//!
//! Invariants: a tenant without limits gets no `x-ratelimit-*` header from fairgate, and costs
//! one map probe; for a limited tenant any `x-ratelimit-*` header of the provider (its shared
//! key's budget, not the tenant's) is replaced by the tenant's own; an error that reaches this
//! stage unrendered is rendered by [`Error::into_response`], the one renderer.

use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use futures_util::future::{BoxFuture, Either};
use http::{HeaderName, Request, Response};

use super::error::rate_headers;
use super::rate::{RateState, RateStore};
use crate::error::Error;
use crate::response::ResponseBody;
use crate::tenant::Identity;

/// Where the admission stage records the bucket state it charged (or refused) a request with;
/// in the request's extensions of limited tenants.
#[derive(Clone, Debug, Default)]
pub struct RateSlot(Arc<OnceLock<RateState>>);

impl RateSlot {
    /// Records the state (the first record wins).
    pub fn set(&self, state: RateState) {
        let _ = self.0.set(state);
    }

    fn get(&self) -> Option<RateState> {
        self.0.get().copied()
    }
}

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

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let tenant = match req.extensions().get::<Identity>() {
            Some(id) if self.store.limited(&id.tenant.id) => id.tenant.id.clone(),
            _ => return Either::Left(self.inner.call(req)),
        };
        let slot = RateSlot::default();
        req.extensions_mut().insert(slot.clone());
        let fut = self.inner.call(req);
        let store = self.store.clone();
        Either::Right(Box::pin(async move {
            let mut res = fut.await.unwrap_or_else(Error::into_response);
            let state = slot.get().unwrap_or_else(|| store.state(&tenant));
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
        }))
    }
}
