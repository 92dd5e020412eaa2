//! Weighted deficit round robin over tenants, metered in tokens, with cut-ins for tenants that
//! are not backlogged.
//!
//! The rules, all from `shared/design.md`:
//! - **Visits.** quantum_i = quantum × weight_i. A visit adds the quantum once and dispatches the
//!   tenant's heads while they fit (cost ≤ credit); it ends when the head does not fit. A visit
//!   that runs out of pool capacity is resumed by the next dispatch, without a new quantum.
//! - **Cut-ins: light tenants go at the next free slot.** A tenant whose queue in this lane is
//!   empty is not in the round robin. When a request arrives for it, its credit catches up
//!   (`tenant.rs`: earned per round, at most two quanta, never banked) and it joins the cut-in
//!   list. The cut-in list is served before the calendar, one request per tenant in arrival
//!   order: if the tenant has credit its head goes out at once — even when larger than the credit,
//!   which is then debt, so a sequential agent with 8k-token requests is not held back by a small
//!   quantum — and what else it has queued is visited at the head of the round (like any visit,
//!   while heads fit); with no credit it is parked for the round that covers its head, like a
//!   visit whose head does not fit. A sequential agent or a person typing, whose demand is below
//!   its weighted share, always has credit when it sends: its requests wait only for a slot to
//!   free, whatever the quantum and whatever the request sizes. That is the limit a non-preemptive
//!   pool allows (the VTC rule — Sheng et al., OSDI '24 — that a returning client is lifted to
//!   the active ones' counter, here by rounds: its credit is brought up to the round in progress,
//!   so it neither banks credit nor waits a round; EEVDF keeps lag across a short sleep as a
//!   present tenant keeps one round's unspent credit, and start-time fair queueing starts a
//!   returning flow at the current virtual time).
//! - **Not gameable.** Rounds are the virtual clock: a round ends when every backlogged tenant
//!   has had its visit. Credit is earned only per round (a quantum for each round a tenant is
//!   backlogged or has requests in flight, one for any stretch it was away), never more than two
//!   quanta outside a visit. So keeping a queue
//!   just empty, splitting work into tiny requests or alternating bursts and silences earns at
//!   most a quantum per round, what a backlogged tenant earns.
//! - **Large requests cost O(1).** A tenant whose head needs k more quanta is parked k rounds
//!   ahead in a calendar (round → tenants) and credited k quanta when its turn comes, exactly what
//!   k plain visits would have added; when every active tenant is parked the round jumps straight
//!   to the first due one. A dispatch is O(log B), B the number of distinct due rounds (≤
//!   largest cost / smallest quantum), independent of the number of tenants; a cut-in is O(1).
//! - **Debt is kept, credit is not banked.** Credit left when a queue empties is kept for one more
//!   round while the tenant has requests in flight, and dropped when it has none (a refund not yet
//!   given back is dropped either way); debt stays until paid. While nothing
//!   is queued a refund is given back up to the two-quanta cap (and dropped when the tenant is
//!   next away). Reconciliation of a queued tenant is applied at its next
//!   visit start, never during a visit, so a refund cannot stretch the visit in progress. Debts are
//!   charged in full at once; refunds are given back in full but at most one quantum per visit, so
//!   a backlogged tenant whose estimates run high loses no share, and none can turn refunds into a
//!   long visit.
//! - **Caps.** A tenant at its concurrency cap met at its turn is set aside (no quantum) and rejoins
//!   the round robin when a permit returns, with one quantum for its next visit.
//!
//! Fairness bounds (checked by `tests/props.rs` and `tests/closed.rs`), with exact estimates (no
//! reconciliation), no caps, Max the largest cost and Q the base quantum: a backlogged tenant's
//! credit after any dispatch lies in [0, Max + Q_i), a tenant's that cut in in (−Max, Max + 2·Q_i),
//! and each round adds at most Q_i. Over any interval in which tenant j stays backlogged, any
//! tenant i — backlogged, or sending however it likes — gets
//! served_i/w_i − served_j/w_j ≤ 3·Q + 2·Max/w_i + Max/w_j
//! (Shreedhar & Varghese's Max + 2Q, written per unit of weight, plus the one round of lag a
//! present tenant keeps and one cut-in's overrun). Two continuously backlogged tenants keep the
//! classic 2·Q + Max/w_i + Max/w_j.

mod tenant;

use std::collections::{BTreeMap, VecDeque};

use super::arena::{Arena, Ticket};
use super::lane::CostOf;
use super::prefetch::prefetch;
use super::{TenantKey, TenantState};
use crate::domain::Tokens;
use tenant::{DrrTenant, State};

/// Turns ahead whose tenant records are prefetched; the head request's slot is prefetched
/// `AHEAD_SLOT` turns ahead (its index is in the tenant record, fetched by then).
const AHEAD_RECORD: usize = 4;
const AHEAD_SLOT: usize = 2;

