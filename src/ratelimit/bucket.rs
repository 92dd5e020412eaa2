//! One governor GCRA bucket on tokio's clock, with what governor does not offer: a
//! side-effect-free look at its level ([`Bucket::peek`]) and the wait for `n` cells from it.
//!
//! Invariant: `peek` never overstates what `take` would grant by more than the cells refilled
//! since the last successful `take` was measured (it is exact up to one replenish interval).

use std::num::NonZeroU32;
use std::sync::Mutex;
use std::time::Duration;

use governor::clock::Clock;
use governor::middleware::StateInformationMiddleware;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};

use super::BucketState;

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

type Limiter = RateLimiter<NotKeyed, InMemoryState, TokioClock, StateInformationMiddleware>;

/// A bucket of `per_minute × burst` cells refilling `per_minute` a minute.
pub(super) struct Bucket {
    limiter: Limiter,
    clock: TokioClock,
    quota: Quota,
    /// Cells left at the last successful take, and when.
    last: Mutex<(u64, Duration)>,
}

impl Bucket {
    pub fn new(per_minute: u32, burst: f64, clock: TokioClock) -> Option<Self> {
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

    pub fn size(&self) -> u64 {
        u64::from(self.quota.burst_size().get())
    }

    /// The header state with `remaining` cells.
    pub fn state(&self, remaining: u64) -> BucketState {
        let missing = self.size().saturating_sub(remaining);
        BucketState {
            limit: self.size(),
            remaining,
            reset: self.refill_time(missing),
        }
    }

    /// The header state of a token bucket whose ledger holds `balance`: credit is tokens the
    /// tenant may still spend, debt is tokens it must still pay.
    pub fn state_with(&self, balance: i64) -> BucketState {
        let remaining = i128::from(self.peek()) + i128::from(balance);
        self.state(remaining.clamp(0, i128::from(self.size())) as u64)
    }

    /// Now, on the bucket's clock.
    pub fn now(&self) -> Duration {
        self.clock.now()
    }

    /// Cells that refill in `elapsed` (not capped at the bucket size).
    pub fn cells_in(&self, elapsed: Duration) -> u64 {
        let interval = self.quota.replenish_interval().as_nanos().max(1);
        u64::try_from(elapsed.as_nanos() / interval).unwrap_or(u64::MAX)
    }

    /// How long `cells` take to refill (not capped at the bucket size).
    pub fn refill_time(&self, cells: u64) -> Duration {
        self.quota
            .replenish_interval()
            .saturating_mul(u32::try_from(cells).unwrap_or(u32::MAX))
    }

    /// Takes `n` cells: `Ok(())`, or `Err(wait)` until they fit (never: the time to refill the
    /// whole bucket).
    pub fn take(&self, n: u64) -> Result<(), Duration> {
        let Some(n) = u32::try_from(n).ok().and_then(NonZeroU32::new) else {
            return if n == 0 {
                Ok(())
            } else {
                Err(self.quota.burst_size_replenished_in())
            };
        };
        match self.limiter.check_n(n) {
            Ok(Ok(snap)) => {
                let remaining = u64::from(snap.remaining_burst_capacity());
                *self.last.lock().unwrap_or_else(|p| p.into_inner()) =
                    (remaining, self.clock.now());
                Ok(())
            }
            Ok(Err(not_until)) => Err(not_until.wait_time_from(self.clock.now())),
            Err(_) => Err(self.quota.burst_size_replenished_in()),
        }
    }

    /// Cells left, without taking any: the last measurement plus what has refilled since
    /// (governor has no side-effect-free check).
    pub fn peek(&self) -> u64 {
        let (remaining, at) = *self.last.lock().unwrap_or_else(|p| p.into_inner());
        let interval = self.quota.replenish_interval().as_nanos().max(1);
        let refilled = self.clock.now().saturating_sub(at).as_nanos() / interval;
        (u128::from(remaining) + refilled).min(u128::from(self.size())) as u64
    }

    /// How long until `n` cells are there, from the current level.
    pub fn wait_for(&self, n: u64) -> Duration {
        self.refill_time(n.min(self.size()).saturating_sub(self.peek()))
    }
}
