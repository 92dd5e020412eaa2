//! Weighted deficit round robin over tenants, metered in tokens.
//!
//! The rules, all from `shared/design.md`:
//! - **Visits.** quantum_i = quantum × weight_i. A visit adds the quantum once and dispatches the
//!   tenant's heads while they fit (cost ≤ credit); it ends when the head does not fit. A visit
//!   that runs out of pool capacity is resumed by the next dispatch, without a new quantum.
//! - **New tenants first** (as in FQ-CoDel's new-flow list): a tenant that becomes active is
//!   visited before the round robin resumes, so it waits for one free slot — about one service
//!   time — not for a quantum of someone else's work, whatever their request sizes. That holds
//!   among newcomers too: several tenants that become active while the pool has no free slot (a
//!   paused pool; in cluster mode a replica that holds no lease yet) get their first requests
//!   out one free slot each, in arrival order, and only then does any of their visits run on —
//!   a newcomer cuts into another newcomer's turn after its first request like into any visit
//!   (it once waited for the whole turn: a quantum of the tenant that happened to queue first,
//!   ~50 requests in `tests/e2e/cluster/fairness.rs`'s noisy-neighbour test). To keep this
//!   from being gamed, a tenant whose queue empties keeps its place in the round robin until its
//!   next turn and is idle only if still empty then: a tenant that comes back within a round
//!   (a closed-loop client, say) waits its turn like everyone else.
//! - **Large requests cost O(1).** A tenant whose head needs k more quanta is parked k rounds
//!   ahead in a calendar (round → tenants) and credited k quanta when its turn comes, exactly what
//!   k plain visits would have added; when every active tenant is parked the round jumps straight
//!   to the first due one. A dispatch is O(log B), B the number of distinct due rounds (≤
//!   largest cost / smallest quantum), independent of the number of tenants.
//! - **Debt is kept, credit is not banked.** An empty queue resets credit (and refunds not yet
//!   given back) to at most zero; while nothing is queued, a refund only repays debt.
//!   Reconciliation is applied at the tenant's next visit start, never during a visit, so a refund
//!   cannot stretch the visit in progress. Debts are charged in full at once; refunds are given
//!   back in full but at most one quantum per visit, so a backlogged tenant whose estimates run
//!   high loses no share, and none can turn refunds into a long visit.
//! - **Caps.** A tenant at its concurrency cap met at its turn is set aside (no quantum) and rejoins
//!   the round robin when a permit returns, with one quantum for its next visit.
//!
//! Fairness bound (checked by `proptests.rs`): with exact estimates (no reconciliation) and no
//! caps, for two tenants continuously backlogged over an interval, credit after any dispatch lies
//! in [0, Max + Q_i) and each round adds exactly Q_i, hence
//! |served_i/w_i − served_j/w_j| ≤ 2·Q + Max/w_i + Max/w_j, Max the largest cost, Q the base
//! quantum (Shreedhar & Varghese's Max + 2Q, written per unit of weight).

use std::collections::{BTreeMap, VecDeque};

use super::arena::{Arena, Ticket};
use super::lane::CostOf;
use super::list::TicketList;
use super::prefetch::prefetch;
use super::{TenantKey, TenantState};
use crate::domain::Tokens;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// No queued work; credit ≤ 0.
    Idle,
    /// In the new-tenant list.
    Fresh,
    /// In the calendar, due at round `due`.
    Parked,
    /// At its concurrency cap; out of every list until a permit returns.
    Blocked,
}

/// One tenant's state in one lane: all a turn reads or writes, in one cache line (with 100k
/// backlogged tenants every dispatch meets a tenant that is not in cache).
#[derive(Debug)]
#[repr(align(64))]
struct DrrTenant {
    credit: i64,
    /// Reconciliation not yet applied (applied at the next visit start).
    pending: i64,
    /// The last round whose quantum has been credited; during a visit, the round the visit
    /// counts for.
    last_round: u64,
    /// While `Parked`: the round it is due at.
    due: u64,
    /// Came back within a round: its next turn (due that round, never 0) is taken at the next
    /// free slot. 0: none.
    early: u64,
    /// Its queued tickets, in arrival order.
    queue: TicketList,
    /// Bumped when its calendar entry is withdrawn (an early turn); stale entries are skipped.
    gen: u32,
    state: State,
    in_visit: bool,
    /// Activated since its last full turn: its next turn comes after the round's old tenants.
    newcomer: bool,
}

const _: () = assert!(std::mem::size_of::<DrrTenant>() == 64);

