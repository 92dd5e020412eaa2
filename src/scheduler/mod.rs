//! The fair queue's pure core: per-tenant virtual queues served by weighted deficit round robin
//! metered in tokens, with per-tenant and pool concurrency caps, priority lanes and bounded queues.
//!
//! Pure and deterministic: no tokio, no clock reads (`now` is an argument, a `Duration` since an
//! epoch the caller picks), no I/O, no locks. The proxy (`queue`) and the simulator (`sim`) drive
//! this very code.
//!
//! Invariants kept here, each checked by the tests in `tests.rs` and its `tests/props.rs` (proptest):
//! - Capacity: pool in-flight ≤ capacity; non-recovery in-flight ≤ capacity − reserved; tenant
//!   in-flight ≤ its `max_concurrency`. Recovery may always hold up to `reserved_slots`: when
//!   `set_capacity` lowers the capacity below what is in flight (a 429 storm, an upstream pause),
//!   ordinary dispatch waits for the excess to drain but the reservation does not.
//!   (With a constant capacity the two rules never conflict.)
//! - Work conservation: `dispatch` returns `None` only when the pool is full or no tenant under
//!   its cap has queued work that the reservation lets through.
//! - Bounded queues: per tenant (`max_queued`) and per pool (`max_queued`).
//! - Cost is evaluated when a request is dispatched (the `cost` callback), never frozen at enqueue.
//! - Cancelling a queued request charges nothing; a completed request returns its slot once.
//!
//! The DRR rules (quantum, cut-ins for tenants that are not backlogged, credit bound, debt) live
//! in `drr/`.

mod arena;
mod drr;
mod fifo;
mod lane;
mod list;
mod prefetch;
#[cfg(test)]
mod tests;

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use crate::domain::{TenantId, Tokens, Weight};

pub use arena::Ticket;
use arena::{Arena, Entry};
use lane::Discipline;

pub use crate::domain::Class;
pub use crate::domain::Policy;

/// The internal lane a queued request sits in: the two classes plus recovery traffic, which has
/// strict priority and may use the reserved slots.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Lane {
    /// Keys marked `recovery`: strict priority, may use `reserved_slots`.
    Recovery,
    /// Interactive class.
    Interactive,
    /// Batch class.
    Batch,
}

impl Lane {
    fn index(self) -> usize {
        match self {
            Lane::Recovery => 0,
            Lane::Interactive => 1,
            Lane::Batch => 2,
        }
    }
}

/// Pool-level settings.
#[derive(Clone, Debug)]
pub struct Config {
    /// Queue discipline.
    pub policy: Policy,
    /// Tokens a weight-1 tenant earns per DRR visit.
    pub quantum: Tokens,
    /// Pool size (may later be lowered by the learned upstream limit, see `set_capacity`).
    pub capacity: u32,
    /// Slots only recovery requests may use.
    pub reserved_slots: u32,
    /// Queued requests across the pool.
    pub max_queued: usize,
    /// Share weights of the interactive and batch classes.
    pub class_weights: (Weight, Weight),
    /// A batch request queued longer than this moves to the interactive class.
    pub batch_max_wait: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            policy: Policy::Drr,
            quantum: Tokens(4096),
            capacity: 64,
            reserved_slots: 0,
            max_queued: 10_000,
            class_weights: (Weight::new(8.0).unwrap_or(Weight::ONE), Weight::ONE),
            batch_max_wait: Duration::from_secs(30),
        }
    }
}

/// Per-tenant settings.
#[derive(Clone, Debug)]
pub struct TenantSpec {
    /// Share weight: quantum_i = quantum × weight_i.
    pub weight: Weight,
    /// Cap on this tenant's in-flight requests in the pool.
    pub max_concurrency: Option<u32>,
    /// Cap on this tenant's queued requests.
    pub max_queued: usize,
}

impl Default for TenantSpec {
    fn default() -> Self {
        Self {
            weight: Weight::ONE,
            max_concurrency: None,
            max_queued: 1000,
        }
    }
}

/// Dense index of a tenant inside one scheduler.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TenantKey(pub(crate) u32);

impl TenantKey {
    pub(crate) fn idx(self) -> usize {
        self.0 as usize
    }
}

