use super::*;
use crate::scheduler::Policy;
use crate::sim::{run, Scenario};

fn scenario() -> Scenario {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/scenarios/endpoints-failover.toml"
    );
    Scenario::load(std::path::Path::new(path)).unwrap()
}

#[test]
fn the_fleet_learns_fails_over_and_never_passes_a_deployment() {
    let s = scenario();
    let r = run(&s, Policy::Drr);
    let row = |n: &str| r.endpoints.iter().find(|e| e.name == n).unwrap().clone();
    let (east, west, central, backup) = (row("east"), row("west"), row("central"), row("backup"));
    // No deployment ever had more than it accepts, nor more than fairgate's limit for it.
    assert!(east.peak <= 2 && west.peak <= 4 && central.peak <= 4 && backup.peak <= 8);
    // east's 429s taught it (its limit is learned near 2), west's outage ejected it and it came
    // back (it served after), and the backup took overflow only.
    assert!(east.refused > 0 && east.learned_limit <= 3, "{east:?}");
    assert!(west.failed > 0 && west.ejections > 0, "{west:?}");
    assert!(backup.served > 0, "{backup:?}");
    assert!(central.served > backup.served, "{central:?} {backup:?}");
    let errors: u64 = r.tenants.iter().map(|t| t.errors).sum();
    assert_eq!(errors, 0, "every request was served");
    // Deterministic.
    let again = run(&s, Policy::Drr);
    assert_eq!(format!("{r}"), format!("{again}"));
}

#[test]
fn a_request_fails_over_inside_its_slot() {
    let spec = |name: &str, down: Vec<[f64; 2]>| EndpointSpec {
        name: name.into(),
        max_concurrency: 2,
        priority: 0,
        weight: 1.0,
        provider_capacity: None,
        slowdown: 1.0,
        down,
    };
    let specs = [spec("dead", vec![[0.0, 10.0]]), spec("live", vec![])];
    let mut f = Fleet::new(&specs, 4, Duration::from_millis(100), Duration::ZERO).unwrap();
    let t0 = Duration::ZERO;
    // The first pick goes to "dead" (first of equals), fails, and goes on to "live".
    assert_eq!(
        f.send(1, t0),
        Sent::Served {
            slowdown: 1.0,
            delay_us: ATTEMPT_US
        }
    );
    f.done(1, Duration::from_millis(5));
    let rows = f.rows(Duration::from_millis(5));
    assert_eq!((rows[0].failed, rows[1].served), (1, 1));
}
