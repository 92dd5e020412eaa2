//! The per-tenant token adjustment ledger: how a bucket that cannot refund is still charged
//! exactly what a tenant used.
//!
//! governor's buckets only ever take tokens. A request is charged its *estimate* at admission;
//! when the actual cost is known (reconcile) the difference goes into this signed balance:
//! - over-estimate (actual < estimate): the balance grows (credit). The next admission spends the
//!   credit first and asks governor only for the rest, so the tokens are given back.
//! - under-estimate (actual > estimate), or an extra charge such as a retried attempt: the
//!   balance shrinks (debt). The next admission asks governor for its cost *plus* the debt.
//!
//! Invariant: `-debt_bound ≤ balance ≤ bound` where `bound` is the bucket size — a tenant cannot
//! bank more than one bucket of credit (no hoarding) — and `debt_bound` is `[admission]
//! max_debt_minutes` of the bucket's rate (never less than one bucket).
//!
//! Debt policy: debt is never forgiven while within `debt_bound`. An admission first pays the
//! debt from what the bucket holds; while any debt is left the tenant is refused (429, with the
//! refill time of its debt plus the request as `Retry-After`). So over any long window the
//! tenant's usage stays within `tokens_per_minute × minutes + one bucket + the debt bound`, even
//! when each request overruns its estimate many times over (`n`-style overruns). A debtor that
//! waits pays as the bucket refills, also beyond the bucket's size (refill the cap would lose
//! pays the debt), so an idle debtor is not charged twice. Only debt
//! beyond `debt_bound` (more than `max_debt_minutes` of the whole rate, unpaid) is dropped.
//! Pure: no clock, no locks.

use crate::domain::Tokens;

/// A signed token balance: positive = credit, negative = debt.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ledger {
    balance: i64,
    /// While in debt: when the bucket was last emptied to pay it (bucket clock). Refill the
    /// bucket's cap lost since then paid the debt too (an idle debtor pays by waiting).
    emptied_at: std::time::Duration,
}

impl Ledger {
    /// The current balance.
    pub fn balance(self) -> i64 {
        self.balance
    }

    /// Adds `delta` (credit > 0, debt < 0), clamped to `[-debt_bound, bound]`.
    pub fn adjust(&mut self, delta: i64, bound: u64, debt_bound: u64) {
        let bound = i64::try_from(bound).unwrap_or(i64::MAX);
        let debt_bound = i64::try_from(debt_bound).unwrap_or(i64::MAX);
        self.balance = self.balance.saturating_add(delta).clamp(-debt_bound, bound);
    }

    /// The debt (0 when the balance is credit).
    pub fn debt(self) -> u64 {
        u64::try_from(-self.balance.min(0)).unwrap_or(0)
    }

    /// When the bucket was last emptied to pay the debt.
    pub fn emptied_at(self) -> std::time::Duration {
        self.emptied_at
    }

    /// Records that the bucket was emptied to pay the debt at `at`.
    pub fn set_emptied_at(&mut self, at: std::time::Duration) {
        self.emptied_at = at;
    }

    /// Pays `tokens` of the debt (taken from the bucket).
    pub fn pay(&mut self, tokens: u64) {
        let tokens = i64::try_from(tokens.min(self.debt())).unwrap_or(0);
        self.balance += tokens;
    }

    /// Tokens to take from the bucket to admit a request of `cost`: the cost minus credit, or
    /// plus debt (0 when credit covers it all).
    pub fn need(self, cost: Tokens) -> u64 {
        u64::try_from(cost.signed().saturating_sub(self.balance).max(0)).unwrap_or(0)
    }

    /// Records an admission of `cost` for which `taken` tokens came from the bucket.
    pub fn settle(&mut self, cost: Tokens, taken: u64) {
        let taken = i64::try_from(taken).unwrap_or(i64::MAX);
        self.balance = self.balance.saturating_add(taken) - cost.signed();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credit_is_spent_first_and_debt_is_added() {
        let mut l = Ledger::default();
        assert_eq!(l.need(Tokens(100)), 100);
        l.settle(Tokens(100), 100);
        // Reconcile: actual 40 of an estimate of 100 → 60 credit.
        l.adjust(60, 1000, 1000);
        assert_eq!(l.need(Tokens(50)), 0);
        l.settle(Tokens(50), 0);
        assert_eq!(l.balance(), 10);
        assert_eq!(l.need(Tokens(50)), 40);
        l.settle(Tokens(50), 40);
        assert_eq!(l.balance(), 0);
        // Under-estimate by 30: the next request pays its cost plus the debt.
        l.adjust(-30, 1000, 1000);
        assert_eq!(l.need(Tokens(50)), 80);
        l.settle(Tokens(50), 80);
        assert_eq!(l.balance(), 0);
    }

    #[test]
    fn credit_is_bounded_by_one_bucket_and_debt_by_the_debt_bound() {
        let mut l = Ledger::default();
        l.adjust(5000, 100, 1000);
        assert_eq!(l.balance(), 100);
        l.adjust(-5000, 100, 1000);
        assert_eq!(l.balance(), -1000);
        assert_eq!(l.debt(), 1000);
        l.pay(300);
        assert_eq!(l.debt(), 700);
        l.pay(5000);
        assert_eq!((l.debt(), l.balance()), (0, 0));
    }
}
