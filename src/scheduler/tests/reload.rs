//! Live changes (config reload): re-weighting, new caps and new pool settings apply in place,
//! to a scheduler with requests queued and in flight.

use std::time::Duration;

use crate::domain::{TenantId, Tokens, Weight};
use crate::scheduler::*;

fn spec(weight: f64, cap: Option<u32>) -> TenantSpec {
    TenantSpec {
        weight: Weight::new(weight).unwrap(),
        max_concurrency: cap,
        max_queued: 100_000,
    }
}

fn sched(capacity: u32) -> Scheduler<usize> {
    Scheduler::new(Config {
        quantum: Tokens(100),
        capacity,
        ..Config::default()
    })
}

fn push(s: &mut Scheduler<usize>, k: TenantKey, n: usize) {
    for _ in 0..n {
        s.enqueue(Duration::ZERO, k, Class::Interactive, false, k.idx())
            .unwrap();
    }
}

/// Dispatches and completes `n` requests of cost 100; served count per tenant index.
fn serve(s: &mut Scheduler<usize>, n: usize) -> [usize; 2] {
    let mut served = [0; 2];
    for _ in 0..n {
        let g = s
            .dispatch(Duration::ZERO, &mut |_| Tokens(100))
            .expect("backlogged");
        served[g.item] += 1;
        s.complete(g.slot);
    }
    served
}

#[test]
fn a_new_weight_applies_to_a_backlogged_tenant_in_place() {
    let mut s = sched(1);
    let a = s.upsert_tenant(TenantId::new("a"), spec(1.0, None));
    let b = s.upsert_tenant(TenantId::new("b"), spec(1.0, None));
    push(&mut s, a, 1000);
    push(&mut s, b, 1000);
    let before = serve(&mut s, 100);
    assert!(before[0].abs_diff(before[1]) <= 2, "{before:?}");
    assert_eq!(s.upsert_tenant(TenantId::new("a"), spec(3.0, None)), a);
    // The visit in progress ends under the old quantum; from then on a gets 3 per round.
    serve(&mut s, 4);
    let after = serve(&mut s, 400);
    assert!((297..=303).contains(&after[0]), "{after:?}");
    assert_eq!(s.snapshot()[0].weight.get(), 3.0);
    assert_eq!(s.queued(), 2000 - 504);
}

#[test]
fn raising_a_cap_unblocks_a_tenant_set_aside_at_its_old_cap() {
    let mut s = sched(8);
    let a = s.upsert_tenant(TenantId::new("a"), spec(1.0, Some(1)));
    push(&mut s, a, 3);
    let first = s.dispatch(Duration::ZERO, &mut |_| Tokens(10)).unwrap();
    assert!(s.dispatch(Duration::ZERO, &mut |_| Tokens(10)).is_none());
    s.upsert_tenant(TenantId::new("a"), spec(1.0, Some(3)));
    assert!(s.dispatch(Duration::ZERO, &mut |_| Tokens(10)).is_some());
    assert!(s.dispatch(Duration::ZERO, &mut |_| Tokens(10)).is_some());
    assert_eq!(s.tenant_load(a), (0, 3));
    // Lowering it again: in-flight requests stay, nothing new is dispatched above the cap.
    s.upsert_tenant(TenantId::new("a"), spec(1.0, Some(1)));
    push(&mut s, a, 1);
    s.complete(first.slot);
    assert!(s.dispatch(Duration::ZERO, &mut |_| Tokens(10)).is_none());
    assert_eq!(s.tenant_load(a), (1, 2));
}

#[test]
fn reconfigure_keeps_policy_and_capacity_and_rescales_quanta() {
    let mut s = sched(4);
    s.set_capacity(2);
    let a = s.upsert_tenant(TenantId::new("a"), spec(2.0, None));
    assert_eq!(s.tenants[a.idx()].quantum, Tokens(200));
    s.reconfigure(Config {
        policy: Policy::Fifo,
        quantum: Tokens(50),
        capacity: 64,
        max_queued: 1,
        ..Config::default()
    });
    assert_eq!(s.config().policy, Policy::Drr);
    assert_eq!(s.config().capacity, 2);
    assert_eq!(s.config().max_queued, 1);
    assert_eq!(s.tenants[a.idx()].quantum, Tokens(100));
    push(&mut s, a, 1);
    let full = s.enqueue(Duration::ZERO, a, Class::Interactive, false, 0);
    assert_eq!(full, Err(QueueFull::Pool));
}
