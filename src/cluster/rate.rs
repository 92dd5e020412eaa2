//! [`RedisStore`]: the tenants' rate limits shared by every replica — GCRA in one Lua script
//! per admission ([`RATE_ADMIT`], both buckets or neither), the same buckets as the in-memory
//! store (`burst × per-minute` cells refilling at `per-minute / 60` a second).
//!
//! Estimate at admission, correct at reconcile: `adjust` (over-estimates credited, under-
//! estimates and retried attempts charged) adds to a per-tenant pending delta, flushed by the
//! sync task every `sync_interval_ms` in its one script call, idempotently ([`SYNC`]): credit
//! moves the token bucket's TAT back (never past "full"), debt moves it ahead (at most one
//! bucket plus `[admission] max_debt_minutes` of the rate) — the in-memory ledger's debt
//! policy: GCRA pays debt with time, so an idle debtor pays by waiting and nothing within the
//! bound is forgiven.
//!
//! Degraded mode (Redis unreachable for `degrade_after_ms`; a single call that fails or is slower
//! than `timeout_ms` gets the same answer for that call alone), stated per limit:
//! - `requests_per_minute` is **soft**: each replica admits against a local bucket of
//!   `requests_per_minute / expected_replicas`, so the cluster stays near the limit.
//! - `tokens_per_minute` is a **hard** budget: it fails closed — a tenant with one gets 429
//!   (`x-fairgate-limit: tenant`, Retry-After 1 s) until Redis answers again.
//!
//! Tenants without limits never touch Redis here.
//!
//! The limits are every generation's tenants, the file's and the API's (`tenant::runtime`):
//! the admission of each new generation hands them over ([`RateStore::with_limits`], here
//! [`RedisStore::retune`], in place), so a tenant created, changed or deleted through
//! `/admin/tenants` on any replica is limited cluster-wide as soon as that replica applies the
//! change (at once where it was made, within `sync_interval_ms` plus a round trip elsewhere).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use futures_util::future::BoxFuture;

use super::link::Link;
use super::scripts::RATE_ADMIT;
use crate::config::{Config, TenantLimits};
use crate::domain::TenantId;
use crate::ratelimit::{BucketState, Budget, Charge, MemoryStore, RateState, RateStore, Refusal};

/// How long an admission's answer is kept for a retry of it, ms.
const IDEMPOTENCY_TTL_MS: u64 = 10_000;

/// One GCRA bucket: emission interval T (µs per cell) and size B (cells).
#[derive(Clone, Copy, Debug)]
pub(super) struct Gcra {
    pub t_us: f64,
    pub size: u64,
    /// Debt carried beyond the bucket, cells: `max_debt_minutes` of the rate, at least one
    /// bucket (the in-memory ledger's bound).
    pub debt: u64,
}

impl Gcra {
    fn new(per_minute: Option<u32>, burst: f64, debt_minutes: u32) -> Option<Self> {
        let pm = per_minute?;
        let size = (f64::from(pm) * burst).round().max(1.0) as u64;
        Some(Self {
            t_us: 60e6 / f64::from(pm.max(1)),
            size,
            debt: (u64::from(pm) * u64::from(debt_minutes)).max(size),
        })
    }

    /// Header state from the TAT's distance ahead of now (µs).
    fn state(self, ahead_us: i64) -> BucketState {
        let ahead = ahead_us.max(0) as f64;
        let used = (ahead / self.t_us).ceil() as u64;
        BucketState {
            limit: self.size,
            remaining: self.size.saturating_sub(used),
            reset: Duration::from_micros(ahead as u64),
        }
    }
}

