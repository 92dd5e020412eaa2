//! Per-tenant rate limits: a request bucket (`requests_per_minute`) and a token bucket
//! (`tokens_per_minute`), both GCRA buckets from governor, behind the [`RateStore`] trait so an
//! in-memory store (here) and a shared (Redis) store can both implement the accounting.
//!
//! A bucket holds `burst × per-minute` cells and refills continuously at `per-minute / 60` a
//! second. Admission charges the token bucket the request's *estimate* through the tenant's
//! [`Ledger`] (credit from earlier over-estimates is spent first, debt from under-estimates and
//! retried attempts is added), then one request cell. If the request bucket refuses after the
//! token bucket accepted, the tokens just taken become credit, so a refused request costs
//! nothing. Reconcile (`RateStore::reconcile`) moves `estimate − actual` into the ledger.
//!
//! Invariants: a refusal says when the limiting bucket can admit the request (governor's
//! `NotUntil`), never a constant; tenants without limits are never locked or charged. The clock
//! is tokio's, so the tests run on a paused clock.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::Mutex;
use std::time::Duration;

use governor::clock::Clock;
use governor::middleware::StateInformationMiddleware;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};

use super::ledger::Ledger;
use crate::config::TenantLimits;
use crate::domain::{TenantId, Tokens};

/// governor's clock on tokio's time, so the limiter follows `tokio::time::pause()`.
#[derive(Clone, Copy, Debug)]
pub struct TokioClock {
    epoch: tokio::time::Instant,
}

impl Default for TokioClock {
    fn default() -> Self {
        Self {
            epoch: tokio::time::Instant::now(),
        }
    }
}

impl Clock for TokioClock {
    type Instant = Duration;
    fn now(&self) -> Duration {
        self.epoch.elapsed()
    }
}

/// One bucket's state for the `x-ratelimit-*` headers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BucketState {
    /// Bucket size.
    pub limit: u64,
    /// Cells left now.
    pub remaining: u64,
    /// Time until the bucket is full again.
    pub reset: Duration,
}

/// Both buckets of a tenant (absent: no such limit).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RateState {
    /// The request bucket.
    pub requests: Option<BucketState>,
    /// The token bucket.
    pub tokens: Option<BucketState>,
}

/// Why a tenant's request was not admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The request bucket is empty until `retry_after`.
    Requests {
        /// When a cell will be available.
        retry_after: Duration,
        /// Both buckets now.
        state: RateState,
    },
    /// The token bucket cannot cover the estimate until `retry_after`.
    Tokens {
        /// When the estimate will fit.
        retry_after: Duration,
        /// Both buckets now.
        state: RateState,
    },
    /// The estimate is larger than the whole token bucket: it can never be admitted.
    TooLarge {
        /// The request's estimate.
        cost: Tokens,
        /// The bucket size.
        burst: u64,
    },
}

/// Rate-limit accounting of all tenants; see the module docs.
pub trait RateStore: Send + Sync + 'static {
    /// Whether `tenant` has any rate limit (only those get `x-ratelimit-*` headers).
    fn limited(&self, tenant: &TenantId) -> bool;
    /// Admits one request estimated at `cost` (charging both buckets), or says why not.
    fn admit(&self, tenant: &TenantId, cost: Tokens) -> Result<RateState, Refusal>;
    /// Admits one request, asking a shared store (Redis, `cluster`) when there is one; the
    /// in-memory store answers at once with [`RateStore::admit`].
    fn admit_shared<'a>(
        &'a self,
        tenant: &'a TenantId,
        cost: Tokens,
    ) -> futures_util::future::BoxFuture<'a, Result<RateState, Refusal>> {
        Box::pin(std::future::ready(self.admit(tenant, cost)))
    }
    /// Moves `delta` tokens into the tenant's ledger (credit > 0, debt < 0).
    fn adjust(&self, tenant: &TenantId, delta: i64);
    /// Settles an admission: credits an over-estimate back, debits an under-estimate.
    fn reconcile(&self, tenant: &TenantId, estimated: Tokens, actual: Tokens) {
        self.adjust(tenant, estimated.signed() - actual.signed());
    }
    /// Charges `tokens` more (e.g. a retried upstream attempt).
    fn charge(&self, tenant: &TenantId, tokens: Tokens) {
        self.adjust(tenant, -tokens.signed());
    }
}

type Limiter = RateLimiter<NotKeyed, InMemoryState, TokioClock, StateInformationMiddleware>;

struct Bucket {
    limiter: Limiter,
    clock: TokioClock,
    quota: Quota,
    /// Cells left at the last check, and when (for headers of refused requests).
    last: Mutex<(u64, Duration)>,
}

