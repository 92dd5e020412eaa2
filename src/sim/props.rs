//! Property tests over random closed-loop and open-loop tenants mixed, through the simulator
//! (the real scheduler on a virtual clock): a light tenant is served at the next free slot, and
//! no way of sending beats a backlogged tenant by more than 5% per unit of weight.

use proptest::prelude::*;

use super::run;
use super::scenario::{Arrivals, Dist, Pool, Scenario, TenantSpec};
use crate::scheduler::Policy;

/// Service time: 1 ms plus 10 ms per 1k tokens, ±30%.
const BASE_MS: f64 = 1.0;
const PER_1K_MS: f64 = 10.0;
const JITTER: f64 = 0.3;

fn service_ms(tokens: f64) -> f64 {
    BASE_MS + PER_1K_MS * tokens / 1000.0
}

fn pool(capacity: u32, quantum: u64) -> Pool {
    Pool {
        capacity,
        quantum,
        service_ms: BASE_MS,
        service_ms_per_1k_tokens: PER_1K_MS,
        provider_capacity: None,
        provider_retry_after_ms: 1000.0,
        service_jitter: JITTER,
        client_rtt_ms: 0.05,
        endpoints: Vec::new(),
    }
}

fn tenant(id: &str, weight: f64, arrivals: Arrivals, cost: (f64, f64)) -> TenantSpec {
    TenantSpec {
        id: id.into(),
        weight,
        max_concurrency: None,
        replicas: 1,
        arrivals,
        cost: Dist::Uniform {
            min: cost.0,
            max: cost.1,
        },
        actual_over_estimate: None,
        hold_ms: None,
        victim: false,
    }
}

fn closed(concurrency: u32, think_ms: f64) -> Arrivals {
    Arrivals::Closed {
        concurrency,
        think_ms: (think_ms > 0.0).then_some(Dist::Uniform {
            min: 0.0,
            max: 2.0 * think_ms,
        }),
        start_s: 0.0,
        end_s: None,
    }
}

fn scenario(pool: Pool, tenants: Vec<TenantSpec>, duration_s: f64, seed: u64) -> Scenario {
    Scenario {
        name: "prop".into(),
        description: String::new(),
        duration_s,
        seed,
        pool,
        tenants,
        fairness_window_s: None,
    }
}

/// How a tenant that tries to beat a backlogged one sends.
#[derive(Clone, Debug)]
enum Gamer {
    /// Closed loops: many requests in flight, its queue (nearly) always empty.
    Loops { concurrency: u32, think_ms: f64 },
    /// Bursts of `count` every `every_ms`: alternating bursts and silences.
    Bursts { count: u32, every_ms: f64 },
}

fn gamer() -> impl Strategy<Value = Gamer> {
    prop_oneof![
        (1u32..24, prop_oneof![Just(0.0), 0.1f64..20.0]).prop_map(|(concurrency, think_ms)| {
            Gamer::Loops {
                concurrency,
                think_ms,
            }
        }),
        (1u32..40, 1.0f64..200.0).prop_map(|(count, every_ms)| Gamer::Bursts { count, every_ms }),
    ]
}