impl Table {
    /// The buckets of `limits`' limited tenants; the local allowance carried over from
    /// `local` (its unchanged tenants' buckets) when given.
    fn of(
        link: &Link,
        limits: &HashMap<TenantId, TenantLimits>,
        replicas: u32,
        local: Option<&dyn RateStore>,
    ) -> Self {
        let tenants = limits
            .iter()
            .filter_map(|(id, l)| {
                let lim = Limits {
                    tokens: Gcra::new(l.tokens_per_minute, l.burst, l.max_debt_minutes),
                    requests: Gcra::new(l.requests_per_minute, l.burst, l.max_debt_minutes),
                    tokens_key: link.key(&["rate", id.as_str(), "tokens"]),
                    requests_key: link.key(&["rate", id.as_str(), "requests"]),
                };
                (lim.tokens.is_some() || lim.requests.is_some()).then(|| (id.clone(), lim))
            })
            .collect();
        let soft: HashMap<TenantId, TenantLimits> = limits
            .iter()
            .map(|(id, l)| {
                let soft = TenantLimits {
                    requests_per_minute: l.requests_per_minute.map(|r| r.div_ceil(replicas)),
                    tokens_per_minute: None,
                    ..l.clone()
                };
                (id.clone(), soft)
            })
            .collect();
        let local = local.and_then(|l| l.with_limits(&soft)).unwrap_or_else(|| {
            Arc::new(MemoryStore::new(soft.iter().map(|(id, l)| (id.clone(), l))))
        });
        Self { tenants, local }
    }
}

pub(super) struct Limits {
    pub tokens: Option<Gcra>,
    requests: Option<Gcra>,
    pub tokens_key: String,
    requests_key: String,
}

/// The limits in force: one generation's tenants (see [`RedisStore::retune`]).
struct Table {
    tenants: HashMap<TenantId, Limits>,
    /// Degraded mode: the soft limits' local allowance.
    local: Arc<dyn RateStore>,
}

/// The shared [`RateStore`]; see the module docs.
pub struct RedisStore {
    link: Arc<Link>,
    /// Every limited tenant's buckets, swapped whole by [`RedisStore::retune`] when a
    /// generation's tenants change (a reload, or an API tenant made here or on another
    /// replica): the sync task and admission read the same table.
    table: ArcSwap<Table>,
    /// Replicas the soft limits are divided by in degraded mode.
    replicas: u32,
    pending: Mutex<HashMap<TenantId, i64>>,
    /// Ledger corrections recorded here (`adjust` calls with a non-zero delta), and how many of
    /// them a successful flush has applied in Redis: equal once everything is flushed.
    corrections: [std::sync::atomic::AtomicU64; 2],
    /// Corrections taken for flushes so far (each batch is applied when its flush succeeds).
    taken: std::sync::atomic::AtomicU64,
    /// This process's admissions: idempotency keys `adm:<replica>:<nonce>:<n>` (the nonce
    /// keeps a restarted replica with the same id from reusing a live key).
    admissions: std::sync::atomic::AtomicU64,
    nonce: u64,
    /// Each tenant's buckets as of its last admission here (the `x-ratelimit-*` headers of a
    /// response admission did not charge; reading Redis for them would cost a round trip).
    last: Mutex<HashMap<TenantId, RateState>>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("tenants", &self.table.load().tenants.len())
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Buckets of every limited tenant of `config`.
    pub fn new(link: Arc<Link>, config: &Config, expected_replicas: u32) -> Self {
        let limits: HashMap<TenantId, TenantLimits> = config
            .tenants
            .iter()
            .map(|t| (TenantId::new(t.id.as_str()), t.effective_limits(config)))
            .collect();
        let replicas = expected_replicas.max(1);
        let table = Table::of(&link, &limits, replicas, None);
        Self {
            table: ArcSwap::from_pointee(table),
            replicas,
            link,
            pending: Mutex::default(),
            last: Mutex::default(),
            corrections: Default::default(),
            taken: Default::default(),
            admissions: Default::default(),
            nonce: rand::random(),
        }
    }

    /// Takes `limits` (every tenant of a new generation) in place: a tenant's shared buckets
    /// are its Redis keys (named by its id), so an unchanged tenant keeps its level, a changed
    /// one is admitted at its new rate against the same level, a new one (an API tenant made
    /// on any replica) is limited cluster-wide from its first request, a removed one is no
    /// longer limited here. The local allowance of degraded mode keeps unchanged tenants'
    /// buckets. In place, not a new store: the sync task flushes this store's corrections.
    pub fn retune(&self, limits: &HashMap<TenantId, TenantLimits>) {
        let old = self.table.load_full();
        let table = Table::of(&self.link, limits, self.replicas, Some(&*old.local));
        {
            let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
            last.retain(|t, _| table.tenants.contains_key(t));
        }
        self.table.store(Arc::new(table));
    }

