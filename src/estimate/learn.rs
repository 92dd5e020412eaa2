//! Learned output estimates: per (tenant, model), the 90th percentile of the last [`WINDOW`]
//! actual output token counts.
//!
//! Invariants: memory is bounded ([`WINDOW`] samples per key, at most [`MAX_KEYS`] keys — when
//! full, a new key evicts an arbitrary one); the percentile is recomputed when a sample is
//! recorded, so reading an estimate (done at every dispatch, under the fair queue's lock) is one
//! short lock and a map lookup; this lock is a leaf: nothing else is locked while it is held.

use std::sync::Mutex;

pub use crate::domain::OutputKey;

/// Samples kept per (tenant, model).
pub const WINDOW: usize = 64;
/// Distinct (tenant, model) keys kept.
pub const MAX_KEYS: usize = 65_536;
#[derive(Debug, Default)]
struct Ring {
    samples: Vec<u64>,
    next: usize,
    p90: u64,
}

impl Ring {
    fn push(&mut self, v: u64) {
        if self.samples.len() < WINDOW {
            self.samples.push(v);
        } else {
            self.samples[self.next] = v;
        }
        self.next = (self.next + 1) % WINDOW;
        // Nearest-rank 90th percentile, selected in a copy on the stack (one per reconciled
        // request: no allocation, no full sort).
        let mut copy = [0u64; WINDOW];
        let n = self.samples.len();
        copy[..n].copy_from_slice(&self.samples);
        let rank = (n * 9).div_ceil(10).max(1);
        self.p90 = *copy[..n].select_nth_unstable(rank - 1).1;
    }
}

/// The learned output history of every (tenant, model).
#[derive(Debug, Default)]
pub struct History {
    rings: Mutex<crate::domain::FastMap<OutputKey, Ring>>,
}

impl History {
    fn lock(&self) -> std::sync::MutexGuard<'_, crate::domain::FastMap<OutputKey, Ring>> {
        self.rings.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records one actual output count.
    pub fn record(&self, key: &OutputKey, output: u64) {
        let mut rings = self.lock();
        if !rings.contains_key(key) && rings.len() >= MAX_KEYS {
            if let Some(victim) = rings.keys().next().cloned() {
                rings.remove(&victim);
            }
        }
        // The key (its model a `String`) is copied only when it is new.
        match rings.get_mut(key) {
            Some(ring) => ring.push(output),
            None => rings.entry(key.clone()).or_default().push(output),
        }
    }

    /// The p90 of the key's recent outputs, if it has any.
    pub fn p90(&self, key: &OutputKey) -> Option<u64> {
        self.lock().get(key).map(|r| r.p90)
    }

    /// Samples held for the key.
    pub fn samples(&self, key: &OutputKey) -> usize {
        self.lock().get(key).map_or(0, |r| r.samples.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::TenantId;

    #[test]
    fn the_p90_is_the_nearest_rank_of_the_sorted_window() {
        let mut ring = Ring::default();
        let mut x = 0x9e37_79b9_u64;
        for i in 0..300 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ring.push(x % 1000);
            let mut sorted = ring.samples.clone();
            sorted.sort_unstable();
            let rank = (sorted.len() * 9).div_ceil(10).max(1);
            assert_eq!(ring.p90, sorted[rank - 1], "after {} samples", i + 1);
        }
    }

    #[test]
    fn p90_of_the_last_window() {
        let h = History::default();
        let k = OutputKey::new(TenantId::new("a"), "m");
        assert_eq!(h.p90(&k), None);
        for v in 1..=100 {
            h.record(&k, v);
        }
        // The last 64 samples are 37..=100; their nearest-rank p90 is the 58th: 94.
        assert_eq!(h.samples(&k), WINDOW);
        assert_eq!(h.p90(&k), Some(94));
        h.record(&k, 1);
        assert!(h.p90(&k).unwrap() >= 94);
        let long = "x".repeat(1000);
        assert_eq!(OutputKey::new(TenantId::new("a"), &long).model.len(), 128);
    }
}
