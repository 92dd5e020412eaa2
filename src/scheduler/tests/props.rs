//! Property tests of the scheduler's invariants over random arrivals, costs, weights and caps:
//! (a) the DRR fairness bound, (b) work conservation, (c) a dispatch bound for every queued
//! request, (d) at most one quantum of burst after idle, (e) caps never exceeded (and nothing
//! leaks), (f) FIFO is FIFO.

use std::time::Duration;

use proptest::prelude::*;

use crate::domain::{TenantId, Tokens, Weight};
use crate::scheduler::*;

/// Payload: (tenant index, cost).
type Item = (usize, u64);

fn cost(i: &Item) -> Tokens {
    Tokens(i.1)
}

fn build(
    policy: Policy,
    quantum: u64,
    capacity: u32,
    reserved: u32,
    specs: &[(f64, Option<u32>)],
) -> (Scheduler<Item>, Vec<TenantKey>) {
    let mut s = Scheduler::new(Config {
        policy,
        quantum: Tokens(quantum),
        capacity,
        reserved_slots: reserved,
        max_queued: 1_000_000,
        ..Config::default()
    });
    let keys = specs
        .iter()
        .enumerate()
        .map(|(i, &(w, cap))| {
            s.upsert_tenant(
                TenantId::new(format!("t{i}")),
                TenantSpec {
                    weight: Weight::new(w).unwrap(),
                    max_concurrency: cap,
                    max_queued: 1_000_000,
                },
            )
        })
        .collect();
    (s, keys)
}