    /// The all-tokens bucket of `tenant` and its Redis key, if it has one (the sync task's
    /// corrections).
    pub(super) fn token_bucket(&self, tenant: &TenantId) -> Option<(String, Gcra)> {
        let table = self.table.load();
        let l = table.tenants.get(tenant)?;
        Some((l.tokens_key.clone(), l.tokens?))
    }

    /// Pending ledger corrections, taken for a flush, and how many corrections they merge.
    pub(super) fn take_pending(&self) -> (HashMap<TenantId, i64>, u64) {
        use std::sync::atomic::Ordering;
        let mut p = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        let recorded = self.corrections[0].load(Ordering::Relaxed);
        let merged = recorded - self.taken.swap(recorded, Ordering::Relaxed);
        (std::mem::take(&mut *p), merged)
    }

    /// A batch holding `n` corrections was applied in Redis.
    pub(super) fn applied(&self, n: u64) {
        self.corrections[1].fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    }

    /// (corrections recorded, corrections applied in Redis): equal when nothing is pending.
    pub fn corrections(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering;
        (
            self.corrections[0].load(Ordering::Relaxed),
            self.corrections[1].load(Ordering::Relaxed),
        )
    }

    /// Degraded admission: soft limits locally, hard token budgets closed.
    fn admit_degraded(&self, tenant: &TenantId, cost: Charge) -> Result<RateState, Refusal> {
        let table = self.table.load();
        let Some(l) = table.tenants.get(tenant) else {
            return Ok(RateState::default());
        };
        if let Some(t) = l.tokens {
            return Err(Refusal::Tokens {
                budget: Budget::Tokens,
                retry_after: Duration::from_secs(1),
                state: Box::new(RateState {
                    tokens: [Some(t.state((t.size as f64 * t.t_us) as i64)), None, None],
                    requests: None,
                }),
            });
        }
        table.local.admit(tenant, cost)
    }
}

impl RateStore for RedisStore {
    fn limited(&self, tenant: &TenantId) -> bool {
        self.table.load().tenants.contains_key(tenant)
    }

    fn state(&self, tenant: &TenantId) -> RateState {
        let last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        last.get(tenant).copied().unwrap_or_default()
    }

    fn admit(&self, tenant: &TenantId, cost: Charge) -> Result<RateState, Refusal> {
        // The synchronous path has no Redis: what degraded mode would answer.
        self.admit_degraded(tenant, cost)
    }

