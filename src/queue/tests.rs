//! The shell's no-leak guarantees: cancel while queued, grant to a vanished waiter, permits
//! dropped at every stage; pool and tenant in-flight counts return to zero.

use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::domain::{TenantId, Weight};
use crate::scheduler::{self, Class};

fn queue(capacity: u32) -> (Arc<FairQueue>, TenantId, TenantId) {
    let (a, b) = (TenantId::new("a"), TenantId::new("b"));
    let spec = TenantSettings {
        weight: Weight::ONE,
        max_concurrency: None,
        max_queued: 2,
    };
    let q = FairQueue::new(
        QueueSettings {
            scheduler: scheduler::Config {
                capacity,
                ..scheduler::Config::default()
            },
            estimator: Arc::new(crate::estimate::Estimator::new(
                &crate::config::EstimateConfig {
                    input_weight: 1.0,
                    output_weight: 1.0,
                    default_output_tokens: 256,
                    ..Default::default()
                },
                &Default::default(),
            )),
        },
        &[(a.clone(), spec.clone()), (b.clone(), spec)],
    );
    (q, a, b)
}

fn cost() -> CostInputs {
    CostInputs {
        input_tokens: 100,
        ..CostInputs::default()
    }
}

#[tokio::test]
async fn grants_wait_for_a_free_slot_and_permits_release_on_drop() {
    let (q, a, b) = queue(1);
    let p1 = q
        .acquire(&a, Class::Interactive, false, cost())
        .await
        .unwrap();
    assert_eq!(p1.charged().0, 356);
    let q2 = q.clone();
    let b2 = b.clone();
    let waiting =
        tokio::spawn(async move { q2.acquire(&b2, Class::Interactive, false, cost()).await });
    tokio::task::yield_now().await;
    assert_eq!(q.load(), (1, 1));
    drop(p1);
    let p2 = waiting.await.unwrap().unwrap();
    assert_eq!(q.tenant_load(&b), Some((0, 1)));
    drop(p2);
    assert_eq!(q.load(), (0, 0));
}

#[tokio::test]
async fn a_waiter_dropped_while_queued_is_removed_without_charge() {
    let (q, a, b) = queue(1);
    let p1 = q
        .acquire(&a, Class::Interactive, false, cost())
        .await
        .unwrap();
    let fut = q.acquire(&b, Class::Interactive, false, cost());
    let timed_out = tokio::time::timeout(Duration::from_millis(10), fut).await;
    assert!(timed_out.is_err());
    assert_eq!(q.load(), (0, 1));
    drop(p1);
    assert_eq!(q.load(), (0, 0));
    assert_eq!(q.tenant_load(&b), Some((0, 0)));
}

#[tokio::test]
async fn a_grant_to_a_waiter_that_is_gone_is_released() {
    let (q, a, b) = queue(1);
    let p1 = q
        .acquire(&a, Class::Interactive, false, cost())
        .await
        .unwrap();
    // Poll the second acquire once so it is queued, then abandon it without running its
    // cancel guard before the grant: abort the task right after the slot frees.
    let q2 = q.clone();
    let waiting =
        tokio::spawn(async move { q2.acquire(&b, Class::Interactive, false, cost()).await });
    tokio::task::yield_now().await;
    drop(p1);
    waiting.abort();
    let _ = waiting.await;
    assert_eq!(q.load(), (0, 0));
}

#[tokio::test]
async fn queue_full_is_reported_with_a_retry_after() {
    let (q, a, _) = queue(1);
    let _p = q
        .acquire(&a, Class::Interactive, false, cost())
        .await
        .unwrap();
    let q1 = q.clone();
    let a1 = a.clone();
    let _w1 = tokio::spawn(async move { q1.acquire(&a1, Class::Interactive, false, cost()).await });
    let q2 = q.clone();
    let a2 = a.clone();
    let _w2 = tokio::spawn(async move { q2.acquire(&a2, Class::Interactive, false, cost()).await });
    tokio::task::yield_now().await;
    let err = q
        .acquire(&a, Class::Interactive, false, cost())
        .await
        .unwrap_err();
    match err {
        QueueError::TenantFull { retry_after } => assert!(retry_after >= Duration::from_secs(1)),
        other => panic!("{other:?}"),
    }
    let unknown = q
        .acquire(&TenantId::new("zz"), Class::Interactive, false, cost())
        .await
        .unwrap_err();
    assert!(matches!(unknown, QueueError::UnknownTenant));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_cancels_leak_nothing() {
    let (q, a, b) = queue(3);
    let mut tasks = Vec::new();
    for i in 0..200u64 {
        let q = q.clone();
        let t = if i % 2 == 0 { a.clone() } else { b.clone() };
        tasks.push(tokio::spawn(async move {
            let Ok(permit) = q.acquire(&t, Class::Interactive, false, cost()).await else {
                return;
            };
            tokio::time::sleep(Duration::from_micros(i % 7 * 50)).await;
            drop(permit);
        }));
        if i % 3 == 0 {
            tasks[i as usize / 2].abort();
        }
    }
    for t in tasks {
        let _ = t.await;
    }
    assert_eq!(q.load(), (0, 0));
    assert_eq!(q.tenant_load(&a), Some((0, 0)));
    assert_eq!(q.tenant_load(&b), Some((0, 0)));
}

#[tokio::test]
async fn extra_attempts_are_charged_to_the_tenant() {
    let (q, a, _) = queue(1);
    let p = q
        .acquire(&a, Class::Interactive, false, cost())
        .await
        .unwrap();
    let charged = p.charged().0 as i64;
    let before = q.credit(&a).unwrap();
    let mut p = p;
    p.settle(None, 2);
    drop(p);
    // Two more attempts at the dispatch cost, charged at once though nothing is queued.
    assert_eq!(q.credit(&a), Some(before - 2 * charged));
    assert_eq!(q.load(), (0, 0));
}

/// Cluster mode: service a tenant received elsewhere (tokens ÷ weight) is charged back in
/// tokens at its weight here now, so a re-weighted (or newly added) tenant counts from the
/// generation that applied it; a tenant without work here, or unknown, is not charged.
#[tokio::test]
async fn remote_service_is_charged_at_the_weight_in_force() {
    let (q, a, b) = queue(1);
    assert_eq!(q.charge_remote(&a, 100.0), None, "idle: not charged");
    let p = q
        .acquire(&a, Class::Interactive, false, cost())
        .await
        .unwrap();
    let before = q.credit(&a).unwrap();
    assert_eq!(q.charge_remote(&a, 100.0), Some(crate::domain::Tokens(100)));
    assert_eq!(q.credit(&a), Some(before - 100));
    let spec = |w: f64| TenantSettings {
        weight: Weight::new(w).unwrap(),
        max_concurrency: None,
        max_queued: 2,
    };
    let settings = scheduler::Config {
        capacity: 1,
        ..scheduler::Config::default()
    };
    let c = TenantId::new("c");
    q.reconfigure(
        settings,
        &[
            (a.clone(), spec(3.0)),
            (b, spec(1.0)),
            (c.clone(), spec(2.0)),
        ],
    );
    assert_eq!(q.charge_remote(&a, 100.0), Some(crate::domain::Tokens(300)));
    assert_eq!(q.charge_remote(&c, 100.0), None, "added, no work here yet");
    assert_eq!(q.charge_remote(&TenantId::new("nobody"), 100.0), None);
    drop(p);
}
