//! One endpoint's health: the outlier-detection state machine of `[upstreams.health]`. Pure:
//! time is an argument, no I/O.
//!
//! `InService` → (`consecutive_failures` failures in a row, or a failed fraction of at least
//! `error_rate` over the last `error_window` answers, and the pool allows it) → `Ejected {
//! until }` for `eject_ms × 2^(n-1)` (n: ejections since the last success, capped at
//! `max_eject_ms`) → at `until` the endpoint is *due a probe*: it may take one request at a
//! time → a success puts it back `InService` (n = 0, the window cleared), a failure ejects it
//! again for twice as long.
//!
//! Invariants: an ejected endpoint whose time is not up takes nothing; a probing one at most
//! one request at a time (the balancer's limit of 1); the window holds at most 64 answers.

use std::time::Duration;

/// Where an endpoint stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// Takes traffic up to its learned limit.
    InService,
    /// Out until `until`; from then on it takes one probe request at a time.
    Ejected {
        /// When the probe is due.
        until: Duration,
    },
}

/// The ejection rules, from `[upstreams.health]`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rules {
    /// Failures in a row that eject.
    pub consecutive_failures: u32,
    /// Failed fraction over the window that ejects.
    pub error_rate: f64,
    /// Answers in the window (1..=64).
    pub error_window: u32,
    /// First ejection.
    pub eject: Duration,
    /// Longest ejection.
    pub max_eject: Duration,
}

impl Default for Rules {
    /// `[upstreams.health]`'s defaults: 5 in a row, half of the last 20, 1 s doubling to 30 s.
    fn default() -> Self {
        Self {
            consecutive_failures: 5,
            error_rate: 0.5,
            error_window: 20,
            eject: Duration::from_secs(1),
            max_eject: Duration::from_secs(30),
        }
    }
}

/// One endpoint's health; see the module docs.
#[derive(Clone, Debug)]
pub struct Health {
    state: State,
    consecutive: u32,
    /// The last `len` answers, newest in bit 0: 1 = failed.
    window: u64,
    len: u32,
    /// Ejections since the last success.
    in_row: u32,
    /// Ejections ever.
    ejections: u64,
}

impl Default for Health {
    fn default() -> Self {
        Self {
            state: State::InService,
            consecutive: 0,
            window: 0,
            len: 0,
            in_row: 0,
            ejections: 0,
        }
    }
}

impl Health {
    /// The state.
    pub fn state(&self) -> State {
        self.state
    }

    /// Ejections so far.
    pub fn ejections(&self) -> u64 {
        self.ejections
    }

    /// Whether the endpoint is out at `now` (ejected, its probe not yet due).
    pub fn out(&self, now: Duration) -> bool {
        matches!(self.state, State::Ejected { until } if now < until)
    }

    /// Whether the endpoint is ejected and its probe is due at `now` (it takes one request at
    /// a time).
    pub fn probing(&self, now: Duration) -> bool {
        matches!(self.state, State::Ejected { until } if now >= until)
    }

    /// When an ejected endpoint's probe is due.
    pub fn until(&self) -> Option<Duration> {
        match self.state {
            State::Ejected { until } => Some(until),
            State::InService => None,
        }
    }

    /// Another replica ejected this endpoint until `until` (cluster mode): out until then, then
    /// due a probe, as after an own ejection, but counted as none of this replica's ejections
    /// and leaving the backoff as it was. An endpoint already out longer stays as it is.
    pub fn hold_out(&mut self, until: Duration) {
        if self.until().is_none_or(|u| u < until) {
            self.state = State::Ejected { until };
        }
    }

    fn record(&mut self, failed: bool, rules: &Rules) {
        let n = rules.error_window;
        self.window = (self.window << 1) | u64::from(failed);
        if n < 64 {
            self.window &= (1u64 << n) - 1;
        }
        self.len = (self.len + 1).min(n);
    }

