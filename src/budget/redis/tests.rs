//! The shared budget scripts against a real `redis-server` (started on a free port, killed on
//! drop): three holders interleaving reservations, settlements and flushes pass a budget by at
//! most their estimate error; a dead holder's reservations stop counting. Without
//! `redis-server` on PATH these fail naming the package, unless `FAIRGATE_SKIP_REDIS=1`.

use super::*;
use crate::jobs::store::redis::test_server::{plain, server};

const DAY: &str = "2026-12-02";

fn tokens(amount: u64) -> Limit {
    Limit {
        period: Period::Day,
        unit: Unit::Tokens,
        amount,
        warn_at: None,
    }
}

fn spend(tokens: u64) -> Spend {
    Spend {
        tokens,
        usd: Usd(0),
    }
}

fn row(tokens: u64) -> (RowKey, Row) {
    (
        RowKey {
            tenant: "t".into(),
            day: DAY.into(),
            model: "m".into(),
        },
        Row {
            requests: 1,
            input_tokens: 0,
            cached_input_tokens: 0,
            output_tokens: tokens,
            cost: Usd(0),
        },
    )
}

#[tokio::test]
async fn three_holders_pass_a_budget_by_at_most_their_estimate_error() {
    let Some(s) = server() else { return };
    let redis = plain(&s).await;
    let holders: Vec<Shared> = (0..3)
        .map(|i| Shared::new(redis.clone(), &format!("r{i}"), 60_000, 1))
        .collect();
    let limit = [tokens(1000)];
    // Per holder: reservations in flight (field, estimate), and the batch it has not flushed.
    let mut flight: Vec<Vec<(String, u64)>> = vec![Vec::new(); 3];
    let mut batch: Vec<Batch> = vec![Batch::default(); 3];
    let (mut admitted, mut spent, mut error) = (0u64, 0u64, 0u64);
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    for step in 0..600u64 {
        let h = next(3) as usize;
        match next(4) {
            // A new request, estimated at 20.
            0 | 1 => {
                let f = holders[h].field();
                let c = holders[h]
                    .reserve("t", &f, &limit, spend(20), DAY)
                    .await
                    .unwrap();
                let counted = c.day.tokens + c.reserved.tokens;
                if c.admitted {
                    assert!(
                        counted + 20 <= 1000,
                        "step {step}: admitted past the budget"
                    );
                    flight[h].push((f, 20));
                    admitted += 1;
                } else {
                    assert!(counted + 20 > 1000, "step {step}: refused with room left");
                }
            }
            // One ends: it used 0..=45 tokens (under-estimates included), or was refunded.
            2 => {
                if let Some((f, est)) = flight[h].pop() {
                    let used = next(46);
                    if used > 0 {
                        batch[h].rows.push(row(used));
                        spent += used;
                        error += used.saturating_sub(est);
                    }
                    batch[h].released.push(("t".into(), f));
                }
            }
            // A flush.
            _ => {
                let mut b = std::mem::take(&mut batch[h]);
                b.id = format!("r{h}:{step}");
                holders[h].write_batch(b.clone()).await.unwrap();
                // Sent twice (a retry after a timeout whose script ran): applied once.
                holders[h].write_batch(b).await.unwrap();
            }
        }
    }
    for (h, held) in flight.iter_mut().enumerate() {
        for (f, _) in held.drain(..) {
            batch[h].released.push(("t".into(), f));
        }
        let mut b = std::mem::take(&mut batch[h]);
        b.id = format!("r{h}:last");
        holders[h].write_batch(b).await.unwrap();
    }
    let c = holders[0]
        .reserve("t", "probe", &limit, spend(0), DAY)
        .await
        .unwrap();
    assert_eq!(c.day.tokens, spent, "Redis counted every settled use once");
    assert_eq!(c.reserved, Spend::default(), "nothing left reserved");
    eprintln!(
        "3 holders, 600 steps, budget 1000: {admitted} admitted, {spent} spent, error {error}"
    );
    assert!(
        spent <= 1000 + error,
        "spent {spent}, estimate error {error}"
    );
    assert!(
        admitted > 40 && error > 0,
        "{admitted} admitted, error {error}"
    );
    let rows = holders[1]
        .read(Query {
            tenant: None,
            from: DAY.into(),
            to: DAY.into(),
        })
        .await
        .unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(
        rows[0].1.output_tokens, spent,
        "the ledger equals the spend"
    );
}

#[tokio::test]
async fn a_dead_holders_reservations_stop_counting() {
    let Some(s) = server() else { return };
    let redis = plain(&s).await;
    let dying = Shared::new(redis.clone(), "r0", 300, 1);
    let live = Shared::new(redis.clone(), "r1", 60_000, 1);
    let limit = [tokens(100)];
    let f = dying.field();
    assert!(
        dying
            .reserve("t", &f, &limit, spend(90), DAY)
            .await
            .unwrap()
            .admitted
    );
    let refused = live
        .reserve("t", &live.field(), &limit, spend(20), DAY)
        .await
        .unwrap();
    assert!(!refused.admitted);
    assert_eq!(refused.reserved.tokens, 90);
    // The dying holder renews nothing: its key expires, and its reservation with it.
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    let ok = live
        .reserve("t", &live.field(), &limit, spend(20), DAY)
        .await
        .unwrap();
    assert!(ok.admitted, "{ok:?}");
    assert_eq!(ok.reserved.tokens, 0);
}

#[test]
fn ledger_fields_name_the_counter_tenant_and_model() {
    assert_eq!(parse_field("r1:agpt-4o"), Some(('r', "a", "gpt-4o")));
    assert_eq!(
        parse_field("u8:x:y:2026gpt:4"),
        Some(('u', "x:y:2026", "gpt:4")),
        "colons in the tenant or the model"
    );
    assert_eq!(parse_field("i3:ab"), None);
    assert_eq!(month_of("2026-12-02"), "2026-12");
}