impl Bucket {
    fn new(per_minute: u32, burst: f64, clock: TokioClock) -> Option<Self> {
        let size = (f64::from(per_minute) * burst)
            .round()
            .clamp(1.0, f64::from(u32::MAX)) as u32;
        let period = Duration::from_nanos(60_000_000_000 / u64::from(per_minute.max(1)));
        let quota = Quota::with_period(period)?.allow_burst(NonZeroU32::new(size)?);
        let limiter = RateLimiter::direct_with_clock(quota, clock).with_middleware();
        Some(Self {
            limiter,
            clock,
            quota,
            last: Mutex::new((u64::from(size), clock.now())),
        })
    }

    fn size(&self) -> u64 {
        u64::from(self.quota.burst_size().get())
    }

    fn state(&self, remaining: u64) -> BucketState {
        let missing = self.size().saturating_sub(remaining);
        BucketState {
            limit: self.size(),
            remaining,
            reset: self
                .quota
                .replenish_interval()
                .saturating_mul(u32::try_from(missing).unwrap_or(u32::MAX)),
        }
    }

    /// Takes `n` cells: `Ok(remaining)`, `Err(Some(wait))`, or `Err(None)` if `n` > size.
    fn take(&self, n: u64) -> Result<u64, Option<Duration>> {
        let Some(n) = u32::try_from(n).ok().and_then(NonZeroU32::new) else {
            return if n == 0 { Ok(self.peek()) } else { Err(None) };
        };
        match self.limiter.check_n(n) {
            Ok(Ok(snap)) => {
                let remaining = u64::from(snap.remaining_burst_capacity());
                *self.last.lock().unwrap_or_else(|p| p.into_inner()) =
                    (remaining, self.clock.now());
                Ok(remaining)
            }
            Ok(Err(not_until)) => Err(Some(not_until.wait_time_from(self.clock.now()))),
            Err(_) => Err(None),
        }
    }

    /// Cells left, without taking any: the last measurement plus what has refilled since
    /// (governor has no side-effect-free check).
    fn peek(&self) -> u64 {
        let (remaining, at) = *self.last.lock().unwrap_or_else(|p| p.into_inner());
        let interval = self.quota.replenish_interval().as_nanos().max(1);
        let refilled = self.clock.now().saturating_sub(at).as_nanos() / interval;
        (u128::from(remaining) + refilled).min(u128::from(self.size())) as u64
    }
}

struct TenantBuckets {
    requests: Option<Bucket>,
    tokens: Option<Bucket>,
    ledger: Mutex<Ledger>,
}

/// The in-memory [`RateStore`]: one pair of governor buckets per limited tenant.
pub struct MemoryStore {
    tenants: HashMap<TenantId, TenantBuckets>,
}

impl MemoryStore {
    /// Buckets for every tenant with a limit (others are never touched).
    pub fn new<'a>(limits: impl IntoIterator<Item = (TenantId, &'a TenantLimits)>) -> Self {
        let clock = TokioClock::default();
        let tenants = limits
            .into_iter()
            .filter_map(|(id, l)| {
                let b = TenantBuckets {
                    requests: l
                        .requests_per_minute
                        .and_then(|r| Bucket::new(r, l.burst, clock)),
                    tokens: l
                        .tokens_per_minute
                        .and_then(|t| Bucket::new(t, l.burst, clock)),
                    ledger: Mutex::new(Ledger::default()),
                };
                (b.requests.is_some() || b.tokens.is_some()).then_some((id, b))
            })
            .collect();
        Self { tenants }
    }

    /// The tenant's ledger balance (tests, metrics).
    pub fn balance(&self, tenant: &TenantId) -> Option<i64> {
        let t = self.tenants.get(tenant)?;
        Some(t.ledger.lock().unwrap_or_else(|p| p.into_inner()).balance())
    }
}

impl RateStore for MemoryStore {
    fn limited(&self, tenant: &TenantId) -> bool {
        self.tenants.contains_key(tenant)
    }

