//! A pool's effective capacity, learned from its endpoints' answers: the shell around the pure
//! [`Balancer`] (one [`Aimd`](super::aimd::Aimd) and health state per endpoint), applied to the
//! pool's [`FairQueue`] with `set_capacity`.
//!
//! - Every attempt takes a [`WireTicket`] for the endpoint [`PoolCapacity::pick`] chose (it
//!   waits, bounded, while every candidate is at its limit); the ticket lives until the answer
//!   is refused or its body ends, and dropping it takes the request off that endpoint's wire.
//! - Every answer is fed to its endpoint ([`PoolCapacity::observe`], classified by
//!   [`signals::classify`](super::signals::classify)): a 429/503 cuts *that endpoint's* limit to
//!   the requests sent to it before the refused one and still on its wire (a provider that caps
//!   concurrency at K accepted exactly those), a second one in the same round trip pauses it
//!   for the wait it named (`retry-after-ms`, `Retry-After`, else the nearest
//!   `x-ratelimit-reset-*`) — pausing on every probe's 429 would idle the endpoint for each
//!   one-request overshoot (measured: goodput 65% of capacity instead of ~90%); a success that
//!   says a budget is spent pauses it until the reset without lowering the limit; a limit that
//!   names the model pauses that model there only. Failures ([`PoolCapacity::fail`], connect,
//!   TLS, timeouts; 5xx answers) drive ejection.
//! - The queue's capacity is the sum of the usable endpoints' limits; while every endpoint is
//!   paused it is the recovery reservation only. One spawned timer at a time, set for the next
//!   pause end or probe, re-applies it — no polling.
//!
//! Invariants: effective capacity ≤ the pool's `max_concurrency`; outside a pause it is at least
//! `reserved_slots + 1`, so recovery keeps its reservation and ordinary traffic keeps a slot;
//! when the learned limit is below the configured size the batch class's share shrinks in
//! proportion (batch is slowed first). Lock order: this controller's mutex, then the queue's.
//! No lock is held across an `.await`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use http::{HeaderMap, StatusCode};

use super::endpoints::{health::Rules, Balancer, Load, NoPick, Signal, Spec, Ticket, View};
use crate::config::UpstreamConfig;
use crate::queue::FairQueue;

pub(crate) use super::signals::spent_until;
pub use super::signals::{parse_go_duration, upstream_wait};

/// The AIMD cooldown: about one round trip.
const COOLDOWN: Duration = Duration::from_millis(250);

struct State {
    balancer: Balancer,
    /// When the pending timer fires, if one is pending.
    timer_at: Option<Duration>,
    applied: u32,
    /// Slots only recovery requests may use (`[scheduler] reserved_slots`).
    reserved: u32,
}

/// One pool's learned capacity over its endpoints; see the module docs.
pub struct PoolCapacity {
    queue: Arc<FairQueue>,
    state: Mutex<State>,
    epoch: tokio::time::Instant,
    /// 429 answers seen from the pool's endpoints.
    overloads: AtomicU64,
    /// Woken when a request leaves an endpoint's wire or the capacity changes by itself.
    freed: tokio::sync::Notify,
    /// Cluster mode: told when a pick waits on an endpoint's leases (the lease gate listens).
    pub blocked: tokio::sync::Notify,
}

/// One request on an endpoint's wire, from pick until its answer is refused or its body ends
/// (attach it to the response body); dropping it takes it off the wire.
pub struct WireTicket {
    pool: Arc<PoolCapacity>,
    ticket: Option<Ticket>,
}

impl WireTicket {
    /// The endpoint it was sent to (index in the pool's list).
    pub fn endpoint(&self) -> usize {
        self.ticket.as_ref().map_or(0, |t| t.endpoint)
    }
}

impl std::fmt::Debug for WireTicket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WireTicket")
            .field("endpoint", &self.endpoint())
            .finish()
    }
}

impl Drop for WireTicket {
    fn drop(&mut self) {
        if let Some(t) = self.ticket.take() {
            self.pool.lock().balancer.release(t);
            self.pool.freed.notify_waiters();
        }
    }
}

/// A pick counted as waiting on endpoints' leases; uncounted on drop.
struct Waiting<'a> {
    pool: &'a PoolCapacity,
    mask: u64,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if self.mask != 0 {
            self.pool.lock().balancer.unwait(self.mask);
        }
    }
}

impl std::fmt::Debug for PoolCapacity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolCapacity")
            .field("limit", &self.limit())
            .field("configured", &self.configured())
            .finish()
    }
}

/// The ejection rules of `[upstreams.health]`.
pub fn rules(c: &crate::config::HealthConfig) -> Rules {
    Rules {
        consecutive_failures: c.consecutive_failures.max(1),
        error_rate: c.error_rate,
        error_window: c.error_window.clamp(1, 64),
        eject: Duration::from_millis(c.eject_ms),
        max_eject: Duration::from_millis(c.max_eject_ms.max(c.eject_ms)),
    }
}

