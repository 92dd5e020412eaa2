//! [`Permit`]: a granted slot (tenant + pool) that returns itself on `Drop`.

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
}

impl Permit {
    pub(super) fn new(queue: Arc<FairQueue>, slot: Slot, waited: Duration) -> Self {
        Self {
            queue,
            slot,
            waited,
            granted_at: Instant::now(),
            actual: None,
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
        self.queue
            .release(self.slot, self.actual, self.granted_at.elapsed());
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