/// Why a request was not queued.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QueueFull {
    /// The tenant already has `max_queued` requests waiting.
    #[error("tenant queue is full")]
    Tenant,
    /// The pool already has `max_queued` requests waiting.
    #[error("pool queue is full")]
    Pool,
}

/// What a grant occupies; hand it back to [`Scheduler::complete`] exactly once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    /// Whose slot it is.
    pub tenant: TenantKey,
    /// The lane it was dispatched from (credit adjustments go there).
    pub lane: Lane,
    /// The cost charged at dispatch.
    pub cost: Tokens,
}

/// A dispatched request.
#[derive(Debug)]
pub struct Grant<T> {
    /// The ticket it was queued under.
    pub ticket: Ticket,
    /// The occupied slot.
    pub slot: Slot,
    /// Time spent queued.
    pub waited: Duration,
    /// The caller's payload.
    pub item: T,
}

/// One tenant's state, read for metrics and the admin API ([`Scheduler::snapshot`]).
#[derive(Clone, Debug, PartialEq)]
pub struct TenantSnapshot {
    /// The tenant.
    pub id: TenantId,
    /// Its share weight.
    pub weight: Weight,
    /// Requests queued.
    pub queued: usize,
    /// Requests in flight.
    pub in_flight: u32,
    /// Credit summed over its lanes (negative: debt).
    pub credit: i64,
    /// When its oldest queued request was enqueued (scheduler time).
    pub oldest_enqueued_at: Option<Duration>,
}

/// Shared per-tenant state (across lanes) that every dispatch reads: 32 bytes, so the record a
/// turn needs never straddles a cache line. The rest lives in [`TenantInfo`].
#[derive(Debug)]
#[repr(align(32))]
pub(crate) struct TenantState {
    /// quantum × weight, cached.
    pub quantum: Tokens,
    pub max_concurrency: Option<u32>,
    pub in_flight: u32,
    pub queued: u32,
    /// `spec.max_queued`, saturated (the arena holds fewer than 2^32 requests anyway).
    pub max_queued: u32,
}

const _: () = assert!(std::mem::size_of::<TenantState>() == 32);

impl TenantState {
    fn new(spec: &TenantSpec, quantum: Tokens) -> Self {
        Self {
            quantum,
            max_concurrency: spec.max_concurrency,
            in_flight: 0,
            queued: 0,
            max_queued: u32::try_from(spec.max_queued).unwrap_or(u32::MAX),
        }
    }

    pub fn at_cap(&self) -> bool {
        self.max_concurrency.is_some_and(|c| self.in_flight >= c)
    }
}

/// Per-tenant settings and identity, read off the hot path.
#[derive(Debug)]
struct TenantInfo {
    id: TenantId,
    spec: TenantSpec,
}

/// One pool's fair queue. See the module docs.
#[derive(Debug)]
pub struct Scheduler<T> {
    cfg: Config,
    arena: Arena<T>,
    tenants: Vec<TenantState>,
    /// Indexed like `tenants`.
    info: Vec<TenantInfo>,
    by_id: HashMap<TenantId, TenantKey>,
    lanes: [Discipline; 3],
    lane_in_flight: [u32; 3],
    /// Weighted service of the interactive and batch classes (tokens / class weight).
    class_vtime: [f64; 2],
    in_flight: u32,
    seq: u64,
    /// Batch requests in arrival order, for aging.
    aging: VecDeque<(Duration, Ticket)>,
}

impl<T> Scheduler<T> {
    /// An empty scheduler for one pool.
    pub fn new(cfg: Config) -> Self {
        let lane = || Discipline::new(cfg.policy);
        Self {
            lanes: [lane(), lane(), lane()],
            cfg,
            arena: Arena::default(),
            tenants: Vec::new(),
            info: Vec::new(),
            by_id: HashMap::new(),
            lane_in_flight: [0; 3],
            class_vtime: [0.0; 2],
            in_flight: 0,
            seq: 0,
            aging: VecDeque::new(),
        }
    }

    /// The pool settings in force.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Sets the effective capacity (e.g. learned from upstream 429s). Requests already in
    /// flight are not touched; dispatch resumes once in-flight falls below the new value.
    pub fn set_capacity(&mut self, capacity: u32) {
        self.cfg.capacity = capacity;
    }

