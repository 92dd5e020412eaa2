//! What the console (`/admin/ui`) reads that Prometheus does not keep per tenant: each tenant's
//! recent queue waits (p50/p95 of its last [`WAITS`] dispatches) and refusals by reason, and
//! each pool's timeline of shares (the last [`TIMELINE`] samples, one at most every
//! [`SAMPLE_SECS`] seconds).
//!
//! Invariants: bounded whatever the traffic — a fixed ring of waits per tenant, one count per
//! refusal reason (reasons are static strings of the code), a fixed ring of samples per pool,
//! each holding at most [`TOP_SHARES`] tenants and the rest summed as `other`.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use crate::error::Reason;

/// Queue waits kept per tenant.
pub const WAITS: usize = 64;
/// Samples kept per pool in the timeline (10 minutes at [`SAMPLE_SECS`]).
pub const TIMELINE: usize = 120;
/// Seconds between two timeline samples.
pub const SAMPLE_SECS: u64 = 5;
/// Tenants named in one timeline sample; the rest are summed as `other`.
pub const TOP_SHARES: usize = 8;

/// One tenant's recent waits and refusals.
#[derive(Default)]
pub struct TenantLive {
    inner: Mutex<Recent>,
}

#[derive(Default)]
struct Recent {
    /// Queue waits in ms, a ring of [`WAITS`].
    waits: Vec<u32>,
    next: usize,
    refusals: Vec<(&'static str, u64)>,
}

impl TenantLive {
    fn lock(&self) -> std::sync::MutexGuard<'_, Recent> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records one dispatch's queue wait.
    pub fn waited(&self, waited: Duration) {
        let ms = u32::try_from(waited.as_millis()).unwrap_or(u32::MAX);
        let mut r = self.lock();
        if r.waits.len() < WAITS {
            r.waits.push(ms);
        } else {
            let i = r.next;
            r.waits[i] = ms;
        }
        r.next = (r.next + 1) % WAITS;
    }

    /// Counts one refusal by reason.
    pub fn refused(&self, reason: Reason) {
        let reason = reason.as_str();
        let mut r = self.lock();
        match r.refusals.iter_mut().find(|(k, _)| *k == reason) {
            Some((_, n)) => *n += 1,
            None => r.refusals.push((reason, 1)),
        }
    }

    /// p50 and p95 of the recent waits, ms (`None`: no dispatch yet).
    pub fn wait_quantiles(&self) -> Option<(u32, u32)> {
        let mut w = self.lock().waits.clone();
        if w.is_empty() {
            return None;
        }
        w.sort_unstable();
        let q = |p: f64| w[((w.len() - 1) as f64 * p).round() as usize];
        Some((q(0.5), q(0.95)))
    }

    /// Refusals since start, by reason.
    pub fn refusals(&self) -> Vec<(&'static str, u64)> {
        self.lock().refusals.clone()
    }
}

/// One timeline sample of a pool: served shares over the rolling window.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Sample {
    /// Seconds since the server started.
    pub at: u64,
    /// The top tenants by served share, with their share (0..1).
    pub shares: Vec<(String, f64)>,
    /// The share of everyone else.
    pub other: f64,
    /// Upstream 429s per second since the previous sample.
    pub throttled_per_s: f64,
}

/// Every pool's ring of samples; shared across reloads.
#[derive(Default)]
pub struct Timeline {
    inner: Mutex<Rings>,
}

#[derive(Default)]
struct Rings {
    /// Per pool name: the samples, and the 429 count at the last one.
    pools: Vec<(String, VecDeque<Sample>, u64)>,
    last: Option<u64>,
}

impl Timeline {
    /// Whether a sample is due at second `sec` (none yet, or [`SAMPLE_SECS`] since the last);
    /// if so, the caller takes it (the next call in the same period answers false).
    pub fn claim(&self, sec: u64) -> bool {
        let mut r = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let due = r.last.is_none_or(|l| sec >= l + SAMPLE_SECS);
        if due {
            r.last = Some(sec);
        }
        due
    }

