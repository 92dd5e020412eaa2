//! FIFO: dispatch in arrival order. Exists to compare against DRR (`policy = "fifo"`).
//!
//! Invariants: among tenants under their concurrency cap, the request dispatched is the oldest
//! queued one (by the pool-wide arrival sequence); a capped tenant's requests wait without
//! blocking anyone else's (work conservation). O(log n) per dispatch via an ordered set of
//! eligible tenants keyed by their head's arrival sequence.

use std::collections::{BTreeSet, VecDeque};

use super::arena::{Arena, Ticket};
use super::lane::CostOf;
use super::{TenantKey, TenantState};
use crate::domain::Tokens;

#[derive(Debug, Default)]
struct FifoTenant {
    /// (arrival sequence, ticket), in arrival order; dead tickets skipped lazily.
    queue: VecDeque<(u64, Ticket)>,
    live: usize,
    in_set: bool,
    blocked: bool,
}

/// One lane's FIFO state.
#[derive(Debug, Default)]
pub(crate) struct Fifo {
    tenants: Vec<FifoTenant>,
    ready: BTreeSet<(u64, TenantKey)>,
    pub queued: usize,
}

impl Fifo {
    pub fn add_tenant(&mut self) {
        self.tenants.push(FifoTenant::default());
    }

    fn make_ready(&mut self, t: TenantKey) {
        let ft = &mut self.tenants[t.idx()];
        if ft.in_set || ft.blocked {
            return;
        }
        if let Some(&(seq, _)) = ft.queue.front() {
            ft.in_set = true;
            self.ready.insert((seq, t));
        }
    }

    pub fn push(&mut self, t: TenantKey, ticket: Ticket, seq: u64) {
        self.queued += 1;
        let ft = &mut self.tenants[t.idx()];
        ft.queue.push_back((seq, ticket));
        ft.live += 1;
        self.make_ready(t);
    }

    /// A ticket of `t` is being cancelled: fix the live counts (the ticket is skipped lazily).
    pub fn forget(&mut self, t: TenantKey) {
        self.queued -= 1;
        self.tenants[t.idx()].live -= 1;
    }

    pub fn take(&mut self, t: TenantKey, ticket: Ticket) {
        self.queued -= 1;
        let ft = &mut self.tenants[t.idx()];
        ft.live -= 1;
        if let Some(pos) = ft.queue.iter().position(|&(_, x)| x == ticket) {
            ft.queue.remove(pos);
        }
    }

    pub fn tenant_queued(&self, t: TenantKey) -> usize {
        self.tenants[t.idx()].live
    }

    pub fn unblock(&mut self, t: TenantKey, _shared: &[TenantState]) {
        let ft = &mut self.tenants[t.idx()];
        if ft.blocked {
            ft.blocked = false;
            self.make_ready(t);
        }
    }

    pub fn next<T>(
        &mut self,
        shared: &[TenantState],
        arena: &Arena<T>,
        cost: &mut CostOf<'_, T>,
    ) -> Option<(Ticket, Tokens)> {
        loop {
            let (_, t) = self.ready.pop_first()?;
            let ft = &mut self.tenants[t.idx()];
            ft.in_set = false;
            while ft
                .queue
                .front()
                .is_some_and(|&(_, x)| arena.get(x).is_none())
            {
                ft.queue.pop_front();
            }
            let Some(&(seq, head)) = ft.queue.front() else {
                continue;
            };
            if shared[t.idx()].at_cap() {
                ft.blocked = true;
                continue;
            }
            // Re-sort by the live head if dead tickets hid it.
            if let Some(&(first, _)) = self.ready.first() {
                if first < seq {
                    self.make_ready(t);
                    continue;
                }
            }
            ft.queue.pop_front();
            ft.live -= 1;
            self.queued -= 1;
            self.make_ready(t);
            let c = cost(&arena.get(head).expect("live head").item);
            return Some((head, c));
        }
    }
}
