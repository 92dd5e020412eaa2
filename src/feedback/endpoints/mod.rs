//! The endpoints below one pool's fair queue: which endpoint a dispatched request goes to, what
//! each endpoint's answers teach it, and the pool capacity that follows. Pure: no I/O, no
//! clock (time is an argument), no locks; `feedback::capacity` is the shell that drives it.
//!
//! - **Capacity.** The pool's capacity is the sum over its usable endpoints (not ejected, not
//!   paused) of their learned limits ([`Aimd`] each; an endpoint due a probe counts 1), capped
//!   at the pool's `max_concurrency`. Backups count too: they take the overflow.
//! - **Choice** ([`Balancer::pick`]): among the endpoints not excluded (already tried by this
//!   request) and free for the request's model (not paused, in flight below its limit), the
//!   lowest `priority` level that has one; in it an endpoint due a probe first (one request
//!   brings it back), else the most free learned capacity × `weight`, then the fewest in
//!   flight. So a backup takes work only while no endpoint of a lower level can. With none
//!   free but one full: [`NoPick::Busy`] (wait for a release). With every candidate paused and
//!   none full: the one whose pause ends first (the request was dispatched: it is sent, as a
//!   single pool's would be).
//! - **Learning** ([`Balancer::observe`]): an endpoint's 429/503 cut *its* limit to the
//!   requests sent to it before the refused one and still on its wire, and a second one in
//!   the same round trip pauses it for the wait it named; a refusal or a spent budget that
//!   names the request's model (`x-ratelimit-remaining-*-MODEL: 0`) pauses that endpoint for
//!   that model only; successes raise the limit. Failures drive [`health`].
//!
//! Invariants: an endpoint never has more requests in flight than its limit at the moment each
//! was picked (a probe: one); an ejected endpoint whose probe is not due gets nothing; the pool's
//! last endpoint in service is never ejected; model pauses per endpoint are bounded
//! ([`MAX_MODEL_PAUSES`], beyond it the endpoint pauses whole). In cluster mode ([`shared`]) the
//! limit a pick obeys is also capped at the slots this replica leased for that endpoint, and an
//! ejection another replica saw holds the endpoint out here too.

pub mod health;
mod shared;
#[cfg(test)]
mod tests;

pub use shared::Load;

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use super::aimd::Aimd;
use health::{Health, Rules};

/// Model pauses one endpoint holds at most.
pub const MAX_MODEL_PAUSES: usize = 256;

/// One endpoint as configured.
#[derive(Clone, Debug, PartialEq)]
pub struct Spec {
    /// Its name.
    pub name: Arc<str>,
    /// `max_concurrency`.
    pub max: u32,
    /// 0 primary, higher: backup levels.
    pub priority: u32,
    /// Share of free capacity (> 0).
    pub weight: f64,
}

/// What one answer (or failure) of an endpoint says.
#[derive(Clone, Debug, PartialEq)]
pub enum Signal {
    /// 2xx; `spent`: the provider said a budget is spent until then (pause, no cut).
    Success {
        /// Until the reset of a spent budget.
        spent: Option<Duration>,
    },
    /// Any other answer that is not a failure (a 4xx): alive, nothing learned.
    Alive,
    /// 429 or 503: overloaded; `failed`: also a health failure (a 503 naming no wait).
    Overload {
        /// The wait the provider asked for.
        wait: Option<Duration>,
        /// Counts as a failure too.
        failed: bool,
    },
    /// The provider's limit of one model refused or is spent: that model pauses here.
    ModelLimited {
        /// The model, as in the request.
        model: Box<str>,
        /// For how long.
        wait: Duration,
    },
    /// Connect or TLS error, no head in time, 5xx.
    Failure,
}

/// Why no endpoint was picked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoPick {
    /// Every candidate is at its limit: wait for a release.
    Busy,
    /// No endpoint outside the excluded ones is in service.
    None,
}