/// Prefetch hints for the next turns of the current round (see `prefetch.rs`).
fn prefetch_turns<T>(
    bucket: &VecDeque<TenantKey>,
    tenants: &[DrrTenant],
    shared: &[TenantState],
    arena: &Arena<T>,
) {
    if let Some(&t) = bucket.get(AHEAD_RECORD) {
        prefetch(&tenants[t.idx()]);
        prefetch(&shared[t.idx()]);
    }
    if let Some(&t) = bucket.get(AHEAD_SLOT) {
        tenants[t.idx()].queue.prefetch_front(arena);
    }
}

/// One lane's DRR state.
#[derive(Debug)]
pub(crate) struct Drr {
    tenants: Vec<DrrTenant>,
    /// Tenants whose queue was empty when a request arrived, in arrival order.
    cut_ins: VecDeque<TenantKey>,
    /// (round, tier) → tenants due. Tier 1 holds tenants that joined the round robin during the
    /// round before: they come after the tenants that were already in it.
    calendar: BTreeMap<(u64, u8), VecDeque<TenantKey>>,
    /// Emptied buckets kept for reuse, so a round's turnover allocates nothing.
    spare: Vec<VecDeque<TenantKey>>,
    round: u64,
    pub queued: usize,
}

impl Default for Drr {
    fn default() -> Self {
        Self {
            tenants: Vec::new(),
            cut_ins: VecDeque::new(),
            calendar: BTreeMap::new(),
            spare: Vec::new(),
            round: 1,
            queued: 0,
        }
    }
}

impl Drr {
    pub fn add_tenant(&mut self) {
        self.tenants.push(DrrTenant::default());
    }

    /// Moves `round` to the calendar's first due round. Calendar rounds are never behind `round`.
    fn sync_round(&mut self) {
        if let Some((&(r, _), _)) = self.calendar.first_key_value() {
            self.round = self.round.max(r);
        }
    }

    fn park(&mut self, t: TenantKey, due: u64, late: bool) {
        let spare = &mut self.spare;
        self.calendar
            .entry((due, u8::from(late)))
            .or_insert_with(|| spare.pop().unwrap_or_default())
            .push_back(t);
        let dt = &mut self.tenants[t.idx()];
        dt.state = State::Parked;
        dt.due = due;
    }

    pub fn push<T>(
        &mut self,
        t: TenantKey,
        ticket: Ticket,
        shared: &[TenantState],
        arena: &mut Arena<T>,
    ) {
        self.queued += 1;
        self.sync_round();
        let dt = &mut self.tenants[t.idx()];
        dt.queue.push_back(arena, ticket);
        if dt.state == State::Idle {
            let s = &shared[t.idx()];
            dt.catch_up(self.round, s.quantum.signed(), s.in_flight > 0);
            dt.state = State::CutIn;
            self.cut_ins.push_back(t);
        }
    }

    /// Unlinks a live ticket of `t` (cancelled, or moving to another lane).
    pub fn take<T>(&mut self, t: TenantKey, ticket: Ticket, arena: &mut Arena<T>) {
        self.queued -= 1;
        self.tenants[t.idx()].queue.unlink(arena, ticket);
    }

    pub fn unblock(&mut self, t: TenantKey, shared: &[TenantState]) {
        self.sync_round();
        let dt = &mut self.tenants[t.idx()];
        if dt.state != State::Blocked {
            return;
        }
        if dt.queue.is_empty() {
            dt.leave(shared[t.idx()].quantum.signed());
            return;
        }
        // One quantum for the next visit, none for the rounds spent at the cap.
        let due = self.round.max(dt.last_round + 1);
        dt.last_round = due - 1;
        self.park(t, due, false);
    }

    /// `t`'s last request in flight ended: the rounds it was present for are credited now (at
    /// most one quantum in all), so a returning agent whose long request left it in debt has
    /// paid it off by the rounds that passed while it was served, not by one round of absence.
    pub fn absent(&mut self, t: TenantKey, shared: &[TenantState]) {
        self.sync_round();
        let dt = &mut self.tenants[t.idx()];
        if dt.state == State::Idle {
            dt.catch_up(self.round, shared[t.idx()].quantum.signed(), true);
        }
    }

    pub fn adjust(&mut self, t: TenantKey, adj: i64, shared: &[TenantState]) {
        let dt = &mut self.tenants[t.idx()];
        if dt.queue.is_empty() {
            dt.adjust_idle(adj, shared[t.idx()].quantum.signed());
        } else {
            dt.pending = dt.pending.saturating_add(adj);
        }
    }

    pub fn tenant_queued(&self, t: TenantKey) -> usize {
        self.tenants[t.idx()].queue.len()
    }

