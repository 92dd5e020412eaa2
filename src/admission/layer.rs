//! The admission stage of the tower stack: decides what may enter the fair queue.
//!
//! In order, cheapest and least stateful first, so a refused request has charged nothing:
//! 1. size caps (estimated input tokens, `max_tokens`) → 400;
//! 2. deadline: parse the budget, predict the queue wait, refuse at once if infeasible → 429;
//! 3. rate limits: charge the estimate to the tenant's buckets (through its ledger) → 429.
//!
//! Admitted requests carry [`Deadline`], [`Estimate`] and [`ActualTokens`] in their extensions;
//! every response of a rate-limited tenant (success or error) carries the `x-ratelimit-*` headers
//! of its buckets; a reconcile guard on the response body settles the ledger with the actual
//! token count once the usage stage has recorded it in [`ActualTokens`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::{Request, Response};

use super::deadline::Deadline;
use super::error::rate_headers;
use super::rate::{RateStore, Refusal};
use super::{estimate, Admission, Error as AdmissionError};
use crate::body::Parsed;
use crate::domain::{TenantId, Tokens};
use crate::error::Error;
use crate::response::ResponseBody;
use crate::route::Route;
use crate::tenant::Identity;

/// The actual token count of a request, recorded by the usage stage (`u64::MAX`: unknown).
#[derive(Clone, Debug)]
pub struct ActualTokens(Arc<AtomicU64>);

impl Default for ActualTokens {
    fn default() -> Self {
        Self(Arc::new(AtomicU64::new(u64::MAX)))
    }
}

impl ActualTokens {
    /// Records the actual cost (call once the upstream reported usage).
    pub fn set(&self, tokens: Tokens) {
        self.0.store(tokens.0.min(u64::MAX - 1), Ordering::Release);
    }

    /// The recorded cost, if any.
    pub fn get(&self) -> Option<Tokens> {
        let v = self.0.load(Ordering::Acquire);
        (v != u64::MAX).then_some(Tokens(v))
    }
}

/// Settles the tenant's ledger when the response body is done.
struct Reconcile {
    store: Arc<dyn RateStore>,
    tenant: TenantId,
    estimated: Tokens,
    actual: ActualTokens,
}

impl Drop for Reconcile {
    fn drop(&mut self) {
        if let Some(actual) = self.actual.get() {
            self.store.reconcile(&self.tenant, self.estimated, actual);
        }
    }
}

/// Holds the shared admission state.
#[derive(Clone)]
pub struct Layer(pub Arc<Admission>);

impl<S> tower::Layer<S> for Layer {
    type Service = Service<S>;
    fn layer(&self, inner: S) -> Service<S> {
        Service {
            admission: self.0.clone(),
            inner,
        }
    }
}

/// See the module docs.
#[derive(Clone)]
pub struct Service<S> {
    admission: Arc<Admission>,
    inner: S,
}

impl<S> tower::Service<Request<Bytes>> for Service<S>
where
    S: tower::Service<Request<Bytes>, Response = Response<ResponseBody>, Error = Error>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = Response<ResponseBody>;
    type Error = Error;
    type Future = BoxFuture<'static, Result<Self::Response, Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<Bytes>) -> Self::Future {
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let adm = self.admission.clone();
        Box::pin(async move {
            let ext = req.extensions();
            let (Some(id), Some(route)) = (ext.get::<Identity>(), ext.get::<Route>()) else {
                return inner.call(req).await;
            };
            let tenant = id.tenant.id.clone();
            let limits = adm.limits(&tenant);
            let est = estimate(
                req.body(),
                ext.get::<Parsed>(),
                ext.get::<crate::estimate::Estimate>(),
                adm.default_output,
            );
            if let Some(log) = ext.get::<Arc<crate::metrics::RequestLog>>() {
                log.estimated(est.total);
            }
            // 1. Size caps.
            if est.input > limits.max_input_tokens {
                return Err(AdmissionError::InputTooLarge {
                    estimated: est.input,
                    max: limits.max_input_tokens,
                }
                .into());
            }
            if let Some(requested) = ext.get::<Parsed>().and_then(|p| p.max_tokens) {
                if requested > limits.max_output_tokens {
                    let max = limits.max_output_tokens;
                    return Err(AdmissionError::OutputTooLarge { requested, max }.into());
                }
            }
            // 2. Deadline feasibility.
            let deadline = Deadline::from_request(req.headers(), limits.max_queue_wait_ms)?;
            if let Some(d) = deadline {
                if let Some(e) = adm.infeasible(route.index, &tenant, d) {
                    return Err(e.into());
                }
            }
            // 3. Rate limits.
            let limited = adm.store.limited(&tenant);
            let state = if limited {
                match adm.store.admit_shared(&tenant, est.total).await {
                    Ok(state) => Some(state),
                    Err(refusal) => return Err(refused(refusal).into()),
                }
            } else {
                None
            };
            let actual = ActualTokens::default();
            let ext = req.extensions_mut();
            ext.insert(est);
            ext.insert(actual.clone());
            if let Some(d) = deadline {
                ext.insert(d);
            }
            let res = inner.call(req).await;
            let Some(state) = state else {
                return res;
            };
            let mut res = res.unwrap_or_else(Error::into_response);
            res.headers_mut().extend(rate_headers(&state));
            res.body_mut().attach(Box::new(Reconcile {
                store: adm.store.clone(),
                tenant,
                estimated: est.total,
                actual,
            }));
            Ok(res)
        })
    }
}

fn refused(r: Refusal) -> AdmissionError {
    match r {
        Refusal::Requests { retry_after, state } => {
            AdmissionError::RequestRate { retry_after, state }
        }
        Refusal::Tokens { retry_after, state } => AdmissionError::TokenRate { retry_after, state },
        Refusal::TooLarge { cost, burst } => AdmissionError::TokenBurst { cost, burst },
    }
}