    /// Adds pool `pool`'s sample at second `sec`: `served` is (tenant, tokens in the window);
    /// `throttled` the pool's 429 count since start.
    pub fn push(&self, pool: &str, sec: u64, served: &[(&str, u64)], throttled: u64) {
        let total: u64 = served.iter().map(|(_, s)| s).sum();
        let mut top: Vec<(&str, u64)> = served.iter().filter(|(_, s)| *s > 0).copied().collect();
        top.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        let share = |s: u64| {
            if total == 0 {
                0.0
            } else {
                s as f64 / total as f64
            }
        };
        let named: Vec<(String, f64)> = top
            .iter()
            .take(TOP_SHARES)
            .map(|(t, s)| ((*t).to_owned(), share(*s)))
            .collect();
        let other = share(top.iter().skip(TOP_SHARES).map(|(_, s)| s).sum());
        let mut r = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let i = match r.pools.iter().position(|(n, ..)| n == pool) {
            Some(i) => i,
            None => {
                r.pools.push((pool.to_owned(), VecDeque::new(), throttled));
                r.pools.len() - 1
            }
        };
        let (_, ring, last_throttled) = &mut r.pools[i];
        let dt = ring.back().map_or(0, |p| sec.saturating_sub(p.at));
        let throttled_per_s = if dt == 0 {
            0.0
        } else {
            throttled.saturating_sub(*last_throttled) as f64 / dt as f64
        };
        *last_throttled = throttled;
        if ring.len() == TIMELINE {
            ring.pop_front();
        }
        ring.push_back(Sample {
            at: sec,
            shares: named,
            other,
            throttled_per_s,
        });
    }

    /// Pool `pool`'s samples, oldest first.
    pub fn samples(&self, pool: &str) -> Vec<Sample> {
        let r = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        r.pools
            .iter()
            .find(|(n, ..)| n == pool)
            .map(|(_, ring, _)| ring.iter().cloned().collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_are_a_bounded_ring_with_quantiles_of_the_recent_ones() {
        let t = TenantLive::default();
        assert_eq!(t.wait_quantiles(), None);
        for ms in 0..1000u64 {
            t.waited(Duration::from_millis(ms));
        }
        assert_eq!(t.inner.lock().unwrap().waits.len(), WAITS);
        let (p50, p95) = t.wait_quantiles().unwrap();
        // Only the last 64 waits (936..=999) count.
        assert!((960..=970).contains(&p50), "{p50}");
        assert!((990..=999).contains(&p95), "{p95}");
        t.refused(Reason::RequestRate);
        t.refused(Reason::RequestRate);
        t.refused(Reason::PoolQueueFull);
        assert_eq!(
            t.refusals(),
            vec![("request_rate", 2), ("pool_queue_full", 1)]
        );
    }

    #[test]
    fn the_timeline_keeps_the_last_samples_and_names_the_top_tenants() {
        let tl = Timeline::default();
        let names: Vec<String> = (0..20).map(|i| format!("t{i:02}")).collect();
        let served: Vec<(&str, u64)> = names
            .iter()
            .enumerate()
            .map(|(i, n)| (n.as_str(), i as u64 + 1))
            .collect();
        for k in 0..(TIMELINE as u64 + 30) {
            let sec = k * SAMPLE_SECS;
            assert!(tl.claim(sec));
            tl.push("p", sec, &served, k * 10);
            tl.push("q", sec, &served, 0);
            assert!(!tl.claim(sec + SAMPLE_SECS - 1));
        }
        let s = tl.samples("p");
        assert_eq!(s.len(), TIMELINE, "bounded ring");
        assert_eq!(s[0].at, 30 * SAMPLE_SECS, "oldest dropped first");
        let last = s.last().unwrap();
        assert_eq!(last.shares.len(), TOP_SHARES);
        assert_eq!(last.shares[0].0, "t19");
        let sum: f64 = last.shares.iter().map(|x| x.1).sum::<f64>() + last.other;
        assert!((sum - 1.0).abs() < 1e-9);
        assert!((last.throttled_per_s - 10.0 / SAMPLE_SECS as f64).abs() < 1e-9);
        assert!(tl.samples("nope").is_empty());
    }
}
