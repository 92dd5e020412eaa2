//! Admission: what may enter the fair queue at all, and how fast a pool may dispatch.
//!
//! Two stages of the tower stack live here:
//! - [`Layer`] (between `route` and `queue`): size caps, deadline feasibility and per-tenant
//!   rate limits, answering 400/429 with an honest `Retry-After` before anything is queued.
//! - [`retry::Layer`] (between `queue` and `upstream`): feeds every upstream answer to the pool's
//!   learned capacity ([`capacity::PoolCapacity`] around the pure [`aimd::Aimd`]) and retries
//!   429/502/503 answered before any byte reached the client, holding the permit.
//!
//! Rate-limit accounting (governor buckets for requests, all tokens, input and output tokens,
//! each token bucket with a signed ledger that gives back over-estimates and charges
//! under-estimates) is behind [`rate::RateStore`]; see `rate` and `ledger` for how a bucket that
//! cannot refund is still charged exactly.
//!
//! Every response of a tenant with rate limits carries its `x-ratelimit-*` headers, added in one
//! place: the [`headers`] stage just below `tenant`.
//!
//! `x-fairgate-limit` on a refusal says whose limit it was: `tenant` (its buckets), `queue`
//! (the pool's backlog vs the deadline) or `upstream` (the provider's answer or pause).

pub mod aimd;
mod bucket;
pub mod capacity;
pub mod deadline;
mod error;
pub mod headers;
mod layer;
pub mod ledger;
mod memory;
pub mod rate;
pub mod retry;

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;

pub use deadline::{Deadline, DEADLINE_HEADER};
pub use error::{rate_headers, Error, LIMIT_HEADER};
pub use layer::{ActualTokens, Layer, Service};

use crate::body::Parsed;
use crate::config::{Config, TenantLimits};
use crate::domain::{TenantId, Tokens};
use crate::queue::FairQueue;
use capacity::PoolCapacity;
use rate::{Charge, MemoryStore, RateStore};
use retry::{RetryPolicy, RetryStats};

/// A request's admission-time cost estimate, in its extensions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Estimate {
    /// Estimated input tokens.
    pub input: u64,
    /// The output allowance: the request's output cap, or the default.
    pub output: u64,
    /// Input plus output: what the `tokens_per_minute` bucket is charged.
    pub total: Tokens,
}

impl Estimate {
    /// What the tenant's token buckets are charged.
    pub fn charge(&self) -> Charge {
        Charge {
            input: self.input,
            output: self.output,
        }
    }
}

/// The one admission-time estimate, in raw tokens (what `tokens_per_minute` counts): the
/// estimation stage's counted input when it ran (else ~4 body bytes per token), plus the
/// request's output cap or `default_output` (`[estimate] default_output_tokens`).
pub fn estimate(
    body: &Bytes,
    parsed: Option<&Parsed>,
    counted: Option<&crate::estimate::Estimate>,
    default_output: u64,
) -> Estimate {
    let input = counted.map_or((body.len() as u64).div_ceil(4), |c| c.input.tokens);
    let output = counted
        .and_then(|c| c.max_output_tokens)
        .or_else(|| parsed.and_then(|p| p.max_tokens))
        .unwrap_or(default_output);
    Estimate {
        input,
        output,
        total: Tokens(input.saturating_add(output)),
    }
}

/// Every tenant's effective limits.
fn limits_of(config: &Config) -> HashMap<TenantId, TenantLimits> {
    config
        .tenants
        .iter()
        .map(|t| (TenantId::new(t.id.as_str()), t.effective_limits(config)))
        .collect()
}

/// Everything admission shares, built at startup and again at each config reload.
pub struct Admission {
    /// Rate-limit accounting.
    pub store: Arc<dyn RateStore>,
    /// Learned capacity per pool, indexed like `[[upstreams]]`.
    pub capacity: Arc<[Arc<PoolCapacity>]>,
    /// Retry counters.
    pub retries: Arc<RetryStats>,
    policy: RetryPolicy,
    limits: HashMap<TenantId, TenantLimits>,
    default_limits: TenantLimits,
    /// Output tokens assumed when a request names no cap (`[estimate] default_output_tokens`).
    pub default_output: u64,
    pools: Arc<[Arc<FairQueue>]>,
}

