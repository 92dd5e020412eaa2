//! The main listener's open client connections: the global and per-IP caps, idle tracking, and
//! shedding the oldest idle connections first.
//!
//! [`Registry::admit`] is called right after `accept`: a connection over `max_connections_per_ip`
//! is refused; one over `max_connections` takes the place of the oldest idle connection (which is
//! asked to close), or is refused when every connection is busy. A refused connection is closed
//! before a byte is read. [`Registry::shed_idle`] asks the oldest idle connections to close when
//! `accept` runs out of descriptors.
//!
//! Invariants: `open` and the per-IP counts change only under the registry's std mutex, which is
//! never held across `.await` and is taken once per connection (admit, close), never per request;
//! a request only touches its connection's atomics ([`Entry::begin`]). A connection is idle
//! when no request of it is in flight (response bodies included) and counts in exactly one of
//! `fairgate_connections{state="active"|"idle"}` from admission to the last reference to it.
//! A connection asked to shed is never chosen again, and does not count against the cap.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ::metrics::{Counter, Gauge};
use tokio::sync::Notify;
use tokio::time::Instant;

/// Why a connection was refused (the `reason` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// `[server] max_connections`, with no idle connection to shed.
    MaxConnections,
    /// `[server] max_connections_per_ip`.
    PerIp,
}

/// The metric handles the registry keeps up to date.
#[derive(Clone)]
pub struct Handles {
    active: Gauge,
    idle: Gauge,
    refused_max: Counter,
    refused_ip: Counter,
    shed_max: Counter,
    shed_fd: Counter,
}

impl Handles {
    /// Handles registered in `metrics` (`fairgate_connections{state}`,
    /// `fairgate_connections_refused_total{reason}`, `fairgate_connections_shed_total{reason}`).
    pub fn register(metrics: &crate::metrics::Metrics) -> Self {
        let refused = "fairgate_connections_refused_total";
        let shed = "fairgate_connections_shed_total";
        Self {
            active: metrics.labeled_gauge("fairgate_connections", "state", "active"),
            idle: metrics.labeled_gauge("fairgate_connections", "state", "idle"),
            refused_max: metrics.labeled_counter(refused, "reason", "max_connections"),
            refused_ip: metrics.labeled_counter(refused, "reason", "max_connections_per_ip"),
            shed_max: metrics.labeled_counter(shed, "reason", "max_connections"),
            shed_fd: metrics.labeled_counter(shed, "reason", "descriptors"),
        }
    }

    /// Handles that record nothing (tests).
    pub fn noop() -> Self {
        Self {
            active: Gauge::noop(),
            idle: Gauge::noop(),
            refused_max: Counter::noop(),
            refused_ip: Counter::noop(),
            shed_max: Counter::noop(),
            shed_fd: Counter::noop(),
        }
    }
}

/// One open connection's shared state.
pub struct Entry {
    id: u64,
    ip: IpAddr,
    epoch: Instant,
    inflight: AtomicU32,
    /// Milliseconds after `epoch` at which the connection last became idle.
    idle_since: AtomicU64,
    shed: AtomicBool,
    notify: Notify,
    handles: Handles,
}

impl Entry {
    /// The peer's address.
    pub fn ip(&self) -> IpAddr {
        self.ip
    }

    fn ms(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.epoch).as_millis() as u64
    }

    /// A request started; the returned guard ends it (drop it with the response body).
    pub fn begin(self: &Arc<Self>) -> Busy {
        if self.inflight.fetch_add(1, Ordering::AcqRel) == 0 {
            self.handles.idle.decrement(1.0);
            self.handles.active.increment(1.0);
        }
        Busy(self.clone())
    }

    /// When this connection will have been idle for `keepalive` (`None`: a request is in flight).
    pub fn idle_deadline(&self, keepalive: Duration) -> Option<Instant> {
        if self.inflight.load(Ordering::Acquire) > 0 {
            return None;
        }
        let since = self.epoch + Duration::from_millis(self.idle_since.load(Ordering::Acquire));
        Some(since + keepalive)
    }

    /// Resolves once the registry has asked this connection to close.
    pub async fn shed_requested(&self) {
        self.notify.notified().await;
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        // The last reference: every request guard is gone, so the connection counts as idle.
        self.handles.idle.decrement(1.0);
    }
}

/// A request in flight on its connection ([`Entry::begin`]).
pub struct Busy(Arc<Entry>);

