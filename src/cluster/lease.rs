//! [`LeaseGate`]: one pool's share of the cluster-wide capacity, held as leases in Redis.
//!
//! The pool's slots (`max_concurrency`, or the lower learned limit shared by the replicas) are
//! members of one Redis sorted set, `replica:lease-id` scored by expiry. A replica leases slots
//! *in blocks*, not per request: its gate keeps the number of leases it holds at its demand
//! (queued + in flight, capped by its local learned capacity) and sets its [`FairQueue`]'s
//! cluster slots to that number, so the queue dispatches against min(local capacity, leased
//! slots) with no Redis call on the request path. One script call ([`LEASE_SYNC`]) per gate
//! round does everything at once: drop expired leases, release idle ones, renew all held ones,
//! grant new ones. Rounds run when demand changes (coalesced: at most one call in flight per
//! pool), every third of the lease TTL to renew, and every 10 ms while the replica has queued
//! work or waits for slots or knows others wait (so a replica holding more than its share hears
//! of waiters within 10 ms, not at its next renewal). Why blocks: a request then costs at most
//! the one round trip that leases a slot for it when the replica held none spare (zero when it
//! did), a burst of k arrivals costs one round trip, not k, and renewal is one call per tick
//! however many streams run — instead of ≥ 3 calls (acquire, renew…, release) per request.
//!
//! Invariants:
//! - Leased slots across replicas ≤ the pool limit (the grant checks the set's size after
//!   dropping expired members), so with every replica dispatching only against its leases the
//!   upstream never sees more than `max_concurrency` in flight — except after a stall longer
//!   than the TTL (a replica whose leases expired under running streams learns it at the next
//!   renewal, stops dispatching, and the overshoot is bounded by what it had in flight).
//! - A release removes only this replica's own members; a lease that expired and was reclaimed
//!   cannot be released twice (the count is the set's size, never a counter).
//! - Fair between replicas: while others wait, a grant stops at ⌊limit / active replicas⌋ and a
//!   replica above that share gives back slots as its requests complete (up to active − 1
//!   slots may idle while every replica is contended).
//! - A dead replica's slots come back within the TTL; a stopping one releases what it holds.
//! - Failing calls (Redis slow or away, not yet degraded, see `link`): the replica keeps
//!   dispatching on the leases it holds while they are certainly still its own — until the
//!   last successful round's send time + TTL — and leases nothing new; past that it dispatches
//!   nothing new until a round succeeds or degraded mode starts.
//! - Degraded (failures lasted `degrade_after_ms`): the local allowance *starts from the leases
//!   this replica held*: until they expire (last successful round + TTL) it dispatches against
//!   exactly those — slots nobody else can lease, so no overshoot at all — and only after that
//!   on ⌈limit / expected_replicas⌉ slots. Overshoot bound: zero while leases are valid; after,
//!   at most ⌈limit / expected_replicas⌉ per replica that cannot reach Redis while others can
//!   (those others lease the expired slots again), and with every replica cut off the total is
//!   N·⌈limit / N⌉ < limit + N for N = expected_replicas replicas. On recovery the held leases
//!   are renewed if Redis still has them (else reported lost), ids a failed round may have been
//!   granted are released, and new leases cover the in-flight requests first, so nothing is
//!   counted twice.
//! - Learned limit: when this replica's learned limit (`PoolCapacity`, from upstream 429s) is
//!   cut, it publishes the cluster's leased count scaled by the fraction of its own in-flight
//!   requests the provider accepted (the cut's value, counted on its own wire) as the pool's
//!   shared limit; grants use it plus 1 per second since it was published (the cluster's
//!   additive increase: an estimate too low is probed back up, the next 429 republishes; the
//!   latest estimate wins; without fresh cuts it is back at the configured size within 60 s).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::Value;
use tokio::sync::{watch, Notify};

use super::endpoints::EndpointGates;
use super::link::Link;
use super::scripts::LEASE_SYNC;
use crate::feedback::capacity::PoolCapacity;
use crate::queue::FairQueue;

