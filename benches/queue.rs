//! The fair queue's own cost per request, as the proxy pays it: `FairQueue::acquire` (enqueue,
//! DRR dispatch, oneshot hand-off, permit) and dropping the permit after `set_actual`
//! (reconcile, release, pump), on a current-thread runtime, 16 tenants, the pool never full.
//! `block_on(async {})` is measured beside it, so the difference is the queue's cost; divide it
//! by the proxy's CPU time per request (bench/overhead.sh) to get the queue's share.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use fairgate::domain::{TenantId, Tokens, Weight};
use fairgate::estimate::Estimator;
use fairgate::queue::{CostInputs, FairQueue, QueueSettings, TenantSettings};
use fairgate::scheduler::{self, Class};

fn queue(tenants: usize) -> (Arc<FairQueue>, Vec<TenantId>) {
    let ids: Vec<_> = (0..tenants)
        .map(|i| TenantId::new(format!("t{i}")))
        .collect();
    let specs: Vec<_> = ids
        .iter()
        .map(|id| {
            let spec = TenantSettings {
                weight: Weight::new(1.0).unwrap(),
                max_concurrency: None,
                max_queued: 1000,
            };
            (id.clone(), spec)
        })
        .collect();
    let settings = QueueSettings {
        scheduler: scheduler::Config {
            capacity: 1024,
            ..Default::default()
        },
        estimator: Arc::new(Estimator::new(&Default::default(), &Default::default())),
    };
    (FairQueue::new(settings, &specs), ids)
}

fn acquire_release(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("fair_queue");
    group.bench_function("block_on_baseline", |b| {
        b.iter(|| rt.block_on(async { black_box(1) }))
    });
    let (q, ids) = queue(16);
    let mut n = 0usize;
    group.bench_function("acquire_release_16_tenants", |b| {
        b.iter(|| {
            n += 1;
            let id = &ids[n % ids.len()];
            let cost = CostInputs {
                input_tokens: 300,
                max_output_tokens: Some(256),
                ..Default::default()
            };
            let mut permit = rt
                .block_on(q.acquire(id, Class::Interactive, false, cost))
                .expect("never full");
            permit.settle(Some(Tokens(500)), 0);
            drop(black_box(permit));
        })
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .sample_size(30);
    targets = acquire_release
}
criterion_main!(benches);
