//! Unit tests of the scheduler's rules, one behaviour each; property tests of its invariants
//! in `props`, reconfiguration in `reload`.

mod light;
mod props;
mod reload;

use std::time::Duration;

use super::*;
use crate::domain::{TenantId, Tokens, Weight};

/// Payload: (tenant index, cost).
type Item = (usize, u64);

fn sched(policy: Policy, quantum: u64, capacity: u32) -> Scheduler<Item> {
    Scheduler::new(Config {
        policy,
        quantum: Tokens(quantum),
        capacity,
        ..Config::default()
    })
}

fn add(s: &mut Scheduler<Item>, n: usize, weight: f64, cap: Option<u32>) -> Vec<TenantKey> {
    (0..n)
        .map(|_| {
            let id = TenantId::new(format!("t{}", s.tenants.len()));
            s.upsert_tenant(
                id,
                TenantSpec {
                    weight: Weight::new(weight).unwrap(),
                    max_concurrency: cap,
                    max_queued: 100_000,
                },
            )
        })
        .collect()
}

fn push(s: &mut Scheduler<Item>, k: TenantKey, cost: u64) -> Ticket {
    s.enqueue(
        Duration::ZERO,
        k,
        Class::Interactive,
        false,
        (k.idx(), cost),
    )
    .unwrap()
}

fn next(s: &mut Scheduler<Item>) -> Option<Grant<Item>> {
    s.dispatch(Duration::ZERO, &mut |i: &Item| Tokens(i.1))
}

/// Dispatches and completes immediately, returning tenant indices in dispatch order.
fn drain(s: &mut Scheduler<Item>, n: usize) -> Vec<usize> {
    (0..n)
        .map_while(|_| {
            let g = next(s)?;
            s.complete(g.slot);
            Some(g.item.0)
        })
        .collect()
}

#[test]
fn fifo_serves_in_arrival_order() {
    let mut s = sched(Policy::Fifo, 100, 4);
    let t = add(&mut s, 3, 1.0, None);
    for &i in &[0, 0, 1, 2, 0, 1] {
        push(&mut s, t[i], 10);
    }
    assert_eq!(drain(&mut s, 10), vec![0, 0, 1, 2, 0, 1]);
}

#[test]
fn a_visit_dispatches_heads_while_they_fit() {
    let mut s = sched(Policy::Drr, 100, 100);
    let t = add(&mut s, 2, 1.0, None);
    for _ in 0..6 {
        push(&mut s, t[0], 30);
        push(&mut s, t[1], 30);
    }
    // Each visit adds 100 once: three heads of 30 fit, the fourth does not. Both start as
    // newcomers: A's first request, then B cuts in for its whole visit, then A's visit resumes
    // (two more fit its 100); from then on, whole visits of three.
    assert_eq!(drain(&mut s, 12), vec![0, 1, 1, 1, 0, 0, 1, 1, 1, 0, 0, 0]);
}

#[test]
fn not_request_count_round_robin() {
    // A's requests cost 10x B's: equal tokens, not equal counts.
    let mut s = sched(Policy::Drr, 100, 100);
    let t = add(&mut s, 2, 1.0, None);
    for _ in 0..200 {
        push(&mut s, t[0], 100);
        push(&mut s, t[1], 10);
    }
    let order = drain(&mut s, 110);
    let a = order.iter().filter(|&&i| i == 0).count();
    let b = order.len() - a;
    assert_eq!((a, b), (10, 100));
}

#[test]
fn a_new_tenant_goes_next_whatever_the_flood_sizes() {
    for cost in [1, 10, 100, 4096, 50_000] {
        let mut s = sched(Policy::Drr, 4096, 4);
        let t = add(&mut s, 2, 1.0, None);
        for _ in 0..100 {
            push(&mut s, t[0], cost);
        }
        let mut held: Vec<_> = (0..4).map(|_| next(&mut s).unwrap()).collect();
        assert!(held.iter().all(|g| g.item.0 == 0));
        push(&mut s, t[1], 500);
        // The next free slot goes to the newcomer.
        s.complete(held.pop().unwrap().slot);
        assert_eq!(next(&mut s).unwrap().item.0, 1, "flood cost {cost}");
    }
}

