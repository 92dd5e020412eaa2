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
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::book::{Book, Limit, Remaining, Spend, Unit};
use super::error::Error;
use super::ledger::{Batch, MemorySink, Pending, Query, Row, RowKey, Sink};
use super::price::{Price, Prices, Used};
use super::redis::Shared;
use super::window::{date_of, day_string, window, Window};
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
    /// Cluster mode: the budgets shared in Redis (also the `sink`); the book then mirrors it.
    shared: Option<Arc<Shared>>,
    /// Cluster mode: reservations settled here, deleted in Redis by the next flush.
    released: Mutex<Vec<(String, String)>>,
    /// A batch whose write failed, sent again as it is (same id) before any other.
    retry: Mutex<Option<Batch>>,
    batches: AtomicU64,
    nonce: u32,
    /// Held through a flush (take and write), so a flush that finds nothing pending also waits
    /// for one still writing (shutdown's last flush returns once everything is written).
    flushing: tokio::sync::Mutex<()>,
    clock: Clock,
    /// Soft thresholds passed, by (tenant, period, unit).
    warnings: Mutex<HashMap<(TenantId, Period, Unit), u64>>,
    /// The ledger's `day` of the last commit and the window it holds for: every request's row
    /// names its day, which is computed (a time-zone conversion and a format) once a day.
    today: Mutex<Option<(Window, String)>>,
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
        Self::build(zone, sink, None, clock)
    }

    /// Spending shared by the replicas of a cluster through `shared` (budgets and ledger).
    pub fn shared(zone: Zone, shared: Arc<Shared>, clock: Clock) -> Arc<Self> {
        Self::build(zone, shared.clone(), Some(shared), clock)
    }

    fn build(
        zone: Zone,
        sink: Arc<dyn Sink>,
        shared: Option<Arc<Shared>>,
        clock: Clock,
    ) -> Arc<Self> {
        Arc::new(Self {
            book: Mutex::new(Book::new(zone.clone())),
            zone,
            pending: Pending::default(),
            sink,
            shared,
            released: Mutex::default(),
            retry: Mutex::default(),
            batches: AtomicU64::new(0),
            nonce: rand::random(),
            flushing: tokio::sync::Mutex::new(()),
            clock,
            warnings: Mutex::default(),
            today: Mutex::default(),
        })
    }

    /// The ledger's `day` of `now` (`YYYY-MM-DD` in the zone).
    fn day(&self, now: i64) -> String {
        let mut today = self.today.lock().unwrap_or_else(|p| p.into_inner());
        match &*today {
            Some((w, day)) if w.holds(now) => day.clone(),
            _ => {
                let day = day_string(date_of(&self.zone, now));
                *today = Some((window(&self.zone, Period::Day, now), day.clone()));
                day
            }
        }
    }

    /// The spending `config` asks for: counted in `[store] timezone` (UTC without `[store]`),
    /// the wall clock, the budgets and ledger in `shared` (cluster mode), else the ledger in
    /// `[store] path` (in memory without `[store]`).
    pub fn for_config(config: &Config, shared: Option<Arc<Shared>>) -> Result<Arc<Self>, String> {
        if let Some(shared) = shared {
            let zone = match &config.store {
                Some(s) => Zone::parse(&s.timezone)?,
                None => Zone::default(),
            };
            return Ok(Self::shared(zone, shared, wall_clock()));
        }
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
    /// In cluster mode there is nothing to restore: Redis holds the spend.
    pub async fn restore(&self) -> Result<(), String> {
        if self.shared.is_some() {
            return Ok(());
        }
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

    /// Writes every pending ledger row (and, in cluster mode, the reservations settled) to the
    /// sink in one batch; a batch that fails is kept and sent again, as it is, first.
    /// In cluster mode a flush is sent even when empty: it renews this replica's holder key.
    pub async fn flush(&self) -> Result<usize, String> {
        let _one_at_a_time = self.flushing.lock().await;
        let retry = self.retry.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(b) = retry {
            if let Err(e) = self.sink.write_batch(b.clone()).await {
                *self.retry.lock().unwrap_or_else(|p| p.into_inner()) = Some(b);
                return Err(e);
            }
        }
        // Released first, rows second: a request settled meanwhile has its row in this batch
        // whenever its release is (it adds its row first), so it is never counted nowhere.
        let released =
            std::mem::take(&mut *self.released.lock().unwrap_or_else(|p| p.into_inner()));
        let rows = self.pending.take();
        let n = rows.len();
        if n == 0 && released.is_empty() && self.shared.is_none() {
            return Ok(0);
        }
        let id = self.batches.fetch_add(1, Ordering::Relaxed);
        let batch = Batch {
            id: format!("{:08x}:{id}", self.nonce),
            rows,
            released,
        };
        if let Err(e) = self.sink.write_batch(batch.clone()).await {
            *self.retry.lock().unwrap_or_else(|p| p.into_inner()) = Some(batch);
            return Err(e);
        }
        Ok(n)
    }

    fn retry_rows(&self) -> Vec<(RowKey, Row)> {
        let r = self.retry.lock().unwrap_or_else(|p| p.into_inner());
        r.as_ref().map(|b| b.rows.clone()).unwrap_or_default()
    }

    fn release(&self, tenant: &TenantId, field: String) {
        let mut r = self.released.lock().unwrap_or_else(|p| p.into_inner());
        r.push((tenant.to_string(), field));
    }

    /// The ledger rows `q` asks for: those written and those pending, added up.
    pub async fn usage(&self, q: Query) -> Result<Vec<(RowKey, Row)>, String> {
        // Not while a flush has rows in hand (neither pending nor stored yet).
        let _no_flush = self.flushing.lock().await;
        let stored = self.sink.read(q.clone()).await?;
        let mut pending = self.pending.read(&q);
        pending.extend(self.retry_rows().into_iter().filter(|(k, _)| q.wants(k)));
        Ok(super::ledger::merge(stored, pending))
    }

    /// Deletes ledger rows older than `days` days.
    pub async fn prune(&self, days: u32) -> Result<u64, String> {
        let cut = self.now().saturating_sub(i64::from(days) * 86_400);
        self.sink.prune(day_string(date_of(&self.zone, cut))).await
    }

    /// Rows waiting for the next flush.
    pub fn pending_rows(&self) -> usize {
        let retry = self.retry.lock().unwrap_or_else(|p| p.into_inner());
        self.pending.len() + retry.as_ref().map_or(0, |b| b.rows.len())
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

    /// Reserved by `tenant`'s requests in flight (cluster mode: on every replica, as last
    /// counted).
    pub fn reserved(&self, tenant: &TenantId) -> Spend {
        self.book().reserved(tenant)
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
    pub async fn reserve(
        &self,
        tenant: &TenantId,
        model: &str,
        est: Charge,
    ) -> Result<Reservation, Error> {
        let price = self.price(model);
        let limits = self.limits(tenant).cloned();
        let est_output = est.output;
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
        let mut field = None;
        if let Some(l) = &limits {
            let s = &self.spending;
            match &s.shared {
                Some(shared) => {
                    let f = shared.field();
                    remaining = s.reserve_shared(shared, tenant, l, est, &f).await?;
                    field = Some(f);
                }
                None => {
                    let now = s.now();
                    remaining = s
                        .book()
                        .reserve(tenant, l, est, now)
                        .map_err(Error::Exhausted)?;
                }
            }
        }
        Ok(Reservation {
            field,
            spending: self.spending.clone(),
            tenant: tenant.clone(),
            model: model.to_owned(),
            limits,
            price,
            est,
            output: est_output,
            remaining,
            settled: false,
        })
    }
}

impl Spending {
    /// Reserves `est` in Redis as `field` (one retry after a failed call: the same field, so
    /// it is reserved once); the book mirrors what Redis counted. Fails closed: Redis not
    /// answering is [`Error::Unavailable`].
    async fn reserve_shared(
        &self,
        shared: &Shared,
        tenant: &TenantId,
        limits: &[Limit],
        est: Spend,
        field: &str,
    ) -> Result<Remaining, Error> {
        let now = self.now();
        let day = day_string(date_of(&self.zone, now));
        let mut failed = false;
        let mut counted = None;
        for _ in 0..2 {
            counted = shared
                .reserve(tenant.as_str(), field, limits, est, &day)
                .await;
            if counted.is_some() {
                break;
            }
            failed = true;
        }
        let Some(c) = counted else {
            // The call may have run: its reservation is deleted by the next flush.
            self.release(tenant, field.to_owned());
            return Err(Error::Unavailable);
        };
        let mut book = self.book();
        book.observe(tenant, c.day, c.month, c.reserved, now);
        if c.admitted {
            if let Ok(r) = book.reserve(tenant, limits, est, now) {
                return Ok(r);
            }
            // Redis admitted what this book refuses (a day boundary between the two): Redis
            // holds the reservation, so it stands.
            book.observe(tenant, c.day, c.month, c.reserved.plus(est), now);
            return Ok(book.remaining(tenant, limits, now));
        }
        if failed {
            self.release(tenant, field.to_owned());
        }
        let refusal = book.refusal(tenant, limits, est, now);
        Err(Error::Exhausted(
            refusal.expect("a budgeted tenant has limits"),
        ))
    }
}

/// A request's reservation, from admission to its end; see the module docs.
#[derive(Debug)]
pub struct Reservation {
    /// Cluster mode: its name in Redis.
    field: Option<String>,
    spending: Arc<Spending>,
    tenant: TenantId,
    model: String,
    limits: Option<Arc<[Limit]>>,
    price: Option<Price>,
    /// Reserved: the estimate, grown by a stream's output past it ([`Reservation::step`]).
    est: Spend,
    /// The output tokens `est` covers.
    output: u64,
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

    /// A stream has produced `output` tokens so far: what passed the reservation is reserved
    /// too, if every budget can cover it. `false`: one cannot (the stream passed a budget; the
    /// caller may end it), and the reservation stays as it was. In cluster mode the check is
    /// against this replica's mirror of what Redis counted (Redis sees the use at settlement).
    pub fn step(&mut self, output: u64) -> bool {
        let Some(limits) = &self.limits else {
            return true;
        };
        if output <= self.output {
            return true;
        }
        let more = output - self.output;
        let extra = Spend {
            tokens: more,
            usd: self.price.map_or(Usd(0), |p| {
                p.cost(Used {
                    input: 0,
                    cached: 0,
                    output: more,
                })
            }),
        };
        let now = self.spending.now();
        let fits = self
            .spending
            .book()
            .reserve(&self.tenant, limits, extra, now)
            .is_ok();
        if fits {
            self.est = self.est.plus(extra);
            self.output = output;
        }
        fits
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
                tenant: self.tenant.as_str().to_owned(),
                day: s.day(now),
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
        // After the row (see `Spending::flush`).
        if let Some(f) = self.field.take() {
            s.release(&self.tenant, f);
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if !self.settled && self.limits.is_some() {
            self.spending.book().refund(&self.tenant, self.est);
        }
        if let Some(f) = self.field.take() {
            self.spending.release(&self.tenant, f);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ledger_day_is_the_zones_and_changes_at_its_midnight() {
        let at = |s: &str| s.parse::<jiff::Timestamp>().unwrap().as_second();
        let now = Arc::new(AtomicU64::new(at("2026-12-01T22:59:59Z") as u64));
        let clock: Clock = {
            let now = now.clone();
            Arc::new(move || now.load(Ordering::Relaxed) as i64)
        };
        let berlin = Zone::parse("Europe/Berlin").unwrap();
        let s = Spending::new(berlin, Arc::new(MemorySink::default()), clock);
        // Berlin is UTC+1 in December: its 2 December starts at 23:00 UTC on the 1st.
        for (t, day) in [
            ("2026-12-01T22:59:59Z", "2026-12-01"),
            ("2026-12-01T23:00:00Z", "2026-12-02"),
            ("2026-12-02T12:00:00Z", "2026-12-02"),
            ("2026-12-02T22:59:59Z", "2026-12-02"),
            ("2026-12-02T23:00:00Z", "2026-12-03"),
            // A clock set back: the day of the moment, not the last one cached.
            ("2026-12-01T10:00:00Z", "2026-12-01"),
        ] {
            now.store(at(t) as u64, Ordering::Relaxed);
            assert_eq!(s.day(s.now()), day, "at {t}");
        }
    }
}
