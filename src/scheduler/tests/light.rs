//! Tenants that are not backlogged (issue 23): a sequential agent takes every next free slot
//! whatever the quantum and the request sizes, and keeping a queue just empty wins nothing.

use super::*;

/// A pool of 4, a flood tenant with a deep queue of `flood_cost` requests, and an agent that
/// sends its next `agent_cost` request when its answer is back. The pool is non-preemptive, so
/// while the agent's request runs the flood's slots free and refill many times (service time in
/// proportion to tokens: `(capacity − 1) × agent_cost` flood tokens). Asserts the agent's every
/// request takes the next free slot.
fn agent_beside_flood(quantum: u64, flood_cost: u64, agent_cost: u64) {
    let mut s = sched(Policy::Drr, quantum, 4);
    let t = add(&mut s, 2, 1.0, None);
    let (flood, agent) = (t[0], t[1]);
    for _ in 0..5000 {
        push(&mut s, flood, flood_cost);
    }
    let mut held: std::collections::VecDeque<Slot> =
        (0..4).map(|_| next(&mut s).unwrap().slot).collect();
    for round in 0..30 {
        push(&mut s, agent, agent_cost);
        // The next free slot goes to the agent.
        s.complete(held.pop_front().unwrap());
        let g = next(&mut s).unwrap();
        assert_eq!(
            g.item.0,
            agent.idx(),
            "request {round}: quantum {quantum}, flood {flood_cost}, agent {agent_cost}"
        );
        // While it runs the flood's three slots turn over.
        let turnover = (3 * agent_cost / flood_cost).clamp(3, 3000);
        for _ in 0..turnover {
            s.complete(held.pop_front().unwrap());
            held.push_back(next(&mut s).unwrap().slot);
            push(&mut s, flood, flood_cost);
        }
        s.complete(g.slot);
        // Its freed slot goes to the flood: the agent is back only after that (a round trip).
        let refill = next(&mut s).unwrap();
        assert_eq!(refill.item.0, flood.idx());
        held.push_back(refill.slot);
    }
}

#[test]
fn a_sequential_agent_takes_every_next_free_slot_whatever_the_quantum_and_sizes() {
    for (q, flood, agent) in [
        (64, 20, 20),
        (1024, 20, 20),
        (4096, 20, 20),
        (16384, 20, 20),
        (256, 20, 8000),
        (4096, 20, 8000),
        (4096, 8000, 20),
        (64, 8000, 8000),
    ] {
        agent_beside_flood(q, flood, agent);
    }
}

#[test]
fn a_tenant_with_many_in_flight_and_an_empty_queue_gets_no_more_than_its_share() {
    // G keeps 6 of 8 slots' worth of closed loops: each answer is followed at once by its next
    // request, so its queue is nearly always empty while requests are in flight. F is
    // backlogged. Completions come oldest first (equal service times). When G asks for more
    // tokens than its half it gets its half (within 5%); when it asks for less (its requests
    // much smaller than F's) it gets all it asks for: its 6 slots, and still no more than F.
    for (q, g_cost, f_cost) in [
        (256, 20, 20),
        (4096, 20, 20),
        (256, 300, 20),
        (1024, 20, 300),
    ] {
        let asks_for_more = 6 * g_cost > 2 * f_cost;
        let mut s = sched(Policy::Drr, q, 8);
        let t = add(&mut s, 2, 1.0, None);
        let (g, f) = (t[0], t[1]);
        for _ in 0..2000 {
            push(&mut s, f, f_cost);
        }
        for _ in 0..6 {
            push(&mut s, g, g_cost);
        }
        let mut held: std::collections::VecDeque<Grant<Item>> =
            std::iter::from_fn(|| next(&mut s)).collect();
        let mut served = [0u64; 2];
        let mut g_requests = 0u64;
        for _ in 0..40_000 {
            let done = held.pop_front().unwrap();
            s.complete(done.slot);
            let who = done.item.0;
            if who == g.idx() {
                push(&mut s, g, g_cost);
            } else {
                push(&mut s, f, f_cost);
            }
            while let Some(n) = next(&mut s) {
                served[usize::from(n.item.0 == f.idx())] += n.item.1;
                g_requests += u64::from(n.item.0 == g.idx());
                held.push_back(n);
            }
        }
        let ratio = served[0] as f64 / served[1] as f64;
        let case = format!(
            "quantum {q}, G cost {g_cost}, F cost {f_cost}: G/F tokens {ratio:.3} ({served:?})"
        );
        assert!(ratio <= 1.05, "{case}");
        if asks_for_more {
            assert!(ratio >= 0.95, "{case}");
        } else {
            // Every one of its answers was followed by its next request at once.
            assert!(
                g_requests * 8 >= 40_000 * 6 * 95 / 100,
                "{case}: {g_requests} requests"
            );
        }
    }
}

#[test]
fn bursts_and_silences_earn_no_more_than_a_quantum_per_round() {
    // G sends a burst of 5 whenever it has nothing queued or in flight, F is backlogged; one slot,
    // so every dispatch is one step of the round robin.
    let mut s = sched(Policy::Drr, 100, 1);
    let t = add(&mut s, 2, 1.0, None);
    let (g, f) = (t[0], t[1]);
    for _ in 0..5000 {
        push(&mut s, f, 50);
    }
    let mut served = [0u64; 2];
    for _ in 0..4000 {
        if s.tenant_load(g) == (0, 0) {
            for _ in 0..5 {
                push(&mut s, g, 50);
            }
        }
        let n = next(&mut s).unwrap();
        served[usize::from(n.item.0 == f.idx())] += n.item.1;
        s.complete(n.slot);
    }
    let ratio = served[0] as f64 / served[1] as f64;
    assert!((0.95..=1.05).contains(&ratio), "G/F {ratio:.3} {served:?}");
}