#[test]
fn a_sequential_tenant_cannot_game_the_newcomer_turn() {
    // B always re-arrives as soon as its request is done; it must not get more than its share.
    let mut s = sched(Policy::Drr, 100, 1);
    let t = add(&mut s, 2, 1.0, None);
    for _ in 0..200 {
        push(&mut s, t[0], 100);
    }
    let mut b = 0;
    for _ in 0..100 {
        if s.tenant_load(t[1]).0 == 0 {
            push(&mut s, t[1], 100);
        }
        let g = next(&mut s).unwrap();
        b += usize::from(g.item.0 == 1);
        s.complete(g.slot);
    }
    assert!((49..=51).contains(&b), "B got {b} of 100");
}

#[test]
fn weights_are_served_in_proportion_in_tokens() {
    let mut s = sched(Policy::Drr, 1000, 1000);
    let mut keys = Vec::new();
    for w in 1..=4 {
        keys.extend(add(&mut s, 1, w as f64, None));
    }
    for &k in &keys {
        for _ in 0..2000 {
            push(&mut s, k, 250);
        }
    }
    let order = drain(&mut s, 2000);
    let served: Vec<usize> = (0..4)
        .map(|i| order.iter().filter(|&&x| x == i).count())
        .collect();
    for (i, &n) in served.iter().enumerate() {
        let expected = 2000.0 * (i + 1) as f64 / 10.0;
        assert!((n as f64 - expected).abs() <= 8.0, "{served:?}");
    }
}

#[test]
fn large_requests_cost_constant_work() {
    let mut s = sched(Policy::Drr, 1, 10);
    let t = add(&mut s, 3, 1.0, None);
    for &k in &t {
        push(&mut s, k, 1_000_000_000);
    }
    let mut evaluations = 0;
    for _ in 0..3 {
        let g = s
            .dispatch(Duration::ZERO, &mut |i: &Item| {
                evaluations += 1;
                Tokens(i.1)
            })
            .unwrap();
        assert_eq!(g.slot.cost, Tokens(1_000_000_000));
    }
    assert!(evaluations <= 6, "{evaluations} cost evaluations");
}

#[test]
fn debt_is_paid_before_dispatching_again() {
    let mut s = sched(Policy::Drr, 100, 10);
    let t = add(&mut s, 2, 1.0, None);
    push(&mut s, t[0], 10);
    let g = next(&mut s).unwrap();
    // Actual was 400 instead of 10: 390 more than charged.
    s.reconcile(g.slot, Tokens(400));
    s.complete(g.slot);
    for _ in 0..10 {
        push(&mut s, t[0], 100);
        push(&mut s, t[1], 100);
    }
    let order = drain(&mut s, 8);
    assert_eq!(order.iter().filter(|&&i| i == 0).count(), 2, "{order:?}");
}

#[test]
fn idle_return_bursts_at_most_one_quantum() {
    let mut s = sched(Policy::Drr, 100, 1000);
    let t = add(&mut s, 2, 1.0, None);
    // A runs alone for a while, then goes idle with leftover credit.
    for _ in 0..7 {
        push(&mut s, t[0], 30);
    }
    drain(&mut s, 7);
    for _ in 0..50 {
        push(&mut s, t[1], 30);
    }
    drain(&mut s, 20);
    // A returns: it dispatches at most one quantum before B is served again.
    for _ in 0..20 {
        push(&mut s, t[0], 30);
    }
    let order = drain(&mut s, 10);
    let burst = order.iter().take_while(|&&i| i == 0).count();
    assert!(burst >= 1 && burst * 30 <= 100, "{order:?}");
}

