//! [`EndpointGates`]: the endpoints of one pool shared by the replicas through Redis — their
//! capacity, their learned limits and their ejections — so that together the replicas never
//! push an endpoint past its limit, as [`LeaseGate`](super::LeaseGate) does for the pool.
//!
//! - **Capacity.** Each endpoint's slots are leases in a sorted set of its own, held in blocks
//!   exactly like the pool's ([`LEASE_SYNC`]: renewal, reclaim, the fair share between
//!   replicas while others wait, the shared learned limit). The pool gate drives these rounds
//!   with its own (same cadence, run concurrently), so an endpoint costs one more Redis call a
//!   round, none on the request path. This replica's picks obey min(learned limit, leases held)
//!   per endpoint (`Balancer::set_cluster_cap`), and the queue dispatches against at most the
//!   sum of the endpoints' leases (and the pool's).
//! - **What is asked for** ([`spread`]): the requests on each endpoint's wire and the picks
//!   waiting only for a lease there (a failover needs one on another endpoint; such a pick
//!   wakes the gate at once), then the rest of
//!   the replica's demand (queued + in flight, up to its local capacity) by priority level,
//!   within a level one slot at a time to the endpoint with the most room × weight — first
//!   within what the cluster has free there (its limit less what others hold), then within its
//!   local room alone, so a replica that finds a primary taken asks a backup first and still
//!   says it waits on the primary (where the fair share then applies).
//! - **Learned limits.** A cut of an endpoint's local limit (its 429s) publishes, as the pool's
//!   does, the cluster's leases of that endpoint scaled by the fraction of this replica's wire
//!   the provider accepted; grants there obey it (+1 a second, gone after 60 s without cuts).
//! - **Ejections.** An ejection by this replica is published ([`EJECT_SYNC`]: a key per
//!   endpoint whose TTL is the time left); every round reads them, and an endpoint another
//!   replica ejected is held out here until then (`Balancer::hold_out`: then due a probe, the
//!   pool's last endpoint in service never out).
//!
//! Invariants: the leases of an endpoint across replicas ≤ its limit (configured, else the
//! shared learned one), and a replica never has more requests on an endpoint's wire than its
//! leases there (a cap is never lowered below the wire, see `Balancer::keep_cluster`) — so,
//! with the same bounds on stalls and degraded mode as the pool's leases (see `lease`), three
//! replicas never send an endpoint more than its limit. Before the first round nothing is
//! picked. The gates follow the endpoint list of startup (as the pool gate follows its size): a
//! reload that changes the list (names, order) stops them, and the pool's leases alone bound
//! the pool from then on. A pool of one endpoint no smaller than the
//! pool has none: the pool's leases already bound it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::join_all;
use redis::Value;

use super::lease::parse;
use super::link::Link;
use super::scripts::{EJECT_SYNC, LEASE_SYNC};
use crate::config::{ClusterConfig, UpstreamConfig};
use crate::feedback::capacity::PoolCapacity;
use crate::feedback::endpoints::Load;
use crate::queue::FairQueue;

/// Most leases asked for or given back in one round, per endpoint.
const BATCH: usize = 256;
/// Abandoned lease ids remembered for release after an outage, per endpoint.
const MAX_ABANDONED: usize = 1024;

/// One endpoint's lease state (the pool gate's, per endpoint).
struct Gate {
    keys: [String; 4],
    held: Vec<u64>,
    abandoned: Vec<u64>,
    next_id: u64,
    share: u32,
    others: u32,
    /// The limit in force at the last round (shared learned limit, else configured).
    limit: u32,
    configured: u32,
    /// The cluster's leases of this endpoint at the last round.
    leases: u32,
    /// The local learned limit last seen (a drop is published).
    seen_learned: u32,
    /// This replica's ejections of it last seen (a new one is published).
    seen_ejections: u64,
    unmet: bool,
    /// Until when the held leases are certainly still this replica's.
    valid_until: Option<tokio::time::Instant>,
}

/// One round's call for one endpoint.
struct Plan {
    endpoint: usize,
    release: Vec<u64>,
    new: Vec<u64>,
    demand: u32,
    /// A learned limit to publish (0: none).
    publish: u32,
}