    fn admit(&self, tenant: &TenantId, cost: Tokens) -> Result<RateState, Refusal> {
        let Some(t) = self.tenants.get(tenant) else {
            return Ok(RateState::default());
        };
        let mut ledger = t.ledger.lock().unwrap_or_else(|p| p.into_inner());
        let zero = |b: &Bucket| b.state(0);
        let refused = |b: &Option<Bucket>| b.as_ref().map(zero);
        let mut state = RateState::default();
        if let Some(b) = &t.tokens {
            if cost.0 > b.size() {
                return Err(Refusal::TooLarge {
                    cost,
                    burst: b.size(),
                });
            }
            let mut need = ledger.need(cost);
            if need > b.size() {
                // More debt than one bucket: pay the debt now, the request waits for a refill.
                let debt = need - cost.0;
                if b.take(debt).is_ok() {
                    ledger.adjust(i64::try_from(debt).unwrap_or(i64::MAX), b.size());
                    need = cost.0;
                }
            }
            match b.take(need) {
                Ok(remaining) => {
                    ledger.settle(cost, need);
                    state.tokens = Some(b.state(remaining));
                }
                Err(wait) => {
                    let retry_after = wait.unwrap_or_else(|| b.quota.burst_size_replenished_in());
                    let state = RateState {
                        requests: t.requests.as_ref().map(|r| r.state(r.peek())),
                        tokens: refused(&t.tokens),
                    };
                    return Err(Refusal::Tokens { retry_after, state });
                }
            }
        }
        if let Some(b) = &t.requests {
            match b.take(1) {
                Ok(remaining) => state.requests = Some(b.state(remaining)),
                Err(wait) => {
                    // Give back what the token bucket just took, as credit.
                    if let Some(tb) = &t.tokens {
                        ledger.adjust(cost.signed(), tb.size());
                    }
                    let retry_after = wait.unwrap_or_else(|| b.quota.replenish_interval());
                    state.requests = refused(&t.requests);
                    return Err(Refusal::Requests { retry_after, state });
                }
            }
        }
        Ok(state)
    }

    fn adjust(&self, tenant: &TenantId, delta: i64) {
        let Some(t) = self.tenants.get(tenant) else {
            return;
        };
        let bound = t.tokens.as_ref().map_or(0, Bucket::size);
        t.ledger
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .adjust(delta, bound);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(rpm: Option<u32>, tpm: Option<u32>) -> (MemoryStore, TenantId) {
        let id = TenantId::new("t");
        let limits = TenantLimits {
            requests_per_minute: rpm,
            tokens_per_minute: tpm,
            burst: 1.0,
            ..TenantLimits::default()
        };
        (MemoryStore::new([(id.clone(), &limits)]), id)
    }

    #[tokio::test(start_paused = true)]
    async fn request_bucket_refuses_with_the_refill_time_and_refills_over_time() {
        let (s, t) = store(Some(6), None);
        for left in (0..6).rev() {
            let st = s.admit(&t, Tokens(10)).unwrap();
            assert_eq!(st.requests.unwrap().remaining, left);
        }
        let Err(Refusal::Requests { retry_after, .. }) = s.admit(&t, Tokens(10)) else {
            panic!("the seventh request in a minute is refused");
        };
        // One cell every 10 s.
        assert!(retry_after > Duration::from_secs(9) && retry_after <= Duration::from_secs(10));
        tokio::time::advance(retry_after).await;
        assert!(s.admit(&t, Tokens(10)).is_ok());
        assert!(s.admit(&t, Tokens(10)).is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn over_estimates_are_credited_and_under_estimates_charged() {
        let (s, t) = store(None, Some(1000));
        s.admit(&t, Tokens(600)).unwrap();
        // 600 of 1000 taken: a second 600 does not fit...
        assert!(matches!(
            s.admit(&t, Tokens(600)),
            Err(Refusal::Tokens { .. })
        ));
        // ...until the first reconciles at 100 actual: 500 credited back.
        s.reconcile(&t, Tokens(600), Tokens(100));
        assert_eq!(s.balance(&t), Some(500));
        s.admit(&t, Tokens(600)).unwrap();
        assert_eq!(s.balance(&t), Some(0));
        // Bucket empty now. After a full minute it is full again; an under-estimate of 400
        // is charged to the next admission.
        tokio::time::advance(Duration::from_secs(60)).await;
        s.reconcile(&t, Tokens(100), Tokens(500));
        let Err(Refusal::Tokens { retry_after, .. }) = s.admit(&t, Tokens(700)) else {
            panic!("700 + 400 debt exceeds the full bucket of 1000");
        };
        // The debt was paid from the bucket (600 left); the request waits for 100 more (6 s).
        assert_eq!(s.balance(&t), Some(0));
        assert!(retry_after > Duration::from_secs(5) && retry_after <= Duration::from_secs(6));
        tokio::time::advance(retry_after).await;
        assert!(s.admit(&t, Tokens(700)).is_ok());
        assert!(matches!(
            s.admit(&t, Tokens(5000)),
            Err(Refusal::TooLarge { burst: 1000, .. })
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_refused_by_the_request_bucket_costs_no_tokens() {
        let (s, t) = store(Some(1), Some(1000));
        s.admit(&t, Tokens(100)).unwrap();
        assert!(matches!(
            s.admit(&t, Tokens(300)),
            Err(Refusal::Requests { .. })
        ));
        // The 300 tokens taken from governor came back as credit.
        assert_eq!(s.balance(&t), Some(300));
        let (unlimited, other) = store(None, None);
        assert!(!unlimited.limited(&other));
        assert_eq!(
            unlimited.admit(&other, Tokens(1 << 40)),
            Ok(RateState::default())
        );
    }
}
