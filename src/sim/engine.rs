//! The simulation loop: a virtual clock (µs), arrivals and completions as events, and the very
//! same `Scheduler` (and `Aimd` limiter) the proxy drives.
//!
//! Invariants: deterministic (seeded arrivals and costs, ties broken by sequence number);
//! terminates (finite arrivals, every dispatched request completes, retries are bounded).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::time::Duration;

use super::endpoints::{Fleet, Sent};
use super::report::{Recorder, Report};
use super::rng::Rng;
use super::scenario::{Scenario, TenantSpec as ScenarioTenant, MAX_REQUESTS};
use crate::domain::{TenantId, Tokens, Weight};
use crate::feedback::aimd::Aimd;
use crate::scheduler::{self, Class, Policy, Scheduler, Slot, TenantKey, TenantSpec};

/// Attempts per request against a provider that answers 429 (the proxy's retry budget).
const MAX_ATTEMPTS: u32 = 4;

/// One simulated request.
#[derive(Clone, Copy, Debug)]
struct Req {
    tenant: usize,
    actual: u64,
    estimate: u64,
    arrived_us: u64,
    attempts: u32,
    /// Extra slot time of a slow-reading client, ms.
    hold_ms: f64,
}

enum Done {
    Served(Req, Slot),
    Overloaded(Req, Slot),
}

/// Runs `scenario` under `policy` and reports per-tenant service.
pub fn run(scenario: &Scenario, policy: Policy) -> Report {
    let mut rng = Rng::new(scenario.seed);
    let pool = &scenario.pool;
    let mut sched: Scheduler<Req> = Scheduler::new(scheduler::Config {
        policy,
        quantum: Tokens(pool.quantum),
        capacity: pool.capacity,
        max_queued: usize::MAX,
        ..scheduler::Config::default()
    });
    let mut rec = Recorder::default().with_window(scenario.fairness_window_s);
    rec.run_us = (scenario.duration_s * 1e6) as u64;
    let mut keys: Vec<TenantKey> = Vec::new();
    // Each tenant's scenario entry, for the requests a closed loop sends after an answer.
    let mut spec_of: Vec<usize> = Vec::new();
    let mut arrivals = Arrivals::default();
    for (group, spec) in scenario.tenants.iter().enumerate() {
        for r in 0..spec.replicas {
            let id = if spec.replicas > 1 {
                format!("{}-{}", spec.id, r + 1)
            } else {
                spec.id.clone()
            };
            let tenant = keys.len();
            keys.push(sched.upsert_tenant(
                TenantId::new(id.clone()),
                TenantSpec {
                    weight: Weight::new(spec.weight).unwrap_or(Weight::ONE),
                    max_concurrency: spec.max_concurrency,
                    max_queued: usize::MAX,
                },
            ));
            spec_of.push(group);
            rec.add_tenant(id, group, spec.weight, spec.max_concurrency);
            for t in spec.arrivals.times(scenario.duration_s, &mut rng) {
                let req = new_req(spec, tenant, (t * 1000.0) as u64, &mut rng);
                arrivals.push(req);
            }
        }
    }
    // The next request of a closed loop, `rtt + think` after an answer, if its loop still runs.
    let follow_up = |req: &Req, now: u64, rng: &mut Rng, arrivals: &mut Arrivals| {
        let spec = &scenario.tenants[spec_of[req.tenant]];
        let Some((think, end_ms)) = spec.arrivals.closed(scenario.duration_s) else {
            return;
        };
        let think = think.map_or(0.0, |d| d.sample(rng, 0.0));
        let at = now + ((pool.client_rtt_ms + think) * 1000.0) as u64;
        if (at as f64) < end_ms * 1000.0 && arrivals.made() < MAX_REQUESTS {
            arrivals.push(new_req(spec, req.tenant, at, rng));
        }
    };
    let mut aimd = pool
        .provider_capacity
        .map(|_| Aimd::new(pool.capacity).with_cooldown(ms(pool.service_ms)));
    let retry_after = ms(pool.provider_retry_after_ms);
    let mut fleet = Fleet::new(
        &pool.endpoints,
        pool.capacity,
        ms(pool.service_ms),
        retry_after,
    );
    let mut done: BinaryHeap<Reverse<(u64, u64)>> = BinaryHeap::new();
    let mut pending: Vec<Option<Done>> = Vec::new();
    let mut provider_in_flight = 0u32;
    let mut now = 0u64;
    loop {
        let paused_until = aimd
            .as_ref()
            .filter(|a| sched.queued() > 0 && a.paused(us(now)))
            .map(|a| a.paused_until().as_micros() as u64);
        let fleet_change = fleet
            .as_ref()
            .filter(|_| sched.queued() > 0)
            .and_then(|f| f.next_change(us(now)))
            .map(|t| t.as_micros() as u64);
        let candidates = [
            arrivals.peek_time(),
            done.peek().map(|d| d.0 .0),
            paused_until,
            fleet_change,
        ];
        let Some(t) = candidates.into_iter().flatten().min() else {
            break;
        };
        now = now.max(t);
        rec.tick(now);
        while let Some(&Reverse((at, i))) = done.peek() {
            if at > now {
                break;
            }
            done.pop();
            provider_in_flight -= 1;
            match pending[i as usize]
                .take()
                .expect("each completion fires once")
            {
                Done::Served(req, slot) => {
                    if let Some(f) = fleet.as_mut() {
                        f.done(i, us(now));
                    }
                    sched.reconcile(slot, Tokens(req.actual));
                    sched.complete(slot);
                    follow_up(&req, at, &mut rng, &mut arrivals);
                    if let Some(a) = aimd.as_mut() {
                        a.on_success();
                    }
                }
                Done::Overloaded(req, slot) => {
                    // The failed attempt stays charged to its tenant (retries are not free).
                    sched.complete(slot);
                    if let Some(a) = aimd.as_mut() {
                        a.on_overload(us(now), Some(ms(pool.provider_retry_after_ms)));
                    }
                    if req.attempts >= MAX_ATTEMPTS {
                        rec.client_error(req.tenant);
                        follow_up(&req, at, &mut rng, &mut arrivals);
                    } else {
                        let k = keys[req.tenant];
                        let _ = sched.enqueue(us(now), k, Class::Interactive, false, req);
                    }
                }
            }
        }
        while let Some(req) = arrivals.pop_until(now) {
            rec.arrived(req.tenant, req.actual);
            if sched
                .enqueue(
                    us(req.arrived_us),
                    keys[req.tenant],
                    Class::Interactive,
                    false,
                    req,
                )
                .is_err()
            {
                rec.client_error(req.tenant);
                follow_up(&req, now, &mut rng, &mut arrivals);
            }
        }
        if let Some(a) = aimd.as_ref() {
            if a.paused(us(now)) {
                continue;
            }
            sched.set_capacity(a.limit());
        }
        if let Some(f) = fleet.as_ref() {
            match f.capacity(us(now)) {
                0 => continue,
                c => sched.set_capacity(c),
            }
        }
        // Who is backlogged at this instant shares the entitlement of what it dispatches.
        let backlog = rec.backlogged(&sched, &keys);
        while let Some(g) = sched.dispatch(us(now), &mut |r: &Req| Tokens(r.estimate)) {
            let mut req = g.item;
            req.attempts += 1;
            let sent = fleet
                .as_mut()
                .map(|f| f.send(pending.len() as u64, us(now)));
            let (slowdown, delay_us) = match sent {
                Some(Sent::Served { slowdown, delay_us }) => (slowdown, delay_us),
                _ => (1.0, 0),
            };
            let overloaded = match sent {
                Some(s) => s == Sent::Overloaded,
                None => pool
                    .provider_capacity
                    .is_some_and(|k| provider_in_flight >= k),
            };
            provider_in_flight += 1;
            let (finish, outcome) = if overloaded {
                rec.provider_429(req.tenant);
                (now + 50_000, Done::Overloaded(req, g.slot))
            } else {
                rec.dispatched(req.tenant, now, now - req.arrived_us, req.actual, &backlog);
                let jitter = if pool.service_jitter > 0.0 {
                    rng.uniform(1.0 - pool.service_jitter, 1.0 + pool.service_jitter)
                } else {
                    1.0
                };
                let service = (pool.service_ms * jitter
                    + pool.service_ms_per_1k_tokens * req.actual as f64 / 1000.0)
                    * slowdown
                    + req.hold_ms;
                let finish = now + delay_us + (service * 1000.0) as u64;
                (finish, Done::Served(req, g.slot))
            };
            done.push(Reverse((finish, pending.len() as u64)));
            pending.push(Some(outcome));
        }
    }
    let mut report = rec.report(scenario, policy, now, aimd.map(|a| a.limit()));
    if let Some(f) = &fleet {
        report.endpoints = f.rows(us(now));
    }
    report
}