#[test]
fn refunds_do_not_stretch_a_visit_or_bank_credit() {
    let mut s = sched(Policy::Drr, 100, 10);
    let t = add(&mut s, 2, 1.0, None);
    for _ in 0..10 {
        push(&mut s, t[0], 50);
        push(&mut s, t[1], 50);
    }
    let g1 = next(&mut s).unwrap();
    assert_eq!(g1.item.0, 0);
    // A huge refund mid-visit: the visit still ends after its 100 tokens.
    s.reconcile(g1.slot, Tokens(0));
    s.reconcile(g1.slot, Tokens(0));
    // B, a newcomer too, cuts in after A's first request for its whole visit...
    assert_eq!(next(&mut s).unwrap().item.0, 1);
    assert_eq!(next(&mut s).unwrap().item.0, 1);
    // ...then A's visit resumes for its remaining 50 and ends there: B's next visit follows.
    assert_eq!(next(&mut s).unwrap().item.0, 0);
    assert_eq!(next(&mut s).unwrap().item.0, 1);
    assert_eq!(next(&mut s).unwrap().item.0, 1);
    // Next visit: at most one extra quantum of the refund is given back.
    assert_eq!(next(&mut s).unwrap().item.0, 0);
    assert!(s.credit(t[0], Lane::Interactive) <= 2 * 100);
}

#[test]
fn cost_is_evaluated_at_dispatch() {
    let mut s = sched(Policy::Drr, 100, 10);
    let t = add(&mut s, 1, 1.0, None);
    push(&mut s, t[0], 10);
    let g = s
        .dispatch(Duration::ZERO, &mut |_: &Item| Tokens(77))
        .unwrap();
    assert_eq!(g.slot.cost, Tokens(77));
}

#[test]
fn caps_are_never_exceeded_and_capped_tenants_do_not_block_others() {
    let mut s = sched(Policy::Drr, 100, 3);
    let a = add(&mut s, 1, 1.0, Some(1))[0];
    let b = add(&mut s, 1, 1.0, None)[0];
    for _ in 0..5 {
        push(&mut s, a, 10);
        push(&mut s, b, 10);
    }
    let grants: Vec<_> = std::iter::from_fn(|| next(&mut s)).collect();
    assert_eq!(grants.len(), 3, "pool capacity");
    assert_eq!(grants.iter().filter(|g| g.item.0 == a.idx()).count(), 1);
    assert_eq!(s.tenant_load(a).1, 1);
    // When A's slot returns it rejoins.
    for g in grants {
        s.complete(g.slot);
    }
    let rest = drain(&mut s, 100);
    assert_eq!(rest.iter().filter(|&&i| i == a.idx()).count(), 4);
}

#[test]
fn reserved_slots_are_only_for_recovery() {
    let mut s: Scheduler<Item> = Scheduler::new(Config {
        capacity: 3,
        reserved_slots: 1,
        ..Config::default()
    });
    let t = add(&mut s, 1, 1.0, None)[0];
    for _ in 0..5 {
        push(&mut s, t, 10);
    }
    assert!(next(&mut s).is_some());
    assert!(next(&mut s).is_some());
    assert!(next(&mut s).is_none(), "the last slot is reserved");
    s.enqueue(Duration::ZERO, t, Class::Interactive, true, (9, 10))
        .unwrap();
    assert_eq!(next(&mut s).unwrap().slot.lane, Lane::Recovery);
}

#[test]
fn a_lowered_capacity_does_not_take_the_reservation_away() {
    let mut s: Scheduler<Item> = Scheduler::new(Config {
        capacity: 16,
        reserved_slots: 1,
        ..Config::default()
    });
    let t = add(&mut s, 1, 1.0, None)[0];
    for _ in 0..20 {
        push(&mut s, t, 10);
    }
    for _ in 0..15 {
        assert!(next(&mut s).is_some());
    }
    // The upstream pauses the pool: only the reservation is left, 15 ordinary still in flight.
    s.set_capacity(1);
    assert!(next(&mut s).is_none(), "ordinary work waits");
    for _ in 0..2 {
        s.enqueue(Duration::ZERO, t, Class::Interactive, true, (9, 10))
            .unwrap();
    }
    assert_eq!(next(&mut s).unwrap().slot.lane, Lane::Recovery);
    assert!(
        next(&mut s).is_none(),
        "one reserved slot, one recovery request"
    );
}