/// Round cadence while this or another replica waits for slots.
const CONTENTION_TICK: Duration = Duration::from_millis(10);
/// Most leases asked for or given back in one round.
const BATCH: usize = 256;
/// Abandoned lease ids remembered for release after an outage.
const MAX_ABANDONED: usize = 4096;

#[derive(Default)]
struct State {
    held: Vec<u64>,
    abandoned: Vec<u64>,
    next_id: u64,
    share: u32,
    others: u32,
    /// The limit in force at the last round (shared learned limit, else configured).
    limit: u32,
    /// The cluster's leased count at the last round.
    pool_leases: u32,
    /// The local learned limit last seen (a drop is published).
    seen_local_limit: u32,
    unmet: bool,
    /// Until when the held leases are certainly still this replica's (send time of the last
    /// successful round + TTL); `None` before the first one.
    valid_until: Option<tokio::time::Instant>,
}

/// One pool's lease gate; see the module docs.
pub struct LeaseGate {
    link: Arc<Link>,
    queue: Arc<FairQueue>,
    capacity: Arc<PoolCapacity>,
    keys: [String; 4],
    configured: u32,
    expected_replicas: u32,
    ttl: Duration,
    /// Woken by the queue when demand changes.
    pub demand: Arc<Notify>,
    /// The pool's endpoints' leases, driven by this gate's rounds (see `endpoints`).
    endpoints: Option<Arc<EndpointGates>>,
    state: Mutex<State>,
}

impl std::fmt::Debug for LeaseGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseGate")
            .field("pool", &self.keys[0])
            .field("held", &self.held())
            .finish_non_exhaustive()
    }
}

