//! Intrusive FIFO lists of tickets threaded through the arena's slots: one per tenant and lane,
//! all sharing the arena's storage instead of one heap buffer per tenant.
//!
//! Invariants: a ticket is linked into at most one list, only while its entry is live (it is
//! unlinked before the arena frees its slot); `len` counts the tickets linked; order is
//! insertion order. Every operation is O(1) and touches only the slots it links or unlinks —
//! popping the head reads the head's own slot and nothing else (a head's `prev` is stale by
//! design: `head` is checked instead).

use super::arena::{Arena, Ticket, NIL};

/// Head, tail and length of one list.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TicketList {
    head: u32,
    tail: u32,
    len: u32,
}

impl Default for TicketList {
    fn default() -> Self {
        Self {
            head: NIL,
            tail: NIL,
            len: 0,
        }
    }
}

impl TicketList {
    /// Tickets linked.
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// True when nothing is linked.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The oldest ticket, if any.
    pub fn front<T>(&self, arena: &Arena<T>) -> Option<Ticket> {
        (self.head != NIL).then(|| arena.ticket_at(self.head))
    }

    /// Prefetch hint for the head's slot.
    pub fn prefetch_front<T>(&self, arena: &Arena<T>) {
        arena.prefetch(self.head);
    }

    /// Links a live ticket at the back.
    pub fn push_back<T>(&mut self, arena: &mut Arena<T>, t: Ticket) {
        let idx = Arena::<T>::index(t);
        let link = arena.link_mut(idx);
        link.prev = self.tail;
        link.next = NIL;
        if self.tail == NIL {
            self.head = idx;
        } else {
            arena.link_mut(self.tail).next = idx;
        }
        self.tail = idx;
        self.len += 1;
    }

    /// Unlinks the head (which must exist).
    pub fn pop_front<T>(&mut self, arena: &Arena<T>) {
        debug_assert_ne!(self.head, NIL);
        let next = arena.link(self.head).next;
        self.head = next;
        if next == NIL {
            self.tail = NIL;
        }
        self.len -= 1;
    }

    /// Unlinks `t`, which must be linked in this list.
    pub fn unlink<T>(&mut self, arena: &mut Arena<T>, t: Ticket) {
        let idx = Arena::<T>::index(t);
        if idx == self.head {
            self.pop_front(arena);
            return;
        }
        let link = arena.link(idx);
        arena.link_mut(link.prev).next = link.next;
        if link.next == NIL {
            self.tail = link.prev;
        } else {
            arena.link_mut(link.next).prev = link.prev;
        }
        self.len -= 1;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::scheduler::arena::Entry;
    use crate::scheduler::{Lane, TenantKey};

    fn order(l: &TicketList, a: &Arena<u32>) -> Vec<u32> {
        let mut copy = *l;
        let mut out = Vec::new();
        while let Some(t) = copy.front(a) {
            out.push(a.get(t).unwrap().item);
            copy.pop_front(a);
        }
        out
    }

    #[test]
    fn push_pop_and_unlink_anywhere_keep_order() {
        let mut a = Arena::default();
        let mut l = TicketList::default();
        let t: Vec<_> = (0..5)
            .map(|n| {
                let e = Entry {
                    tenant: TenantKey(0),
                    lane: Lane::Interactive,
                    enqueued_at: Duration::ZERO,
                    seq: 0,
                    item: n,
                };
                let t = a.insert(e);
                l.push_back(&mut a, t);
                t
            })
            .collect();
        l.unlink(&mut a, t[2]);
        l.unlink(&mut a, t[4]);
        assert_eq!(order(&l, &a), vec![0, 1, 3]);
        l.unlink(&mut a, t[0]);
        assert_eq!(order(&l, &a), vec![1, 3]);
        l.pop_front(&a);
        l.unlink(&mut a, t[3]);
        assert!(l.is_empty() && l.front(&a).is_none());
        l.push_back(&mut a, t[4]);
        assert_eq!(order(&l, &a), vec![4]);
    }
}
