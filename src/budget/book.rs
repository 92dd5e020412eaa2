//! The budget book: every tenant's spend in its current day and month, and what its requests
//! in flight have reserved.
//!
//! Admission [`Book::reserve`]s a request's estimate against every budget of its tenant before
//! it is queued; when it ends, the reservation is settled exactly once: [`Book::commit`] with
//! what the provider reported, or [`Book::refund`] (cancelled, never dispatched, no usage).
//!
//! Invariants:
//! - a reservation passes only if, for every budget, `spent + reserved + estimate ≤ amount`:
//!   requests in flight are counted at their estimate, so concurrent requests cannot jointly
//!   pass a budget by more than their estimate error (Σ max(0, actual − estimate)); with
//!   estimates that are upper bounds (the output cap), never at all (`tests::proptest`);
//! - spend is counted in the window in which the request ends (the ledger's day is that day);
//!   a window that ends starts the next one at zero, reservations in flight carried over;
//! - a clock that steps back never reopens a finished window.
//!
//! Pure: no clock (`now` is Unix seconds, an argument), no I/O, no locks.

use std::collections::HashMap;

use super::window::{window, Window};
use crate::domain::{Period, TenantId, Usd, Zone};

/// Tokens and money.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Spend {
    /// Tokens (input + output).
    pub tokens: u64,
    /// Money.
    pub usd: Usd,
}

impl Spend {
    /// The amount of `unit`.
    pub fn of(self, unit: Unit) -> u64 {
        match unit {
            Unit::Tokens => self.tokens,
            Unit::Usd => self.usd.0,
        }
    }

    /// The sum.
    pub fn plus(self, o: Spend) -> Spend {
        Spend {
            tokens: self.tokens.saturating_add(o.tokens),
            usd: Usd(self.usd.0.saturating_add(o.usd.0)),
        }
    }

    fn minus(self, o: Spend) -> Spend {
        Spend {
            tokens: self.tokens.saturating_sub(o.tokens),
            usd: Usd(self.usd.0.saturating_sub(o.usd.0)),
        }
    }
}

/// What a budget counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Unit {
    /// Tokens, input + output.
    Tokens,
    /// USD (picodollars).
    Usd,
}

impl Unit {
    /// Both units.
    pub const ALL: [Unit; 2] = [Unit::Tokens, Unit::Usd];

    /// `tokens` or `usd`.
    pub fn name(self) -> &'static str {
        match self {
            Unit::Tokens => "tokens",
            Unit::Usd => "usd",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// One budget: at most `amount` of `unit` per `period`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Limit {
    /// Day or month.
    pub period: Period,
    /// Tokens or USD.
    pub unit: Unit,
    /// Tokens, or picodollars.
    pub amount: u64,
    /// Fraction at which a [`Warning`] is raised, once per window.
    pub warn_at: Option<f64>,
}

/// What is left of a tenant's budgets: the least left of each unit (`None`: no budget of it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Remaining {
    /// Tokens left.
    pub tokens: Option<u64>,
    /// Money left.
    pub usd: Option<Usd>,
}

impl Remaining {
    fn note(&mut self, unit: Unit, left: u64) {
        match unit {
            Unit::Tokens => self.tokens = Some(self.tokens.map_or(left, |t| t.min(left))),
            Unit::Usd => self.usd = Some(Usd(self.usd.map_or(left, |u| u.0.min(left)))),
        }
    }
}

/// A reservation refused: the budget that cannot cover it (of those that cannot, the one that
/// resets last, so the wait is honest).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Exhausted {
    /// The budget.
    pub limit: Limit,
    /// Spent and reserved in its window.
    pub used: u64,
    /// Seconds until its window resets.
    pub resets_in: u64,
    /// What is left of every budget.
    pub remaining: Remaining,
}

/// A soft threshold crossed (`warn_at`), once per budget and window.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Warning {
    /// The budget.
    pub limit: Limit,
    /// Spent in its window.
    pub spent: u64,
}

#[derive(Clone, Debug)]
struct Account {
    /// The current window and its spend, per period.
    windows: [(Window, Spend); 2],
    reserved: Spend,
    /// The window start in which each (period, unit) warned.
    warned: [[Option<i64>; 2]; 2],
}

impl Account {
    fn new(zone: &Zone, now: i64) -> Self {
        let w = |p| (window(zone, p, now), Spend::default());
        Self {
            windows: [w(Period::Day), w(Period::Month)],
            reserved: Spend::default(),
            warned: [[None; 2]; 2],
        }
    }

    fn roll(&mut self, zone: &Zone, now: i64) {
        for (i, p) in Period::ALL.into_iter().enumerate() {
            if now >= self.windows[i].0.end {
                self.windows[i] = (window(zone, p, now), Spend::default());
            }
        }
    }

    fn slot(p: Period) -> usize {
        match p {
            Period::Day => 0,
            Period::Month => 1,
        }
    }

    fn used(&self, l: &Limit) -> u64 {
        let spent = self.windows[Self::slot(l.period)].1;
        spent.of(l.unit).saturating_add(self.reserved.of(l.unit))
    }

    fn remaining(&self, limits: &[Limit]) -> Remaining {
        let mut r = Remaining::default();
        for l in limits {
            r.note(l.unit, l.amount.saturating_sub(self.used(l)));
        }
        r
    }
}

/// See the module docs.
#[derive(Clone, Debug, Default)]
pub struct Book {
    zone: Zone,
    accounts: HashMap<TenantId, Account>,
}