    pub fn credit(&self, t: TenantKey) -> i64 {
        self.tenants[t.idx()].credit
    }

    /// Removes the tenant at the front of the current round.
    fn pop_front(&mut self) {
        if let Some(mut e) = self.calendar.first_entry() {
            e.get_mut().pop_front();
            if e.get().is_empty() {
                self.spare.push(e.remove());
            }
        }
    }

    /// The k ≥ 1 rounds after which a head of cost `c` fits `credit`.
    fn rounds_to_cover(c: Tokens, credit: i64, quantum: i64) -> u64 {
        let need = c.signed().saturating_sub(credit);
        ((need + quantum - 1) / quantum).max(1) as u64
    }

    /// A cut-in's turn: its head goes out if it has credit, and the rest of its queue is visited
    /// at the head of the round; without credit it is parked until a round covers its head.
    fn cut_in<T>(
        &mut self,
        t: TenantKey,
        shared: &[TenantState],
        arena: &mut Arena<T>,
        cost: &mut CostOf<'_, T>,
    ) -> Option<(Ticket, Tokens)> {
        let quantum = shared[t.idx()].quantum.signed();
        let dt = &mut self.tenants[t.idx()];
        let Some(head) = dt.queue.front(arena) else {
            // Cancelled while waiting.
            dt.leave(quantum);
            return None;
        };
        if shared[t.idx()].at_cap() {
            dt.state = State::Blocked;
            return None;
        }
        // Its allowance is for the round in progress (the round may have moved on since it
        // arrived: `push` syncs it to the calendar).
        dt.catch_up(self.round, quantum, true);
        dt.charge_pending();
        let c = cost(&arena.get(head).expect("listed tickets are live").item);
        if dt.credit <= 0 {
            let k = Self::rounds_to_cover(c, dt.credit, quantum);
            let due = dt.last_round + k;
            self.park(t, due, true);
            return None;
        }
        dt.credit -= c.signed();
        dt.queue.pop_front(arena);
        self.queued -= 1;
        if dt.queue.is_empty() {
            dt.leave(quantum);
        } else {
            // The rest is a visit at the head of the round, ahead of the visit in progress
            // (which resumes after it, without a new quantum); further cut-ins still cut into it.
            let first = (self.round, 0);
            let key = self
                .calendar
                .first_key_value()
                .map_or(first, |(&k, _)| k.min(first));
            let spare = &mut self.spare;
            self.calendar
                .entry(key)
                .or_insert_with(|| spare.pop().unwrap_or_default())
                .push_front(t);
            let dt = &mut self.tenants[t.idx()];
            dt.state = State::Parked;
            dt.due = self.round;
            dt.in_visit = true;
            dt.late = true;
        }
        Some((head, c))
    }

    pub fn next<T>(
        &mut self,
        shared: &[TenantState],
        arena: &mut Arena<T>,
        cost: &mut CostOf<'_, T>,
    ) -> Option<(Ticket, Tokens)> {
        while let Some(t) = self.cut_ins.pop_front() {
            if let Some(grant) = self.cut_in(t, shared, arena, cost) {
                return Some(grant);
            }
        }
        loop {
            self.sync_round();
            let (&(round, _), bucket) = self.calendar.first_key_value()?;
            let t = *bucket.front().expect("empty buckets are removed");
            prefetch_turns(bucket, &self.tenants, shared, arena);
            debug_assert_eq!(round, self.round);
            let quantum = shared[t.idx()].quantum.signed();
            let dt = &mut self.tenants[t.idx()];
            let Some(head) = dt.queue.front(arena) else {
                // Emptied by cancellation before its turn.
                self.pop_front();
                self.tenants[t.idx()].leave(quantum);
                continue;
            };
            if shared[t.idx()].at_cap() {
                dt.in_visit = false;
                dt.late = false;
                dt.state = State::Blocked;
                self.pop_front();
                continue;
            }
            if !dt.in_visit {
                dt.start_visit(round, quantum);
            }
            // During a visit `last_round` is the round the visit counts for.
            let round = dt.last_round;
            let c = cost(&arena.get(head).expect("listed tickets are live").item);
            if c.signed() <= dt.credit {
                dt.credit -= c.signed();
                dt.queue.pop_front(arena);
                self.queued -= 1;
                if dt.queue.is_empty() {
                    // Out of the round robin; its next request cuts in (with what is left of
                    // this round's quantum, see `tenant.rs`).
                    dt.leave(quantum);
                    self.pop_front();
                }
                return Some((head, c));
            }
            // The head does not fit: the visit ends; come back when k more quanta cover it.
            let k = Self::rounds_to_cover(c, dt.credit, quantum);
            let late = std::mem::take(&mut dt.late);
            dt.in_visit = false;
            self.pop_front();
            self.park(t, round + k, late);
        }
    }
}
