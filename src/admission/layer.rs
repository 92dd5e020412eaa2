//! The admission stage of the tower stack: decides what may enter the fair queue.
//!
//! In order, cheapest and least stateful first, so a refused request has charged nothing:
//! 1. size caps (estimated input tokens, `max_tokens`) → 400;
//! 2. deadline: parse the budget, predict the queue wait, refuse at once if infeasible → 429;
//! 3. rate limits: charge the estimate to the tenant's buckets (through its ledger) → 429.
//!
//! Admitted requests carry [`Deadline`], [`Estimate`] and [`ActualTokens`] in their extensions;
//! the bucket state a request was charged or refused with goes into its [`RateSlot`], from which
//! the `headers` stage writes the `x-ratelimit-*` headers. A reconcile guard on the response
//! body settles the ledger with the actual token count once the usage stage has recorded it in
//! [`ActualTokens`]; a request refused below before it was sent upstream (queue full, deadline
//! passed in the queue) gets its whole estimate back as credit.
//!
//! Errors of the stages below pass through typed (they are rendered once, above).

use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::{Request, Response};

use super::deadline::Deadline;
use super::headers::RateSlot;
use super::rate::{Charge, RateStore, Refusal};
use super::{estimate, Admission, Error as AdmissionError};
use crate::body::Parsed;
use crate::domain::{TenantId, Tokens};
use crate::error::Error;
use crate::response::ResponseBody;
use crate::route::Route;
use crate::tenant::Identity;

/// The actual token counts of a request, recorded once by the usage stage.
#[derive(Clone, Debug, Default)]
pub struct ActualTokens(Arc<OnceLock<Charge>>);

impl ActualTokens {
    /// Records the actual input and output tokens (once the upstream reported usage; the first
    /// record wins).
    pub fn set(&self, input: u64, output: u64) {
        let _ = self.0.set(Charge { input, output });
    }

    /// The recorded input + output tokens, if any.
    pub fn get(&self) -> Option<Tokens> {
        self.parts().map(Charge::total)
    }

    /// The recorded counts by direction, if any.
    pub fn parts(&self) -> Option<Charge> {
        self.0.get().copied()
    }
}

/// Settles the tenant's ledger when the response body is done.
struct Reconcile {
    store: Arc<dyn RateStore>,
    tenant: TenantId,
    estimated: Charge,
    actual: ActualTokens,
}

impl Drop for Reconcile {
    fn drop(&mut self) {
        if let Some(actual) = self.actual.parts() {
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
            if limited {
                let slot = ext.get::<RateSlot>().cloned().unwrap_or_default();
                match adm.store.admit_shared(&tenant, est.charge()).await {
                    Ok(state) => slot.set(state),
                    Err(refusal) => {
                        if let Some(state) = refusal.state() {
                            slot.set(state);
                        }
                        return Err(refused(refusal).into());
                    }
                }
            }
            let actual = ActualTokens::default();
            let ext = req.extensions_mut();
            ext.insert(est);
            ext.insert(actual.clone());
            if let Some(d) = deadline {
                ext.insert(d);
            }
            let res = inner.call(req).await;
            if !limited {
                return res;
            }
            match res {
                Ok(mut res) => {
                    res.body_mut().attach(Box::new(Reconcile {
                        store: adm.store.clone(),
                        tenant,
                        estimated: est.charge(),
                        actual,
                    }));
                    Ok(res)
                }
                Err(e) => {
                    if never_sent(&e) {
                        adm.store
                            .reconcile(&tenant, est.charge(), Charge::default());
                    }
                    Err(e)
                }
            }
        })
    }
}

/// Whether an error of the stages below means the request never reached the upstream.
fn never_sent(e: &Error) -> bool {
    matches!(
        e,
        Error::Queue(_) | Error::Admission(AdmissionError::DeadlineExceeded { .. })
    )
}

fn refused(r: Refusal) -> AdmissionError {
    match r {
        Refusal::Requests { retry_after, .. } => AdmissionError::RequestRate { retry_after },
        Refusal::Tokens {
            budget,
            retry_after,
            ..
        } => AdmissionError::TokenRate {
            budget,
            retry_after,
        },
        Refusal::TooLarge {
            budget,
            cost,
            burst,
        } => AdmissionError::TokenBurst {
            budget,
            cost,
            burst,
        },
    }
}
