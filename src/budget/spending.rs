//! The imperative shell around the [`Book`]: the shared spending state (kept across config
//! reloads), each generation's limits and prices ([`Budgets`]), and the [`Reservation`] a
//! request carries from admission to its end.
//!
//! Invariants: a reservation is settled exactly once — [`Reservation::commit`] with the usage,
//! or its `Drop` (a refund) — so a cancelled or never dispatched request gets its reservation
//! back; every committed request adds to the usage ledger in memory (nothing is written on the
//! request path; [`flush`] writes in batches); the clock is the wall clock (budget periods are
//! calendar dates), read through a [`Clock`] that tests replace.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::book::{Book, Limit, Remaining, Spend, Unit};
use super::error::Error;
use super::ledger::{MemorySink, Pending, Query, Row, RowKey, Sink};
use super::price::{Price, Prices, Used};
use super::window::{date_of, day_string, window};
use crate::config::{BudgetConfig, Config};
use crate::domain::{Charge, Period, TenantId, Usd, Zone};

/// Unix seconds now.
pub type Clock = Arc<dyn Fn() -> i64 + Send + Sync>;

/// The wall clock.
pub fn wall_clock() -> Clock {
    Arc::new(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
    })
}

/// Spending shared by every configuration generation: the book, the ledger rows not yet
/// written, the ledger's sink.
pub struct Spending {
    book: Mutex<Book>,
    zone: Zone,
    pending: Pending,
    sink: Arc<dyn Sink>,
    /// Held through a flush (take and write), so a flush that finds nothing pending also waits
    /// for one still writing (shutdown's last flush returns once everything is written).
    flushing: tokio::sync::Mutex<()>,
    clock: Clock,
    /// Soft thresholds passed, by (tenant, period, unit).
    warnings: Mutex<HashMap<(TenantId, Period, Unit), u64>>,
}

impl std::fmt::Debug for Spending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spending")
            .field("zone", &self.zone)
            .finish_non_exhaustive()
    }
}

impl Spending {
    /// Spending counted in `zone`, its ledger kept by `sink`, the time read from `clock`.
    pub fn new(zone: Zone, sink: Arc<dyn Sink>, clock: Clock) -> Arc<Self> {
        Arc::new(Self {
            book: Mutex::new(Book::new(zone.clone())),
            zone,
            pending: Pending::default(),
            sink,
            flushing: tokio::sync::Mutex::new(()),
            clock,
            warnings: Mutex::default(),
        })
    }

    /// The spending `config` asks for: counted in `[store] timezone` (UTC without `[store]`),
    /// the wall clock, the ledger in `[store] path` (in memory without `[store]`).
    pub fn for_config(config: &Config) -> Result<Arc<Self>, String> {
        let (zone, sink): (Zone, Arc<dyn Sink>) = match &config.store {
            Some(s) => (
                Zone::parse(&s.timezone)?,
                Arc::new(super::sqlite::SqliteSink::open(&s.path)?),
            ),
            None => (Zone::default(), Arc::new(MemorySink::default())),
        };
        Ok(Self::new(zone, sink, wall_clock()))
    }

    /// In memory only, UTC, the wall clock (tests, and a config without `[store]`).
    pub fn in_memory() -> Arc<Self> {
        Self::new(
            Zone::default(),
            Arc::new(MemorySink::default()),
            wall_clock(),
        )
    }

    fn book(&self) -> std::sync::MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Unix seconds now.
    pub fn now(&self) -> i64 {
        (self.clock)()
    }

    /// The calendar.
    pub fn zone(&self) -> &Zone {
        &self.zone
    }

    /// Reads this month's ledger back into the book (at startup, before serving): what was
    /// spent before a restart still counts.
    pub async fn restore(&self) -> Result<(), String> {
        let _no_flush = self.flushing.lock().await;
        let now = self.now();
        let month = window(&self.zone, Period::Month, now);
        let today = day_string(date_of(&self.zone, now));
        let q = Query {
            tenant: None,
            from: day_string(date_of(&self.zone, month.start)),
            to: today.clone(),
        };
        let rows = self.sink.read(q).await?;
        let mut book = self.book();
        for (k, r) in rows {
            let t = TenantId::new(k.tenant.as_str());
            let s = Spend {
                tokens: r.input_tokens.saturating_add(r.output_tokens),
                usd: r.cost,
            };
            book.restore(&t, Period::Month, s, now);
            if k.day == today {
                book.restore(&t, Period::Day, s, now);
            }
        }
        Ok(())
    }

