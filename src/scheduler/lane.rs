//! One lane's queue discipline: weighted DRR (`drr.rs`) or FIFO (`fifo.rs`), behind one enum so
//! the pool can switch policy by config. Also the per-tenant ticket queue both disciplines use.
//!
//! Invariant: a `TenantQueue` holds tickets in arrival order; `live` counts those still in the
//! arena. Dead tickets (cancelled, aged out) are skipped lazily at the head.

use std::collections::VecDeque;

use super::arena::{Arena, Ticket};
use super::drr::Drr;
use super::fifo::Fifo;
use super::{Policy, TenantKey, TenantState};
use crate::domain::Tokens;

/// A tenant's tickets in one lane.
#[derive(Debug, Default)]
pub(crate) struct TenantQueue {
    pub tickets: VecDeque<Ticket>,
    pub live: usize,
}

impl TenantQueue {
    /// Drops dead tickets at the head and returns the first live one.
    pub fn head<T>(&mut self, arena: &Arena<T>) -> Option<Ticket> {
        while let Some(&t) = self.tickets.front() {
            if arena.get(t).is_some() {
                return Some(t);
            }
            self.tickets.pop_front();
        }
        None
    }

    /// Removes `ticket` (normally the live head) when it leaves this lane while still live.
    pub fn take(&mut self, ticket: Ticket) {
        if let Some(pos) = self.tickets.iter().position(|&t| t == ticket) {
            self.tickets.remove(pos);
        }
        self.live -= 1;
    }
}

/// A lane's discipline.
#[derive(Debug)]
pub(crate) enum Discipline {
    Drr(Drr),
    Fifo(Fifo),
}

/// The cost of a live ticket, evaluated at the moment of the call.
pub(crate) type CostOf<'a> = dyn FnMut(Ticket) -> Tokens + 'a;

impl Discipline {
    pub fn new(policy: Policy) -> Self {
        match policy {
            Policy::Drr => Self::Drr(Drr::default()),
            Policy::Fifo => Self::Fifo(Fifo::default()),
        }
    }

    pub fn add_tenant(&mut self) {
        match self {
            Self::Drr(d) => d.add_tenant(),
            Self::Fifo(f) => f.add_tenant(),
        }
    }

    /// Live requests queued in this lane.
    pub fn queued(&self) -> usize {
        match self {
            Self::Drr(d) => d.queued,
            Self::Fifo(f) => f.queued,
        }
    }

    /// Appends a live ticket to `tenant`'s queue, activating the tenant if it was idle.
    pub fn push(&mut self, tenant: TenantKey, ticket: Ticket, seq: u64) {
        match self {
            Self::Drr(d) => d.push(tenant, ticket),
            Self::Fifo(f) => f.push(tenant, ticket, seq),
        }
    }

    /// A ticket of `tenant` left the arena while queued (cancelled): fix the live counts.
    pub fn forget(&mut self, tenant: TenantKey) {
        match self {
            Self::Drr(d) => d.forget(tenant),
            Self::Fifo(f) => f.forget(tenant),
        }
    }

    /// Removes a still-live ticket from this lane (it moves to another lane).
    pub fn take(&mut self, tenant: TenantKey, ticket: Ticket) {
        match self {
            Self::Drr(d) => d.take(tenant, ticket),
            Self::Fifo(f) => f.take(tenant, ticket),
        }
    }

    /// Pops the next ticket to dispatch and the cost charged for it.
    pub fn next<T>(
        &mut self,
        tenants: &[TenantState],
        arena: &Arena<T>,
        cost: &mut CostOf<'_>,
    ) -> Option<(Ticket, Tokens)> {
        match self {
            Self::Drr(d) => d.next(tenants, arena, cost),
            Self::Fifo(f) => f.next(tenants, arena, cost),
        }
    }

    /// `tenant` dropped below its concurrency cap.
    pub fn unblock(&mut self, tenant: TenantKey, tenants: &[TenantState]) {
        match self {
            Self::Drr(d) => d.unblock(tenant),
            Self::Fifo(f) => f.unblock(tenant, tenants),
        }
    }

    /// Credit adjustment from reconciliation (positive: refund).
    pub fn adjust(&mut self, tenant: TenantKey, adj: i64) {
        if let Self::Drr(d) = self {
            d.adjust(tenant, adj);
        }
    }

    /// Live requests `tenant` has queued in this lane.
    pub fn tenant_queued(&self, tenant: TenantKey) -> usize {
        match self {
            Self::Drr(d) => d.tenant_queued(tenant),
            Self::Fifo(f) => f.tenant_queued(tenant),
        }
    }

    pub fn credit(&self, tenant: TenantKey) -> i64 {
        match self {
            Self::Drr(d) => d.credit(tenant),
            Self::Fifo(_) => 0,
        }
    }
}