impl Drop for Busy {
    fn drop(&mut self) {
        let e = &self.0;
        e.idle_since.store(e.ms(Instant::now()), Ordering::Release);
        if e.inflight.fetch_sub(1, Ordering::AcqRel) == 1 {
            e.handles.active.decrement(1.0);
            e.handles.idle.increment(1.0);
        }
    }
}

#[derive(Default)]
struct Inner {
    open: usize,
    shedding: usize,
    by_ip: HashMap<IpAddr, u32>,
    conns: HashMap<u64, Arc<Entry>>,
}

/// The open connections of the main listener (shared by every worker).
pub struct Registry {
    max: usize,
    per_ip: Option<u32>,
    epoch: Instant,
    next_id: AtomicU64,
    inner: Mutex<Inner>,
    handles: Handles,
}

/// An admitted connection; dropping it (when the connection ends) frees its place.
pub struct Guard {
    registry: Arc<Registry>,
    /// The connection's shared state.
    pub entry: Arc<Entry>,
    /// Whether admitting it asked an idle connection to close.
    pub shed: bool,
}

impl Registry {
    /// A registry capping connections at `max` in all and `per_ip` from one address.
    pub fn new(max: usize, per_ip: Option<u32>, handles: Handles) -> Arc<Self> {
        Arc::new(Self {
            max,
            per_ip,
            epoch: Instant::now(),
            next_id: AtomicU64::new(0),
            inner: Mutex::new(Inner::default()),
            handles,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Admits a connection from `ip`, shedding the oldest idle connection when at the cap.
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Result<Guard, Refusal> {
        let mut inner = self.lock();
        let from_ip = inner.by_ip.get(&ip).copied().unwrap_or(0);
        if self.per_ip.is_some_and(|cap| from_ip >= cap) {
            drop(inner);
            self.handles.refused_ip.increment(1);
            return Err(Refusal::PerIp);
        }
        let shed = inner.open - inner.shedding >= self.max;
        if shed {
            if Self::shed_oldest(&mut inner, 1) == 0 {
                drop(inner);
                self.handles.refused_max.increment(1);
                return Err(Refusal::MaxConnections);
            }
            self.handles.shed_max.increment(1);
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let entry = Arc::new(Entry {
            id,
            ip,
            epoch: self.epoch,
            inflight: AtomicU32::new(0),
            idle_since: AtomicU64::new(0),
            shed: AtomicBool::new(false),
            notify: Notify::new(),
            handles: self.handles.clone(),
        });
        entry
            .idle_since
            .store(entry.ms(Instant::now()), Ordering::Relaxed);
        self.handles.idle.increment(1.0);
        inner.open += 1;
        *inner.by_ip.entry(ip).or_insert(0) += 1;
        inner.conns.insert(id, entry.clone());
        Ok(Guard {
            registry: self.clone(),
            entry,
            shed,
        })
    }

    /// Asks up to `n` of the oldest idle connections to close (out of descriptors); how many.
    pub fn shed_idle(&self, n: usize) -> usize {
        let shed = Self::shed_oldest(&mut self.lock(), n);
        self.handles.shed_fd.increment(shed as u64);
        shed
    }

    /// Open connections (those asked to shed included).
    pub fn open(&self) -> usize {
        self.lock().open
    }

    /// Marks the `n` longest idle connections to shed and wakes them; how many it found.
    fn shed_oldest(inner: &mut Inner, n: usize) -> usize {
        let mut idle: Vec<(u64, &Arc<Entry>)> = inner
            .conns
            .values()
            .filter(|e| e.inflight.load(Ordering::Acquire) == 0 && !e.shed.load(Ordering::Relaxed))
            .map(|e| (e.idle_since.load(Ordering::Acquire), e))
            .collect();
        let n = n.min(idle.len());
        if n > 0 && n < idle.len() {
            idle.select_nth_unstable_by_key(n - 1, |(since, _)| *since);
        }
        for (_, e) in &idle[..n] {
            e.shed.store(true, Ordering::Relaxed);
            e.notify.notify_one();
        }
        inner.shedding += n;
        n
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let mut inner = self.registry.lock();
        inner.open -= 1;
        if self.entry.shed.load(Ordering::Relaxed) {
            inner.shedding -= 1;
        }
        if let Some(n) = inner.by_ip.get_mut(&self.entry.ip) {
            *n -= 1;
            if *n == 0 {
                inner.by_ip.remove(&self.entry.ip);
            }
        }
        inner.conns.remove(&self.entry.id);
    }
}

#[cfg(test)]
mod tests;
