//! [`FairQueue`]: one pool's scheduler behind a mutex, with waiters woken by oneshot grants.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::permit::Permit;
use crate::domain::{TenantId, Tokens, Weight};
use crate::estimate::{CostInputs, Estimator};
use crate::scheduler::{self, Class, QueueFull, Scheduler, Slot, Ticket};

/// Pool-level settings of a fair queue.
#[derive(Clone, Debug)]
pub struct QueueSettings {
    /// The scheduler's configuration (policy, quantum, capacity, caps, classes).
    pub scheduler: scheduler::Config,
    /// Prices requests at dispatch (weights, learned output estimates); shared by all pools.
    pub estimator: Arc<Estimator>,
}

/// Per-tenant settings of a fair queue.
pub type TenantSettings = scheduler::TenantSpec;

/// Why a request could not be queued or granted.
#[derive(Clone, Debug, thiserror::Error)]
pub enum QueueError {
    /// The tenant's own queue is full.
    #[error("too many queued requests for this tenant; retry after {}s", retry_after.as_secs())]
    TenantFull {
        /// Estimated time until a queue slot frees.
        retry_after: Duration,
    },
    /// The pool's queue is full.
    #[error("the upstream pool's queue is full; retry after {}s", retry_after.as_secs())]
    PoolFull {
        /// Estimated time until a queue slot frees.
        retry_after: Duration,
    },
    /// The tenant is not configured on this pool (config changed underneath).
    #[error("tenant is not configured")]
    UnknownTenant,
    /// The tenant's request bytes in this pool are at `max_queued_bytes`.
    #[error("too many queued request bytes for this tenant; retry after {}s", retry_after.as_secs())]
    TenantBytes {
        /// Estimated time until the pool has served what it holds.
        retry_after: Duration,
    },
    /// The pool's request bytes are at `[scheduler] max_queued_bytes`.
    #[error("the upstream pool holds too many request bytes; retry after {}s", retry_after.as_secs())]
    PoolBytes {
        /// Estimated time until the pool has served what it holds.
        retry_after: Duration,
    },
    /// The request's deadline passed while queued; it was removed before dispatch.
    #[error("the request waited its whole deadline ({} ms) in the queue and was not sent upstream", budget.as_millis())]
    DeadlineExceeded {
        /// The budget.
        budget: Duration,
    },
}

pub(super) struct Waiter {
    pub tx: oneshot::Sender<Permit>,
    pub cost: CostInputs,
}

pub(super) struct Inner {
    pub sched: Scheduler<Waiter>,
    estimator: Arc<Estimator>,
    /// Exponentially weighted mean time a permit is held, seconds.
    service_s: f64,
    /// The configured class weights (batch is scaled down from these when degraded).
    class_weights: (Weight, Weight),
    /// The capacity set by `set_capacity` (configured, or learned from the upstream).
    local_capacity: u32,
    /// Cluster mode: slots this replica holds leases for (the scheduler gets the minimum).
    cluster_slots: Option<u32>,
    /// Cluster mode: wakes the lease gate on demand changes, and counts served tokens.
    hook: Option<ClusterHook>,
}

/// What cluster mode attaches to a queue (see `cluster`): off in a single process.
struct ClusterHook {
    demand: Arc<tokio::sync::Notify>,
    /// Tokens served (reconciled) per tenant key since the last `take_served`.
    served: Vec<u64>,
}

/// What a wait prediction needs from a pool, read under one lock (see `admission::deadline`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WaitInputs {
    /// Requests queued in the pool.
    pub queued: usize,
    /// Requests in flight in the pool.
    pub in_flight: u32,
    /// The pool's effective capacity.
    pub capacity: u32,
    /// Requests this tenant has queued.
    pub tenant_queued: usize,
    /// Tenants with queued requests (including this one if it has any).
    pub backlogged_tenants: usize,
    /// Recent mean time a permit is held.
    pub service_time: Duration,
}

/// One pool's fair queue. Cheap to share (`Arc`).
pub struct FairQueue {
    pub(super) inner: Mutex<Inner>,
    epoch: Instant,
    bytes: Arc<super::bytes::ByteBudget>,
}