/// The endpoints of `cfg` as the balancer sees them.
pub fn specs(cfg: &UpstreamConfig) -> Vec<Spec> {
    cfg.endpoints
        .iter()
        .map(|e| Spec {
            name: Arc::from(e.name.as_str()),
            max: u32::try_from(e.max_concurrency).unwrap_or(u32::MAX),
            priority: e.priority,
            weight: e.weight,
        })
        .collect()
}

impl PoolCapacity {
    /// A controller for `queue` over one endpoint of `max` slots, of which `reserved` are
    /// recovery's.
    pub fn new(queue: Arc<FairQueue>, max: u32, reserved: u32) -> Arc<Self> {
        let one = Spec {
            name: Arc::from("default"),
            max,
            priority: 0,
            weight: 1.0,
        };
        Self::with_endpoints(queue, vec![one], max, Rules::default(), reserved)
    }

    /// A controller for `queue` over the endpoints of `cfg`.
    pub fn for_upstream(queue: Arc<FairQueue>, cfg: &UpstreamConfig, reserved: u32) -> Arc<Self> {
        let max = u32::try_from(cfg.max_concurrency).unwrap_or(u32::MAX);
        let rules = rules(&cfg.health);
        Self::with_endpoints(queue, specs(cfg), max, rules, reserved)
    }

    fn with_endpoints(
        queue: Arc<FairQueue>,
        specs: Vec<Spec>,
        max: u32,
        rules: Rules,
        reserved: u32,
    ) -> Arc<Self> {
        let balancer = Balancer::new(specs, max, rules, COOLDOWN);
        let applied = balancer.capacity(Duration::ZERO);
        let this = Arc::new(Self {
            queue,
            state: Mutex::new(State {
                balancer,
                timer_at: None,
                applied: u32::MAX,
                reserved,
            }),
            epoch: tokio::time::Instant::now(),
            overloads: AtomicU64::new(0),
            freed: tokio::sync::Notify::new(),
            blocked: tokio::sync::Notify::new(),
        });
        {
            let mut st = this.lock();
            // The queue starts at its configured size; push only what differs.
            st.applied = if applied == max { max } else { u32::MAX };
            this.apply(&mut st, Duration::ZERO);
        }
        this
    }

    fn now(&self) -> Duration {
        self.epoch.elapsed()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Applies a reloaded upstream and `reserved_slots` in place: the same endpoints keep what
    /// they learned (clamped to their new sizes), and the queue's capacity is set again at once.
    /// In-flight requests keep their slots.
    pub fn reconfigure(self: &Arc<Self>, cfg: &UpstreamConfig, reserved: u32) {
        let max = u32::try_from(cfg.max_concurrency).unwrap_or(u32::MAX);
        let mut st = self.lock();
        st.balancer.reconfigure(specs(cfg), max, rules(&cfg.health));
        st.reserved = reserved;
        // Forces `apply` to push the capacity and batch share to the queue.
        st.applied = u32::MAX;
        let now = self.now();
        self.apply(&mut st, now);
    }

    /// The configured pool size (`max_concurrency`).
    pub fn configured(&self) -> u32 {
        self.lock().balancer.max()
    }

    /// The learned concurrency limit: the endpoints in service, summed.
    pub fn limit(&self) -> u32 {
        let now = self.now();
        self.lock().balancer.limit(now)
    }

    /// The capacity currently applied to the queue.
    pub fn effective(&self) -> u32 {
        self.lock().applied
    }

    /// Time left until an endpoint stops being paused, while every one is (zero otherwise).
    pub fn paused_for(&self) -> Duration {
        let now = self.now();
        self.lock().balancer.paused_for(now)
    }

    /// 429 answers the pool's endpoints have sent so far.
    pub fn throttled(&self) -> u64 {
        self.overloads.load(Ordering::Relaxed)
    }

    /// Every endpoint's state now.
    pub fn views(&self) -> Vec<View> {
        let now = self.now();
        self.lock().balancer.views(now)
    }

    /// How many endpoints the pool has.
    pub fn endpoints(&self) -> usize {
        self.lock().balancer.len()
    }

    /// The name of endpoint `i`.
    pub fn endpoint_name(&self, i: usize) -> Option<Arc<str>> {
        self.lock().balancer.name(i).cloned()
    }

    /// Picks the endpoint for one attempt for `model`, skipping those in `exclude` (bit i:
    /// endpoint i); while every candidate is at its limit, waits for one to free, at most
    /// `wait`. `Err(NoPick::None)`: nothing in service outside `exclude`; `Err(NoPick::Busy)`:
    /// still full after `wait`.
    pub async fn pick(
        self: &Arc<Self>,
        model: &str,
        exclude: u64,
        wait: Duration,
    ) -> Result<WireTicket, NoPick> {
        let until = tokio::time::Instant::now() + wait;
        // Cluster mode: what this pick waits on, counted until it returns (see `wait_on`).
        let mut waiting = Waiting {
            pool: self,
            mask: 0,
        };
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            let now = self.now();
            let picked = self.lock().balancer.pick(now, model, exclude);
            match picked {
                Ok(t) => {
                    return Ok(WireTicket {
                        pool: self.clone(),
                        ticket: Some(t),
                    })
                }
                Err(NoPick::None) => return Err(NoPick::None),
                Err(NoPick::Busy) if waiting.mask == 0 => {
                    let mask = self.lock().balancer.wait_on(now, model, exclude);
                    if mask != 0 {
                        waiting.mask = mask;
                        self.blocked.notify_one();
                    }
                }
                Err(NoPick::Busy) => {}
            }
            if tokio::time::timeout_at(until, freed).await.is_err() {
                return Err(NoPick::Busy);
            }
        }
    }

