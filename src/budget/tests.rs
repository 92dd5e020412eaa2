//! The budget book's rules, and the property that concurrent requests cannot jointly pass a
//! budget by more than their estimate error.

use proptest::prelude::*;

use super::book::{Book, Limit, Spend, Unit};
use crate::domain::{Period, TenantId, Usd, Zone};

const NOON: i64 = 1_796_212_800; // 2026-12-02T12:00:00Z

fn tokens(period: Period, amount: u64) -> Limit {
    Limit {
        period,
        unit: Unit::Tokens,
        amount,
        warn_at: None,
    }
}

fn spend(tokens: u64) -> Spend {
    Spend {
        tokens,
        usd: Usd(tokens * 10),
    }
}

#[test]
fn in_flight_estimates_count_until_settled_and_a_refund_gives_them_back() {
    let mut b = Book::new(Zone::default());
    let t = TenantId::new("a");
    let limits = [tokens(Period::Day, 100)];
    assert_eq!(
        b.reserve(&t, &limits, spend(60), NOON).unwrap().tokens,
        Some(40)
    );
    let refused = b.reserve(&t, &limits, spend(50), NOON).unwrap_err();
    assert_eq!((refused.used, refused.remaining.tokens), (60, Some(40)));
    assert_eq!(refused.resets_in, 12 * 3600, "until midnight UTC");
    b.refund(&t, spend(60));
    assert_eq!(b.reserved(&t), Spend::default());
    b.reserve(&t, &limits, spend(50), NOON).unwrap();
    // Settled at 30 of an estimate of 50: 70 left.
    b.commit(&t, &limits, spend(50), spend(30), NOON);
    assert_eq!(b.remaining(&t, &limits, NOON).tokens, Some(70));
    assert_eq!(b.spent(&t, Period::Month, NOON), spend(30));
}

#[test]
fn the_refusal_names_the_budget_that_resets_last_and_windows_reset() {
    let mut b = Book::new(Zone::default());
    let t = TenantId::new("a");
    let usd = Limit {
        period: Period::Month,
        unit: Unit::Usd,
        amount: 1000,
        warn_at: None,
    };
    let limits = [tokens(Period::Day, 50), usd];
    b.reserve(&t, &limits, spend(50), NOON).unwrap();
    b.commit(&t, &limits, spend(50), spend(50), NOON);
    let day = b.reserve(&t, &limits, spend(1), NOON).unwrap_err();
    assert_eq!(day.limit.period, Period::Day);
    assert_eq!(day.remaining.usd, Some(Usd(500)));
    // The next day the day budget is fresh, the month one is not.
    let tomorrow = NOON + 86_400;
    b.reserve(&t, &limits, spend(50), tomorrow).unwrap();
    b.commit(&t, &limits, spend(50), spend(50), tomorrow);
    // Both refuse the day after: the month budget, which resets last, is named.
    let later = tomorrow + 86_400;
    let month = b.reserve(&t, &limits, spend(60), later).unwrap_err();
    assert_eq!(month.limit.unit, Unit::Usd);
    assert_eq!(month.resets_in, 27 * 86_400 + 12 * 3600, "until 1 January");
    // A clock stepping back does not reopen yesterday.
    assert_eq!(b.spent(&t, Period::Day, NOON).tokens, 0);
    // A new month: everything is fresh.
    let january = NOON + 31 * 86_400;
    assert!(b.reserve(&t, &limits, spend(50), january).is_ok());
}

#[test]
fn restored_spend_counts_and_a_threshold_warns_once_a_window() {
    let mut b = Book::new(Zone::default());
    let t = TenantId::new("a");
    let mut l = tokens(Period::Month, 1000);
    l.warn_at = Some(0.8);
    b.restore(&t, Period::Month, spend(700), NOON);
    assert_eq!(b.remaining(&t, &[l], NOON).tokens, Some(300));
    b.reserve(&t, &[l], spend(50), NOON).unwrap();
    assert!(b.commit(&t, &[l], spend(50), spend(50), NOON).is_empty());
    b.reserve(&t, &[l], spend(100), NOON).unwrap();
    let w = b.commit(&t, &[l], spend(100), spend(100), NOON);
    assert_eq!(w.len(), 1);
    assert_eq!(w[0].spent, 850);
    b.reserve(&t, &[l], spend(10), NOON).unwrap();
    assert!(
        b.commit(&t, &[l], spend(10), spend(10), NOON).is_empty(),
        "once"
    );
}