impl FairQueue {
    /// A queue for one pool with these tenants.
    pub fn new(settings: QueueSettings, tenants: &[(TenantId, TenantSettings)]) -> Arc<Self> {
        let class_weights = settings.scheduler.class_weights;
        let local_capacity = settings.scheduler.capacity;
        let mut sched = Scheduler::new(settings.scheduler);
        for (id, spec) in tenants {
            sched.upsert_tenant(id.clone(), spec.clone());
        }
        Arc::new(Self {
            inner: Mutex::new(Inner {
                sched,
                estimator: settings.estimator,
                service_s: 1.0,
                class_weights,
                local_capacity,
                cluster_slots: None,
                hook: None,
            }),
            epoch: Instant::now(),
            bytes: super::bytes::ByteBudget::new(u64::MAX),
        })
    }

    pub(super) fn now(&self) -> Duration {
        self.epoch.elapsed()
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave the scheduler half-updated in a way that
        // matters more than refusing all traffic would, so keep serving.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues a request and waits for its grant. Dropping the future while queued removes the
    /// request without charge.
    pub async fn acquire(
        self: &Arc<Self>,
        tenant: &TenantId,
        class: Class,
        recovery: bool,
        cost: CostInputs,
    ) -> Result<Permit, QueueError> {
        let (tx, rx) = oneshot::channel();
        let (ticket, failed) = {
            let mut inner = self.lock();
            let key = inner
                .sched
                .tenant_key(tenant)
                .ok_or(QueueError::UnknownTenant)?;
            let ticket = inner
                .sched
                .enqueue(self.now(), key, class, recovery, Waiter { tx, cost })
                .map_err(|full| inner.full_error(full))?;
            if let Some(h) = &inner.hook {
                h.demand.notify_one();
            }
            (ticket, self.pump(&mut inner))
        };
        drop(failed);
        let mut guard = CancelOnDrop {
            queue: self,
            ticket: Some(ticket),
        };
        let permit = rx
            .await
            .expect("a waiter's sender lives until it is granted or cancelled");
        guard.ticket = None;
        Ok(permit)
    }

    /// Dispatches while the pool has room. Returns permits whose waiter was gone, to be dropped
    /// by the caller after unlocking.
    pub(super) fn pump(self: &Arc<Self>, inner: &mut Inner) -> Vec<Permit> {
        let mut failed = Vec::new();
        let now = self.now();
        let estimator = inner.estimator.clone();
        while let Some(g) = inner
            .sched
            .dispatch(now, &mut |w: &Waiter| cost_now(&w.cost, &estimator))
        {
            let permit = Permit::new(self.clone(), g.slot, g.waited);
            if let Err(permit) = g.item.tx.send(permit) {
                failed.push(permit);
            }
        }
        failed
    }

    /// Charges a running slot's tenant `extra` in the slot's lane (from `Permit`, a stream
    /// metered as it runs).
    pub(super) fn charge_running(&self, slot: Slot, extra: Tokens) {
        let mut inner = self.lock();
        let zero = Slot {
            cost: Tokens(0),
            ..slot
        };
        inner.sched.reconcile(zero, extra);
    }

    /// Returns a slot (from `Permit::drop`) and dispatches what it makes room for.
    pub(super) fn release(self: &Arc<Self>, slot: Slot, actual: Option<Tokens>, held: Duration) {
        let failed = {
            let mut inner = self.lock();
            if let Some(actual) = actual {
                inner.sched.reconcile(slot, actual);
            }
            inner.sched.complete(slot);
            if let Some(h) = &mut inner.hook {
                if let Some(s) = h.served.get_mut(slot.tenant.idx()) {
                    *s = s.saturating_add(actual.unwrap_or(slot.cost).0);
                }
                h.demand.notify_one();
            }
            inner.service_s = 0.9 * inner.service_s + 0.1 * held.as_secs_f64();
            self.pump(&mut inner)
        };
        drop(failed);
    }

    /// Sets the pool's effective capacity (learned from upstream overload answers). In cluster
    /// mode the scheduler gets the minimum of this and the slots leased (`set_cluster_slots`).
    pub fn set_capacity(self: &Arc<Self>, capacity: u32) {
        let failed = {
            let mut inner = self.lock();
            inner.local_capacity = capacity;
            inner.apply_capacity();
            self.pump(&mut inner)
        };
        drop(failed);
    }

    /// Applies a reloaded configuration in place: the pool settings (quantum, queue caps,
    /// reservation, classes; not the policy, not the effective capacity, see
    /// [`Scheduler::reconfigure`]) and every listed tenant's spec (added if new). Tenants not
    /// listed keep their spec: their queued and in-flight requests drain as usual (the proxy
    /// refuses their keys before anything reaches the queue). Dispatches what the new settings
    /// make room for.
    /// The pool's byte budget (`[scheduler] max_queued_bytes`, see `queue::bytes`).
    pub fn bytes(&self) -> &Arc<super::bytes::ByteBudget> {
        &self.bytes
    }

    /// The time this pool needs to serve `requests` at its recent service time (≥ 1 s): the
    /// honest Retry-After of a refusal for what the pool holds.
    pub fn drain_time(&self, requests: usize) -> Duration {
        let inner = self.lock();
        super::bytes::drain(requests, inner.service_s, inner.sched.config().capacity)
    }

    pub fn reconfigure(
        self: &Arc<Self>,
        scheduler: scheduler::Config,
        tenants: &[(TenantId, TenantSettings)],
    ) {
        let failed = {
            let mut inner = self.lock();
            inner.class_weights = scheduler.class_weights;
            inner.sched.reconfigure(scheduler);
            for (id, spec) in tenants {
                inner.sched.upsert_tenant(id.clone(), spec.clone());
            }
            // Cluster mode: count the service of tenants added by the reload too.
            let known = inner.sched.snapshot().len();
            if let Some(h) = &mut inner.hook {
                h.served.resize(known, 0);
            }
            self.pump(&mut inner)
        };
        drop(failed);
    }

    /// The capacity last set by `set_capacity` (before any cluster lease limit).
    pub fn local_capacity(&self) -> u32 {
        self.lock().local_capacity
    }

    /// Cluster mode: the slots this replica holds leases for (`None`: no cluster limit).
    pub fn set_cluster_slots(self: &Arc<Self>, slots: Option<u32>) {
        let failed = {
            let mut inner = self.lock();
            if inner.cluster_slots == slots {
                return;
            }
            inner.cluster_slots = slots;
            inner.apply_capacity();
            self.pump(&mut inner)
        };
        drop(failed);
    }

    /// Cluster mode: before giving leases back, atomically lowers the cluster slots to
    /// `min(max(target, in flight), held)` (never below what is in flight, so no request
    /// dispatched meanwhile runs on a lease being released), capped at `cap` for dispatch.
    /// Returns the number of leases to keep.
    pub fn keep_cluster_slots(self: &Arc<Self>, target: u32, held: u32, cap: u32) -> u32 {
        let (keep, failed) = {
            let mut inner = self.lock();
            let keep = target.max(inner.sched.in_flight()).min(held);
            inner.cluster_slots = Some(keep.min(cap));
            inner.apply_capacity();
            (keep, self.pump(&mut inner))
        };
        drop(failed);
        keep
    }

    /// Cluster mode: `demand` is notified whenever a request is queued or a permit returns, and
    /// served tokens are counted per tenant (see [`FairQueue::take_served`]).
    pub fn attach_cluster(&self, demand: Arc<tokio::sync::Notify>) {
        let mut inner = self.lock();
        let tenants = inner.sched.snapshot().len();
        inner.hook = Some(ClusterHook {
            demand,
            served: vec![0; tenants],
        });
    }

    /// Cluster mode: tokens served per tenant (reconciled, else as charged) since the last call,
    /// with the tenant's weight; tenants with nothing served are left out.
    pub fn take_served(&self) -> Vec<(TenantId, Weight, u64)> {
        let mut inner = self.lock();
        let Inner { sched, hook, .. } = &mut *inner;
        let Some(h) = hook else {
            return Vec::new();
        };
        let snapshot = sched.snapshot();
        h.served
            .iter_mut()
            .zip(snapshot)
            .filter(|(s, _)| **s > 0)
            .map(|(s, t)| (t.id, t.weight, std::mem::take(s)))
            .collect()
    }

    /// Cluster mode: charges `tenant` for the weighted service (tokens ÷ weight) it received
    /// on other replicas, back in tokens at its weight here now (so a weight changed by a
    /// reload or an API tenant's `PATCH` counts from the generation that applied it), as debt
    /// to its DRR credit — only while it has work here (an idle tenant returns as usual, with
    /// at most zero credit). Returns the tokens charged, if any.
    pub fn charge_remote(&self, tenant: &TenantId, service: f64) -> Option<Tokens> {
        let mut inner = self.lock();
        let key = inner.sched.tenant_key(tenant)?;
        let (queued, in_flight) = inner.sched.tenant_load(key);
        if queued == 0 && in_flight == 0 {
            return None;
        }
        let tokens = Tokens((service * inner.sched.weight(key).get()).round() as u64);
        inner.sched.charge(key, tokens);
        Some(tokens)
    }

    /// Scales the batch class's share by `fraction` (0–1] of its configured weight: batch is
    /// slowed first when the learned capacity is below the configured one.
    pub fn set_batch_share(&self, fraction: f64) {
        let mut inner = self.lock();
        let (interactive, batch) = inner.class_weights;
        let scaled = Weight::new(batch.get() * fraction.clamp(0.05, 1.0)).unwrap_or(batch);
        inner.sched.set_class_weights((interactive, scaled));
    }

    /// The inputs of a queue-wait prediction for `tenant`.
    pub fn wait_inputs(&self, tenant: &TenantId) -> Option<WaitInputs> {
        let inner = self.lock();
        let key = inner.sched.tenant_key(tenant)?;
        Some(WaitInputs {
            queued: inner.sched.queued(),
            in_flight: inner.sched.in_flight(),
            capacity: inner.sched.config().capacity,
            tenant_queued: inner.sched.tenant_load(key).0,
            backlogged_tenants: inner.sched.backlogged_tenants(),
            service_time: Duration::from_secs_f64(inner.service_s),
        })
    }

    /// Every tenant's state in this pool, with the age of its oldest queued request.
    pub fn snapshot(&self) -> Vec<(scheduler::TenantSnapshot, Option<Duration>)> {
        let now = self.now();
        let inner = self.lock();
        inner
            .sched
            .snapshot()
            .into_iter()
            .map(|t| {
                let age = t.oldest_enqueued_at.map(|at| now.saturating_sub(at));
                (t, age)
            })
            .collect()
    }

    /// (queued, in flight) in the pool.
    pub fn load(&self) -> (usize, u32) {
        let inner = self.lock();
        (inner.sched.queued(), inner.sched.in_flight())
    }

    /// A tenant's DRR credit in the interactive lane (negative: debt), for introspection.
    pub fn credit(&self, tenant: &TenantId) -> Option<i64> {
        let inner = self.lock();
        let key = inner.sched.tenant_key(tenant)?;
        Some(inner.sched.credit(key, scheduler::Lane::Interactive))
    }

    /// (queued, in flight) of one tenant in this pool.
    pub fn tenant_load(&self, tenant: &TenantId) -> Option<(usize, u32)> {
        let inner = self.lock();
        let key = inner.sched.tenant_key(tenant)?;
        Some(inner.sched.tenant_load(key))
    }
}

impl std::fmt::Debug for FairQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (queued, in_flight) = self.load();
        f.debug_struct("FairQueue")
            .field("queued", &queued)
            .field("in_flight", &in_flight)
            .finish()
    }
}

