//! [`Permit`]: a granted slot (tenant + pool) that returns itself on `Drop`.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::fair::FairQueue;
use crate::domain::Tokens;
use crate::scheduler::Slot;

/// A granted request's hold on the pool. Dropping it returns the slot (exactly once) and lets
/// the next request in; [`Permit::settle`] makes the release reconcile the tenant's credit.
pub struct Permit {
    queue: Arc<FairQueue>,
    slot: Slot,
    waited: Duration,
    granted_at: Instant,
    actual: Option<Tokens>,
    retries: u32,
}

impl Permit {
    pub(super) fn new(queue: Arc<FairQueue>, slot: Slot, waited: Duration) -> Self {
        Self {
            queue,
            slot,
            waited,
            granted_at: Instant::now(),
            actual: None,
            retries: 0,
        }
    }

    /// When the grant was made.
    pub fn granted_at(&self) -> Instant {
        self.granted_at
    }

    /// Time the request spent queued.
    pub fn waited(&self) -> Duration {
        self.waited
    }

    /// The cost charged at dispatch.
    pub fn charged(&self) -> Tokens {
        self.slot.cost
    }

    /// Charges the tenant's credit `extra` more while the request runs (a stream whose counted
    /// output passed what dispatch charged); the release reconciles against the raised charge.
    pub fn charge_running(&mut self, extra: Tokens) {
        if extra.0 == 0 {
            return;
        }
        self.queue.charge_running(self.slot, extra);
        self.slot.cost = Tokens(self.slot.cost.0.saturating_add(extra.0));
    }

    /// Records what the request cost for the release to reconcile credit with: the actual
    /// cost (`None`: unknown, the charge stands) and the upstream attempts beyond the first,
    /// each charged the cost charged at dispatch (a tenant's retry storm is paid by that
    /// tenant's share, not by everyone's).
    pub fn settle(&mut self, actual: Option<Tokens>, retries: u32) {
        self.actual = actual;
        self.retries = retries;
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        // Extra attempts are charged on top of the actual cost (or of the estimate, when the
        // actual is unknown).
        let extra = self.slot.cost.0.saturating_mul(u64::from(self.retries));
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
