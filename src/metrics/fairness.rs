//! Fairness figures computed at scrape time from the tokens served over a rolling window (the
//! last [`WINDOW_SECS`] seconds, kept per tenant and pool in a [`Window`] of per-second
//! buckets): served share ÷ entitled share per label, and Jain's index per pool.
//!
//! Pure: no clock (the second is an argument), no locks. Invariant: a [`Window`] counts exactly
//! the tokens added in its last `WINDOW_SECS` seconds (the current one included) and forgets
//! older ones, whatever the gaps between calls; it never grows.

/// Length of the rolling window, seconds.
pub const WINDOW_SECS: usize = 30;

/// Tokens added over the last [`WINDOW_SECS`] seconds: a ring of per-second buckets.
#[derive(Clone, Debug, Default)]
pub struct Window {
    buckets: [u64; WINDOW_SECS],
    /// The second of the newest bucket.
    head: u64,
}

impl Window {
    fn advance(&mut self, sec: u64) {
        if sec <= self.head {
            return;
        }
        if sec - self.head >= WINDOW_SECS as u64 {
            self.buckets = [0; WINDOW_SECS];
        } else {
            for s in self.head + 1..=sec {
                self.buckets[(s % WINDOW_SECS as u64) as usize] = 0;
            }
        }
        self.head = sec;
    }

    /// Adds `tokens` served in second `sec` (a late add still inside the window counts in its
    /// own second; one older than the window is dropped).
    pub fn add(&mut self, sec: u64, tokens: u64) {
        self.advance(sec);
        if self.head - sec < WINDOW_SECS as u64 {
            let b = &mut self.buckets[(sec % WINDOW_SECS as u64) as usize];
            *b = b.saturating_add(tokens);
        }
    }

    /// Tokens added in the window ending at second `sec`.
    pub fn sum(&mut self, sec: u64) -> u64 {
        self.advance(sec);
        self.buckets.iter().sum()
    }
}

/// One tenant's figures for one window.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample {
    /// Index of the tenant's label (its id, or its cohort).
    pub label: usize,
    /// Its weight.
    pub weight: f64,
    /// Tokens dispatched in the window.
    pub served: u64,
    /// Backlogged at the scrape.
    pub backlogged: bool,
}

impl Sample {
    /// Served or backlogged: entitled to a share of the window.
    fn active(&self) -> bool {
        self.served > 0 || self.backlogged
    }
}

/// Served share ÷ entitled share per label (`None`: inactive label, or nothing served in the
/// window). Entitlement is the label's weight over the weight of every active tenant.
pub fn share_ratios(samples: &[Sample], labels: usize) -> Vec<Option<f64>> {
    let total_served: u64 = samples.iter().map(|s| s.served).sum();
    let total_weight: f64 = samples
        .iter()
        .filter(|s| s.active())
        .map(|s| s.weight)
        .sum();
    let mut served = vec![0u64; labels];
    let mut weight = vec![0f64; labels];
    for s in samples.iter().filter(|s| s.active()) {
        served[s.label] += s.served;
        weight[s.label] += s.weight;
    }
    (0..labels)
        .map(|l| {
            (total_served > 0 && weight[l] > 0.0)
                .then(|| (served[l] as f64 / total_served as f64) / (weight[l] / total_weight))
        })
        .collect()
}

/// Jain's index of weighted service (served ÷ weight) over backlogged tenants: 1 is perfectly
/// fair, 1/n is one tenant getting everything. `None` with no backlogged tenant or no service.
pub fn jain(samples: &[Sample]) -> Option<f64> {
    let xs: Vec<f64> = samples
        .iter()
        .filter(|s| s.backlogged)
        .map(|s| s.served as f64 / s.weight)
        .collect();
    let sum: f64 = xs.iter().sum();
    let sq: f64 = xs.iter().map(|x| x * x).sum();
    (sum > 0.0).then(|| sum * sum / (xs.len() as f64 * sq))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(label: usize, weight: f64, served: u64, backlogged: bool) -> Sample {
        Sample {
            label,
            weight,
            served,
            backlogged,
        }
    }

    #[test]
    fn weighted_shares_served_in_proportion_are_one() {
        let v = [
            s(0, 1.0, 100, true),
            s(1, 3.0, 300, true),
            s(2, 1.0, 0, false),
        ];
        let r = share_ratios(&v, 3);
        assert!((r[0].unwrap() - 1.0).abs() < 1e-9);
        assert!((r[1].unwrap() - 1.0).abs() < 1e-9);
        assert_eq!(r[2], None);
        assert!((jain(&v).unwrap() - 1.0).abs() < 1e-9);
    }

    #[test]
    fn one_tenant_taking_everything() {
        let v = [s(0, 1.0, 1000, true), s(1, 1.0, 0, true)];
        let r = share_ratios(&v, 2);
        assert!((r[0].unwrap() - 2.0).abs() < 1e-9);
        assert_eq!(r[1], Some(0.0));
        assert!((jain(&v).unwrap() - 0.5).abs() < 1e-9);
        assert_eq!(jain(&[s(0, 1.0, 0, false)]), None);
    }

    #[test]
    fn cohorts_aggregate_their_tenants() {
        let v = [
            s(0, 1.0, 50, true),
            s(0, 1.0, 50, true),
            s(1, 2.0, 100, true),
        ];
        let r = share_ratios(&v, 2);
        assert!((r[0].unwrap() - 1.0).abs() < 1e-9);
        assert!((r[1].unwrap() - 1.0).abs() < 1e-9);
    }

    #[test]
    fn the_window_keeps_the_last_seconds_and_forgets_older_ones() {
        let mut w = Window::default();
        w.add(0, 5);
        w.add(1, 10);
        assert_eq!(w.sum(1), 15);
        let last = WINDOW_SECS as u64 - 1;
        assert_eq!(w.sum(last), 15, "second 0 is still inside");
        assert_eq!(w.sum(last + 1), 10, "second 0 left the window");
        w.add(last, 1);
        w.add(0, 100);
        assert_eq!(w.sum(last + 1), 11, "too late for the window: dropped");
        w.add(last + 1, 2);
        assert_eq!(w.sum(last + 1), 13);
        assert_eq!(w.sum(last + 2), 3);
        // A long gap clears everything at once.
        assert_eq!(w.sum(10_000), 0);
        w.add(10_000, 7);
        w.add(9_999, 1);
        assert_eq!(w.sum(10_000), 8);
    }
}