/// A request on an endpoint's wire, from pick until [`Balancer::release`].
#[derive(Debug, PartialEq, Eq)]
pub struct Ticket {
    /// The endpoint (index in the pool's list).
    pub endpoint: usize,
    seq: u64,
    generation: u64,
}

#[derive(Clone, Debug)]
struct Endpoint {
    spec: Spec,
    aimd: Aimd,
    in_flight: u32,
    wire: BTreeSet<u64>,
    health: Health,
    models: HashMap<Box<str>, Duration>,
    throttled: u64,
    failovers: u64,
    /// Cluster mode: the slots this replica holds leases for here (`None`: no cluster).
    cluster_cap: Option<u32>,
    /// Cluster mode: picks waiting that only its cap keeps from it (see `shared`).
    waiting: u32,
}

impl Endpoint {
    fn new(spec: Spec, cooldown: Duration) -> Self {
        Self {
            aimd: Aimd::new(spec.max).with_cooldown(cooldown),
            spec,
            in_flight: 0,
            wire: BTreeSet::new(),
            health: Health::default(),
            models: HashMap::new(),
            throttled: 0,
            failovers: 0,
            cluster_cap: None,
            waiting: 0,
        }
    }

    /// Not ejected (or due a probe).
    fn in_service(&self, now: Duration) -> bool {
        !self.health.out(now)
    }

    /// The limit picks obey now.
    fn limit(&self, now: Duration) -> u32 {
        if self.health.probing(now) {
            1
        } else {
            self.aimd.limit()
        }
    }

    /// When a pause for `model` (endpoint-wide or that model's) ends; zero: none.
    fn paused_until(&self, model: &str, now: Duration) -> Duration {
        let own = self.models.get(model).copied().unwrap_or_default();
        let until = self.aimd.paused_until().max(own);
        if until > now {
            until
        } else {
            Duration::ZERO
        }
    }
}

/// One endpoint's state as the console and metrics show it.
#[derive(Clone, Debug, PartialEq)]
pub struct View {
    /// Its name.
    pub name: Arc<str>,
    /// `in_service`, `paused`, `probing` or `ejected`.
    pub state: &'static str,
    /// Requests on its wire.
    pub in_flight: u32,
    /// Learned limit.
    pub limit: u32,
    /// Configured `max_concurrency`.
    pub max: u32,
    /// Priority level.
    pub priority: u32,
    /// Ejections so far.
    pub ejections: u64,
    /// Overload answers (429/503) so far.
    pub throttled: u64,
    /// Requests it refused or failed that were sent on to another endpoint.
    pub failovers: u64,
    /// Time left in its pause (zero: none).
    pub paused_for: Duration,
}

/// The endpoints of one pool; see the module docs.
#[derive(Clone, Debug)]
pub struct Balancer {
    endpoints: Vec<Endpoint>,
    rules: Rules,
    max: u32,
    next: u64,
    generation: u64,
    cooldown: Duration,
}

impl Balancer {
    /// A pool of `specs` (at least one) capped at `max` concurrent requests.
    pub fn new(specs: Vec<Spec>, max: u32, rules: Rules, cooldown: Duration) -> Self {
        let endpoints = specs
            .into_iter()
            .map(|s| Endpoint::new(s, cooldown))
            .collect();
        Self {
            endpoints,
            rules,
            max: max.max(1),
            next: 0,
            generation: 0,
            cooldown,
        }
    }

    /// Applies a reloaded configuration: the same endpoints (names, in order) keep what they
    /// learned and their requests in flight, resized in place; otherwise the list starts anew
    /// (tickets of the old list are ignored when they come back).
    pub fn reconfigure(&mut self, specs: Vec<Spec>, max: u32, rules: Rules) {
        self.max = max.max(1);
        self.rules = rules;
        let same = specs.len() == self.endpoints.len()
            && specs
                .iter()
                .zip(&self.endpoints)
                .all(|(s, e)| s.name == e.spec.name);
        if same {
            for (s, e) in specs.into_iter().zip(&mut self.endpoints) {
                e.aimd.set_max(s.max);
                e.spec = s;
            }
        } else {
            self.generation += 1;
            self.endpoints = specs
                .into_iter()
                .map(|s| Endpoint::new(s, self.cooldown))
                .collect();
        }
    }

