//! Scheduler hot path: one dispatch + complete (+ the re-enqueue that keeps every tenant
//! backlogged) with 10 … 100k backlogged tenants. The cost must stay flat in the tenant count.
//! The harness adds nothing that grows with the tenant count (the grant's own key is re-queued).

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use fairgate::domain::{TenantId, Tokens, Weight};
use fairgate::scheduler::{Class, Config, Policy, Scheduler, TenantSpec};

fn setup(tenants: usize, policy: Policy) -> Scheduler<u64> {
    let mut s = Scheduler::new(Config {
        policy,
        capacity: 64,
        max_queued: usize::MAX,
        ..Config::default()
    });
    let keys: Vec<_> = (0..tenants)
        .map(|i| {
            s.upsert_tenant(
                TenantId::new(format!("t{i}")),
                TenantSpec {
                    weight: Weight::new(1.0 + (i % 4) as f64).unwrap(),
                    max_concurrency: Some(8),
                    max_queued: 1000,
                },
            )
        })
        .collect();
    for (i, &k) in keys.iter().enumerate() {
        for j in 0..2 {
            let cost = 500 + ((i * 7919 + j * 104_729) % 7000) as u64;
            s.enqueue(Duration::ZERO, k, Class::Interactive, false, cost)
                .unwrap();
        }
    }
    s
}

fn dispatch_complete(c: &mut Criterion) {
    let mut group = c.benchmark_group("dispatch_complete");
    group.throughput(Throughput::Elements(1));
    for policy in [Policy::Drr, Policy::Fifo] {
        for tenants in [10usize, 1_000, 10_000, 100_000] {
            let mut s = setup(tenants, policy);
            let name = format!("{policy:?}").to_lowercase();
            group.bench_with_input(BenchmarkId::new(name, tenants), &tenants, |b, _| {
                let mut n = 0u64;
                b.iter(|| {
                    n += 1;
                    let g = s
                        .dispatch(Duration::ZERO, &mut |c: &u64| Tokens(*c))
                        .expect("always backlogged");
                    let tenant = g.slot.tenant;
                    s.reconcile(g.slot, Tokens(g.item + n % 97));
                    s.complete(g.slot);
                    s.enqueue(Duration::ZERO, tenant, Class::Interactive, false, g.item)
                        .unwrap();
                    black_box(n)
                });
            });
        }
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30);
    targets = dispatch_complete
}
criterion_main!(benches);