/// One pool's endpoint gates; see the module docs.
pub struct EndpointGates {
    link: Arc<Link>,
    queue: Arc<FairQueue>,
    capacity: Arc<PoolCapacity>,
    eject_keys: Vec<String>,
    /// The endpoints' names at startup, in order.
    names: Vec<String>,
    /// Set once a reload changed the pool's endpoint list: the gates stop bounding it.
    stale: AtomicBool,
    expected_replicas: u32,
    ttl: Duration,
    gates: Mutex<Vec<Gate>>,
}

impl std::fmt::Debug for EndpointGates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EndpointGates")
            .field("held", &self.held())
            .finish_non_exhaustive()
    }
}

impl EndpointGates {
    /// The gates of pool `cfg`'s endpoints (`None`: one endpoint no smaller than the pool).
    /// Nothing is picked before their first round.
    pub fn new(
        link: Arc<Link>,
        cfg: &UpstreamConfig,
        queue: Arc<FairQueue>,
        capacity: Arc<PoolCapacity>,
        cluster: &ClusterConfig,
    ) -> Option<Arc<Self>> {
        let single =
            cfg.endpoints.len() == 1 && cfg.endpoints[0].max_concurrency >= cfg.max_concurrency;
        if single || cfg.endpoints.is_empty() {
            return None;
        }
        let key = |ep: &str, k: &str| link.key(&["pool", &cfg.name, "ep", ep, k]);
        let gates = cfg
            .endpoints
            .iter()
            .map(|e| {
                let max = u32::try_from(e.max_concurrency).unwrap_or(u32::MAX);
                Gate {
                    keys: ["leases", "active", "waiting", "limit"].map(|k| key(&e.name, k)),
                    held: Vec::new(),
                    abandoned: Vec::new(),
                    next_id: 0,
                    share: 0,
                    others: 0,
                    limit: max,
                    configured: max,
                    leases: 0,
                    seen_learned: max,
                    seen_ejections: 0,
                    unmet: false,
                    valid_until: None,
                }
            })
            .collect::<Vec<_>>();
        for i in 0..gates.len() {
            capacity.set_endpoint_slots(i, Some(0));
        }
        Some(Arc::new(Self {
            eject_keys: cfg
                .endpoints
                .iter()
                .map(|e| key(&e.name, "ejected"))
                .collect(),
            names: cfg.endpoints.iter().map(|e| e.name.clone()).collect(),
            stale: AtomicBool::new(false),
            link,
            queue,
            capacity,
            expected_replicas: cluster.expected_replicas.max(1),
            ttl: Duration::from_millis(cluster.lease_ttl_ms),
            gates: Mutex::new(gates),
        }))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Gate>> {
        self.gates.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Leases held per endpoint.
    pub fn held(&self) -> Vec<usize> {
        self.lock().iter().map(|g| g.held.len()).collect()
    }

    /// The slots the queue may dispatch against: every endpoint's, summed (no bound once a
    /// reload changed the endpoint list).
    pub fn slots(&self) -> u32 {
        if self.stale.load(Ordering::Relaxed) {
            return u32::MAX;
        }
        self.lock()
            .iter()
            .map(|g| self.slots_of(g))
            .fold(0, u32::saturating_add)
    }

    /// Whether a round is due every contention tick (a grant fell short, or others wait).
    pub fn urgent(&self) -> bool {
        self.capacity.waiting() || self.lock().iter().any(|g| g.unmet || g.others > 0)
    }

    /// Told when a pick waits on an endpoint's leases.
    pub fn blocked(&self) -> &tokio::sync::Notify {
        &self.capacity.blocked
    }

    /// One endpoint's slots now: as the pool's (see `lease`).
    fn slots_of(&self, g: &Gate) -> u32 {
        let held = u32::try_from(g.held.len()).unwrap_or(u32::MAX);
        let valid = g
            .valid_until
            .is_some_and(|t| tokio::time::Instant::now() < t);
        if self.link.degraded() {
            return if valid {
                held
            } else {
                g.limit.max(1).div_ceil(self.expected_replicas)
            };
        }
        match (valid, g.others > 0) {
            (false, _) => 0,
            (true, true) => held.min(g.share.max(1)),
            (true, false) => held,
        }
    }

    /// One round for every endpoint; `renew_due` forces the calls. Returns whether a call
    /// was made and succeeded.
    pub async fn round(&self, renew_due: bool) -> bool {
        let loads = self.capacity.loads();
        let same = loads.len() == self.names.len()
            && (0..loads.len())
                .all(|i| self.capacity.endpoint_name(i).as_deref() == Some(self.names[i].as_str()));
        if !same {
            // A reload changed the list: the pool's leases alone bound it from now on (the
            // endpoint leases held expire within the TTL).
            self.stale.store(true, Ordering::Relaxed);
            return false;
        }
        let (queued, in_flight) = self.queue.load();
        let demand = u32::try_from(queued)
            .unwrap_or(u32::MAX)
            .saturating_add(in_flight)
            .min(self.queue.local_capacity());
        let (plans, ejects, invocations) = {
            let mut gates = self.lock();
            let (plans, ejects) = self.plan(&mut gates, &loads, demand, renew_due);
            let invocations: Vec<_> = plans
                .iter()
                .map(|p| self.invocation(&gates[p.endpoint], p))
                .collect();
            (plans, ejects, invocations)
        };
        if plans.is_empty() && ejects.iter().all(|&ms| ms == 0) && !renew_due {
            return false;
        }
        let mut eject = EJECT_SYNC.prepare_invoke();
        for (k, ms) in self.eject_keys.iter().zip(&ejects) {
            eject.key(k).arg(*ms);
        }
        let sent = tokio::time::Instant::now();
        let calls = join_all(invocations.iter().map(|inv| self.link.run::<Value>(inv)));
        let (answers, held_out) = tokio::join!(calls, self.link.run::<Vec<u64>>(&eject));
        let ok = answers.iter().all(Option::is_some) && held_out.is_some();
        {
            let mut gates = self.lock();
            for (p, answer) in plans.into_iter().zip(answers) {
                self.settle(&mut gates[p.endpoint], p, answer.as_ref(), sent);
            }
            for (i, g) in gates.iter().enumerate() {
                self.capacity.set_endpoint_slots(i, Some(self.slots_of(g)));
            }
        }
        for (i, ms) in held_out.unwrap_or_default().into_iter().enumerate() {
            if ms > 0 {
                self.capacity.hold_out(i, Duration::from_millis(ms));
            }
        }
        ok
    }

    /// What each endpoint's call asks (and the cap lowered before leases go back); the
    /// ejections to publish.
    fn plan(
        &self,
        gates: &mut [Gate],
        loads: &[Load],
        demand: u32,
        renew_due: bool,
    ) -> (Vec<Plan>, Vec<u64>) {
        let degraded = self.link.degraded();
        let free: Vec<u32> = gates
            .iter()
            .map(|g| {
                let theirs = g
                    .leases
                    .saturating_sub(u32::try_from(g.held.len()).unwrap_or(0));
                g.limit.saturating_sub(theirs)
            })
            .collect();
        let wants = spread(loads, &free, demand);
        let mut plans = Vec::new();
        let mut ejects = vec![0; gates.len()];
        for (i, (g, l)) in gates.iter_mut().zip(loads).enumerate() {
            if l.ejections > g.seen_ejections {
                ejects[i] = l.out_for.map_or(0, |d| d.as_millis().max(1) as u64);
            }
            g.seen_ejections = l.ejections;
            let by_share = if g.others > 0 {
                g.share.max(1)
            } else {
                u32::MAX
            };
            let target = wants[i].min(by_share);
            let held = u32::try_from(g.held.len()).unwrap_or(u32::MAX);
            let keep = if degraded {
                g.held.len()
            } else {
                let valid = g
                    .valid_until
                    .is_some_and(|t| tokio::time::Instant::now() < t);
                let cap = if valid { by_share } else { 0 };
                self.capacity.keep_endpoint_slots(i, target, held, cap) as usize
            };
            let release: Vec<u64> = g
                .held
                .split_off(keep)
                .into_iter()
                .chain(std::mem::take(&mut g.abandoned))
                .take(BATCH * 4)
                .collect();
            let want = (target as usize).saturating_sub(g.held.len()).min(BATCH);
            let new: Vec<u64> = (0..want as u64).map(|k| g.next_id + k).collect();
            g.next_id += want as u64;
            let mut publish = 0;
            if l.learned < g.seen_learned && g.leases > 0 {
                // As the pool's: the cluster's leases here × the fraction of this replica's
                // wire the provider accepted.
                let out = l.in_flight.max(l.learned).max(1);
                let scaled = u64::from(g.leases) * u64::from(l.learned) / u64::from(out);
                publish = u32::try_from(scaled).unwrap_or(u32::MAX).max(1);
            }
            g.seen_learned = l.learned;
            if release.is_empty() && new.is_empty() && publish == 0 && !renew_due {
                continue;
            }
            plans.push(Plan {
                endpoint: i,
                release,
                new,
                demand: wants[i],
                publish,
            });
        }
        (plans, ejects)
    }

    fn invocation(&self, g: &Gate, p: &Plan) -> redis::ScriptInvocation<'static> {
        let mut inv = LEASE_SYNC.prepare_invoke();
        for k in &g.keys {
            inv.key(k);
        }
        inv.arg(&self.link.replica)
            .arg(u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX))
            .arg(g.configured)
            .arg(p.demand)
            .arg(p.publish);
        for ids in [&p.release, &g.held, &p.new] {
            inv.arg(ids.len());
            for id in ids {
                inv.arg(*id);
            }
        }
        inv
    }