    /// Endpoints in the pool.
    pub fn len(&self) -> usize {
        self.endpoints.len()
    }

    /// Whether the pool has no endpoint (never, once built from a valid config).
    pub fn is_empty(&self) -> bool {
        self.endpoints.is_empty()
    }

    /// The pool's `max_concurrency`.
    pub fn max(&self) -> u32 {
        self.max
    }

    /// The sum of the endpoints' configured sizes.
    pub fn configured_sum(&self) -> u32 {
        self.endpoints
            .iter()
            .map(|e| e.spec.max)
            .fold(0, u32::saturating_add)
    }

    /// The learned limits of the endpoints in service, summed (capped at `max`).
    pub fn limit(&self, now: Duration) -> u32 {
        self.endpoints
            .iter()
            .filter(|e| e.in_service(now))
            .map(|e| e.limit(now))
            .fold(0, u32::saturating_add)
            .min(self.max)
    }

    /// What the fair queue may dispatch at `now`: the limits of the endpoints in service and
    /// not paused, summed (capped at `max`). Zero: every endpoint is paused or out.
    pub fn capacity(&self, now: Duration) -> u32 {
        self.endpoints
            .iter()
            .filter(|e| e.in_service(now) && !e.aimd.paused(now))
            .map(|e| e.limit(now))
            .fold(0, u32::saturating_add)
            .min(self.max)
    }

    /// Time until an endpoint in service stops being paused, when every one is (zero: one is
    /// not paused).
    pub fn paused_for(&self, now: Duration) -> Duration {
        self.endpoints
            .iter()
            .filter(|e| e.in_service(now))
            .map(|e| e.aimd.paused_until().saturating_sub(now))
            .min()
            .unwrap_or_default()
    }

    /// The next moment a pause ends or a probe falls due after `now` (when the capacity
    /// changes by itself).
    pub fn next_change(&self, now: Duration) -> Option<Duration> {
        self.endpoints
            .iter()
            .flat_map(|e| [Some(e.aimd.paused_until()), e.health.until()])
            .flatten()
            .filter(|&t| t > now)
            .min()
    }

    /// Picks the endpoint for a request for `model` at `now`, skipping the endpoints whose bit
    /// is set in `exclude`; see the module docs.
    pub fn pick(&mut self, now: Duration, model: &str, exclude: u64) -> Result<Ticket, NoPick> {
        let mut best: Option<(usize, (u32, bool, f64, f64))> = None;
        let mut paused: Option<(usize, Duration)> = None;
        let mut busy = false;
        for (i, e) in self.endpoints.iter().enumerate() {
            if (i < 64 && exclude & (1 << i) != 0) || !e.in_service(now) {
                continue;
            }
            // In cluster mode also within the leases held for it (see `shared`).
            let limit = e.limit(now).min(e.cluster_cap.unwrap_or(u32::MAX));
            let free = limit.saturating_sub(e.in_flight);
            let until = e.paused_until(model, now);
            if free == 0 {
                // Full (paused or not): a slot frees when one of its requests ends.
                busy = true;
                continue;
            }
            if !until.is_zero() {
                if paused.is_none_or(|(_, u)| until < u) {
                    paused = Some((i, until));
                }
                continue;
            }
            let w = e.spec.weight;
            // Smaller is better: priority, then a due probe, then free × weight (negated),
            // then in flight / weight.
            let key = (
                e.spec.priority,
                !e.health.probing(now),
                -(f64::from(free) * w),
                f64::from(e.in_flight) / w,
            );
            if best.as_ref().is_none_or(|(_, b)| key < *b) {
                best = Some((i, key));
            }
        }
        let chosen = match (best, busy, paused) {
            (Some((i, _)), _, _) => i,
            (None, true, _) => return Err(NoPick::Busy),
            (None, false, Some((i, _))) => i,
            (None, false, None) => return Err(NoPick::None),
        };
        let seq = self.next;
        self.next += 1;
        let e = &mut self.endpoints[chosen];
        e.in_flight += 1;
        e.wire.insert(seq);
        Ok(Ticket {
            endpoint: chosen,
            seq,
            generation: self.generation,
        })
    }

