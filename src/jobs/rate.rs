//! What the files and batches endpoints cost a tenant besides storage: every `/v1/files` and
//! `/v1/batches` call takes one request of the tenant's request bucket (`requests_per_minute`,
//! the one chat requests take too), through [`Requests`], which `server` implements over the
//! generation's rate store (this stage imports nothing of `ratelimit`); and every byte uploaded
//! or downloaded takes from the tenant's byte rate ([`ByteRate`], `[jobs]
//! transfer_bytes_per_second_per_tenant`), which paces the transfer.
//!
//! Invariants: a refused call (429 type `requests`, `x-fairgate-limit: tenant`, an honest
//! `Retry-After`) did nothing; a transfer is never cut for its rate, it waits: each chunk
//! takes its bytes before it is passed on, so all of a tenant's transfers together move at
//! most the rate after a burst of one second of it, and the wait is backpressure to the client
//! (TCP), not a buffer. The byte buckets are per replica. The clock is tokio's, so the tests
//! run on a paused clock.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::time::Instant;

use crate::domain::TenantId;

/// Takes one request of a tenant's request bucket (implemented by `server` over the rate
/// store in force).
pub trait Requests: Send + Sync {
    /// One request of `tenant`'s bucket, or how long until one is there (a tenant without a
    /// request limit is never refused).
    fn take<'a>(&'a self, tenant: &'a TenantId) -> BoxFuture<'a, Result<(), Duration>>;
}

/// Whether a call to `path` is charged one request (the files and batches APIs; an async
/// job's status is not: its answer is what the client waits for).
pub fn charged(path: &str) -> bool {
    let api = |p: &str| path == p || path.strip_prefix(p).is_some_and(|r| r.starts_with('/'));
    api("/v1/files") || api("/v1/batches")
}

/// Buckets above this many tenants drop the ones that refilled whole (a full bucket is the
/// same as none).
const PRUNE_ABOVE: usize = 4096;

/// Per-tenant byte buckets of `per_second` bytes a second, `per_second` deep; see the module
/// docs. `per_second` 0: no limit.
#[derive(Debug)]
pub struct ByteRate {
    per_second: u64,
    /// Per tenant: bytes left (negative: reserved ahead of the refill) at an instant.
    buckets: Mutex<HashMap<TenantId, (f64, Instant)>>,
}

impl ByteRate {
    /// A rate of `per_second` bytes a second per tenant (0: unlimited).
    pub fn new(per_second: u64) -> Self {
        Self {
            per_second,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Reserves `bytes` of `tenant`'s rate and returns how long to wait before moving them
    /// (zero while the bucket holds them).
    pub fn reserve(&self, tenant: &TenantId, bytes: u64) -> Duration {
        if self.per_second == 0 || bytes == 0 {
            return Duration::ZERO;
        }
        let (rate, now) = (self.per_second as f64, Instant::now());
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        if buckets.len() > PRUNE_ABOVE {
            buckets.retain(|_, (left, at)| {
                *left + now.duration_since(*at).as_secs_f64() * rate < rate
            });
        }
        let (left, at) = buckets.entry(tenant.clone()).or_insert((rate, now));
        let refilled = (*left + now.duration_since(*at).as_secs_f64() * rate).min(rate);
        *left = refilled - bytes as f64;
        *at = now;
        if *left >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-*left / rate)
        }
    }

    /// Waits until `tenant` may move `bytes` more.
    pub async fn pace(&self, tenant: &TenantId, bytes: u64) {
        let wait = self.reserve(tenant, bytes);
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_tenants_transfers_share_its_byte_rate_and_another_tenant_has_its_own() {
        let r = ByteRate::new(1000);
        let (a, b) = (TenantId::new("a"), TenantId::new("b"));
        let start = Instant::now();
        // One second of burst, then the rate: 3000 bytes in 250-byte chunks take 2 s.
        for _ in 0..12 {
            r.pace(&a, 250).await;
        }
        assert_eq!(start.elapsed(), Duration::from_secs(2));
        // b is not paced by a's transfers.
        let t = Instant::now();
        r.pace(&b, 1000).await;
        assert_eq!(t.elapsed(), Duration::ZERO);
        // Two transfers of a at once: each waits behind the other's reservation.
        assert_eq!(r.reserve(&a, 500), Duration::from_millis(500));
        assert_eq!(r.reserve(&a, 500), Duration::from_secs(1));
        // Idle, the bucket refills to one second's worth, no more.
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(r.reserve(&a, 500), Duration::ZERO);
        assert_eq!(r.reserve(&a, 1000), Duration::from_millis(500));
        assert_eq!(
            ByteRate::new(0).reserve(&a, u64::MAX),
            Duration::ZERO,
            "0: no limit"
        );
    }

    #[test]
    fn the_files_and_batches_calls_are_charged_and_a_jobs_status_is_not() {
        for p in [
            "/v1/files",
            "/v1/files/f1/content",
            "/v1/batches",
            "/v1/batches/b/cancel",
        ] {
            assert!(charged(p), "{p}");
        }
        for p in ["/v1/fairgate/jobs/j1", "/v1/filesx", "/v1/chat/completions"] {
            assert!(!charged(p), "{p}");
        }
    }
}
