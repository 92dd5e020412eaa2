//! The admission stage of the tower stack: decides what may enter the fair queue.
//!
//! In order, cheapest and least stateful first, so a refused request has charged nothing:
//! 1. size caps (estimated input tokens, `max_tokens`) → 400;
//! 2. deadline: parse the budget, predict the queue wait, refuse at once if infeasible → 429;
//! 3. budgets: reserve the estimate against every day and month budget of the tenant
//!    (`budget`) → 429 `insufficient_quota`; given back if the rate limits refuse, grown by a
//!    stream's output past the estimate while it runs (with `cut_off_over_budget`, a stream a
//!    budget cannot cover is ended), settled with the usage (and written to the usage ledger)
//!    when the request ends;
//! 4. rate limits: charge the context's estimate to the tenant's buckets (through its ledger)
//!    → 429.
//!
//! Writes the context's `rate` (the bucket state charged or refused with, which the
//! `ratelimit` headers stage shows) and `admitted` (charge and deadline, which the queue and the
//! retry stage read). A reconcile guard settles the ledger with the context's `usage`: it is
//! handed down ([`Handoff`]) to the usage stage, which ties it to the body it observes, so it
//! settles after the usage is written — also when a long output is counted off-thread after the
//! client is gone. A guard that settles nothing (no usage: a non-2xx answer) leaves the charge
//! as it stands. A request refused below before it
//! reached the provider ([`crate::Error::never_sent`]: queue full, deadline passed in the
//! queue) gets its whole charge back as credit.
//!
//! Errors of the stages below pass through untouched (they are rendered once, above).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response};

use super::{deadline, Admission, Error as AdmissionError};
use crate::budget::{remaining_headers, Reservation, Used};
use crate::context::{Admitted, Ctx};
use crate::domain::{Charge, TenantId};
use crate::error::Error;
use crate::ratelimit::{RateStore, Refusal};
use crate::response::{Handoff, Meter, Progress, ResponseBody};

/// One admission's charge to the tenant's ledger, settled exactly once (whichever of the
/// reconcile guard and the error path comes first). A stream metered while it runs is debited
/// in steps (`streamed`: output tokens charged beyond the estimate); the settling reconciles
/// against the estimate plus those steps.
struct Charged {
    store: Arc<dyn RateStore>,
    tenant: TenantId,
    estimated: Charge,
    streamed: AtomicU64,
    done: AtomicBool,
}

impl Charged {
    /// Settles with `actual` unless already settled.
    fn settle(&self, actual: Charge) {
        if !self.done.swap(true, Ordering::AcqRel) {
            let charged = Charge {
                input: self.estimated.input,
                output: self
                    .estimated
                    .output
                    .saturating_add(self.streamed.load(Ordering::Acquire)),
            };
            self.store.reconcile(&self.tenant, charged, actual);
        }
    }

    /// Debits a stream's output counted so far beyond what was charged; `false` when the
    /// tenant's token budget did not cover it.
    fn step(&self, output: u64) -> bool {
        if self.done.load(Ordering::Acquire) {
            return true;
        }
        let charged = self
            .estimated
            .output
            .saturating_add(self.streamed.load(Ordering::Acquire));
        if output <= charged {
            return true;
        }
        let extra = output - charged;
        self.streamed.fetch_add(extra, Ordering::AcqRel);
        self.store.charge_streamed(
            &self.tenant,
            Charge {
                input: 0,
                output: extra,
            },
        )
    }
}

/// The stream limits of one admitted request (`max_stream_output_tokens`,
/// `cut_off_over_budget`).
#[derive(Clone, Copy, Debug)]
struct StreamLimits {
    max_output: Option<u64>,
    cut_off_over_budget: bool,
}

/// Settles the tenant's ledger when the body observed by `usage` is done (it travels down in a
/// [`Handoff`]): with the usage when it was written; with nothing (the whole charge back) when
/// the request was never dispatched (client gone while queued, refused in the queue); else (it
/// reached the provider, no usage: a non-2xx answer, a client gone before the head) the charge
/// stands. While a stream runs it meters it: the buckets are debited in steps, and the stream is
/// ended when it passes `max_stream_output_tokens`, or the remaining budget with
/// `cut_off_over_budget`.
struct Reconcile {
    charged: Option<Arc<Charged>>,
    /// The budget reservation: committed with the usage, else (never dispatched, no usage)
    /// given back by its own `Drop`.
    budget: Option<Reservation>,
    limits: StreamLimits,
    ctx: Ctx,
}

impl Meter for Reconcile {
    fn progress(&mut self, p: Progress) -> bool {
        let covered = self.charged.as_ref().is_none_or(|c| c.step(p.output));
        // A spend budget: the output past the estimate is reserved as it streams.
        let within = self.budget.as_mut().is_none_or(|r| r.step(p.output));
        let over_cap = self.limits.max_output.is_some_and(|m| p.output > m);
        !(over_cap || (self.limits.cut_off_over_budget && !(covered && within)))
    }

