//! One tenant's DRR record in one lane, and the credit rules that touch only that record.
//!
//! Credit is the tenant's allowance, in tokens, for the round it was last credited for
//! (`last_round`). It is earned one quantum per round and spent by dispatches:
//! - **Backlogged** (in the calendar): a visit adds a quantum for each round since the last one it
//!   was credited for (a tenant parked k rounds ahead gets k quanta at its turn, exactly what k
//!   plain visits would have added).
//! - **Not backlogged** (`Idle`: nothing queued in this lane): an arrival first *catches up* to
//!   the round in progress. A tenant that has requests in flight (*present*) earns a quantum for
//!   each round since it was last credited, and keeps what it left unspent of the round before,
//!   but never holds more than two quanta: the lag of one round, kept across the short gap between
//!   an answer and the next request (as EEVDF keeps lag across a short sleep), so a closed loop
//!   whose round ended while its requests were in flight is not cut short. A tenant with nothing
//!   in flight (*away*) gets one quantum and drops what it left (credit reset to zero, never the
//!   debt): an hour of absence is worth one quantum, like a round. Within the round it was last
//!   credited for, a tenant spends what is left.
//!
//! So credit is a bounded memory of recent service, not a savings account: it never exceeds two
//! quanta outside a visit, earning is one quantum per round whatever the tenant does, and debt is
//! kept until paid (a round of absence repays at most one quantum of it).

use super::super::list::TicketList;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum State {
    /// Nothing queued in this lane (it may have requests in flight).
    Idle,
    /// Queued in the cut-in list: its head goes out at the next free slot if it has credit.
    CutIn,
    /// In the calendar, due at round `due` (its visit may be in progress at the front).
    Parked,
    /// At its concurrency cap; out of every list until a permit returns.
    Blocked,
}

/// One tenant's state in one lane: all a turn reads or writes, in one cache line (with 100k
/// backlogged tenants every dispatch meets a tenant that is not in cache).
#[derive(Debug)]
#[repr(align(64))]
pub(super) struct DrrTenant {
    pub credit: i64,
    /// Reconciliation not yet applied (applied at the next visit start).
    pub pending: i64,
    /// The last round whose quantum has been credited; during a visit, the round the visit
    /// counts for.
    pub last_round: u64,
    /// While `Parked`: the round it is due at.
    pub due: u64,
    /// Its queued tickets, in arrival order.
    pub queue: TicketList,
    pub state: State,
    pub in_visit: bool,
    /// Joined the round after its tenants were placed: its next turn comes after theirs.
    pub late: bool,
}

const _: () = assert!(std::mem::size_of::<DrrTenant>() == 64);

impl Default for DrrTenant {
    fn default() -> Self {
        Self {
            credit: 0,
            pending: 0,
            last_round: 0,
            due: 0,
            queue: TicketList::default(),
            state: State::Idle,
            in_visit: false,
            late: false,
        }
    }
}

impl DrrTenant {
    /// Starts a visit in `round`: a quantum per round since the last credited one, then the
    /// pending reconciliation (charges in full, refunds at most one quantum per visit).
    pub fn start_visit(&mut self, round: u64, quantum: i64) {
        let rounds = round.saturating_sub(self.last_round) as i64;
        self.credit = self.credit.saturating_add(rounds.saturating_mul(quantum));
        self.apply_pending(quantum);
        self.last_round = self.last_round.max(round);
        self.in_visit = true;
    }

    fn apply_pending(&mut self, quantum: i64) {
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
    }

    /// Applies a pending charge now (a cut-in: refunds wait for a visit).
    pub fn charge_pending(&mut self) {
        if self.pending < 0 {
            self.credit = self.credit.saturating_add(self.pending);
            self.pending = 0;
        }
    }

    /// An arrival to an empty queue in `round` (see the module doc). `present`: it has requests
    /// in flight.
    pub fn catch_up(&mut self, round: u64, quantum: i64, present: bool) {
        if round > self.last_round {
            self.credit = if present {
                let rounds = (round - self.last_round) as i64;
                self.credit
                    .saturating_add(rounds.saturating_mul(quantum))
                    .min(quantum.saturating_mul(2))
            } else {
                self.credit.min(0).saturating_add(quantum)
            };
            self.last_round = round;
        }
    }

    /// Its queue emptied: out of every list. What is left of this round's quantum stays (at most
    /// one quantum, and only until the round ends, see `catch_up`); a charge not yet applied is
    /// debt now; a refund not yet given back is dropped (no banking).
    pub fn leave(&mut self, quantum: i64) {
        self.credit = self
            .credit
            .min(quantum.saturating_mul(2))
            .saturating_add(self.pending.min(0));
        self.pending = 0;
        self.in_visit = false;
        self.late = false;
        self.state = State::Idle;
    }

    /// A reconciliation while nothing is queued: a charge is debt at once; a refund is given
    /// back up to two quanta (the most a tenant holds outside a visit), so a closed loop whose
    /// estimates run high is refunded like a backlogged tenant, and banks nothing beyond the cap
    /// (what it holds when it is next away is dropped, see `catch_up`).
    pub fn adjust_idle(&mut self, adj: i64, quantum: i64) {
        if adj < 0 {
            self.credit = self.credit.saturating_add(adj);
        } else {
            let cap = quantum.saturating_mul(2).max(self.credit);
            self.credit = self.credit.saturating_add(adj).min(cap);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catch_up_carries_at_most_one_round_and_keeps_debt() {
        let mut t = DrrTenant {
            credit: 50,
            last_round: 3,
            ..DrrTenant::default()
        };
        // Same round: what is left of it.
        t.catch_up(3, 100, true);
        assert_eq!(t.credit, 50);
        // The next round: what was left plus a quantum.
        t.catch_up(4, 100, true);
        assert_eq!((t.credit, t.last_round), (150, 4));
        // Many rounds later: never more than two quanta.
        t.catch_up(9, 100, true);
        assert_eq!((t.credit, t.last_round), (200, 9));
        // Present for three rounds repays three quanta of debt...
        t.credit = -250;
        t.catch_up(12, 100, true);
        assert_eq!(t.credit, 50);
        // ...absent for an hour of rounds, only one, and nothing of what was left.
        t.credit = -250;
        t.catch_up(10_000, 100, false);
        assert_eq!(t.credit, -150);
        t.credit = 180;
        t.catch_up(10_001, 100, false);
        assert_eq!(t.credit, 100);
    }

    #[test]
    fn leave_keeps_at_most_two_quanta_and_turns_pending_charges_into_debt() {
        let mut t = DrrTenant {
            credit: 380,
            pending: 70,
            state: State::Parked,
            ..DrrTenant::default()
        };
        t.leave(100);
        assert_eq!((t.credit, t.pending, t.state), (200, 0, State::Idle));
        t.pending = -30;
        t.leave(100);
        assert_eq!(t.credit, 170);
    }

    #[test]
    fn refunds_while_nothing_is_queued_stop_at_two_quanta() {
        let mut t = DrrTenant {
            credit: 40,
            ..DrrTenant::default()
        };
        t.adjust_idle(50, 100);
        assert_eq!(t.credit, 90);
        t.adjust_idle(500, 100);
        assert_eq!(t.credit, 200);
        t.adjust_idle(-300, 100);
        assert_eq!(t.credit, -100);
    }
}