    fn admit_shared<'a>(
        &'a self,
        tenant: &'a TenantId,
        charge: Charge,
    ) -> BoxFuture<'a, Result<RateState, Refusal>> {
        let cost = charge.total();
        Box::pin(async move {
            let table = self.table.load_full();
            let Some(l) = table.tenants.get(tenant) else {
                return Ok(RateState::default());
            };
            let (tt, tb) = l.tokens.map_or((0.0, 0), |g| (g.t_us, g.size));
            let (rt, rb) = l.requests.map_or((0.0, 0), |g| (g.t_us, g.size));
            let n = self
                .admissions
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let id = format!("{:x}:{n}", self.nonce);
            let once = self.link.key(&["adm", &self.link.replica, &id]);
            let mut inv = RATE_ADMIT.prepare_invoke();
            inv.key(&l.tokens_key)
                .key(&l.requests_key)
                .key(&once)
                .arg(cost.0)
                .arg(tt)
                .arg(tb)
                .arg(rt)
                .arg(rb)
                .arg(IDEMPOTENCY_TTL_MS);
            // One retry after a failed call (e.g. a timeout whose script did run): the same
            // idempotency key, so it is charged once.
            let mut answer = self.link.run::<Vec<i64>>(&inv).await;
            if answer.is_none() && !self.link.degraded() {
                answer = self.link.run::<Vec<i64>>(&inv).await;
            }
            let Some(v) = answer else {
                return self.admit_degraded(tenant, charge);
            };
            let get = |i: usize| v.get(i).copied().unwrap_or(0);
            let state = RateState {
                tokens: [l.tokens.map(|g| g.state(get(2))), None, None],
                requests: l.requests.map(|g| g.state(get(3))),
            };
            let retry_after = Duration::from_micros(u64::try_from(get(1)).unwrap_or(0));
            if get(0) != 3 {
                let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
                last.insert(tenant.clone(), state);
            }
            let state = Box::new(state);
            match get(0) {
                0 => Ok(*state),
                1 => Err(Refusal::Requests { retry_after, state }),
                2 => Err(Refusal::Tokens {
                    budget: Budget::Tokens,
                    retry_after,
                    state,
                }),
                _ => Err(Refusal::TooLarge {
                    budget: Budget::Tokens,
                    cost,
                    burst: l.tokens.map_or(0, |g| g.size),
                }),
            }
        })
    }

    fn adjust(&self, tenant: &TenantId, input: i64, output: i64) {
        // Only the all-tokens budget is shared (input/output budgets are refused with
        // `[cluster]` by config validation).
        let delta = input.saturating_add(output);
        let table = self.table.load();
        let shared = table
            .tenants
            .get(tenant)
            .is_some_and(|l| l.tokens.is_some());
        if delta == 0 || !shared {
            return;
        }
        let mut p = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        let e = p.entry(tenant.clone()).or_insert(0);
        *e = e.saturating_add(delta);
        // Counted under the lock, so `take_pending` sees the count and the delta together.
        self.corrections[0].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    fn with_limits(&self, limits: &HashMap<TenantId, TenantLimits>) -> Option<Arc<dyn RateStore>> {
        // Shared with the sync task: retuned in place, kept by the caller.
        self.retune(limits);
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(rpm: Option<u32>, tpm: Option<u32>) -> TenantLimits {
        TenantLimits {
            requests_per_minute: rpm,
            tokens_per_minute: tpm,
            burst: 1.0,
            max_debt_minutes: 10,
            ..TenantLimits::default()
        }
    }

    /// A store on a Redis that is never dialled (`admit` answers as degraded mode does).
    fn store(replicas: u32) -> RedisStore {
        let config = Config::from_toml_str(
            "[[upstreams]]\nname = \"u\"\nbase_url = \"http://h/v1\"\n\
             [[tenants]]\nid = \"file\"\napi_keys = [\"k\"]\nrequests_per_minute = 10\n\
             [cluster]\nredis_url = \"redis://127.0.0.1:1\"\n",
        )
        .unwrap();
        let cfg = config.cluster.clone().unwrap();
        let link = Link::new(
            &cfg,
            &Default::default(),
            "r0".into(),
            metrics::Gauge::noop(),
        );
        RedisStore::new(Arc::new(link.unwrap()), &config, replicas)
    }

    /// A tenant a new generation adds (an API tenant) is limited through the shared buckets
    /// named by its id; a removed one is no longer limited; an unchanged tenant keeps its local
    /// (degraded-mode) allowance across the retune.
    #[tokio::test]
    async fn a_new_generations_tenants_are_taken_in_place() {
        let s = store(2);
        let (file, api) = (TenantId::new("file"), TenantId::new("api"));
        assert!(s.limited(&file) && !s.limited(&api));
        let one = Charge {
            input: 1,
            output: 0,
        };
        // The file tenant's soft allowance here: 10 a minute over 2 replicas.
        for _ in 0..3 {
            s.admit(&file, one).unwrap();
        }
        let both = HashMap::from([
            (file.clone(), limits(Some(10), None)),
            (api.clone(), limits(None, Some(6000))),
        ]);
        s.retune(&both);
        assert!(s.limited(&api));
        let (key, g) = s.token_bucket(&api).unwrap();
        assert!(key.ends_with(":rate:api:tokens"), "{key}");
        assert_eq!(g.size, 6000);
        // Its token budget is shared: without Redis it fails closed, as a file tenant's does.
        assert!(matches!(s.admit(&api, one), Err(Refusal::Tokens { .. })));
        // The file tenant kept its local bucket: 2 of 5 left.
        s.admit(&file, one).unwrap();
        s.admit(&file, one).unwrap();
        assert!(matches!(s.admit(&file, one), Err(Refusal::Requests { .. })));
        s.retune(&HashMap::from([(file.clone(), limits(Some(10), None))]));
        assert!(!s.limited(&api) && s.token_bucket(&api).is_none());
        assert!(
            s.admit(&api, one).is_ok(),
            "deleted: no longer limited here"
        );
    }
}
