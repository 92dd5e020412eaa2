//! [`Permit`]: a granted slot (tenant + pool) that returns itself on `Drop`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::fair::FairQueue;
use crate::domain::Tokens;
use crate::scheduler::Slot;

/// A granted request's hold on the pool. Dropping it returns the slot (exactly once) and lets
/// the next request in; `set_actual` makes the release reconcile the tenant's credit.
pub struct Permit {
    queue: Arc<FairQueue>,
    slot: Slot,
    waited: Duration,
    granted_at: Instant,
    actual: Option<Tokens>,
    extra: Arc<AtomicU64>,
}

/// A handle, carried in request extensions, through which later stages add to what a granted
/// request costs its tenant — e.g. one more upstream attempt after a retryable failure, so a
/// tenant's retry storm is paid by that tenant's share, not by everyone's.
#[derive(Clone, Debug)]
pub struct Surcharge {
    cost: Tokens,
    extra: Arc<AtomicU64>,
}

impl Surcharge {
    /// Charges one more attempt at the cost charged at dispatch.
    pub fn charge_attempt(&self) {
        self.extra.fetch_add(self.cost.0, Ordering::Relaxed);
    }
}

impl Permit {
    pub(super) fn new(queue: Arc<FairQueue>, slot: Slot, waited: Duration) -> Self {
        Self {
            queue,
            slot,
            waited,
            granted_at: Instant::now(),
            actual: None,
            extra: Arc::default(),
        }
    }

    /// The surcharge handle of this grant (see [`Surcharge`]).
    pub fn surcharge(&self) -> Surcharge {
        Surcharge {
            cost: self.slot.cost,
            extra: self.extra.clone(),
        }
    }

    /// Time the request spent queued.
    pub fn waited(&self) -> Duration {
        self.waited
    }

    /// The cost charged at dispatch.
    pub fn charged(&self) -> Tokens {
        self.slot.cost
    }

    /// Records the actual cost; the release reconciles credit with it.
    pub fn set_actual(&mut self, actual: Tokens) {
        self.actual = Some(actual);
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        // Extra attempts are charged on top of the actual cost (or of the estimate, when the
        // actual is unknown).
        let extra = self.extra.load(Ordering::Relaxed);
        let actual = match (self.actual, extra) {
            (a, 0) => a,
            (a, x) => Some(Tokens(a.unwrap_or(self.slot.cost).0.saturating_add(x))),
        };
        self.queue
            .release(self.slot, actual, self.granted_at.elapsed());
    }
}

impl std::fmt::Debug for Permit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Permit")
            .field("slot", &self.slot)
            .field("waited", &self.waited)
            .finish()
    }
}