/// One request of `spec`'s tenant arriving at `at_us`, with its cost, estimate and hold sampled.
fn new_req(spec: &ScenarioTenant, tenant: usize, at_us: u64, rng: &mut Rng) -> Req {
    let actual = spec.cost.sample(rng, 1.0).round() as u64;
    let factor = spec
        .actual_over_estimate
        .as_ref()
        .map_or(1.0, |d| d.sample(rng, 0.01));
    Req {
        tenant,
        actual,
        estimate: ((actual as f64) / factor).round().max(1.0) as u64,
        arrived_us: at_us,
        attempts: 0,
        hold_ms: spec.hold_ms.as_ref().map_or(0.0, |d| d.sample(rng, 0.0)),
    }
}

/// Requests not yet arrived, earliest first (ties by tenant, then by the order they were made).
#[derive(Default)]
struct Arrivals {
    heap: BinaryHeap<Reverse<(u64, usize, u64)>>,
    reqs: HashMap<u64, Req>,
    seq: u64,
}

impl Arrivals {
    /// Requests made so far (bounded by `MAX_REQUESTS`).
    fn made(&self) -> usize {
        self.seq as usize
    }
}

impl Arrivals {
    fn push(&mut self, req: Req) {
        self.seq += 1;
        self.heap
            .push(Reverse((req.arrived_us, req.tenant, self.seq)));
        self.reqs.insert(self.seq, req);
    }

    fn peek_time(&self) -> Option<u64> {
        self.heap.peek().map(|r| r.0 .0)
    }

    /// The next request that has arrived by `now`.
    fn pop_until(&mut self, now: u64) -> Option<Req> {
        if self.peek_time()? > now {
            return None;
        }
        let Reverse((_, _, seq)) = self.heap.pop()?;
        self.reqs.remove(&seq)
    }
}

fn us(t: u64) -> Duration {
    Duration::from_micros(t)
}

fn ms(t: f64) -> Duration {
    Duration::from_micros((t * 1000.0) as u64)
}
