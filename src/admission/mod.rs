//! Admission: the gate in front of the fair queue. Size caps, the pause of a tenant's own
//! provider key (`feedback::keys`), deadline feasibility and the tenant's rate limits, answering 400/429 with an honest `Retry-After` before anything is
//! queued ([`Layer`], between `estimate` and `usage`).
//!
//! [`Admission`] is the state the gate shares: each tenant's limits, the rate store
//! (`ratelimit`, which it charges) and each pool's learned capacity (`feedback`, whose pause
//! makes a deadline infeasible). The upstream-feedback stage (`feedback::retry`) shares the same
//! capacity controllers and store; [`Admission::retry_layer`] builds it.
//!
//! `x-fairgate-limit` on a refusal says whose limit it was: `tenant` (its buckets), `queue`
//! (the pool's backlog vs the deadline), `upstream` (the provider's answer or pause) or
//! `budget` (a spent day or month budget, `budget::Error`).

mod caps;
pub mod deadline;
mod error;
mod layer;

use std::collections::HashMap;
use std::sync::Arc;

pub use deadline::{Deadline, DEADLINE_HEADER};
pub use error::Error;
pub use layer::{Admit, Layer};

use crate::budget::{Budgets, Spending};
use crate::config::{Config, TenantLimits};
use crate::domain::TenantId;
use crate::feedback::capacity::PoolCapacity;
use crate::feedback::keys::KeyPauses;
use crate::feedback::retry::{self, RetryPolicy, RetryStats};
use crate::queue::FairQueue;
use crate::ratelimit::{MemoryStore, RateStore};

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
    /// Pauses of tenants' own provider keys (kept across reloads, like the counters).
    pub key_pauses: Arc<KeyPauses>,
    /// Spend budgets and the usage ledger (this generation's limits and prices; the spending
    /// itself is kept across reloads).
    pub budgets: Arc<Budgets>,
    policy: RetryPolicy,
    limits: HashMap<TenantId, TenantLimits>,
    default_limits: TenantLimits,
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
        Self::with_spending(config, pools, store, Spending::in_memory())
    }

    /// As [`Admission::with_store`], budgets counted in `spending` (the server's: its zone,
    /// its ledger's sink).
    pub fn with_spending(
        config: &Config,
        pools: Arc<[Arc<FairQueue>]>,
        store: Option<Arc<dyn RateStore>>,
        spending: Arc<Spending>,
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
            .map(|(u, q)| PoolCapacity::for_upstream(q.clone(), u, reserved))
            .collect();
        let carried = (Arc::default(), Arc::default(), spending);
        Self::build(config, pools, capacity, store, carried, limits)
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
        let carried = (
            self.retries.clone(),
            self.key_pauses.clone(),
            self.budgets.spending().clone(),
        );
        Self::build(config, pools, capacity, store, carried, limits)
    }

    fn build(
        config: &Config,
        pools: Arc<[Arc<FairQueue>]>,
        capacity: Arc<[Arc<PoolCapacity>]>,
        store: Arc<dyn RateStore>,
        (retries, key_pauses, spending): (Arc<RetryStats>, Arc<KeyPauses>, Arc<Spending>),
        limits: HashMap<TenantId, TenantLimits>,
    ) -> Arc<Self> {
        let a = &config.admission;
        Arc::new(Self {
            store,
            capacity,
            retries,
            key_pauses,
            budgets: Arc::new(Budgets::new(config, spending)),
            policy: RetryPolicy::from_config(a),
            limits,
            default_limits: TenantLimits {
                burst: 1.0,
                max_input_tokens: a.max_input_tokens,
                max_output_tokens: a.max_output_tokens,
                max_queue_wait_ms: a.max_queue_wait_ms,
                ..TenantLimits::default()
            },
            pools,
        })
    }

    /// The retry/feedback stage sharing this state.
    pub fn retry_layer(&self) -> retry::Layer {
        retry::Layer::new(retry::Shared {
            capacity: self.capacity.clone(),
            key_pauses: self.key_pauses.clone(),
            store: self.store.clone(),
            policy: self.policy,
            stats: self.retries.clone(),
        })
    }

    fn limits(&self, tenant: &TenantId) -> &TenantLimits {
        self.limits.get(tenant).unwrap_or(&self.default_limits)
    }

    /// `Some(refusal)` when `who` has its own provider keys and the provider paused them for
    /// `model` on every endpoint of pool `index` it would use (429 `x-fairgate-limit:
    /// upstream`, `Retry-After` the pause left).
    fn own_key_paused(
        &self,
        index: usize,
        who: &crate::context::Identity,
        model: &str,
    ) -> Option<crate::Error> {
        let keys = &who.tenant.upstream_keys;
        if keys.is_empty() {
            return None;
        }
        let pool = self.capacity.get(index)?;
        let (_, left) =
            retry::own_keys_paused(&self.key_pauses, pool, index, keys, &who.tenant.id, model);
        (!left.is_zero()).then(|| retry::KeyPaused(left).into())
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
            limit: if paused > queue {
                crate::error::Limit::Upstream
            } else {
                crate::error::Limit::Queue
            },
        })
    }
}