/// Bursts as steady arrivals: `count` per `every_ms`, all at once.
fn bursts(count: u32, every_ms: f64, duration_s: f64) -> Vec<TenantSpec> {
    (0..count)
        .map(|i| {
            tenant(
                &format!("g{i}"),
                1.0,
                Arrivals::Steady {
                    per_minute: 60_000.0 / every_ms,
                    start_s: f64::from(i) * 1e-6,
                    end_s: Some(duration_s),
                },
                (0.0, 0.0),
            )
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// A sequential agent (or a person thinking between messages) whose demand is below its
    /// share waits at most for the next slot to free, whatever the quantum and the sizes.
    #[test]
    fn a_light_closed_loop_is_served_at_the_next_free_slot(
        capacity in 3u32..9,
        quantum in prop::sample::select(vec![64u64, 256, 1024, 4096, 16_384]),
        flood_cost in 100f64..4000.0,
        agent_cost in 20f64..8000.0,
        think_ms in prop_oneof![Just(0.0), 1.0f64..300.0],
        seed in 0u64..1000,
    ) {
        // Light in tokens too: the agent's token rate on one slot is well below what the flood
        // gets on the others.
        let rate = |c: f64| c / service_ms(c);
        prop_assume!(rate(agent_cost * 1.1) <= 0.8 * f64::from(capacity - 1) * rate(flood_cost * 0.9));
        let s = scenario(
            pool(capacity, quantum),
            vec![
                tenant("flood", 1.0, closed(capacity * 6, 0.0), (flood_cost * 0.9, flood_cost * 1.1)),
                tenant("agent", 1.0, closed(1, think_ms), (agent_cost * 0.9, agent_cost * 1.1)),
            ],
            10.0,
            seed,
        );
        let r = run(&s, Policy::Drr);
        let agent = r.row("agent").unwrap();
        // The next free slot: at most the longest service of a flood request.
        let slot_ms = service_ms(flood_cost * 1.1) * (1.0 + JITTER) + 0.1;
        prop_assert!(agent.served > 10, "{}", r);
        prop_assert!(agent.wait_max_s * 1000.0 <= slot_ms, "waited {} ms > {slot_ms} ms\n{}", agent.wait_max_s * 1000.0, r);
    }

    /// However a tenant sends — many requests in flight and an empty queue, tiny requests,
    /// bursts and silences — it gets no more than a backlogged tenant per unit of weight (5%),
    /// and its full share when it asks for it.
    #[test]
    fn no_way_of_sending_beats_a_backlogged_tenant(
        capacity in 2u32..9,
        quantum in prop::sample::select(vec![64u64, 256, 1024, 4096]),
        flood_cost in 100f64..2000.0,
        gamer_cost in 20f64..2000.0,
        weight in prop::sample::select(vec![1.0f64, 2.0, 0.5]),
        how in gamer(),
        seed in 0u64..1000,
    ) {
        let duration_s = 20.0;
        let mut tenants = vec![tenant("flood", 1.0, closed(capacity * 6, 0.0), (flood_cost * 0.9, flood_cost * 1.1))];
        // The gamer's loops start first, so whatever slots it holds it could keep by re-sending.
        if let Arrivals::Closed { start_s, .. } = &mut tenants[0].arrivals {
            *start_s = 0.01;
        }
        let asks_for_its_share = matches!(how, Gamer::Loops { concurrency, think_ms } if concurrency >= 2 * capacity && think_ms == 0.0);
        let mut gamers = match how {
            Gamer::Loops { concurrency, think_ms } => vec![tenant("g", weight, closed(concurrency, think_ms), (0.0, 0.0))],
            Gamer::Bursts { count, every_ms } => bursts(count, every_ms, duration_s),
        };
        // The gamer's requests are one tenant: replicas would be separate tenants, so a burst is
        // one tenant's `count` steady streams sharing an id.
        for g in &mut gamers {
            g.id = "g".into();
            g.weight = weight;
            g.cost = Dist::Uniform { min: gamer_cost * 0.9, max: gamer_cost * 1.1 };
        }
        tenants.extend(gamers);
        let s = scenario(pool(capacity, quantum), tenants, duration_s, seed);
        let r = run(&s, Policy::Drr);
        // While both ran (the flood's loops stop at the end; a gamer's backlog may not).
        let flood = r.tenants[0].in_run_tokens as f64;
        let g: f64 = r.tenants[1..].iter().map(|t| t.in_run_tokens as f64).sum();
        // Per unit of weight (the DRR bound, a few quanta, is far below 5% here).
        let per_weight = (g / weight) / flood;
        prop_assert!(per_weight <= 1.05, "gamer per weight ÷ flood = {per_weight:.3}\n{}", r);
        if asks_for_its_share {
            prop_assert!(per_weight >= 0.95, "gamer per weight ÷ flood = {per_weight:.3}\n{}", r);
        }
    }
}