#[test]
fn queues_are_bounded() {
    let mut s: Scheduler<Item> = Scheduler::new(Config {
        max_queued: 3,
        ..Config::default()
    });
    let k = s.upsert_tenant(
        TenantId::new("a"),
        TenantSpec {
            max_queued: 2,
            ..TenantSpec::default()
        },
    );
    let k2 = s.upsert_tenant(TenantId::new("b"), TenantSpec::default());
    push(&mut s, k, 1);
    push(&mut s, k, 1);
    let full = s.enqueue(Duration::ZERO, k, Class::Interactive, false, (0, 1));
    assert_eq!(full, Err(QueueFull::Tenant));
    push(&mut s, k2, 1);
    let full = s.enqueue(Duration::ZERO, k2, Class::Interactive, false, (1, 1));
    assert_eq!(full, Err(QueueFull::Pool));
}

#[test]
fn cancel_charges_nothing() {
    let mut s = sched(Policy::Drr, 100, 10);
    let t = add(&mut s, 1, 1.0, None);
    let tk = push(&mut s, t[0], 10);
    assert_eq!(s.cancel(tk), Some((0, 10)));
    assert_eq!(s.cancel(tk), None);
    assert!(next(&mut s).is_none());
    // Nothing charged: the quantum of its round is still unspent.
    assert_eq!(s.credit(t[0], Lane::Interactive), 100);
    assert_eq!(s.queued(), 0);
    assert_eq!(s.tenant_load(t[0]), (0, 0));
}

#[test]
fn batch_ages_into_interactive() {
    let mut s: Scheduler<Item> = Scheduler::new(Config {
        capacity: 1,
        batch_max_wait: Duration::from_secs(10),
        ..Config::default()
    });
    let t = add(&mut s, 1, 1.0, None)[0];
    s.enqueue(Duration::ZERO, t, Class::Batch, false, (0, 10))
        .unwrap();
    let g = s
        .dispatch(Duration::from_secs(11), &mut |i: &Item| Tokens(i.1))
        .unwrap();
    assert_eq!(g.slot.lane, Lane::Interactive);
    assert_eq!(g.waited, Duration::from_secs(11));
}

#[test]
fn classes_share_by_weight_and_batch_is_not_starved() {
    let mut s = sched(Policy::Drr, 100, 1000);
    let t = add(&mut s, 1, 1.0, None)[0];
    for _ in 0..1000 {
        s.enqueue(Duration::ZERO, t, Class::Interactive, false, (0, 100))
            .unwrap();
        s.enqueue(Duration::ZERO, t, Class::Batch, false, (1, 100))
            .unwrap();
    }
    let mut lanes = [0usize; 2];
    for _ in 0..900 {
        let g = next(&mut s).unwrap();
        s.complete(g.slot);
        lanes[g.item.0] += 1;
    }
    assert_eq!(lanes, [800, 100]);
}

#[test]
fn neither_class_takes_the_whole_pool_while_the_other_waits() {
    let mut s = sched(Policy::Drr, 100, 9);
    let t = add(&mut s, 1, 1.0, None)[0];
    for _ in 0..20 {
        s.enqueue(Duration::ZERO, t, Class::Batch, false, (1, 1))
            .unwrap();
        s.enqueue(Duration::ZERO, t, Class::Interactive, false, (0, 1000))
            .unwrap();
    }
    let grants: Vec<_> = std::iter::from_fn(|| next(&mut s)).collect();
    let batch = grants.iter().filter(|g| g.item.0 == 1).count();
    assert!((1..9).contains(&batch), "batch holds {batch} of 9");
}