/// One step of the property test: a request arrives (estimate, and what it will really
/// spend as a multiple of it), or the `k`-th one in flight ends (committed, or refunded).
#[derive(Clone, Debug)]
enum Step {
    Arrive { est: u64, actual_pct: u64 },
    End { k: usize, refund: bool },
    Later { secs: i64 },
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    let step = prop_oneof![
        4 => (1u64..400, 0u64..=250).prop_map(|(est, actual_pct)| Step::Arrive { est, actual_pct }),
        4 => (0usize..64, proptest::bool::weighted(0.2)).prop_map(|(k, refund)| Step::End { k, refund }),
        1 => (0i64..20_000).prop_map(|secs| Step::Later { secs }),
    ];
    proptest::collection::vec(step, 1..200)
}

proptest! {
    /// Whatever the interleaving of arrivals and endings, the spend in any window stays within
    /// the budget plus the estimate error of the requests that ended in it (Σ max(0, actual −
    /// estimate)); requests that spend at most their estimate never pass it; and once every
    /// request has ended nothing is left reserved.
    #[test]
    fn concurrent_requests_pass_a_budget_by_at_most_their_estimate_error(
        amount in 1u64..5_000,
        steps in steps(),
    ) {
        let mut b = Book::new(Zone::default());
        let t = TenantId::new("a");
        let limits = [tokens(Period::Day, amount), Limit { period: Period::Month, unit: Unit::Usd, amount: amount * 30, warn_at: None }];
        let mut now = NOON;
        let mut in_flight: Vec<(u64, u64)> = Vec::new();
        let (mut day, mut error) = (b.spent(&t, Period::Day, now), 0u64);
        let mut day_start = super::window::window(b.zone(), Period::Day, now).start;
        for s in steps {
            match s {
                Step::Arrive { est, actual_pct } => {
                    if b.reserve(&t, &limits, spend(est), now).is_ok() {
                        in_flight.push((est, est * actual_pct / 100));
                    }
                }
                Step::End { k, refund } if !in_flight.is_empty() => {
                    let (est, actual) = in_flight.swap_remove(k % in_flight.len());
                    if refund {
                        b.refund(&t, spend(est));
                    } else {
                        b.commit(&t, &limits, spend(est), spend(actual), now);
                        error += actual.saturating_sub(est);
                    }
                }
                Step::End { .. } => {}
                Step::Later { secs } => now += secs,
            }
            let start = super::window::window(b.zone(), Period::Day, now).start;
            if start != day_start {
                (day_start, error) = (start, 0);
            }
            day = b.spent(&t, Period::Day, now);
            prop_assert!(day.tokens <= amount + error, "spent {} of {amount} (error {error})", day.tokens);
            let reserved: u64 = in_flight.iter().map(|(e, _)| e).sum();
            prop_assert_eq!(b.reserved(&t).tokens, reserved);
        }
        let _ = day;
        for (est, _) in in_flight.drain(..) {
            b.refund(&t, spend(est));
        }
        prop_assert_eq!(b.reserved(&t), Spend::default());
    }

    /// Requests that never spend more than their estimate never pass any budget, however many
    /// run at once.
    #[test]
    fn upper_bound_estimates_never_pass_a_budget(
        amount in 1u64..2_000,
        ests in proptest::collection::vec((1u64..300, 0u64..=100), 1..100),
    ) {
        let mut b = Book::new(Zone::default());
        let t = TenantId::new("a");
        let limits = [tokens(Period::Month, amount)];
        let mut admitted = Vec::new();
        for (est, pct) in ests {
            if b.reserve(&t, &limits, spend(est), NOON).is_ok() {
                admitted.push((est, est * pct / 100));
            }
        }
        for (est, actual) in admitted {
            b.commit(&t, &limits, spend(est), spend(actual), NOON);
        }
        prop_assert!(b.spent(&t, Period::Month, NOON).tokens <= amount);
    }
}