    /// Changes the pool settings in place (config reload). The policy and the effective
    /// capacity stay as they are (the lanes are built for one policy; the capacity is owned by
    /// the learned limit, see `set_capacity`); every tenant's quantum follows the new base
    /// quantum from its next visit. Queued and in-flight requests are untouched.
    pub fn reconfigure(&mut self, cfg: Config) {
        let (policy, capacity) = (self.cfg.policy, self.cfg.capacity);
        self.cfg = Config {
            policy,
            capacity,
            ..cfg
        };
        for (t, info) in self.tenants.iter_mut().zip(&self.info) {
            t.quantum = info.spec.weight.scale(self.cfg.quantum);
        }
    }

    /// Adds a tenant or updates its spec (weights and caps apply from the next visit; a tenant
    /// set aside at its old concurrency cap rejoins at once if the new cap lets it).
    pub fn upsert_tenant(&mut self, id: TenantId, spec: TenantSpec) -> TenantKey {
        let quantum = spec.weight.scale(self.cfg.quantum);
        if let Some(&k) = self.by_id.get(&id) {
            let t = &mut self.tenants[k.idx()];
            *t = TenantState {
                in_flight: t.in_flight,
                queued: t.queued,
                ..TenantState::new(&spec, quantum)
            };
            self.info[k.idx()].spec = spec;
            if !t.at_cap() {
                for lane in &mut self.lanes {
                    lane.unblock(k, &self.tenants);
                }
            }
            return k;
        }
        let k = TenantKey(u32::try_from(self.tenants.len()).expect("fewer than 2^32 tenants"));
        self.tenants.push(TenantState::new(&spec, quantum));
        self.info.push(TenantInfo {
            id: id.clone(),
            spec,
        });
        for lane in &mut self.lanes {
            lane.add_tenant();
        }
        self.by_id.insert(id, k);
        k
    }

    /// The key of a known tenant.
    pub fn tenant_key(&self, id: &TenantId) -> Option<TenantKey> {
        self.by_id.get(id).copied()
    }

    /// Queues `item` for `tenant` in `class` (`recovery` requests use the recovery lane).
    pub fn enqueue(
        &mut self,
        now: Duration,
        tenant: TenantKey,
        class: Class,
        recovery: bool,
        item: T,
    ) -> Result<Ticket, QueueFull> {
        let t = &self.tenants[tenant.idx()];
        if t.queued >= t.max_queued {
            return Err(QueueFull::Tenant);
        }
        if self.arena.len() >= self.cfg.max_queued {
            return Err(QueueFull::Pool);
        }
        let lane = match (recovery, class, self.cfg.policy) {
            (true, _, _) => Lane::Recovery,
            (false, Class::Batch, Policy::Drr) => Lane::Batch,
            _ => Lane::Interactive,
        };
        self.seq += 1;
        let ticket = self.arena.insert(Entry {
            tenant,
            lane,
            enqueued_at: now,
            seq: self.seq,
            item,
        });
        self.tenants[tenant.idx()].queued += 1;
        if lane == Lane::Batch {
            self.aging.push_back((now, ticket));
        }
        self.lanes[lane.index()].push(tenant, ticket, self.seq, &self.tenants, &mut self.arena);
        Ok(ticket)
    }

    /// Removes a queued request without charging anything. `None` if it is no longer queued.
    pub fn cancel(&mut self, ticket: Ticket) -> Option<T> {
        let e = self.arena.get(ticket)?;
        let (tenant, lane) = (e.tenant, e.lane);
        self.lanes[lane.index()].forget(tenant, ticket, &mut self.arena);
        let e = self.arena.remove(ticket)?;
        self.tenants[tenant.idx()].queued -= 1;
        Some(e.item)
    }