    /// Writes every pending ledger row to the sink in one batch (put back if that fails).
    pub async fn flush(&self) -> Result<usize, String> {
        let _one_at_a_time = self.flushing.lock().await;
        let rows = self.pending.take();
        let n = rows.len();
        if n == 0 {
            return Ok(0);
        }
        if let Err(e) = self.sink.write(rows.clone()).await {
            self.pending.put_back(rows);
            return Err(e);
        }
        Ok(n)
    }

    /// The ledger rows `q` asks for: those written and those pending, added up.
    pub async fn usage(&self, q: Query) -> Result<Vec<(RowKey, Row)>, String> {
        // Not while a flush has rows in hand (neither pending nor stored yet).
        let _no_flush = self.flushing.lock().await;
        let stored = self.sink.read(q.clone()).await?;
        Ok(super::ledger::merge(stored, self.pending.read(&q)))
    }

    /// Deletes ledger rows older than `days` days.
    pub async fn prune(&self, days: u32) -> Result<u64, String> {
        let cut = self.now().saturating_sub(i64::from(days) * 86_400);
        self.sink.prune(day_string(date_of(&self.zone, cut))).await
    }

    /// Rows waiting for the next flush.
    pub fn pending_rows(&self) -> usize {
        self.pending.len()
    }

    /// What is left of `limits` for `tenant` now.
    pub fn remaining(&self, tenant: &TenantId, limits: &[Limit]) -> Remaining {
        let now = self.now();
        self.book().remaining(tenant, limits, now)
    }

    /// What is left of each of `limits` for `tenant` now, in their order.
    pub fn left(&self, tenant: &TenantId, limits: &[Limit]) -> Vec<u64> {
        let now = self.now();
        let mut book = self.book();
        limits.iter().map(|l| book.left(tenant, l, now)).collect()
    }

    /// Spent by `tenant` in the `period` window now.
    pub fn spent(&self, tenant: &TenantId, period: Period) -> Spend {
        let now = self.now();
        self.book().spent(tenant, period, now)
    }

    /// Soft thresholds passed so far, by (tenant, period, unit).
    pub fn warnings(&self) -> Vec<((TenantId, Period, Unit), u64)> {
        let w = self.warnings.lock().unwrap_or_else(|p| p.into_inner());
        w.iter().map(|(k, v)| (k.clone(), *v)).collect()
    }
}

/// Writes the ledger every `every` until `stop` turns true, then once more; prunes rows older
/// than `retention_days` at start and once a day.
pub async fn run_flusher(
    spending: Arc<Spending>,
    every: Duration,
    retention_days: u32,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut pruned_at: Option<tokio::time::Instant> = None;
    loop {
        let stopping = tokio::select! {
            _ = tick.tick() => false,
            _ = stop.changed() => true,
        } || *stop.borrow();
        if let Err(e) = spending.flush().await {
            tracing::error!(error = %e, pending = spending.pending_rows(), "usage ledger not written; kept for the next flush");
        }
        if stopping {
            return;
        }
        if pruned_at.is_none_or(|t| t.elapsed() >= Duration::from_secs(86_400)) {
            pruned_at = Some(tokio::time::Instant::now());
            match spending.prune(retention_days).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(rows = n, "usage ledger rows past retention deleted"),
                Err(e) => tracing::warn!(error = %e, "usage ledger retention not applied"),
            }
        }
    }
}

fn limit(b: &BudgetConfig) -> Limit {
    let (unit, amount) = match (b.tokens, b.usd) {
        (Some(t), _) => (Unit::Tokens, t),
        (None, usd) => (Unit::Usd, Usd::from_dollars(usd.unwrap_or(0.0)).0),
    };
    Limit {
        period: b.period,
        unit,
        amount,
        warn_at: b.warn_at,
    }
}

/// One configuration generation's budgets (limits per tenant, prices) over the shared
/// [`Spending`].
#[derive(Debug)]
pub struct Budgets {
    spending: Arc<Spending>,
    limits: HashMap<TenantId, Arc<[Limit]>>,
    prices: Prices,
}