#[test]
fn a_newcomer_waits_for_at_most_one_request_of_a_tenant_that_queued_while_the_pool_was_full() {
    // A's requests arrive one by one while the pool is full, so A queues a burst behind its one
    // cut-in; B, new, goes right after that one request, ahead of the rest of A's burst.
    let mut s = sched(Policy::Drr, 4096, 2);
    let t = add(&mut s, 2, 1.0, None);
    let mut held = Vec::new();
    for _ in 0..30 {
        push(&mut s, t[0], 22);
        held.extend(std::iter::from_fn(|| next(&mut s)));
    }
    push(&mut s, t[1], 22);
    s.complete(held.pop().unwrap().slot);
    assert_eq!(
        next(&mut s).unwrap().item.0,
        0,
        "A's request that arrived first"
    );
    s.complete(held.pop().unwrap().slot);
    assert_eq!(next(&mut s).unwrap().item.0, 1, "then B, before A's burst");
}

#[test]
fn snapshot_reports_queued_in_flight_weight_and_oldest() {
    let mut s = sched(Policy::Drr, 100, 1);
    let k = add(&mut s, 2, 2.0, None);
    let at = |s: &mut Scheduler<Item>, t: u64, k: TenantKey| {
        s.enqueue(
            Duration::from_secs(t),
            k,
            Class::Interactive,
            false,
            (k.idx(), 50),
        )
        .unwrap()
    };
    at(&mut s, 1, k[0]);
    at(&mut s, 2, k[0]);
    at(&mut s, 3, k[0]);
    let g = next(&mut s).unwrap();
    let snap = s.snapshot();
    assert_eq!(snap.len(), 2);
    assert_eq!(snap[0].id, TenantId::new("t0"));
    assert_eq!((snap[0].queued, snap[0].in_flight), (2, 1));
    assert_eq!(snap[0].weight.get(), 2.0);
    // The oldest still queued arrived at 2 s (the one at 1 s was dispatched).
    assert_eq!(snap[0].oldest_enqueued_at, Some(Duration::from_secs(2)));
    assert_eq!(snap[0].credit, s.credit(k[0], Lane::Interactive));
    assert_eq!(
        (
            snap[1].queued,
            snap[1].in_flight,
            snap[1].oldest_enqueued_at
        ),
        (0, 0, None)
    );
    s.complete(g.slot);
}

#[test]
fn a_newcomer_goes_next_even_when_the_backlogged_tenant_is_charged_debt_from_elsewhere() {
    // Cluster mode charges a backlogged tenant for service it got on other replicas, while its
    // requests here complete; a newcomer must still take the next free slot.
    let mut s = sched(Policy::Drr, 64, 2);
    let k = add(&mut s, 2, 1.0, None);
    for _ in 0..50 {
        push(&mut s, k[0], 33);
    }
    let mut in_flight: Vec<Slot> = (0..2).map(|_| next(&mut s).unwrap().slot).collect();
    for i in 0..10u64 {
        s.charge(k[0], Tokens(500 * 10u64.pow(i as u32)));
        let slot = in_flight.remove(0);
        s.reconcile(slot, Tokens(33));
        s.complete(slot);
        in_flight.push(next(&mut s).unwrap().slot);
    }
    push(&mut s, k[1], 33);
    s.charge(k[0], Tokens(500));
    let slot = in_flight.remove(0);
    s.complete(slot);
    let g = next(&mut s).unwrap();
    assert_eq!(g.item.0, k[1].idx(), "the newcomer goes next");
}

#[test]
fn newcomers_that_queued_while_the_pool_had_no_slot_each_go_within_one_free_slot() {
    // Cluster mode: a replica holds no lease yet (capacity 0) while a noisy tenant queues a
    // quantum's worth and then a small one arrives. Once slots come, the small request must
    // not wait for the noisy tenant's whole first visit.
    let mut s = sched(Policy::Drr, 1024, 0);
    let k = add(&mut s, 2, 1.0, None);
    for _ in 0..50 {
        push(&mut s, k[0], 20);
    }
    push(&mut s, k[1], 20);
    assert!(next(&mut s).is_none(), "no slot, no dispatch");
    s.set_capacity(2);
    let first: Vec<usize> = (0..2).map(|_| next(&mut s).unwrap().item.0).collect();
    assert_eq!(first, vec![k[0].idx(), k[1].idx()]);
}