    /// Dispatches the next request if the pool has room, charging it `cost(item)` evaluated now.
    pub fn dispatch(
        &mut self,
        now: Duration,
        cost: &mut dyn FnMut(&T) -> Tokens,
    ) -> Option<Grant<T>> {
        // A lowered capacity (e.g. learned from upstream 429s) may leave more in flight than it
        // allows; recovery's reservation stays usable even then.
        let reserved_free = self.lane_in_flight[Lane::Recovery.index()] < self.cfg.reserved_slots;
        if self.in_flight >= self.cfg.capacity && !reserved_free {
            return None;
        }
        self.age(now);
        let (ticket, lane, charged) = self.pick(cost)?;
        let e = self
            .arena
            .remove(ticket)
            .expect("a lane only yields live tickets");
        let t = &mut self.tenants[e.tenant.idx()];
        t.queued -= 1;
        t.in_flight += 1;
        self.in_flight += 1;
        self.lane_in_flight[lane.index()] += 1;
        if let Some(c) = class_index(lane) {
            self.class_vtime[c] += charged.0 as f64 / self.class_weight(c);
        }
        Some(Grant {
            ticket,
            slot: Slot {
                tenant: e.tenant,
                lane,
                cost: charged,
            },
            waited: now.saturating_sub(e.enqueued_at),
            item: e.item,
        })
    }

    /// Returns a grant's slot. Call exactly once per grant (the proxy's permit does, on drop).
    pub fn complete(&mut self, slot: Slot) {
        let t = &mut self.tenants[slot.tenant.idx()];
        let was_capped = t.at_cap();
        t.in_flight -= 1;
        self.in_flight -= 1;
        self.lane_in_flight[slot.lane.index()] -= 1;
        if was_capped {
            for lane in &mut self.lanes {
                lane.unblock(slot.tenant, &self.tenants);
            }
        }
        if self.tenants[slot.tenant.idx()].in_flight == 0 {
            for lane in &mut self.lanes {
                lane.absent(slot.tenant, &self.tenants);
            }
        }
    }

    /// Corrects a tenant's credit once the actual cost is known: credit −= actual − estimated.
    pub fn reconcile(&mut self, slot: Slot, actual: Tokens) {
        let adj = slot.cost.signed() - actual.signed();
        self.lanes[slot.lane.index()].adjust(slot.tenant, adj, &self.tenants);
    }

    /// Charges a tenant `tokens` of service it received elsewhere (another replica, see
    /// `cluster`): debt in the lane it has queued work in (interactive first), applied like an
    /// under-estimate at its next visit.
    pub fn charge(&mut self, k: TenantKey, tokens: Tokens) {
        let lane = [Lane::Interactive, Lane::Batch]
            .into_iter()
            .find(|&l| self.lanes[l.index()].tenant_queued(k) > 0)
            .unwrap_or(Lane::Interactive);
        self.lanes[lane.index()].adjust(k, -tokens.signed(), &self.tenants);
    }

    /// Requests in flight in the pool.
    pub fn in_flight(&self) -> u32 {
        self.in_flight
    }

    /// Sets the class share weights (the proxy slows batch while the pool is degraded).
    pub fn set_class_weights(&mut self, weights: (Weight, Weight)) {
        self.cfg.class_weights = weights;
    }

    /// Tenants with at least one queued request.
    pub fn backlogged_tenants(&self) -> usize {
        self.tenants.iter().filter(|t| t.queued > 0).count()
    }

    /// Requests queued in the pool.
    pub fn queued(&self) -> usize {
        self.arena.len()
    }

    /// A tenant's share weight as configured now.
    pub fn weight(&self, k: TenantKey) -> Weight {
        self.info[k.idx()].spec.weight
    }

    /// A tenant's queued and in-flight counts.
    pub fn tenant_load(&self, k: TenantKey) -> (usize, u32) {
        let t = &self.tenants[k.idx()];
        (t.queued as usize, t.in_flight)
    }

    /// Requests a tenant has queued in one lane.
    pub fn lane_queued(&self, k: TenantKey, lane: Lane) -> usize {
        self.lanes[lane.index()].tenant_queued(k)
    }