    /// The endpoint answered at `now` (anything that is not a failure). An answer to a request
    /// sent before an ejection, arriving while the endpoint is out, changes nothing: only the
    /// probe brings it back.
    pub fn on_success(&mut self, now: Duration, rules: &Rules) {
        if self.out(now) {
            return;
        }
        self.consecutive = 0;
        if matches!(self.state, State::Ejected { .. }) {
            // The probe passed: back in, with a clean slate.
            self.state = State::InService;
            self.in_row = 0;
            self.window = 0;
            self.len = 0;
            return;
        }
        self.in_row = 0;
        self.record(false, rules);
    }

    /// The endpoint failed a request at `now`; `may_eject`: the pool has another endpoint in
    /// service. Returns whether this ejected it.
    pub fn on_failure(&mut self, now: Duration, rules: &Rules, may_eject: bool) -> bool {
        self.consecutive = self.consecutive.saturating_add(1);
        self.record(true, rules);
        let probe_failed = self.probing(now);
        if self.out(now) {
            // A request sent before the ejection: already out.
            return false;
        }
        let by_count = self.consecutive >= rules.consecutive_failures;
        let by_rate = self.len >= rules.error_window
            && f64::from(self.window.count_ones()) >= rules.error_rate * f64::from(self.len);
        if !(probe_failed || by_count || by_rate) || !may_eject {
            return false;
        }
        let factor = 1u32 << self.in_row.min(16);
        let time = rules.eject.saturating_mul(factor).min(rules.max_eject);
        self.in_row = self.in_row.saturating_add(1);
        self.ejections += 1;
        self.state = State::Ejected { until: now + time };
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn consecutive_failures_eject_and_probes_back_off() {
        let r = Rules::default();
        let mut h = Health::default();
        for i in 0..4 {
            assert!(!h.on_failure(ms(i), &r, true));
        }
        assert!(h.on_failure(ms(4), &r, true), "the fifth in a row");
        assert!(h.out(ms(500)) && !h.probing(ms(500)));
        assert!(h.probing(ms(1004)), "due after eject_ms");
        // The probe fails: out twice as long.
        assert!(h.on_failure(ms(1004), &r, true));
        assert_eq!(h.until(), Some(ms(1004 + 2000)));
        assert!(h.on_failure(ms(3004), &r, true));
        assert_eq!(h.until(), Some(ms(3004 + 4000)));
        // The probe passes: back in service, and the next ejection starts short again.
        h.on_success(ms(5000), &r);
        assert_eq!(
            h.state(),
            State::Ejected { until: ms(7004) },
            "out: ignored"
        );
        h.on_success(ms(7004), &r);
        assert_eq!(h.state(), State::InService);
        for i in 0..5 {
            h.on_failure(ms(10_000 + i), &r, true);
        }
        assert_eq!(h.until(), Some(ms(10_004 + 1000)));
        assert_eq!(h.ejections(), 4);
    }

    #[test]
    fn an_error_rate_over_the_window_ejects_and_the_last_endpoint_stays() {
        let r = Rules::default();
        let mut h = Health::default();
        // Alternating: never 5 in a row, but half of the last 20 failed.
        let mut ejected = false;
        for i in 0..20 {
            if i % 2 == 0 {
                ejected |= h.on_failure(ms(i), &r, true);
            } else {
                h.on_success(ms(i), &r);
            }
        }
        assert!(!ejected, "19 answers: the window is not full yet");
        assert!(h.on_failure(ms(20), &r, true));
        // The pool's last endpoint in service is never ejected.
        let mut h = Health::default();
        for i in 0..50 {
            assert!(!h.on_failure(ms(i), &r, false));
        }
        assert_eq!(h.state(), State::InService);
        let capped = Rules {
            max_eject: ms(1500),
            ..r
        };
        let mut h = Health::default();
        for i in 0..5 {
            h.on_failure(ms(i), &capped, true);
        }
        h.on_failure(ms(2000), &capped, true);
        assert_eq!(h.until(), Some(ms(3500)), "capped at max_eject");
    }
}