impl Default for DrrTenant {
    fn default() -> Self {
        Self {
            credit: 0,
            pending: 0,
            last_round: 0,
            due: 0,
            early: 0,
            queue: TicketList::default(),
            gen: 0,
            state: State::Idle,
            in_visit: false,
            newcomer: false,
        }
    }
}

impl DrrTenant {
    fn start_visit(&mut self, round: u64, quantum: i64) {
        let rounds = round.saturating_sub(self.last_round) as i64;
        self.credit = self.credit.saturating_add(rounds.saturating_mul(quantum));
        if self.pending < 0 {
            // Under-estimates are charged in full.
            self.credit = self.credit.saturating_add(self.pending);
            self.pending = 0;
        } else {
            // Refunds are given back at most one quantum per visit: all of them, over time,
            // but never as one long visit.
            let give = self.pending.min(quantum);
            self.credit = self.credit.saturating_add(give);
            self.pending -= give;
        }
        self.last_round = round;
        self.in_visit = true;
    }

    fn deactivate(&mut self) {
        self.credit = self.credit.saturating_add(self.pending).min(0);
        self.pending = 0;
        self.in_visit = false;
        self.newcomer = false;
        self.state = State::Idle;
    }
}

/// Turns ahead whose tenant records are prefetched; the head request's slot is prefetched
/// `AHEAD_SLOT` turns ahead (its index is in the tenant record, fetched by then).
const AHEAD_RECORD: usize = 4;
const AHEAD_SLOT: usize = 2;

/// Prefetch hints for the next turns of the current round (see `prefetch.rs`).
fn prefetch_turns<T>(
    bucket: &VecDeque<(TenantKey, u32)>,
    tenants: &[DrrTenant],
    shared: &[TenantState],
    arena: &Arena<T>,
) {
    if let Some(&(t, _)) = bucket.get(AHEAD_RECORD) {
        prefetch(&tenants[t.idx()]);
        prefetch(&shared[t.idx()]);
    }
    if let Some(&(t, _)) = bucket.get(AHEAD_SLOT) {
        tenants[t.idx()].queue.prefetch_front(arena);
    }
}

/// One lane's DRR state.
#[derive(Debug)]
pub(crate) struct Drr {
    tenants: Vec<DrrTenant>,
    /// Newcomers, in arrival order.
    fresh: VecDeque<TenantKey>,
    /// Tenants back within a round, taking their next turn early (after the newcomers).
    early: VecDeque<TenantKey>,
    /// (round, tier) → tenants due. Tier 1 holds newcomers after their turn: they come after
    /// the tenants that were already in the round robin when they arrived.
    calendar: BTreeMap<(u64, u8), VecDeque<(TenantKey, u32)>>,
    /// Emptied buckets kept for reuse, so a round's turnover allocates nothing.
    spare: Vec<VecDeque<(TenantKey, u32)>>,
    round: u64,
    pub queued: usize,
}