impl Budgets {
    /// The budgets and prices of `config`.
    pub fn new(config: &Config, spending: Arc<Spending>) -> Self {
        let limits = config
            .tenants
            .iter()
            .filter_map(|t| {
                let b = t.effective_budgets(config);
                (!b.is_empty())
                    .then(|| (TenantId::new(t.id.as_str()), b.iter().map(limit).collect()))
            })
            .collect();
        Self {
            spending,
            limits,
            prices: Prices::from_config(&config.prices),
        }
    }

    /// The shared spending.
    pub fn spending(&self) -> &Arc<Spending> {
        &self.spending
    }

    /// The budgets of `tenant`, if it has any.
    pub fn limits(&self, tenant: &TenantId) -> Option<&Arc<[Limit]>> {
        self.limits.get(tenant)
    }

    /// Every tenant with budgets.
    pub fn budgeted(&self) -> impl Iterator<Item = (&TenantId, &Arc<[Limit]>)> {
        self.limits.iter()
    }

    /// The price of `model`.
    pub fn price(&self, model: &str) -> Option<Price> {
        self.prices.of(model)
    }

    /// Reserves a request's estimate (`est`: counted input, output cap) against every budget of
    /// `tenant`, priced as `model`; refused with the budget that cannot cover it.
    pub fn reserve(
        &self,
        tenant: &TenantId,
        model: &str,
        est: Charge,
    ) -> Result<Reservation, Error> {
        let price = self.price(model);
        let limits = self.limits(tenant).cloned();
        let est = Spend {
            tokens: est.total().0,
            usd: price.map_or(Usd(0), |p| {
                p.cost(Used {
                    input: est.input,
                    cached: 0,
                    output: est.output,
                })
            }),
        };
        let mut remaining = Remaining::default();
        if let Some(l) = &limits {
            let now = self.spending.now();
            remaining = self
                .spending
                .book()
                .reserve(tenant, l, est, now)
                .map_err(Error::Exhausted)?;
        }
        Ok(Reservation {
            spending: self.spending.clone(),
            tenant: tenant.clone(),
            model: model.to_owned(),
            limits,
            price,
            est,
            remaining,
            settled: false,
        })
    }
}

/// A request's reservation, from admission to its end; see the module docs.
#[derive(Debug)]
pub struct Reservation {
    spending: Arc<Spending>,
    tenant: TenantId,
    model: String,
    limits: Option<Arc<[Limit]>>,
    price: Option<Price>,
    est: Spend,
    remaining: Remaining,
    settled: bool,
}

impl Reservation {
    /// What was left of the tenant's budgets once this request was reserved (`None`s: it has
    /// none).
    pub fn remaining(&self) -> Remaining {
        self.remaining
    }

    /// Whether the tenant has budgets.
    pub fn budgeted(&self) -> bool {
        self.limits.is_some()
    }

    /// Settles with what the provider reported: the book, the ledger row, the soft thresholds.
    pub fn commit(mut self, used: Used) {
        self.settled = true;
        let s = &self.spending;
        let now = s.now();
        let cost = self.price.map_or(Usd(0), |p| p.cost(used));
        if let Some(limits) = &self.limits {
            let actual = Spend {
                tokens: used.tokens(),
                usd: cost,
            };
            let warnings = s.book().commit(&self.tenant, limits, self.est, actual, now);
            for w in warnings {
                tracing::warn!(
                    tenant = %self.tenant,
                    period = w.limit.period.name(),
                    unit = w.limit.unit.name(),
                    spent = w.spent,
                    budget = w.limit.amount,
                    warn_at = w.limit.warn_at.unwrap_or(1.0),
                    "budget warning threshold passed"
                );
                let key = (self.tenant.clone(), w.limit.period, w.limit.unit);
                *s.warnings
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .entry(key)
                    .or_default() += 1;
            }
        }
        s.pending.add(
            RowKey {
                tenant: self.tenant.to_string(),
                day: day_string(date_of(&s.zone, now)),
                model: std::mem::take(&mut self.model),
            },
            Row {
                requests: 1,
                input_tokens: used.input,
                cached_input_tokens: used.cached.min(used.input),
                output_tokens: used.output,
                cost,
            },
        );
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if !self.settled && self.limits.is_some() {
            self.spending.book().refund(&self.tenant, self.est);
        }
    }
}
