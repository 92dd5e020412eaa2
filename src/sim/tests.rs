//! The seven design scenarios (`scenarios/`), run through the simulator: each asserts what the
//! design promises, against FIFO where the comparison is the point.

use super::*;
use crate::scheduler::Policy;

fn run_file(name: &str, policy: Policy) -> Report {
    let path = format!("{}/scenarios/{name}.toml", env!("CARGO_MANIFEST_DIR"));
    let s = Scenario::load(std::path::Path::new(&path)).unwrap();
    run(&s, policy)
}

fn both(name: &str) -> (Report, Report) {
    (run_file(name, Policy::Fifo), run_file(name, Policy::Drr))
}

#[test]
fn noisy_neighbor_small_tenants_wait_about_one_service_time() {
    let (fifo, drr) = both("noisy-neighbor");
    let service_s = 20.0;
    let f = fifo.row("small").unwrap();
    let d = drr.row("small").unwrap();
    assert!(
        f.wait_max_s > 30.0 * 60.0,
        "FIFO should show the 40-minute wait: {fifo}"
    );
    assert!(d.wait_max_s <= service_s, "DRR small tenants: {drr}");
    assert_eq!(d.served, f.served);
}

#[test]
fn large_steady_tenant_gets_its_share_and_the_idle_remainder() {
    let (_, drr) = both("large-steady");
    let others = drr.row("other").unwrap();
    let a = drr.row("A").unwrap();
    // The others ask for less than their fair share and get it promptly; A gets the rest.
    assert!(others.wait_p99_s < 30.0, "{drr}");
    assert!((a.share_ratio - 1.0).abs() < 0.05, "{drr}");
    assert!(drr.jain_index > 0.99);
}

#[test]
fn cost_variance_is_fair_in_tokens_not_requests() {
    let (fifo, drr) = both("cost-variance");
    // While both were backlogged, DRR split tokens evenly (entitlement ratio 1).
    for r in &drr.tenants {
        assert!((r.share_ratio - 1.0).abs() < 0.02, "{drr}");
    }
    assert!(fifo.row("A").unwrap().share_ratio > 1.4, "{fifo}");
}

#[test]
fn chronic_underestimates_are_reconciled() {
    let (_, drr) = both("chronic-underestimate");
    let a = drr.row("A").unwrap();
    assert!((a.share_ratio - 1.0).abs() < 0.03, "{drr}");
}

#[test]
fn weights_one_to_four_are_served_in_proportion() {
    let (fifo, drr) = both("weights");
    for r in &drr.tenants {
        assert!((r.share_ratio - 1.0).abs() < 0.02, "{drr}");
    }
    assert!(drr.jain_index > 0.999);
    assert!(fifo.jain_index < 0.8);
}

#[test]
fn idle_return_banks_nothing() {
    let (_, drr) = both("idle-return");
    let a = drr.row("A").unwrap();
    assert!((a.share_ratio - 1.0).abs() < 0.02, "{drr}");
}

#[test]
fn upstream_429_storm_is_absorbed() {
    let (_, drr) = both("upstream-429");
    let t = drr.row("t").unwrap();
    assert_eq!(t.errors, 0, "no client-visible failures: {drr}");
    assert!(
        t.provider_429 * 20 < t.served,
        "429s under 5% of attempts: {drr}"
    );
    assert_eq!(drr.learned_limit, Some(4));
}

#[test]
fn runs_are_deterministic() {
    let a = run_file("noisy-neighbor", Policy::Drr).to_string();
    let b = run_file("noisy-neighbor", Policy::Drr).to_string();
    assert_eq!(a, b);
}

#[test]
fn bad_scenarios_are_refused_with_the_key() {
    let e = Scenario::from_toml("name='x'\nduration_s=1\nbogus=1\n[pool]\ncapacity=1\nservice_ms=1\n[[tenants]]\nid='a'\narrivals={kind='steady',per_minute=1}\ncost={dist='const',value=1}").unwrap_err();
    assert!(e.to_string().contains("bogus"), "{e}");
    let e = Scenario::from_toml("name='x'\nduration_s=1\n[pool]\ncapacity=0\nservice_ms=1\n[[tenants]]\nid='a'\narrivals={kind='steady',per_minute=1}\ncost={dist='const',value=1}").unwrap_err();
    assert!(e.to_string().contains("capacity"), "{e}");
}

#[test]
fn non_reading_client_holds_slots_but_quiet_tenants_wait_about_one_hold() {
    let (fifo, drr) = both("non-reading-client");
    let hold_s = 2.0 + 30.0;
    let (f, d) = (fifo.row("quiet").unwrap(), drr.row("quiet").unwrap());
    println!(
        "ISOLATION | non-reading client (simulate scenarios/non-reading-client.toml) | quiet \
         tenants' max wait DRR ÷ FIFO = {:.3} | DRR {:.0} s, FIFO {:.0} s",
        d.wait_max_s / f.wait_max_s,
        d.wait_max_s,
        f.wait_max_s
    );
    assert!(f.wait_max_s > 10.0 * hold_s, "FIFO: {fifo}");
    assert!(d.wait_max_s <= hold_s, "DRR: {drr}");
    assert_eq!(d.served, f.served);
}

/// The victim's comparison of a scenario file.
fn compare_file(name: &str) -> Comparison {
    let path = format!("{}/scenarios/{name}.toml", env!("CARGO_MANIFEST_DIR"));
    let s = Scenario::load(std::path::Path::new(&path)).unwrap();
    compare(&s).remove(0)
}

#[test]
fn a_sequential_agent_beside_a_flood_is_served_at_the_next_free_slot() {
    for name in ["sequential-agent", "sequential-agent-8k"] {
        let c = compare_file(name);
        println!("{name}\n{c}");
        // Within 10% of the limit, and its p95 queue wait within one service time (50 ms for
        // the short requests, up to ~170 ms for the long ones).
        let service_s = if name.ends_with("8k") { 0.17 } else { 0.05 };
        assert!(c.drr.per_s >= 0.9 * c.limit.per_s, "{name}: {c}");
        assert!(c.drr.wait_p95_s <= service_s, "{name}: {c}");
        // FIFO is far from it, and the limit is below alone (it waits for a slot to free).
        assert!(c.fifo.per_s < 0.5 * c.limit.per_s, "{name}: {c}");
        assert!(c.limit.per_s < c.alone.per_s, "{name}: {c}");
    }
}

#[test]
fn an_interactive_user_beside_a_flood_waits_at_most_one_service_time() {
    let c = compare_file("interactive-user");
    println!("{c}");
    assert!(c.drr.wait_p95_s <= 0.050, "{c}");
    assert!(c.fifo.wait_p95_s > 0.150, "{c}");
    assert!(c.drr.per_s >= 0.95 * c.alone.per_s * 0.9, "{c}");
}

#[test]
fn with_identical_service_times_the_limit_itself_drops() {
    // Every slot frees at once, so the agent, back 1 ms after its answer, always finds the pool
    // refilled by the flood and waits a whole service time: the limit is ~0.5× alone, and DRR
    // still reaches it.
    let path = format!(
        "{}/scenarios/sequential-agent.toml",
        env!("CARGO_MANIFEST_DIR")
    );
    let mut s = Scenario::load(std::path::Path::new(&path)).unwrap();
    s.pool.service_jitter = 0.0;
    let c = compare(&s).remove(0);
    println!("{c}");
    let limit = c.limit.per_s / c.alone.per_s;
    assert!((0.4..0.7).contains(&limit), "{c}");
    assert!(c.drr.per_s >= 0.9 * c.limit.per_s, "{c}");
}