    fn exact(&self) -> bool {
        let budgeted = self.budget.as_ref().is_some_and(Reservation::budgeted);
        self.limits.max_output.is_some()
            || (self.limits.cut_off_over_budget && (self.charged.is_some() || budgeted))
    }
}

impl Drop for Reconcile {
    fn drop(&mut self) {
        if let (Some(r), Some(u)) = (self.budget.take(), self.ctx.usage()) {
            r.commit(Used {
                input: u.tokens.input,
                cached: u.cached_input,
                output: u.tokens.output,
            });
        }
        let Some(charged) = &self.charged else {
            return;
        };
        if let Some(actual) = self.ctx.usage() {
            charged.settle(actual.tokens);
        } else if self.ctx.dispatch().is_none() {
            charged.settle(Charge::default());
        }
    }
}

/// The admission stage: holds the shared admission state.
#[derive(Clone)]
pub struct Admit(Arc<Admission>);

impl From<Arc<Admission>> for Admit {
    fn from(a: Arc<Admission>) -> Self {
        Self(a)
    }
}

/// The admission layer (`Layer::new(admission)`).
pub type Layer = crate::stage::Layer<Admit>;

impl<S> crate::stage::Stage<Request<Bytes>, S> for Admit
where
    S: crate::stage::Below<Request<Bytes>, Response<ResponseBody>, Error>,
{
    type Down = Request<Bytes>;

    async fn call(
        self,
        req: Request<Bytes>,
        mut inner: S,
    ) -> Result<Response<ResponseBody>, Error> {
        let adm = self.0;
        let ctx = crate::context::of(&req)?;
        let tenant = ctx.identity()?.tenant.id.clone();
        let pool = ctx.route()?.pool;
        let est = ctx.estimate()?;
        let limits = adm.limits(&tenant);
        // 1. Size caps.
        let parsed = ctx.request()?;
        super::caps::check(
            limits,
            super::caps::Size {
                input_tokens: est.input.tokens,
                output_cap: est.max_output_tokens,
                choices: est.choices,
                cap_param: parsed.max_tokens_param,
                choices_param: parsed.choices_param,
            },
        )?;
        // A tenant's own provider key that the provider paused: its own limit, said before
        // the request queues for a pool slot (the retry stage checks again at dispatch).
        if let Some(e) = adm.own_key_paused(pool, ctx.identity()?, &ctx.request()?.model) {
            return Err(e);
        }
        // 2. Deadline feasibility.
        let deadline = deadline::from_request(req.headers(), limits.max_queue_wait_ms)?;
        if let Some(d) = deadline {
            if let Some(e) = adm.infeasible(pool, &tenant, d) {
                return Err(e.into());
            }
        }
        // 3. Budgets: the estimate reserved against each (a refusal below drops it: given
        // back).
        let reservation = adm
            .budgets
            .reserve(&tenant, &ctx.request()?.model, est.charge)
            .await?;
        let remaining = reservation.budgeted().then(|| reservation.remaining());
        // 4. Rate limits.
        let charge = est.charge;
        let charged = if adm.store.limited(&tenant) {
            match adm.store.admit_shared(&tenant, charge).await {
                Ok(state) => ctx.set_rate(state),
                Err(refusal) => {
                    if let Some(state) = refusal.state() {
                        ctx.set_rate(state);
                    }
                    return Err(refused(refusal).into());
                }
            }
            Some(charge)
        } else {
            None
        };
        ctx.set_admitted(Admitted { charged, deadline });
        let stream_limits = StreamLimits {
            max_output: limits.max_stream_output_tokens,
            cut_off_over_budget: limits.cut_off_over_budget,
        };
        let charged = charged.map(|estimated| {
            Arc::new(Charged {
                store: adm.store.clone(),
                tenant: tenant.clone(),
                estimated,
                streamed: AtomicU64::new(0),
                done: AtomicBool::new(false),
            })
        });
        let handoff = Handoff::default();
        handoff.push(Box::new(Reconcile {
            charged: charged.clone(),
            budget: Some(reservation),
            limits: stream_limits,
            ctx: ctx.clone(),
        }));
        let mut req = req;
        req.extensions_mut().insert(handoff.clone());
        let res = inner.call(req).await;
        match res {
            Ok(mut res) => {
                // No usage stage below took it: tied to this body.
                for meter in handoff.take() {
                    res.body_mut().attach_meter(meter);
                }
                for (k, v) in remaining.map(remaining_headers).unwrap_or_default() {
                    res.headers_mut().insert(k, v);
                }
                Ok(res)
            }
            Err(e) => {
                if let (true, Some(c)) = (e.never_sent(), &charged) {
                    c.settle(Charge::default());
                }
                Err(e)
            }
        }
    }
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
