//! One lane's queue discipline: weighted DRR (`drr/`) or FIFO (`fifo.rs`), behind one enum so
//! the pool can switch policy by config.
//!
//! Invariant: a discipline counts exactly the live tickets of its lane — the pool tells it of
//! every ticket that enters (`push`) or leaves it without being dispatched (`forget`: cancelled;
//! `take`: moved to another lane) while the ticket is still in the arena. DRR unlinks such a
//! ticket at once; FIFO skips dead tickets lazily at the head.

use super::arena::{Arena, Ticket};
use super::drr::Drr;
use super::fifo::Fifo;
use super::{Policy, TenantKey, TenantState};
use crate::domain::Tokens;

/// A lane's discipline.
#[derive(Debug)]
pub(crate) enum Discipline {
    Drr(Drr),
    Fifo(Fifo),
}

/// The cost of a queued request, evaluated at the moment of the call.
pub(crate) type CostOf<'a, T> = dyn FnMut(&T) -> Tokens + 'a;

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
    pub fn push<T>(
        &mut self,
        tenant: TenantKey,
        ticket: Ticket,
        seq: u64,
        tenants: &[TenantState],
        arena: &mut Arena<T>,
    ) {
        match self {
            Self::Drr(d) => d.push(tenant, ticket, tenants, arena),
            Self::Fifo(f) => f.push(tenant, ticket, seq),
        }
    }

    /// A still-live ticket of `tenant` is being cancelled; call before the arena drops it.
    pub fn forget<T>(&mut self, tenant: TenantKey, ticket: Ticket, arena: &mut Arena<T>) {
        match self {
            Self::Drr(d) => d.take(tenant, ticket, arena),
            Self::Fifo(f) => f.forget(tenant),
        }
    }

    /// Removes a still-live ticket from this lane (it moves to another lane).
    pub fn take<T>(&mut self, tenant: TenantKey, ticket: Ticket, arena: &mut Arena<T>) {
        match self {
            Self::Drr(d) => d.take(tenant, ticket, arena),
            Self::Fifo(f) => f.take(tenant, ticket),
        }
    }

    /// Pops the next ticket to dispatch and the cost charged for it.
    pub fn next<T>(
        &mut self,
        tenants: &[TenantState],
        arena: &mut Arena<T>,
        cost: &mut CostOf<'_, T>,
    ) -> Option<(Ticket, Tokens)> {
        match self {
            Self::Drr(d) => d.next(tenants, arena, cost),
            Self::Fifo(f) => f.next(tenants, arena, cost),
        }
    }

    /// `tenant` dropped below its concurrency cap.
    pub fn unblock(&mut self, tenant: TenantKey, tenants: &[TenantState]) {
        match self {
            Self::Drr(d) => d.unblock(tenant, tenants),
            Self::Fifo(f) => f.unblock(tenant, tenants),
        }
    }

    /// `tenant` has nothing in flight any more.
    pub fn absent(&mut self, tenant: TenantKey, tenants: &[TenantState]) {
        if let Self::Drr(d) = self {
            d.absent(tenant, tenants);
        }
    }

    /// Credit adjustment from reconciliation (positive: refund).
    pub fn adjust(&mut self, tenant: TenantKey, adj: i64, tenants: &[TenantState]) {
        if let Self::Drr(d) = self {
            d.adjust(tenant, adj, tenants);
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