    /// A request endpoint `i` refused or failed goes on to another endpoint.
    pub fn count_failover(&self, i: usize) {
        self.lock().balancer.count_failover(i);
    }

    /// Whether an endpoint outside `exclude` is in service (somewhere to fail over to).
    pub fn has_other(&self, exclude: u64) -> bool {
        let now = self.now();
        self.lock()
            .balancer
            .views(now)
            .iter()
            .enumerate()
            .any(|(i, v)| (i >= 64 || exclude & (1 << i) == 0) && v.state != "ejected")
    }

    /// Cluster mode: whether a pick waits on an endpoint's leases.
    pub fn waiting(&self) -> bool {
        self.lock().balancer.waiting()
    }

    /// Cluster mode: every endpoint's load now (see `cluster::endpoints`).
    pub fn loads(&self) -> Vec<Load> {
        let now = self.now();
        self.lock().balancer.loads(now)
    }

    /// Cluster mode: the slots leased for endpoint `i` (`None`: no cluster limit); waiting
    /// picks look again.
    pub fn set_endpoint_slots(&self, i: usize, slots: Option<u32>) {
        self.lock().balancer.set_cluster_cap(i, slots);
        self.freed.notify_waiters();
    }

    /// Cluster mode, before leases of endpoint `i` are given back: see
    /// [`Balancer::keep_cluster`].
    pub fn keep_endpoint_slots(&self, i: usize, target: u32, held: u32, cap: u32) -> u32 {
        let keep = self.lock().balancer.keep_cluster(i, target, held, cap);
        self.freed.notify_waiters();
        keep
    }

    /// Cluster mode: another replica ejected endpoint `i` for `left` more; see
    /// [`Balancer::hold_out`].
    pub fn hold_out(self: &Arc<Self>, i: usize, left: Duration) {
        let now = self.now();
        let mut st = self.lock();
        st.balancer.hold_out(i, now, now + left);
        self.apply(&mut st, now);
    }

    /// Feeds one answer to the endpoint of `ticket`, for a request for `model` as sent.
    pub fn observe(
        self: &Arc<Self>,
        ticket: &WireTicket,
        status: StatusCode,
        headers: &HeaderMap,
        model: &str,
    ) {
        if status == StatusCode::TOO_MANY_REQUESTS {
            self.overloads.fetch_add(1, Ordering::Relaxed);
        }
        let signal = super::signals::classify(status, headers, model);
        self.feed(ticket, signal);
    }

    /// The endpoint of `ticket` failed the request (connect or TLS error, no head in time).
    pub fn fail(self: &Arc<Self>, ticket: &WireTicket) {
        self.feed(ticket, Signal::Failure);
    }

    fn feed(self: &Arc<Self>, ticket: &WireTicket, signal: Signal) {
        let Some(t) = &ticket.ticket else { return };
        let now = self.now();
        let mut st = self.lock();
        st.balancer.observe(t, now, signal);
        self.apply(&mut st, now);
    }

    fn apply(self: &Arc<Self>, st: &mut State, now: Duration) {
        if let Some(at) = st.balancer.next_change(now) {
            if st.timer_at.is_none_or(|t| at < t) {
                if let Ok(rt) = tokio::runtime::Handle::try_current() {
                    st.timer_at = Some(at);
                    let weak: Weak<Self> = Arc::downgrade(self);
                    let wait = at.saturating_sub(now);
                    rt.spawn(async move {
                        tokio::time::sleep(wait).await;
                        if let Some(this) = weak.upgrade() {
                            let mut st = this.lock();
                            if st.timer_at == Some(at) {
                                st.timer_at = None;
                            }
                            let now = this.now();
                            this.apply(&mut st, now);
                            drop(st);
                            this.freed.notify_waiters();
                        }
                    });
                }
            }
        }
        let b = &st.balancer;
        let usable = b.capacity(now);
        let cap = if usable == 0 {
            st.reserved
        } else {
            usable
                .max(st.reserved + 1)
                .min(b.max().max(st.reserved + 1))
        };
        if cap != st.applied {
            st.applied = cap;
            let share = f64::from(b.limit(now)) / f64::from(b.max().min(b.configured_sum()).max(1));
            self.queue.set_capacity(cap);
            self.queue.set_batch_share(share.min(1.0));
        }
    }
}

#[cfg(test)]
mod tests;
