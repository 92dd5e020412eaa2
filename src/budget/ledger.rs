//! The usage ledger: what every tenant used, per day and model — the bill.
//!
//! A request that ends with usage adds to its row (tenant, day, model) in memory
//! ([`Pending::add`]: one short lock, nothing written); a flusher writes all pending rows to
//! the [`Sink`] every `[store] flush_ms` in one batch, and once more at shutdown. Rows only
//! ever add up (a write is an upsert that adds), so a flush that fails is put back and tried
//! again, and the ledger's totals are the sum of what every request reported.
//!
//! Durability bound: a crash (`kill -9`) loses the spend of the requests in flight and of those
//! that ended in the last `flush_ms`; a clean shutdown loses only the requests in flight.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use futures_util::future::BoxFuture;

use crate::domain::Usd;

/// A ledger row's key.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RowKey {
    /// The tenant id.
    pub tenant: String,
    /// `YYYY-MM-DD`, in `[store] timezone`.
    pub day: String,
    /// The model the request asked for.
    pub model: String,
}

/// What the requests of one row used.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Row {
    /// Requests that ended with usage.
    pub requests: u64,
    /// Input tokens (cached ones included).
    pub input_tokens: u64,
    /// Of those, cached.
    pub cached_input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
    /// What they cost.
    pub cost: Usd,
}

impl Row {
    /// Adds `o`.
    pub fn add(&mut self, o: &Row) {
        self.requests = self.requests.saturating_add(o.requests);
        self.input_tokens = self.input_tokens.saturating_add(o.input_tokens);
        self.cached_input_tokens = self
            .cached_input_tokens
            .saturating_add(o.cached_input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(o.output_tokens);
        self.cost = Usd(self.cost.0.saturating_add(o.cost.0));
    }
}

/// Rows to read: `tenant` (all when `None`), days `from..=to` (`YYYY-MM-DD`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Query {
    /// One tenant, or all.
    pub tenant: Option<String>,
    /// First day (inclusive).
    pub from: String,
    /// Last day (inclusive).
    pub to: String,
}

impl Query {
    /// Whether `k` is asked for.
    pub fn wants(&self, k: &RowKey) -> bool {
        self.tenant.as_ref().is_none_or(|t| *t == k.tenant)
            && k.day.as_str() >= self.from.as_str()
            && k.day.as_str() <= self.to.as_str()
    }
}

/// Error of a sink (its message; never a key or a prompt).
pub type SinkError = String;

/// One flush: the rows to add, and (cluster mode) the shared reservations it settles.
#[derive(Clone, Debug, Default)]
pub struct Batch {
    /// Unique per batch (a retried batch keeps it: Redis applies it once).
    pub id: String,
    /// Rows to add.
    pub rows: Vec<(RowKey, Row)>,
    /// (tenant, reservation) settled by this batch (`budget::redis`; ignored elsewhere).
    pub released: Vec<(String, String)>,
}

/// Where the ledger is kept: SQLite (`[store]`), Redis (`[cluster]`), or memory.
pub trait Sink: Send + Sync + 'static {
    /// Adds `rows` to what is stored (one transaction).
    fn write(&self, rows: Vec<(RowKey, Row)>) -> BoxFuture<'_, Result<(), SinkError>>;
    /// Adds a batch (one transaction; by default its rows alone).
    fn write_batch(&self, batch: Batch) -> BoxFuture<'_, Result<(), SinkError>> {
        self.write(batch.rows)
    }
    /// The stored rows `q` asks for, sorted by key.
    fn read(&self, q: Query) -> BoxFuture<'_, Result<Vec<(RowKey, Row)>, SinkError>>;
    /// Deletes rows of days before `day`.
    fn prune(&self, day: String) -> BoxFuture<'_, Result<u64, SinkError>>;
}

/// Rows not yet written.
#[derive(Debug, Default)]
pub struct Pending(Mutex<HashMap<RowKey, Row>>);

impl Pending {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<RowKey, Row>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds one request's use to its row.
    pub fn add(&self, key: RowKey, row: Row) {
        self.lock().entry(key).or_default().add(&row);
    }

    /// Takes every pending row (and the table that held them: a burst of 10,000 tenants'
    /// rows does not keep its table between flushes).
    pub fn take(&self) -> Vec<(RowKey, Row)> {
        std::mem::take(&mut *self.lock()).into_iter().collect()
    }

    /// Puts rows back (a write that failed).
    pub fn put_back(&self, rows: Vec<(RowKey, Row)>) {
        let mut m = self.lock();
        for (k, r) in rows {
            m.entry(k).or_default().add(&r);
        }
    }

    /// Pending rows `q` asks for.
    pub fn read(&self, q: &Query) -> Vec<(RowKey, Row)> {
        self.lock()
            .iter()
            .filter(|(k, _)| q.wants(k))
            .map(|(k, r)| (k.clone(), *r))
            .collect()
    }

    /// How many rows are pending.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Adds `more` into `rows` (sorted by key).
pub fn merge(rows: Vec<(RowKey, Row)>, more: Vec<(RowKey, Row)>) -> Vec<(RowKey, Row)> {
    let mut m: BTreeMap<RowKey, Row> = rows.into_iter().collect();
    for (k, r) in more {
        m.entry(k).or_default().add(&r);
    }
    m.into_iter().collect()
}

/// The ledger in memory only (no `[store]`): a restart forgets it.
#[derive(Debug, Default)]
pub struct MemorySink(Mutex<BTreeMap<RowKey, Row>>);

impl Sink for MemorySink {
    fn write(&self, rows: Vec<(RowKey, Row)>) -> BoxFuture<'_, Result<(), SinkError>> {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        for (k, r) in rows {
            m.entry(k).or_default().add(&r);
        }
        Box::pin(std::future::ready(Ok(())))
    }

    fn read(&self, q: Query) -> BoxFuture<'_, Result<Vec<(RowKey, Row)>, SinkError>> {
        let m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let rows = m
            .iter()
            .filter(|(k, _)| q.wants(k))
            .map(|(k, r)| (k.clone(), *r))
            .collect();
        Box::pin(std::future::ready(Ok(rows)))
    }

    fn prune(&self, day: String) -> BoxFuture<'_, Result<u64, SinkError>> {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let before = m.len();
        m.retain(|k, _| k.day >= day);
        Box::pin(std::future::ready(Ok((before - m.len()) as u64)))
    }
}