    fn settle(&self, g: &mut Gate, p: Plan, answer: Option<&Value>, sent: tokio::time::Instant) {
        match answer.and_then(parse) {
            Some(a) => {
                g.held.retain(|id| !a.lost.contains(id));
                g.held.extend(a.granted.iter().copied());
                g.unmet = g.held.len() < p.demand as usize && a.granted.len() < p.new.len();
                g.share = a.share;
                g.others = a.others;
                g.limit = a.limit;
                g.leases = a.leases;
                g.valid_until = Some(sent + self.ttl);
            }
            None => {
                g.abandoned.extend(p.release);
                g.abandoned.extend(p.new);
                let excess = g.abandoned.len().saturating_sub(MAX_ABANDONED);
                g.abandoned.drain(..excess);
                g.unmet = false;
            }
        }
    }
}

/// The slots this replica asks for on each endpoint (see the module docs): what is on each
/// wire and the picks waiting for a slot there, then the rest of `demand` by priority level, one slot at a time to the endpoint of
/// the level with the most spare × weight — spare first within `free` (the cluster's free
/// slots there), then within the endpoint's local room alone.
pub fn spread(loads: &[Load], free: &[u32], demand: u32) -> Vec<u32> {
    let mut want: Vec<u32> = loads
        .iter()
        .map(|l| l.in_flight.saturating_add(l.waiting))
        .collect();
    let mut left = demand.saturating_sub(want.iter().fold(0, |a, &b| a.saturating_add(b)));
    let mut levels: Vec<u32> = loads.iter().map(|l| l.priority).collect();
    levels.sort_unstable();
    levels.dedup();
    for within_free in [true, false] {
        for &level in &levels {
            while left > 0 {
                let best = loads
                    .iter()
                    .enumerate()
                    .filter(|(_, l)| l.priority == level)
                    .filter_map(|(i, l)| {
                        let cap = if within_free {
                            l.room.min(free.get(i).copied().unwrap_or(0))
                        } else {
                            l.room
                        };
                        let spare = cap.saturating_sub(want[i]);
                        (spare > 0).then(|| (i, f64::from(spare) * l.weight))
                    })
                    .max_by(|a, b| a.1.total_cmp(&b.1).then(b.0.cmp(&a.0)));
                let Some((i, _)) = best else { break };
                want[i] += 1;
                left -= 1;
            }
        }
    }
    want
}

#[cfg(test)]
mod tests;