impl std::fmt::Debug for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admission")
            .field("capacity", &self.capacity)
            .finish_non_exhaustive()
    }
}

impl Admission {
    /// Limits of every tenant, one capacity controller per pool, the in-memory store.
    pub fn new(config: &Config, pools: Arc<[Arc<FairQueue>]>) -> Arc<Self> {
        Self::with_store(config, pools, None)
    }

    /// As [`Admission::new`], with a shared rate store (cluster mode) instead of the
    /// in-memory one when `store` is given.
    pub fn with_store(
        config: &Config,
        pools: Arc<[Arc<FairQueue>]>,
        store: Option<Arc<dyn RateStore>>,
    ) -> Arc<Self> {
        let limits = limits_of(config);
        let store = store.unwrap_or_else(|| {
            Arc::new(MemoryStore::new(limits.iter().map(|(k, v)| (k.clone(), v))))
        });
        let reserved = u32::try_from(config.scheduler.reserved_slots).unwrap_or(u32::MAX);
        let capacity = config
            .upstreams
            .iter()
            .zip(pools.iter())
            .map(|(u, q)| {
                let max = u32::try_from(u.max_concurrency).unwrap_or(u32::MAX);
                PoolCapacity::new(q.clone(), max, reserved)
            })
            .collect();
        Self::build(config, pools, capacity, store, Arc::default(), limits)
    }

    /// Admission for a reloaded `config` (see `server::reload`): limits, defaults and retry
    /// policy from `config`; the retry counters kept; the rate store carried over
    /// ([`RateStore::with_limits`]); `capacity` (indexed like `config.upstreams`, controllers
    /// already reconfigured by the caller) and `pools` as given.
    pub fn reloaded(
        &self,
        config: &Config,
        pools: Arc<[Arc<FairQueue>]>,
        capacity: Arc<[Arc<PoolCapacity>]>,
    ) -> Arc<Self> {
        let limits = limits_of(config);
        let store = self
            .store
            .with_limits(&limits)
            .unwrap_or_else(|| self.store.clone());
        Self::build(config, pools, capacity, store, self.retries.clone(), limits)
    }

    fn build(
        config: &Config,
        pools: Arc<[Arc<FairQueue>]>,
        capacity: Arc<[Arc<PoolCapacity>]>,
        store: Arc<dyn RateStore>,
        retries: Arc<RetryStats>,
        limits: HashMap<TenantId, TenantLimits>,
    ) -> Arc<Self> {
        let a = &config.admission;
        Arc::new(Self {
            store,
            capacity,
            retries,
            policy: RetryPolicy::from_config(a),
            limits,
            default_limits: TenantLimits {
                burst: 1.0,
                max_input_tokens: a.max_input_tokens,
                max_output_tokens: a.max_output_tokens,
                max_queue_wait_ms: a.max_queue_wait_ms,
                ..TenantLimits::default()
            },
            default_output: config.estimate.default_output_tokens,
            pools,
        })
    }

    /// The retry/feedback stage sharing this state.
    pub fn retry_layer(&self) -> retry::Layer {
        retry::Layer(Arc::new(retry::Shared {
            capacity: self.capacity.clone(),
            store: self.store.clone(),
            policy: self.policy,
            stats: self.retries.clone(),
        }))
    }

    fn limits(&self, tenant: &TenantId) -> &TenantLimits {
        self.limits.get(tenant).unwrap_or(&self.default_limits)
    }

    /// `Some(refusal)` when the predicted wait in pool `index` exceeds the deadline's budget.
    fn infeasible(&self, index: usize, tenant: &TenantId, d: Deadline) -> Option<Error> {
        let inputs = self.pools.get(index)?.wait_inputs(tenant)?;
        let queue = deadline::predict_wait(&inputs);
        let paused = self
            .capacity
            .get(index)
            .map(|c| c.paused_for())
            .unwrap_or_default();
        let predicted = queue + paused;
        (predicted > d.budget).then_some(Error::DeadlineInfeasible {
            predicted,
            budget: d.budget,
            limit: if paused > queue { "upstream" } else { "queue" },
        })
    }
}