    /// A read-only view of every tenant, indexed by [`TenantKey`] order. `oldest_enqueued_at` is
    /// the enqueue time (the `now` passed to `enqueue`) of its oldest queued request.
    pub fn snapshot(&self) -> Vec<TenantSnapshot> {
        let mut oldest: Vec<Option<Duration>> = vec![None; self.tenants.len()];
        for e in self.arena.iter() {
            let o = &mut oldest[e.tenant.idx()];
            *o = Some(o.map_or(e.enqueued_at, |o| o.min(e.enqueued_at)));
        }
        self.tenants
            .iter()
            .zip(&self.info)
            .zip(oldest)
            .enumerate()
            .map(|(i, ((t, info), oldest_enqueued_at))| {
                let k = TenantKey(i as u32);
                TenantSnapshot {
                    id: info.id.clone(),
                    weight: info.spec.weight,
                    queued: t.queued as usize,
                    in_flight: t.in_flight,
                    credit: self.lanes.iter().map(|l| l.credit(k)).sum(),
                    oldest_enqueued_at,
                }
            })
            .collect()
    }

    /// A tenant's current credit in a lane (negative: debt). Zero for FIFO.
    pub fn credit(&self, k: TenantKey, lane: Lane) -> i64 {
        self.lanes[lane.index()].credit(k)
    }

    fn class_weight(&self, c: usize) -> f64 {
        if c == 0 {
            self.cfg.class_weights.0.get()
        } else {
            self.cfg.class_weights.1.get()
        }
    }

    /// Moves batch requests that waited past `batch_max_wait` into the interactive lane.
    fn age(&mut self, now: Duration) {
        while let Some(&(at, ticket)) = self.aging.front() {
            if now.saturating_sub(at) < self.cfg.batch_max_wait {
                break;
            }
            self.aging.pop_front();
            let Some(e) = self.arena.get_mut(ticket) else {
                continue;
            };
            if e.lane != Lane::Batch {
                continue;
            }
            e.lane = Lane::Interactive;
            let (tenant, seq) = (e.tenant, e.seq);
            self.lanes[Lane::Batch.index()].take(tenant, ticket, &mut self.arena);
            self.lanes[Lane::Interactive.index()].push(
                tenant,
                ticket,
                seq,
                &self.tenants,
                &mut self.arena,
            );
        }
    }

    /// Chooses the lane and the request: recovery first, then the class that is furthest behind
    /// its weighted share, with each class capped while the other waits.
    fn pick(&mut self, cost: &mut dyn FnMut(&T) -> Tokens) -> Option<(Ticket, Lane, Tokens)> {
        if let Some((t, c)) = self.lanes[0].next(&self.tenants, &mut self.arena, cost) {
            return Some((t, Lane::Recovery, c));
        }
        if self.in_flight + self.cfg.reserved_slots >= self.cfg.capacity {
            return None;
        }
        let backlogged = [self.lanes[1].queued() > 0, self.lanes[2].queued() > 0];
        let first = match backlogged {
            [true, true] => {
                let capped = |c: usize| self.lane_in_flight[c + 1] >= self.class_cap(1 - c);
                let behind = usize::from(self.class_vtime[1] < self.class_vtime[0]);
                if capped(behind) {
                    1 - behind
                } else {
                    behind
                }
            }
            [false, true] => 1,
            _ => 0,
        };
        for c in [first, 1 - first] {
            if !backlogged[c] {
                continue;
            }
            if !backlogged[1 - c] {
                // A class returning from idle does not bring banked service with it.
                self.class_vtime[1 - c] = self.class_vtime[1 - c].max(self.class_vtime[c]);
            }
            let lane = [Lane::Interactive, Lane::Batch][c];
            if let Some((t, k)) = self.lanes[c + 1].next(&self.tenants, &mut self.arena, cost) {
                return Some((t, lane, k));
            }
        }
        None
    }

    /// Slots a class may hold while the class `other` waits: all but `other`'s weighted share
    /// (at least one slot), so neither class can take the whole pool from the other.
    fn class_cap(&self, other: usize) -> u32 {
        let cap = self.cfg.capacity.saturating_sub(self.cfg.reserved_slots);
        if cap < 2 {
            return u32::MAX;
        }
        let total = self.cfg.class_weights.0.get() + self.cfg.class_weights.1.get();
        let share = ((cap as f64) * self.class_weight(other) / total).floor() as u32;
        cap - share.clamp(1, cap - 1)
    }
}

fn class_index(lane: Lane) -> Option<usize> {
    match lane {
        Lane::Recovery => None,
        Lane::Interactive => Some(0),
        Lane::Batch => Some(1),
    }
}
