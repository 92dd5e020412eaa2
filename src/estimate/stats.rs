//! Per-tenant estimate-error statistics: actual ÷ estimated cost of every reconciled request,
//! kept for metrics.
//!
//! Invariants: one short lock per reconciled request; memory is one small record per configured
//! tenant (ids come from the tenant directory, never from clients); a request whose estimate was
//! zero counts with ratio `actual` (as if estimated at one token).

use std::sync::Mutex;

use crate::domain::{TenantId, Tokens};

/// Upper bounds of the ratio histogram buckets (the last bucket is everything above).
pub const BUCKETS: [f64; 6] = [0.25, 0.5, 0.9, 1.1, 2.0, 4.0];

/// One tenant's estimate errors.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TenantStats {
    /// Reconciled requests.
    pub count: u64,
    /// Sum of actual ÷ estimated.
    pub ratio_sum: f64,
    /// Counts per bucket of [`BUCKETS`], plus one for ratios above the last bound.
    pub buckets: [u64; BUCKETS.len() + 1],
    /// Requests reconciled without provider `usage` (counted from the streamed text).
    pub without_usage: u64,
    /// Sum of estimated cost.
    pub estimated: u64,
    /// Sum of actual cost.
    pub actual: u64,
}

impl TenantStats {
    /// Mean actual ÷ estimated, if any request was reconciled.
    pub fn mean_ratio(&self) -> Option<f64> {
        (self.count > 0).then(|| self.ratio_sum / self.count as f64)
    }
}

/// Estimate-error statistics of every tenant.
#[derive(Debug, Default)]
pub struct Stats {
    tenants: Mutex<crate::domain::FastMap<TenantId, TenantStats>>,
}

impl Stats {
    /// Records one reconciled request.
    pub fn record(&self, tenant: &TenantId, estimated: Tokens, actual: Tokens, had_usage: bool) {
        let ratio = actual.0 as f64 / estimated.0.max(1) as f64;
        let bucket = BUCKETS
            .iter()
            .position(|&b| ratio <= b)
            .unwrap_or(BUCKETS.len());
        let mut map = self.tenants.lock().unwrap_or_else(|p| p.into_inner());
        let s = map.entry(tenant.clone()).or_default();
        s.count += 1;
        s.ratio_sum += ratio;
        s.buckets[bucket] += 1;
        s.without_usage += u64::from(!had_usage);
        s.estimated += estimated.0;
        s.actual += actual.0;
    }

    /// A copy of one tenant's statistics.
    pub fn tenant(&self, tenant: &TenantId) -> Option<TenantStats> {
        let map = self.tenants.lock().unwrap_or_else(|p| p.into_inner());
        map.get(tenant).cloned()
    }

    /// A copy of every tenant's statistics.
    pub fn snapshot(&self) -> Vec<(TenantId, TenantStats)> {
        let map = self.tenants.lock().unwrap_or_else(|p| p.into_inner());
        map.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_ratios_into_buckets() {
        let s = Stats::default();
        let a = TenantId::new("a");
        s.record(&a, Tokens(100), Tokens(100), true);
        s.record(&a, Tokens(100), Tokens(300), false);
        s.record(&a, Tokens(0), Tokens(10), true);
        let t = s.tenant(&a).unwrap();
        assert_eq!(t.count, 3);
        assert_eq!(t.buckets, [0, 0, 0, 1, 0, 1, 1]);
        assert_eq!(t.without_usage, 1);
        assert!((t.mean_ratio().unwrap() - (1.0 + 3.0 + 10.0) / 3.0).abs() < 1e-9);
        assert_eq!(s.snapshot().len(), 1);
    }
}
