//! Additive-increase / multiplicative-decrease limit on a pool's concurrency, learned from the
//! upstream: an overload answer (429/503) cuts the limit by `decrease`, each success raises it
//! by `1/limit` (about +1 per limit's worth of successes, i.e. per round trip at full load).
//! Near the level where the last overload happened the increase is `PROBE_SLOWDOWN` times
//! slower: the limiter probes gently where it already knows the wall is, so a provider with a
//! fixed capacity sees a 429 every few dozen round trips rather than every few.
//!
//! Invariants: `min ≤ limit ≤ max`; at most one relative decrease per `cooldown` (the in-flight
//! requests that were sent before the first 429 came back must not cut the limit again and
//! again), while a decrease *to* a counted concurrency (`on_overload_at`) may come sooner, as it
//! only ever takes the lowest count seen; a
//! `Retry-After` from the upstream pauses dispatch until then (`paused_until`). Pure: time is an
//! argument.

use std::time::Duration;

/// The learned limit of one pool.
#[derive(Clone, Debug)]
pub struct Aimd {
    limit: f64,
    min: f64,
    max: f64,
    decrease: f64,
    cooldown: Duration,
    last_decrease: Option<Duration>,
    paused_until: Duration,
    /// The limit at the last overload: where the wall was.
    wall: Option<f64>,
}

/// How much slower the limit grows within 10% of the last overload level.
const PROBE_SLOWDOWN: f64 = 16.0;

impl Aimd {
    /// Starts at `max` (the configured pool size).
    pub fn new(max: u32) -> Self {
        let max = f64::from(max.max(1));
        Self {
            limit: max,
            min: 1.0,
            max,
            decrease: 0.7,
            cooldown: Duration::from_millis(500),
            last_decrease: None,
            paused_until: Duration::ZERO,
            wall: None,
        }
    }

    /// Sets how long after one decrease further overloads are ignored (about one round trip).
    pub fn with_cooldown(mut self, cooldown: Duration) -> Self {
        self.cooldown = cooldown;
        self
    }

    /// The concurrency the pool may use now.
    pub fn limit(&self) -> u32 {
        self.limit.floor() as u32
    }

    /// The configured ceiling.
    pub fn max(&self) -> u32 {
        self.max as u32
    }

    /// Changes the ceiling (config reload): a limit at the old ceiling (nothing learned below
    /// it) follows the new one; a learned lower limit stays, clamped to the new ceiling.
    pub fn set_max(&mut self, max: u32) {
        let at_ceiling = self.limit >= self.max;
        self.max = f64::from(max.max(1));
        self.limit = if at_ceiling {
            self.max
        } else {
            self.limit.min(self.max)
        };
    }

    /// Whether dispatch is paused by an upstream `Retry-After` at `now`.
    pub fn paused(&self, now: Duration) -> bool {
        now < self.paused_until
    }

    /// When the current pause ends.
    pub fn paused_until(&self) -> Duration {
        self.paused_until
    }

    /// Pauses dispatch until `now + for_` without lowering the limit (the upstream said its
    /// budget is spent until a reset, e.g. `x-ratelimit-remaining-requests: 0`).
    pub fn pause(&mut self, now: Duration, for_: Duration) {
        self.paused_until = self.paused_until.max(now + for_);
    }

    /// A request succeeded.
    pub fn on_success(&mut self) {
        let near_wall = self.wall.is_some_and(|w| self.limit >= 0.9 * w);
        let step = if near_wall {
            1.0 / (self.limit * PROBE_SLOWDOWN)
        } else {
            1.0 / self.limit
        };
        self.limit = (self.limit + step).min(self.max);
    }

    /// The upstream answered 429/503, optionally saying when to come back.
    pub fn on_overload(&mut self, now: Duration, retry_after: Option<Duration>) {
        self.on_overload_at(now, retry_after, None);
    }

    /// As [`Aimd::on_overload`], knowing how many requests were in flight when it happened
    /// (the refused one included): a provider that caps concurrency at K refuses the (K+1)-th,
    /// so the limit goes straight to `in_flight - 1` (instead of the blind multiplicative cut,
    /// which overshoots below K and then probes back), and the wall is remembered at `in_flight`.
    pub fn on_overload_at(
        &mut self,
        now: Duration,
        retry_after: Option<Duration>,
        in_flight: Option<u32>,
    ) {
        if let Some(ra) = retry_after {
            self.paused_until = self.paused_until.max(now + ra);
        }
        let within_cooldown = self
            .last_decrease
            .is_some_and(|t| now.saturating_sub(t) < self.cooldown);
        match in_flight.filter(|&n| n >= 2).map(f64::from) {
            // A count is an absolute estimate, not a relative cut: more of them in one round
            // trip (answers overtaking each other) can only bring the limit down to the lowest.
            Some(n) if within_cooldown => {
                if n - 1.0 < self.limit {
                    self.limit = (n - 1.0).max(self.min);
                    self.wall = Some(self.wall.map_or(n, |w| w.min(n)));
                }
            }
            Some(n) => {
                self.last_decrease = Some(now);
                self.wall = Some(n.min(self.limit));
                self.limit = (n - 1.0).min(self.limit - 1.0).max(self.min);
            }
            None if within_cooldown => {}
            None => {
                self.last_decrease = Some(now);
                self.wall = Some(self.limit);
                self.limit = (self.limit * self.decrease).max(self.min);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overload_cuts_once_per_cooldown_and_success_climbs_back() {
        let mut a = Aimd::new(16);
        a.on_overload(Duration::ZERO, None);
        assert_eq!(a.limit(), 11);
        a.on_overload(Duration::from_millis(100), None);
        assert_eq!(a.limit(), 11, "same round trip");
        a.on_overload(Duration::from_secs(1), None);
        assert_eq!(a.limit(), 7);
        for _ in 0..2000 {
            a.on_success();
        }
        assert_eq!(a.limit(), 16);
    }

    #[test]
    fn a_concurrency_wall_is_learned_from_the_in_flight_count() {
        let mut a = Aimd::new(16);
        // Limit 16, the provider refused the 5th concurrent request: K = 4.
        a.on_overload_at(Duration::ZERO, None, Some(5));
        assert_eq!(a.limit(), 4, "straight to the wall, not below it");
        // Probing past the wall is slow: many successes per step.
        for _ in 0..20 {
            a.on_success();
        }
        assert_eq!(a.limit(), 4);
        // Answers of one burst come back out of order: within the cooldown a lower count still
        // lowers the limit (to the count, not compounding), a higher one does nothing.
        let mut a = Aimd::new(16);
        a.on_overload_at(Duration::ZERO, None, Some(12));
        assert_eq!(a.limit(), 11);
        a.on_overload_at(Duration::from_millis(1), None, Some(14));
        assert_eq!(a.limit(), 11);
        a.on_overload_at(Duration::from_millis(2), None, Some(5));
        a.on_overload_at(Duration::from_millis(3), None, Some(5));
        assert_eq!(a.limit(), 4);
        a.on_overload(Duration::from_millis(4), None);
        assert_eq!(a.limit(), 4, "a blind cut still waits out the cooldown");
    }

    #[test]
    fn retry_after_pauses_and_limit_stays_in_bounds() {
        let mut a = Aimd::new(4);
        a.on_overload(Duration::from_secs(1), Some(Duration::from_secs(2)));
        assert!(a.paused(Duration::from_secs(2)));
        assert!(!a.paused(Duration::from_secs(3)));
        for i in 0..50 {
            a.on_overload(Duration::from_secs(10 + i), None);
        }
        assert_eq!(a.limit(), 1);
    }
}