impl Default for Drr {
    fn default() -> Self {
        Self {
            tenants: Vec::new(),
            fresh: VecDeque::new(),
            early: VecDeque::new(),
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

    /// Moves `round` to the calendar's first due round once the new tenants (who belong to the
    /// current round) have had their turn. Calendar rounds are never behind `round`.
    fn sync_round(&mut self) {
        if !self.fresh.is_empty() || !self.early.is_empty() {
            return;
        }
        if let Some((&(r, _), _)) = self.calendar.first_key_value() {
            self.round = self.round.max(r);
        }
    }

    fn park(&mut self, t: TenantKey, due: u64, late: bool) {
        let spare = &mut self.spare;
        let gen = self.tenants[t.idx()].gen;
        self.calendar
            .entry((due, u8::from(late)))
            .or_insert_with(|| spare.pop().unwrap_or_default())
            .push_back((t, gen));
        let dt = &mut self.tenants[t.idx()];
        dt.state = State::Parked;
        dt.due = due;
    }

    pub fn push<T>(&mut self, t: TenantKey, ticket: Ticket, arena: &mut Arena<T>) {
        self.queued += 1;
        self.sync_round();
        let round = self.round;
        let dt = &mut self.tenants[t.idx()];
        dt.queue.push_back(arena, ticket);
        match dt.state {
            State::Idle => {
                dt.state = State::Fresh;
                dt.in_visit = false;
                dt.newcomer = true;
                dt.last_round = round - 1;
                self.fresh.push_back(t);
            }
            // Back within a round (its queue had emptied): it takes the turn it is due next
            // round now, at the next free slot, instead of waiting for the rest of this round;
            // after that it waits its turns (at most one round ahead, ever).
            State::Parked if dt.queue.len() == 1 && !dt.in_visit && dt.due <= round + 1 => {
                dt.gen = dt.gen.wrapping_add(1);
                dt.early = dt.due;
                dt.state = State::Fresh;
                self.early.push_back(t);
            }
            _ => {}
        }
    }

    /// Unlinks a live ticket of `t` (cancelled, or moving to another lane).
    pub fn take<T>(&mut self, t: TenantKey, ticket: Ticket, arena: &mut Arena<T>) {
        self.queued -= 1;
        self.tenants[t.idx()].queue.unlink(arena, ticket);
    }

    pub fn unblock(&mut self, t: TenantKey) {
        self.sync_round();
        let dt = &mut self.tenants[t.idx()];
        if dt.state != State::Blocked {
            return;
        }
        if dt.queue.is_empty() {
            dt.deactivate();
            return;
        }
        // One quantum for the next visit, none for the rounds spent at the cap.
        let due = self.round.max(dt.last_round + 1);
        dt.last_round = due - 1;
        self.park(t, due, false);
    }

    pub fn adjust(&mut self, t: TenantKey, adj: i64) {
        let dt = &mut self.tenants[t.idx()];
        if dt.state == State::Idle || dt.queue.is_empty() {
            // Nothing queued: a charge becomes debt, a refund only repays debt (no banking).
            dt.credit = dt.credit.saturating_add(adj).min(0);
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

    pub fn next<T>(
        &mut self,
        shared: &[TenantState],
        arena: &mut Arena<T>,
        cost: &mut CostOf<'_, T>,
    ) -> Option<(Ticket, Tokens)> {
        loop {
            if let Some(t) = self.fresh.pop_front().or_else(|| self.early.pop_front()) {
                // A newcomer's turn: it goes to the head of the current round, ahead of the
                // visit in progress (which resumes after it, without a new quantum) — also when
                // that visit is another newcomer's turn, which has had its first request.
                let first = (self.round, 0);
                let key = self
                    .calendar
                    .first_key_value()
                    .map_or(first, |(&k, _)| k.min(first));
                let spare = &mut self.spare;
                let gen = self.tenants[t.idx()].gen;
                self.calendar
                    .entry(key)
                    .or_insert_with(|| spare.pop().unwrap_or_default())
                    .push_front((t, gen));
                let dt = &mut self.tenants[t.idx()];
                dt.state = State::Parked;
                dt.due = self.round;
            }
            self.sync_round();
            let (&(round, _), bucket) = self.calendar.first_key_value()?;
            let (t, gen) = *bucket.front().expect("empty buckets are removed");
            prefetch_turns(bucket, &self.tenants, shared, arena);
            debug_assert_eq!(round, self.round);
            if self.tenants[t.idx()].gen != gen {
                // Withdrawn for an early turn.
                self.pop_front();
                continue;
            }
            let quantum = shared[t.idx()].quantum.signed();
            let dt = &mut self.tenants[t.idx()];
            let Some(head) = dt.queue.front(arena) else {
                // Still empty at its turn: idle now.
                self.pop_front();
                self.tenants[t.idx()].deactivate();
                continue;
            };
            if shared[t.idx()].at_cap() {
                dt.in_visit = false;
                dt.newcomer = false;
                dt.state = State::Blocked;
                self.pop_front();
                continue;
            }
            if !dt.in_visit {
                let early = std::mem::take(&mut dt.early);
                dt.start_visit(early.max(round), quantum);
            }
            // During a visit `last_round` is the round the visit counts for.
            let round = dt.last_round;
            let c = cost(&arena.get(head).expect("listed tickets are live").item);
            if c.signed() <= dt.credit {
                dt.credit -= c.signed();
                dt.queue.pop_front(arena);
                self.queued -= 1;
                if dt.queue.is_empty() {
                    // The queue emptied: the visit ends and credit resets (debt stays), but the
                    // tenant keeps its place until its next turn, so coming back within a round
                    // earns no newcomer turn.
                    dt.credit = dt.credit.min(0);
                    dt.pending = dt.pending.min(0);
                    let late = std::mem::take(&mut dt.newcomer);
                    dt.in_visit = false;
                    self.pop_front();
                    self.park(t, round + 1, late);
                }
                return Some((head, c));
            }
            // The head does not fit: the visit ends; come back when k more quanta cover it.
            let need = c.signed().saturating_sub(dt.credit);
            let k = ((need + quantum - 1) / quantum).max(1) as u64;
            let late = std::mem::take(&mut dt.newcomer);
            dt.in_visit = false;
            self.pop_front();
            self.park(t, round + k, late);
        }
    }
}
