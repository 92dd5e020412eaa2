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
//! Invariant: `-bound ≤ balance ≤ bound` where `bound` is the bucket size — a tenant cannot bank
//! more than one bucket of credit (no hoarding), and one bad estimate delays it by at most one
//! bucket refill. Pure: no clock, no locks.

use crate::domain::Tokens;

/// A signed token balance: positive = credit, negative = debt.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ledger {
    balance: i64,
}

impl Ledger {
    /// The current balance.
    pub fn balance(self) -> i64 {
        self.balance
    }

    /// Adds `delta` (credit > 0, debt < 0), clamped to `±bound`.
    pub fn adjust(&mut self, delta: i64, bound: u64) {
        let bound = i64::try_from(bound).unwrap_or(i64::MAX);
        self.balance = self.balance.saturating_add(delta).clamp(-bound, bound);
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
        l.adjust(60, 1000);
        assert_eq!(l.need(Tokens(50)), 0);
        l.settle(Tokens(50), 0);
        assert_eq!(l.balance(), 10);
        assert_eq!(l.need(Tokens(50)), 40);
        l.settle(Tokens(50), 40);
        assert_eq!(l.balance(), 0);
        // Under-estimate by 30: the next request pays its cost plus the debt.
        l.adjust(-30, 1000);
        assert_eq!(l.need(Tokens(50)), 80);
        l.settle(Tokens(50), 80);
        assert_eq!(l.balance(), 0);
    }

    #[test]
    fn balance_is_bounded_by_one_bucket() {
        let mut l = Ledger::default();
        l.adjust(5000, 100);
        assert_eq!(l.balance(), 100);
        l.adjust(-5000, 100);
        assert_eq!(l.balance(), -100);
    }
}