fn weights() -> impl Strategy<Value = Vec<f64>> {
    prop::collection::vec(prop::sample::select(vec![0.5, 1.0, 2.0, 3.0, 4.0]), 2..6)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// (a) + (c): all tenants backlogged from the start, exact estimates, no caps.
    #[test]
    fn drr_fairness_and_dispatch_bounds(
        ws in weights(),
        quantum in 1u64..3000,
        max_cost in 1u64..5000,
        seed in any::<u64>(),
    ) {
        let specs: Vec<_> = ws.iter().map(|&w| (w, None)).collect();
        let (mut s, keys) = build(Policy::Drr, quantum, u32::MAX, 0, &specs);
        let mut rng = seed;
        let mut rand = move || { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; rng };
        let per_tenant = 60;
        // prefix[i][p]: tokens of tenant i's queue up to and including request p.
        let mut prefix = vec![Vec::new(); keys.len()];
        for p in 0..per_tenant {
            for (i, &k) in keys.iter().enumerate() {
                let c = 1 + rand() % max_cost;
                let before = prefix[i].last().copied().unwrap_or(0);
                prefix[i].push(before + c);
                s.enqueue(Duration::ZERO, k, Class::Interactive, false, (i, c)).unwrap();
                let _ = p;
            }
        }
        let n = keys.len();
        let mut served = vec![0u64; n];
        let mut count = vec![0usize; n];
        let q = quantum as f64;
        // The quanta actually used (quantum × weight, rounded) and the weights they imply.
        let qs: Vec<f64> = ws.iter().map(|w| (q * w).round().max(1.0)).collect();
        let ws: Vec<f64> = qs.iter().map(|qi| qi / q).collect();
        let sum_q_max: f64 = qs.iter().map(|qi| qi + max_cost as f64).sum();
        while let Some(g) = s.dispatch(Duration::ZERO, &mut cost) {
            let (i, c) = g.item;
            s.complete(g.slot);
            // (c) tokens served to others before this request ≤ rounds it needs × what a round
            // can give the others.
            let others: u64 = served.iter().enumerate().filter(|&(j, _)| j != i).map(|(_, &x)| x).sum();
            let rounds = (prefix[i][count[i]] as f64 / qs[i]).ceil() + 1.0;
            let own = qs[i] + max_cost as f64;
            prop_assert!(others as f64 <= rounds * (sum_q_max - own),
                "request {} of tenant {i} waited behind {others} tokens", count[i]);
            served[i] += c;
            count[i] += 1;
            // (a) only while every tenant is still backlogged.
            if count.iter().all(|&c| c < per_tenant) {
                for a in 0..n {
                    for b in 0..n {
                        let diff = served[a] as f64 / ws[a] - served[b] as f64 / ws[b];
                        let bound = 2.0 * q + max_cost as f64 / ws[a] + max_cost as f64 / ws[b];
                        prop_assert!(diff.abs() <= bound, "|{diff}| > {bound} ({a} vs {b}, served {served:?})");
                    }
                }
            }
        }
        prop_assert_eq!(count.iter().sum::<usize>(), n * per_tenant);
    }

    /// (b) + (e): random interleavings of arrivals, dispatches, completions and cancels.
    #[test]
    fn caps_hold_work_is_conserved_and_nothing_leaks(
        policy in prop::sample::select(vec![Policy::Drr, Policy::Fifo]),
        specs in prop::collection::vec((prop::sample::select(vec![1.0, 2.0, 3.0]), prop::option::of(1u32..4)), 1..6),
        capacity in 1u32..8,
        reserved in 0u32..3,
        ops in prop::collection::vec((0u8..10, any::<u16>(), 1u64..3000), 1..400),
    ) {
        let reserved = reserved.min(capacity - 1);
        let (mut s, keys) = build(policy, 1000, capacity, reserved, &specs);
        let mut grants: Vec<Grant<Item>> = Vec::new();
        let mut tickets: Vec<Ticket> = Vec::new();
        let mut now = Duration::ZERO;
        for (op, pick, c) in ops {
            now += Duration::from_millis(u64::from(pick % 50));
            match op {
                0..=3 => {
                    let i = usize::from(pick) % keys.len();
                    let class = if pick % 3 == 0 { Class::Batch } else { Class::Interactive };
                    let recovery = pick % 11 == 0;
                    if let Ok(t) = s.enqueue(now, keys[i], class, recovery, (i, c)) {
                        tickets.push(t);
                    }
                }
                4..=6 => {
                    match s.dispatch(now, &mut cost) {
                        Some(g) => grants.push(g),
                        None => {
                            // (b) nothing dispatchable: the pool is full, or every tenant with
                            // queued work is at its cap, or only reserved slots are left and
                            // nobody queued recovery work.
                            let pool_full = s.in_flight() >= capacity;
                            let reserved_only = s.in_flight() + reserved >= capacity;
                            let stuck = keys.iter().enumerate().all(|(i, &k)| {
                                let (queued, inflight) = s.tenant_load(k);
                                queued == 0
                                    || specs[i].1.is_some_and(|cap| inflight >= cap)
                                    || (reserved_only && s.lane_queued(k, Lane::Recovery) == 0)
                            });
                            prop_assert!(pool_full || stuck);
                        }
                    }
                }
                7 | 8 => {
                    if !grants.is_empty() {
                        let g = grants.swap_remove(usize::from(pick) % grants.len());
                        if pick % 2 == 0 {
                            s.reconcile(g.slot, Tokens(c));
                        }
                        s.complete(g.slot);
                    }
                }
                _ => {
                    if !tickets.is_empty() {
                        let t = tickets.swap_remove(usize::from(pick) % tickets.len());
                        s.cancel(t);
                    }
                }
            }
            // (e) caps.
            prop_assert!(s.in_flight() <= capacity);
            let non_recovery = grants.iter().filter(|g| g.slot.lane != Lane::Recovery).count() as u32;
            prop_assert!(non_recovery <= capacity - reserved);
            for (i, &k) in keys.iter().enumerate() {
                if let Some(cap) = specs[i].1 {
                    prop_assert!(s.tenant_load(k).1 <= cap);
                }
            }
        }
        // Everything drains and nothing leaks.
        for g in grants.drain(..) {
            s.complete(g.slot);
        }
        while let Some(g) = s.dispatch(now + Duration::from_secs(3600), &mut cost) {
            s.complete(g.slot);
        }
        prop_assert_eq!(s.queued(), 0);
        prop_assert_eq!(s.in_flight(), 0);
        for &k in &keys {
            prop_assert_eq!(s.tenant_load(k), (0, 0));
        }
    }

    /// (d): a tenant back from idle (with refunds that arrived while idle) gets at most one
    /// quantum of burst: its lead over a backlogged peer stays within one quantum + one request.
    #[test]
    fn idle_return_gets_at_most_one_quantum(
        quantum in 1u64..3000,
        history in prop::collection::vec(1u64..3000, 0..20),
        costs in prop::collection::vec(1u64..3000, 1..50),
        refund in 0u64..100_000,
    ) {
        let (mut s, keys) = build(Policy::Drr, quantum, u32::MAX, 0, &[(1.0, None), (1.0, None)]);
        // X's earlier activity, with an over-estimate refunded after it went idle.
        let mut last = None;
        for &c in &history {
            s.enqueue(Duration::ZERO, keys[0], Class::Interactive, false, (0, c)).unwrap();
        }
        while let Some(g) = s.dispatch(Duration::ZERO, &mut cost) {
            s.complete(g.slot);
            last = Some(g.slot);
        }
        if let Some(slot) = last {
            s.reconcile(slot, Tokens(slot.cost.0.saturating_sub(refund)));
        }
        // B backlogged (for longer than X will be) and mid-stream.
        let backlog = costs.iter().sum::<u64>() / 100 + 200;
        for _ in 0..backlog {
            s.enqueue(Duration::ZERO, keys[1], Class::Interactive, false, (1, 100)).unwrap();
        }
        for _ in 0..3 {
            let g = s.dispatch(Duration::ZERO, &mut cost).unwrap();
            s.complete(g.slot);
        }
        for &c in &costs {
            s.enqueue(Duration::ZERO, keys[0], Class::Interactive, false, (0, c)).unwrap();
        }
        // From X's return on, X's lead over B stays within the fairness bound.
        let max_cost = costs.iter().copied().max().unwrap_or(0);
        let (mut x, mut b) = (0u64, 0u64);
        while let Some(g) = s.dispatch(Duration::ZERO, &mut cost) {
            s.complete(g.slot);
            if g.item.0 == 0 { x += g.item.1 } else { b += g.item.1 }
            // The fairness bound of (a) for two weight-1 tenants (B's requests cost 100): an
            // idle history or refunds must not add to it.
            let bound = 2 * quantum + 2 * max_cost.max(100);
            prop_assert!(x.saturating_sub(b) <= bound, "lead {} > {bound}", x - b);
            if s.tenant_load(keys[0]).0 == 0 {
                break;
            }
        }
        // What it keeps when its queue empties: at most two quanta (one round's lag).
        prop_assert!(s.credit(keys[0], Lane::Interactive) <= 2 * quantum as i64);
    }

    /// (f): with no caps, FIFO dispatches in arrival order.
    #[test]
    fn fifo_is_fifo(arrivals in prop::collection::vec((0usize..5, 1u64..5000), 1..200)) {
        let specs = vec![(1.0, None); 5];
        let (mut s, keys) = build(Policy::Fifo, 100, 3, 0, &specs);
        for (n, &(i, _)) in arrivals.iter().enumerate() {
            s.enqueue(Duration::ZERO, keys[i], Class::Interactive, false, (i, n as u64)).unwrap();
        }
        let mut order = Vec::new();
        while let Some(g) = s.dispatch(Duration::ZERO, &mut cost) {
            order.push(g.item.1);
            s.complete(g.slot);
        }
        let expected: Vec<u64> = (0..arrivals.len() as u64).collect();
        prop_assert_eq!(order, expected);
    }
}