impl Inner {
    fn apply_capacity(&mut self) {
        let cap = self
            .local_capacity
            .min(self.cluster_slots.unwrap_or(u32::MAX));
        self.sched.set_capacity(cap);
    }

    /// A queue-full error with an honest Retry-After: the time the pool needs to serve what is
    /// queued ahead at its recent rate (queued × mean service time / capacity), at least 1 s.
    fn full_error(&self, full: QueueFull) -> QueueError {
        let retry_after = super::bytes::drain(
            self.sched.queued(),
            self.service_s,
            self.sched.config().capacity,
        );
        match full {
            QueueFull::Tenant => QueueError::TenantFull { retry_after },
            QueueFull::Pool => QueueError::PoolFull { retry_after },
        }
    }
}

/// The cost charged at dispatch: input + the output estimate of the moment, weighted. Takes the
/// estimator's history lock (a leaf lock) under the queue's lock; never the other way round.
fn cost_now(c: &CostInputs, estimator: &Estimator) -> Tokens {
    estimator.cost(c)
}

/// Removes a still-queued request when its waiter goes away.
struct CancelOnDrop<'a> {
    queue: &'a Arc<FairQueue>,
    ticket: Option<Ticket>,
}

impl Drop for CancelOnDrop<'_> {
    fn drop(&mut self) {
        if let Some(ticket) = self.ticket.take() {
            // If it was already granted, the permit sits in the dropped channel and releases
            // itself; `cancel` then finds nothing.
            let item = self.queue.lock().sched.cancel(ticket);
            drop(item);
        }
    }
}
