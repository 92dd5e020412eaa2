//! Per-tenant rate limits: a request bucket (`requests_per_minute`) and up to three token
//! buckets — all tokens (`tokens_per_minute`), input tokens (`input_tokens_per_minute`) and
//! output tokens (`output_tokens_per_minute`) — behind the [`RateStore`] trait, so an in-memory
//! store ([`MemoryStore`], governor GCRA buckets) and a shared (Redis) store can both implement
//! the accounting.
//!
//! A bucket holds `burst × per-minute` cells and refills continuously at `per-minute / 60` a
//! second. Admission charges each token bucket its part of the request's *estimate*
//! ([`Charge`]: counted input, and the output cap or default) through that bucket's [`Ledger`]
//! (credit from earlier over-estimates is spent first, debt from under-estimates and retried
//! attempts is added), then one request cell. If a later bucket refuses after an earlier one
//! accepted, the tokens just taken become credit, so a refused request costs nothing.
//! Reconcile (`RateStore::reconcile`) moves `estimate − actual` of each part into the ledgers.
//!
//! Invariants: a refusal's `retry_after` is when *every* bucket can admit the request (the
//! refusing bucket's governor `NotUntil`, the others' refill at their current level) — never a
//! constant; tenants without limits are never locked or charged. The clock is tokio's, so the
//! tests run on a paused clock.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

pub use crate::context::{BucketState, RateState};
pub use crate::domain::Charge;
use crate::domain::{TenantId, Tokens};

mod bucket;
pub mod headers;
pub mod ledger;
mod memory;

pub use bucket::TokioClock;
pub use headers::rate_headers;
pub use memory::MemoryStore;

/// One of a tenant's token budgets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Budget {
    /// `tokens_per_minute`: input + output.
    Tokens,
    /// `input_tokens_per_minute`.
    Input,
    /// `output_tokens_per_minute`.
    Output,
}

impl Budget {
    /// All budgets, in the order admission charges them.
    pub const ALL: [Budget; 3] = [Budget::Tokens, Budget::Input, Budget::Output];

    /// The name in `x-ratelimit-*-{name}` headers: `tokens`, `input-tokens`, `output-tokens`.
    pub fn header_name(self) -> &'static str {
        match self {
            Budget::Tokens => "tokens",
            Budget::Input => "input-tokens",
            Budget::Output => "output-tokens",
        }
    }

    /// Index into per-budget arrays.
    pub fn index(self) -> usize {
        self as usize
    }
}

impl std::fmt::Display for Budget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Budget::Tokens => "tokens",
            Budget::Input => "input tokens",
            Budget::Output => "output tokens",
        })
    }
}

impl Charge {
    /// The part `budget` counts.
    pub fn of(self, budget: Budget) -> Tokens {
        match budget {
            Budget::Tokens => self.total(),
            Budget::Input => Tokens(self.input),
            Budget::Output => Tokens(self.output),
        }
    }
}

impl RateState {
    /// The bucket of `budget`.
    pub fn budget(&self, budget: Budget) -> Option<BucketState> {
        self.tokens[budget.index()]
    }
}

/// Why a tenant's request was not admitted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The request bucket is empty until `retry_after`.
    Requests {
        /// When every bucket can admit the request.
        retry_after: Duration,
        /// All buckets now.
        state: Box<RateState>,
    },
    /// A token bucket cannot cover its part of the estimate until `retry_after`.
    Tokens {
        /// The refusing budget.
        budget: Budget,
        /// When every bucket can admit the request.
        retry_after: Duration,
        /// All buckets now.
        state: Box<RateState>,
    },
    /// A part of the estimate is larger than its whole bucket: it can never be admitted.
    TooLarge {
        /// The budget.
        budget: Budget,
        /// The request's estimate of that part.
        cost: Tokens,
        /// The bucket size.
        burst: u64,
    },
}

impl Refusal {
    /// The tenant's buckets at the refusal (`None`: nothing was checked).
    pub fn state(&self) -> Option<RateState> {
        match self {
            Refusal::Requests { state, .. } | Refusal::Tokens { state, .. } => Some(**state),
            Refusal::TooLarge { .. } => None,
        }
    }
}

/// Rate-limit accounting of all tenants; see the module docs.
pub trait RateStore: Send + Sync + 'static {
    /// Whether `tenant` has any rate limit (only those get `x-ratelimit-*` headers).
    fn limited(&self, tenant: &TenantId) -> bool;
    /// The tenant's buckets now, without charging anything (the `x-ratelimit-*` headers of a
    /// response admission did not charge, e.g. one refused before admission).
    fn state(&self, tenant: &TenantId) -> RateState;
    /// Admits one request estimated at `cost` (charging every bucket), or says why not.
    fn admit(&self, tenant: &TenantId, cost: Charge) -> Result<RateState, Refusal>;
    /// Admits one request, asking a shared store (Redis, `cluster`) when there is one; the
    /// in-memory store answers at once with [`RateStore::admit`].
    fn admit_shared<'a>(
        &'a self,
        tenant: &'a TenantId,
        cost: Charge,
    ) -> futures_util::future::BoxFuture<'a, Result<RateState, Refusal>> {
        Box::pin(std::future::ready(self.admit(tenant, cost)))
    }
    /// Charges one request to the tenant's request bucket only (a call that costs no tokens:
    /// the files and batches endpoints), asking the shared store when there is one. The
    /// default is a zero-token admission, which is exactly that where a token bucket cannot
    /// refuse zero (the shared store's GCRA); the in-memory store overrides it, since a token
    /// ledger in debt refuses even zero.
    fn admit_request<'a>(
        &'a self,
        tenant: &'a TenantId,
    ) -> futures_util::future::BoxFuture<'a, Result<RateState, Refusal>> {
        self.admit_shared(tenant, Charge::default())
    }
    /// Moves `input` and `output` tokens into the tenant's ledgers (credit > 0, debt < 0); the
    /// all-tokens ledger gets their sum.
    fn adjust(&self, tenant: &TenantId, input: i64, output: i64);
    /// Settles an admission: credits an over-estimate back, debits an under-estimate.
    fn reconcile(&self, tenant: &TenantId, estimated: Charge, actual: Charge) {
        let diff = |e: u64, a: u64| Tokens(e).signed() - Tokens(a).signed();
        self.adjust(
            tenant,
            diff(estimated.input, actual.input),
            diff(estimated.output, actual.output),
        );
    }
    /// Charges `extra` more (e.g. a retried upstream attempt).
    fn charge(&self, tenant: &TenantId, extra: Charge) {
        self.adjust(
            tenant,
            -Tokens(extra.input).signed(),
            -Tokens(extra.output).signed(),
        );
    }
    /// Charges `extra` of a stream's output counted while it runs; `false` when the tenant's
    /// token budget did not cover it (the stream went past its remaining budget). The default
    /// (the shared store) charges and says `true`: only `max_stream_output_tokens` cuts there.
    fn charge_streamed(&self, tenant: &TenantId, extra: Charge) -> bool {
        self.charge(tenant, extra);
        true
    }
    /// The store for a reloaded configuration's `limits` (config reload): tenants whose rates
    /// are unchanged keep their buckets and ledgers, changed and new ones start full, removed
    /// ones are dropped. `None`: the caller keeps using this store (one that takes no limits
    /// from the configuration, or the shared store, `cluster::rate`, which takes them in place).
    fn with_limits(
        &self,
        limits: &HashMap<TenantId, crate::config::TenantLimits>,
    ) -> Option<Arc<dyn RateStore>> {
        let _ = limits;
        None
    }
}
