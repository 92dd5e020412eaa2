//! A generational arena of queued requests, addressed by [`Ticket`].
//!
//! Invariants: a `Ticket` names at most one live entry, ever — a slot's generation is bumped on
//! every removal, so a stale ticket (cancelled, dispatched or aged) never reaches a newer entry.
//! Removal here is O(1). Each slot also carries the links of the intrusive per-tenant lists
//! (`list.rs`) that DRR queues its tickets in, so reaching a tenant's head request and its queue
//! links costs one memory access, not one per structure.

use std::time::Duration;

use super::{Lane, TenantKey};

/// Handle of one queued request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ticket {
    idx: u32,
    gen: u32,
}

/// One queued request and where it waits.
#[derive(Debug)]
pub(crate) struct Entry<T> {
    pub tenant: TenantKey,
    pub lane: Lane,
    pub enqueued_at: Duration,
    /// Arrival order across the whole pool (FIFO uses it).
    pub seq: u64,
    pub item: T,
}

#[derive(Debug)]
struct Slot<T> {
    gen: u32,
    /// Links of the list (if any) this slot's ticket is queued in; see `list.rs`.
    link: Link,
    entry: Option<Entry<T>>,
}

/// Neighbours of a slot in a [`super::list::TicketList`]; `NIL` for none. Meaningful only while
/// the slot is linked into a list (a head's `prev` is not maintained).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Link {
    pub prev: u32,
    pub next: u32,
}

/// "No slot" in a [`Link`].
pub(crate) const NIL: u32 = u32::MAX;

impl Link {
    const NONE: Link = Link {
        prev: NIL,
        next: NIL,
    };
}

/// Slab of entries with a free list.
#[derive(Debug)]
pub(crate) struct Arena<T> {
    slots: Vec<Slot<T>>,
    free: Vec<u32>,
    live: usize,
}

impl<T> Default for Arena<T> {
    fn default() -> Self {
        Self {
            slots: Vec::new(),
            free: Vec::new(),
            live: 0,
        }
    }
}

impl<T> Arena<T> {
    /// Stores `entry`, returning its ticket.
    pub fn insert(&mut self, entry: Entry<T>) -> Ticket {
        self.live += 1;
        if let Some(idx) = self.free.pop() {
            let slot = &mut self.slots[idx as usize];
            slot.entry = Some(entry);
            return Ticket { idx, gen: slot.gen };
        }
        let idx = u32::try_from(self.slots.len()).expect("fewer than 2^32 queued requests");
        self.slots.push(Slot {
            gen: 0,
            link: Link::NONE,
            entry: Some(entry),
        });
        Ticket { idx, gen: 0 }
    }

    /// The live entry `t` names, if any.
    pub fn get(&self, t: Ticket) -> Option<&Entry<T>> {
        let slot = self.slots.get(t.idx as usize)?;
        if slot.gen == t.gen {
            slot.entry.as_ref()
        } else {
            None
        }
    }

    /// Mutable access to the live entry `t` names, if any.
    pub fn get_mut(&mut self, t: Ticket) -> Option<&mut Entry<T>> {
        let slot = self.slots.get_mut(t.idx as usize)?;
        if slot.gen == t.gen {
            slot.entry.as_mut()
        } else {
            None
        }
    }

    /// Removes and returns the live entry `t` names; the ticket is dead afterwards.
    pub fn remove(&mut self, t: Ticket) -> Option<Entry<T>> {
        let slot = self.slots.get_mut(t.idx as usize)?;
        if slot.gen != t.gen {
            return None;
        }
        let entry = slot.entry.take()?;
        slot.gen = slot.gen.wrapping_add(1);
        self.free.push(t.idx);
        self.live -= 1;
        Some(entry)
    }

    /// The ticket currently naming slot `idx` (live or not).
    pub fn ticket_at(&self, idx: u32) -> Ticket {
        Ticket {
            idx,
            gen: self.slots[idx as usize].gen,
        }
    }

    /// The slot index a ticket names.
    pub fn index(t: Ticket) -> u32 {
        t.idx
    }

    /// Prefetch hint for slot `idx` (ignored if out of range).
    pub fn prefetch(&self, idx: u32) {
        if let Some(slot) = self.slots.get(idx as usize) {
            super::prefetch::prefetch(slot);
        }
    }

    /// List links of slot `idx`.
    pub fn link(&self, idx: u32) -> Link {
        self.slots[idx as usize].link
    }

    /// Mutable list links of slot `idx`.
    pub fn link_mut(&mut self, idx: u32) -> &mut Link {
        &mut self.slots[idx as usize].link
    }

    /// Live entries, in slot order.
    pub fn iter(&self) -> impl Iterator<Item = &Entry<T>> {
        self.slots.iter().filter_map(|s| s.entry.as_ref())
    }

    /// Number of live entries.
    pub fn len(&self) -> usize {
        self.live
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(n: u32) -> Entry<u32> {
        Entry {
            tenant: TenantKey(0),
            lane: Lane::Interactive,
            enqueued_at: Duration::ZERO,
            seq: 0,
            item: n,
        }
    }

    #[test]
    fn stale_tickets_never_reach_newer_entries() {
        let mut a = Arena::default();
        let t1 = a.insert(entry(1));
        assert_eq!(a.remove(t1).map(|e| e.item), Some(1));
        let t2 = a.insert(entry(2));
        assert_ne!(t1, t2);
        assert!(a.get(t1).is_none());
        assert!(a.remove(t1).is_none());
        assert_eq!(a.get(t2).map(|e| e.item), Some(2));
        assert_eq!(a.len(), 1);
    }
}
