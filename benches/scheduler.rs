//! Scheduler hot path: one dispatch + complete (+ the re-enqueue that keeps every tenant
//! backlogged) with 10 … 100k backlogged tenants. The cost must stay flat in the tenant count.
//! The harness adds nothing that grows with the tenant count (the grant's own key is re-queued).
//! `light`: the same cycle where every tenant is a closed loop with one request at a time (each
//! request cuts in, issue 23) beside one backlogged flood tenant.

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

fn light(c: &mut Criterion) {
    let mut group = c.benchmark_group("light");
    group.throughput(Throughput::Elements(1));
    for tenants in [10usize, 1_000, 10_000, 100_000] {
        let mut s: Scheduler<u64> = Scheduler::new(Config {
            capacity: 64,
            max_queued: usize::MAX,
            ..Config::default()
        });
        let spec = TenantSpec {
            weight: Weight::ONE,
            max_concurrency: None,
            max_queued: 100_000,
        };
        let flood = s.upsert_tenant(TenantId::new("flood"), spec.clone());
        let keys: Vec<_> = (0..tenants)
            .map(|i| s.upsert_tenant(TenantId::new(format!("t{i}")), spec.clone()))
            .collect();
        for _ in 0..10_000 {
            s.enqueue(Duration::ZERO, flood, Class::Interactive, false, 40)
                .unwrap();
        }
        let mut held = std::collections::VecDeque::new();
        while let Some(g) = s.dispatch(Duration::ZERO, &mut |c: &u64| Tokens(*c)) {
            held.push_back(g.slot);
        }
        group.bench_with_input(BenchmarkId::new("drr", tenants), &tenants, |b, _| {
            let mut n = 0usize;
            b.iter(|| {
                n += 1;
                // A light tenant's request arrives; the oldest slot frees; whoever is next goes.
                let k = keys[n % keys.len()];
                s.enqueue(Duration::ZERO, k, Class::Interactive, false, 40)
                    .unwrap();
                let done = held.pop_front().expect("the pool is full");
                s.complete(done);
                let g = s
                    .dispatch(Duration::ZERO, &mut |c: &u64| Tokens(*c))
                    .expect("a slot just freed");
                if g.slot.tenant == flood {
                    s.enqueue(Duration::ZERO, flood, Class::Interactive, false, 40)
                        .unwrap();
                } else {
                    // The light request went first; the flood takes the next slot.
                    held.push_back(g.slot);
                    let next = held.pop_front().expect("the pool is full");
                    s.complete(next);
                    let f = s
                        .dispatch(Duration::ZERO, &mut |c: &u64| Tokens(*c))
                        .expect("a slot just freed");
                    s.enqueue(Duration::ZERO, flood, Class::Interactive, false, 40)
                        .unwrap();
                    held.push_back(f.slot);
                    return black_box(n);
                }
                held.push_back(g.slot);
                black_box(n)
            });
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30);
    targets = dispatch_complete, light
}
criterion_main!(benches);