impl Book {
    /// An empty book counting periods in `zone`.
    pub fn new(zone: Zone) -> Self {
        Self {
            zone,
            accounts: HashMap::new(),
        }
    }

    /// The calendar.
    pub fn zone(&self) -> &Zone {
        &self.zone
    }

    fn account(&mut self, tenant: &TenantId, now: i64) -> &mut Account {
        let zone = &self.zone;
        let a = self
            .accounts
            .entry(tenant.clone())
            .or_insert_with(|| Account::new(zone, now));
        a.roll(zone, now);
        a
    }

    /// Reserves `est` against every one of `limits`, or says which cannot cover it.
    pub fn reserve(
        &mut self,
        tenant: &TenantId,
        limits: &[Limit],
        est: Spend,
        now: i64,
    ) -> Result<Remaining, Exhausted> {
        if let Some(r) = self.check(tenant, limits, est, now, false) {
            return Err(r);
        }
        let a = self.account(tenant, now);
        a.reserved = a.reserved.plus(est);
        Ok(a.remaining(limits))
    }

    /// The budget of `limits` that cannot cover `est` (of those that cannot, the one that
    /// resets last); with `anyway`, the one that resets last when all could (the shared
    /// store refused what this book would admit: it counted more).
    fn check(
        &mut self,
        tenant: &TenantId,
        limits: &[Limit],
        est: Spend,
        now: i64,
        anyway: bool,
    ) -> Option<Exhausted> {
        let a = self.account(tenant, now);
        let mut refused: Option<Exhausted> = None;
        for pass in [false, true] {
            if pass && (refused.is_some() || !anyway) {
                break;
            }
            for l in limits {
                let used = a.used(l);
                if pass || used.saturating_add(est.of(l.unit)) > l.amount {
                    let resets_in = a.windows[Account::slot(l.period)].0.resets_in(now);
                    if refused.is_none_or(|r| resets_in > r.resets_in) {
                        refused = Some(Exhausted {
                            limit: *l,
                            used,
                            resets_in,
                            remaining: Remaining::default(),
                        });
                    }
                }
            }
        }
        let mut r = refused?;
        r.remaining = a.remaining(limits);
        Some(r)
    }

    /// The refusal of `est` (a budget that cannot cover it, else the one that resets last).
    pub fn refusal(
        &mut self,
        tenant: &TenantId,
        limits: &[Limit],
        est: Spend,
        now: i64,
    ) -> Option<Exhausted> {
        self.check(tenant, limits, est, now, !limits.is_empty())
    }

    /// Sets what the shared store (cluster mode) counted for `tenant` at `now`: spent in the
    /// day and the month, reserved by requests in flight on every replica. The book then
    /// mirrors the cluster, for this replica's headers, metrics and console.
    pub fn observe(
        &mut self,
        tenant: &TenantId,
        day: Spend,
        month: Spend,
        reserved: Spend,
        now: i64,
    ) {
        let a = self.account(tenant, now);
        a.windows[Account::slot(Period::Day)].1 = day;
        a.windows[Account::slot(Period::Month)].1 = month;
        a.reserved = reserved;
    }

    /// Settles a reservation of `est` with what the request `actual`ly spent (counted in the
    /// windows holding `now`); returns the soft thresholds it crossed.
    pub fn commit(
        &mut self,
        tenant: &TenantId,
        limits: &[Limit],
        est: Spend,
        actual: Spend,
        now: i64,
    ) -> Vec<Warning> {
        let a = self.account(tenant, now);
        a.reserved = a.reserved.minus(est);
        for w in &mut a.windows {
            w.1 = w.1.plus(actual);
        }
        let mut warnings = Vec::new();
        for l in limits {
            let Some(at) = l.warn_at else { continue };
            let (win, spent) = a.windows[Account::slot(l.period)];
            let spent = spent.of(l.unit);
            let warned = &mut a.warned[Account::slot(l.period)][l.unit.index()];
            if spent as f64 >= at * l.amount as f64 && *warned != Some(win.start) {
                *warned = Some(win.start);
                warnings.push(Warning { limit: *l, spent });
            }
        }
        warnings
    }

    /// Gives a reservation of `est` back (the request spent nothing that was reported).
    pub fn refund(&mut self, tenant: &TenantId, est: Spend) {
        if let Some(a) = self.accounts.get_mut(tenant) {
            a.reserved = a.reserved.minus(est);
        }
    }

    /// Adds spend already made in the `period` window holding `now` (read back from the usage
    /// ledger at startup).
    pub fn restore(&mut self, tenant: &TenantId, period: Period, spent: Spend, now: i64) {
        let a = self.account(tenant, now);
        let w = &mut a.windows[Account::slot(period)];
        w.1 = w.1.plus(spent);
    }

    /// Spent in the `period` window holding `now`.
    pub fn spent(&mut self, tenant: &TenantId, period: Period, now: i64) -> Spend {
        self.account(tenant, now).windows[Account::slot(period)].1
    }

    /// Reserved by requests in flight.
    pub fn reserved(&self, tenant: &TenantId) -> Spend {
        self.accounts
            .get(tenant)
            .map(|a| a.reserved)
            .unwrap_or_default()
    }

    /// What is left of one budget at `now` (its amount less spent and reserved).
    pub fn left(&mut self, tenant: &TenantId, limit: &Limit, now: i64) -> u64 {
        limit
            .amount
            .saturating_sub(self.account(tenant, now).used(limit))
    }

    /// What is left of `limits` at `now`.
    pub fn remaining(&mut self, tenant: &TenantId, limits: &[Limit], now: i64) -> Remaining {
        self.account(tenant, now).remaining(limits)
    }
}