    fn of(&mut self, t: &Ticket) -> Option<&mut Endpoint> {
        (t.generation == self.generation)
            .then(|| self.endpoints.get_mut(t.endpoint))
            .flatten()
    }

    /// The request of `ticket` left its endpoint's wire (answered and done, refused, failed or
    /// cancelled).
    pub fn release(&mut self, ticket: Ticket) {
        if let Some(e) = self.of(&ticket) {
            if e.wire.remove(&ticket.seq) {
                e.in_flight = e.in_flight.saturating_sub(1);
            }
        }
    }

    /// Feeds what the endpoint of `ticket` answered at `now` (see the module docs).
    pub fn observe(&mut self, ticket: &Ticket, now: Duration, signal: Signal) {
        let rules = self.rules;
        let others_in_service = self
            .endpoints
            .iter()
            .enumerate()
            .any(|(i, e)| i != ticket.endpoint && e.in_service(now));
        let Some(e) = self.of(ticket) else {
            return;
        };
        match signal {
            Signal::Success { spent } => {
                e.aimd.on_success();
                if let Some(reset) = spent {
                    e.aimd.pause(now, reset);
                }
                e.health.on_success(now, &rules);
            }
            Signal::Alive => e.health.on_success(now, &rules),
            Signal::Overload { wait, failed } => {
                e.throttled += 1;
                // Those ahead were accepted, this one refused: the wall is at ahead + 1.
                let ahead = u32::try_from(e.wire.range(..ticket.seq).count()).unwrap_or(u32::MAX);
                let before = e.aimd.limit();
                e.aimd.on_overload_at(now, None, Some(ahead + 1));
                if let Some(w) = wait.filter(|_| e.aimd.limit() == before) {
                    e.aimd.pause(now, w);
                }
                if failed {
                    e.health.on_failure(now, &rules, others_in_service);
                } else {
                    e.health.on_success(now, &rules);
                }
            }
            Signal::ModelLimited { model, wait } => {
                e.throttled += 1;
                if e.models.len() >= MAX_MODEL_PAUSES {
                    e.models.retain(|_, until| *until > now);
                }
                if e.models.len() >= MAX_MODEL_PAUSES {
                    e.aimd.pause(now, wait);
                } else {
                    let until = e.models.entry(model).or_default();
                    *until = (*until).max(now + wait);
                }
                e.health.on_success(now, &rules);
            }
            Signal::Failure => {
                e.health.on_failure(now, &rules, others_in_service);
            }
        }
    }

    /// Every endpoint's state at `now`, in config order.
    pub fn views(&self, now: Duration) -> Vec<View> {
        self.endpoints
            .iter()
            .map(|e| View {
                name: e.spec.name.clone(),
                state: if e.health.out(now) {
                    "ejected"
                } else if e.health.probing(now) {
                    "probing"
                } else if e.aimd.paused(now) {
                    "paused"
                } else {
                    "in_service"
                },
                in_flight: e.in_flight,
                limit: e.limit(now),
                max: e.spec.max,
                priority: e.spec.priority,
                ejections: e.health.ejections(),
                throttled: e.throttled,
                failovers: e.failovers,
                paused_for: e.aimd.paused_until().saturating_sub(now),
            })
            .collect()
    }

    /// A request endpoint `i` refused or failed goes on to another endpoint.
    pub fn count_failover(&mut self, i: usize) {
        if let Some(e) = self.endpoints.get_mut(i) {
            e.failovers += 1;
        }
    }

    /// The name of endpoint `i`.
    pub fn name(&self, i: usize) -> Option<&Arc<str>> {
        self.endpoints.get(i).map(|e| &e.spec.name)
    }
}