impl LeaseGate {
    /// A gate for pool `name` of `configured` slots; attaches itself to `queue`.
    pub fn new(
        link: Arc<Link>,
        name: &str,
        queue: Arc<FairQueue>,
        capacity: Arc<PoolCapacity>,
        configured: u32,
        cfg: &crate::config::ClusterConfig,
        endpoints: Option<Arc<EndpointGates>>,
    ) -> Arc<Self> {
        let key = |k: &str| link.key(&["pool", name, k]);
        let keys = [key("leases"), key("active"), key("waiting"), key("limit")];
        let demand = Arc::new(Notify::new());
        queue.attach_cluster(demand.clone());
        let gate = Arc::new(Self {
            keys,
            queue,
            capacity,
            configured,
            expected_replicas: cfg.expected_replicas.max(1),
            ttl: Duration::from_millis(cfg.lease_ttl_ms),
            demand,
            endpoints,
            state: Mutex::new(State {
                limit: configured,
                seen_local_limit: configured,
                ..State::default()
            }),
            link,
        });
        // Nothing is dispatched before the first round has leased slots.
        gate.queue.set_cluster_slots(Some(0));
        gate
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Leases this replica holds now.
    pub fn held(&self) -> usize {
        self.lock().held.len()
    }

    /// The local allowance while Redis is unreachable, once the held leases have expired.
    pub fn allowance(&self) -> u32 {
        let limit = self.lock().limit.max(1);
        limit.div_ceil(self.expected_replicas)
    }

    /// The slots to dispatch against now (see the module docs): the held leases (capped at the
    /// fair share while others wait) while they are certainly valid; past that, nothing new —
    /// or in degraded mode the allowance.
    fn slots(&self, st: &State) -> u32 {
        self.pool_slots(st).min(self.endpoint_slots())
    }

    /// The endpoints' leased slots, summed (no limit without endpoint gates).
    fn endpoint_slots(&self) -> u32 {
        self.endpoints.as_ref().map_or(u32::MAX, |e| e.slots())
    }

    /// [`LeaseGate::slots`] by the pool's leases alone.
    fn pool_slots(&self, st: &State) -> u32 {
        let held = u32::try_from(st.held.len()).unwrap_or(u32::MAX);
        let valid = st
            .valid_until
            .is_some_and(|t| tokio::time::Instant::now() < t);
        if self.link.degraded() {
            return if valid {
                held
            } else {
                st.limit.max(1).div_ceil(self.expected_replicas)
            };
        }
        if !valid {
            return 0;
        }
        let by_share = if st.others > 0 {
            st.share.max(1)
        } else {
            u32::MAX
        };
        held.min(by_share)
    }

    /// Runs rounds until `stop`, then (once nothing is in flight) releases every lease.
    pub async fn run(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let renew = self.ttl / 3;
        let mut last = tokio::time::Instant::now();
        let mut stopping = false;
        loop {
            // A replica with queued work may hold more than its share while others wait: it
            // must hear of them within one contention tick, not at its next renewal.
            let saturated = self.queue.load().0 > 0;
            let urgent = {
                let st = self.lock();
                st.unmet || st.others > 0 || saturated || self.link.degraded()
            } || self.endpoints.as_ref().is_some_and(|e| e.urgent());
            let wait = if urgent {
                CONTENTION_TICK
            } else {
                renew.saturating_sub(last.elapsed())
            };
            let blocked = async {
                match &self.endpoints {
                    Some(e) => e.blocked().notified().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = self.demand.notified() => {}
                _ = blocked => {}
                _ = tokio::time::sleep(wait) => {}
                r = stop.wait_for(|s| *s), if !stopping => {
                    stopping = true;
                    let _ = r;
                }
            }
            let (queued, in_flight) = self.queue.load();
            if stopping && queued == 0 && in_flight == 0 {
                self.rounds(true).await;
                return;
            }
            let due = last.elapsed() >= renew || (urgent && last.elapsed() >= CONTENTION_TICK);
            if self.rounds(due).await {
                last = tokio::time::Instant::now();
            }
        }
    }

    /// The pool's round and its endpoints' (concurrently), then the queue's slots from both.
    async fn rounds(&self, renew_due: bool) -> bool {
        let Some(endpoints) = &self.endpoints else {
            return self.round(renew_due).await;
        };
        let (pool, _) = tokio::join!(self.round(renew_due), endpoints.round(renew_due));
        self.apply(&self.lock());
        pool
    }

    /// One round; `renew_due` forces a call. Returns whether a call succeeded.
    async fn round(&self, renew_due: bool) -> bool {
        let (queued, in_flight) = self.queue.load();
        let degraded = self.link.degraded();
        if degraded {
            // Still degraded: held leases until they expire, then the allowance, while probing
            // (a success renews and leases).
            let slots = self.slots(&self.lock());
            self.queue.set_cluster_slots(Some(slots));
        }
        let local_cap = self.queue.local_capacity();
        let local_limit = self.capacity.limit();
        let demand = u32::try_from(queued)
            .unwrap_or(u32::MAX)
            .saturating_add(in_flight)
            .min(local_cap);
        let plan = {
            let mut st = self.lock();
            let mut publish = 0;
            if local_limit < st.seen_local_limit && st.pool_leases > 0 {
                // The local cut counts this replica's own wire only: the provider accepted
                // `local_limit` of the `in_flight` requests it had out (see `PoolCapacity`), so
                // the cluster's leased count scaled by that fraction estimates the provider's
                // capacity. (Scaling by the local limit's drop instead — from the configured
                // size — published about what one replica had on the wire: 2 for K = 4.)
                let out = in_flight.max(local_limit).max(1);
                let scaled = u64::from(st.pool_leases) * u64::from(local_limit) / u64::from(out);
                publish = u32::try_from(scaled).unwrap_or(u32::MAX).max(1);
            }
            st.seen_local_limit = local_limit;
            let by_share = if st.others > 0 {
                st.share.max(1)
            } else {
                u32::MAX
            };
            let target = demand.min(by_share);
            let held = u32::try_from(st.held.len()).unwrap_or(u32::MAX);
            let keep = if degraded {
                // Running on held leases or the allowance: nothing is given back (the leases
                // are renewed if Redis answers again).
                st.held.len()
            } else {
                // Leases that may have expired meanwhile (calls failing) dispatch nothing new.
                let valid = st
                    .valid_until
                    .is_some_and(|t| tokio::time::Instant::now() < t);
                let cap = if valid { by_share } else { 0 };
                let cap = cap.min(self.endpoint_slots());
                self.queue.keep_cluster_slots(target, held, cap) as usize
            };
            let target = target as usize;
            let release: Vec<u64> = st.held.split_off(keep);
            let release: Vec<u64> = release
                .into_iter()
                .chain(std::mem::take(&mut st.abandoned))
                .take(BATCH * 4)
                .collect();
            let want = target.saturating_sub(st.held.len()).min(BATCH);
            let new: Vec<u64> = (0..want as u64).map(|i| st.next_id + i).collect();
            st.next_id += want as u64;
            if release.is_empty() && want == 0 && publish == 0 && !renew_due {
                self.apply(&st);
                return false;
            }
            (release, st.held.clone(), new, demand, publish)
        };
        let (release, renew, new, demand, publish) = plan;
        let mut inv = LEASE_SYNC.prepare_invoke();
        for k in &self.keys {
            inv.key(k);
        }
        inv.arg(&self.link.replica)
            .arg(u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX))
            .arg(self.configured)
            .arg(demand)
            .arg(publish);
        for ids in [&release, &renew, &new] {
            inv.arg(ids.len());
            for id in ids.iter() {
                inv.arg(*id);
            }
        }
        let sent = tokio::time::Instant::now();
        let answer: Option<Value> = self.link.run(&inv).await;
        let mut st = self.lock();
        let parsed = answer.as_ref().and_then(parse);
        match parsed {
            Some(a) => {
                st.held.retain(|id| !a.lost.contains(id));
                st.held.extend(a.granted.iter().copied());
                st.unmet = st.held.len() < demand as usize && a.granted.len() < new.len();
                st.share = a.share;
                st.others = a.others;
                st.limit = a.limit;
                st.pool_leases = a.leases;
                st.valid_until = Some(sent + self.ttl);
                if !a.lost.is_empty() {
                    tracing::warn!(
                        pool = %self.keys[0],
                        lost = a.lost.len(),
                        "cluster: leases expired before renewal"
                    );
                }
                self.apply(&st);
                true
            }
            None => {
                // Failed (maybe executed): keep the held leases (renewed by the next successful
                // round if still there); ids given back or asked for are released then.
                st.abandoned.extend(release);
                st.abandoned.extend(new);
                let excess = st.abandoned.len().saturating_sub(MAX_ABANDONED);
                st.abandoned.drain(..excess);
                st.unmet = false;
                let slots = self.slots(&st);
                drop(st);
                self.queue.set_cluster_slots(Some(slots));
                false
            }
        }
    }

    fn apply(&self, st: &State) {
        self.queue.set_cluster_slots(Some(self.slots(st)));
    }
}

/// One [`LEASE_SYNC`] answer.
pub(super) struct Answer {
    pub(super) granted: Vec<u64>,
    pub(super) lost: Vec<u64>,
    pub(super) share: u32,
    pub(super) others: u32,
    pub(super) limit: u32,
    pub(super) leases: u32,
}

pub(super) fn parse(v: &Value) -> Option<Answer> {
    let Value::Array(items) = v else {
        return None;
    };
    let ids = |v: &Value| -> Option<Vec<u64>> {
        match v {
            Value::Array(xs) => xs
                .iter()
                .map(|x| redis::from_redis_value_ref(x).ok())
                .collect(),
            _ => None,
        }
    };
    let num = |v: &Value| -> Option<u32> {
        redis::from_redis_value_ref::<i64>(v)
            .ok()
            .map(|n| u32::try_from(n.max(0)).unwrap_or(u32::MAX))
    };
    Some(Answer {
        granted: ids(items.first()?)?,
        lost: ids(items.get(1)?)?,
        share: num(items.get(2)?)?,
        others: num(items.get(3)?)?,
        limit: num(items.get(4)?)?,
        leases: num(items.get(5)?)?,
    })
}
