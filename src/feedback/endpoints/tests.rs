use std::time::Duration;

use proptest::prelude::*;

use super::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn spec(name: &str, max: u32, priority: u32) -> Spec {
    Spec {
        name: Arc::from(name),
        max,
        priority,
        weight: 1.0,
    }
}

fn pool(specs: Vec<Spec>) -> Balancer {
    let max = specs.iter().map(|s| s.max).sum();
    Balancer::new(specs, max, Rules::default(), ms(250))
}

#[test]
fn requests_spread_by_free_capacity_and_never_past_a_limit() {
    let mut b = pool(vec![spec("a", 4, 0), spec("b", 12, 0)]);
    assert_eq!(b.capacity(ms(0)), 16);
    let picks: Vec<Ticket> = (0..16).map(|_| b.pick(ms(0), "m", 0).unwrap()).collect();
    let on_a = picks.iter().filter(|t| t.endpoint == 0).count();
    assert_eq!(on_a, 4, "each endpoint filled to its own limit");
    assert_eq!(b.pick(ms(0), "m", 0), Err(NoPick::Busy));
    // The first picks went to the larger endpoint (more free capacity).
    assert_eq!(picks[0].endpoint, 1);
    for t in picks {
        b.release(t);
    }
    assert!(b.views(ms(0)).iter().all(|v| v.in_flight == 0));
}

#[test]
fn a_backup_takes_only_what_no_primary_can() {
    let mut b = pool(vec![spec("primary", 2, 0), spec("backup", 8, 1)]);
    let t1 = b.pick(ms(0), "m", 0).unwrap();
    let t2 = b.pick(ms(0), "m", 0).unwrap();
    assert_eq!((t1.endpoint, t2.endpoint), (0, 0));
    let t3 = b.pick(ms(0), "m", 0).unwrap();
    assert_eq!(
        t3.endpoint, 1,
        "the primary is full: overflow to the backup"
    );
    b.release(t1);
    assert_eq!(
        b.pick(ms(0), "m", 0).unwrap().endpoint,
        0,
        "back to the primary"
    );
    // Excluded (already tried by this request): the backup, though the primary had room.
    b.release(t2);
    assert_eq!(b.pick(ms(0), "m", 1).unwrap().endpoint, 1);
    assert_eq!(b.pick(ms(0), "m", 0b11), Err(NoPick::None));
}

#[test]
fn a_refusal_teaches_and_pauses_only_its_endpoint() {
    let mut b = pool(vec![spec("a", 8, 0), spec("b", 8, 0)]);
    let on_a: Vec<Ticket> = (0..16)
        .map(|_| b.pick(ms(0), "m", 0).unwrap())
        .filter(|t| t.endpoint == 0)
        .collect();
    // a holds 3, refuses its fourth: its limit goes to 3, b keeps 8.
    let refused = Signal::Overload {
        wait: Some(ms(500)),
        failed: false,
    };
    b.observe(&on_a[3], ms(1), refused.clone());
    let v = b.views(ms(1));
    assert_eq!((v[0].limit, v[1].limit), (3, 8));
    assert_eq!(b.capacity(ms(1)), 11);
    // A second refusal in the same round trip pauses a (only a) for the wait it named.
    b.observe(&on_a[3], ms(2), refused);
    assert_eq!(b.views(ms(2))[0].state, "paused");
    assert_eq!(b.capacity(ms(2)), 8);
    assert_eq!(b.paused_for(ms(2)), Duration::ZERO, "b is not paused");
    assert_eq!(b.next_change(ms(2)), Some(ms(502)));
    assert_eq!(b.capacity(ms(502)), 11);
}

#[test]
fn a_full_paused_endpoint_is_waited_for_not_given_up() {
    let mut b = pool(vec![spec("a", 1, 0), spec("b", 1, 0)]);
    let on_a = b.pick(ms(0), "m", 0b10).unwrap();
    b.observe(
        &on_a,
        ms(0),
        Signal::Success {
            spent: Some(ms(500)),
        },
    );
    assert_eq!(b.views(ms(1))[0].state, "paused");
    // b tried already; a is paused and full: its slot frees when its request ends.
    assert_eq!(b.pick(ms(1), "m", 0b10), Err(NoPick::Busy));
    b.release(on_a);
    assert_eq!(
        b.pick(ms(1), "m", 0b10).map(|t| t.endpoint),
        Ok(0),
        "sent, paused"
    );
}

#[test]
fn a_model_limit_pauses_that_model_on_that_endpoint_only() {
    let mut b = pool(vec![spec("a", 4, 0), spec("b", 4, 0)]);
    let t = b.pick(ms(0), "gpt-4o", 0).unwrap();
    let on = t.endpoint;
    b.observe(
        &t,
        ms(0),
        Signal::ModelLimited {
            model: "gpt-4o".into(),
            wait: ms(1000),
        },
    );
    b.release(t);
    for _ in 0..4 {
        assert_ne!(b.pick(ms(10), "gpt-4o", 0).unwrap().endpoint, on);
    }
    assert_eq!(b.pick(ms(10), "other", 0).unwrap().endpoint, on);
    assert_eq!(
        b.capacity(ms(10)),
        8,
        "the endpoint still serves other models"
    );
}

#[test]
fn failures_eject_one_endpoint_and_a_probe_brings_it_back() {
    let mut b = pool(vec![spec("a", 4, 0), spec("b", 4, 0)]);
    for i in 0..5 {
        let t = b.pick(ms(i), "m", 0b10).unwrap();
        b.observe(&t, ms(i), Signal::Failure);
        b.release(t);
    }
    assert_eq!(b.views(ms(5))[0].state, "ejected");
    assert_eq!(b.capacity(ms(5)), 4);
    assert_eq!(b.pick(ms(5), "m", 0b10), Err(NoPick::None));
    // b fails as often: it is the last in service and stays.
    for i in 0..10 {
        let t = b.pick(ms(5 + i), "m", 0).unwrap();
        assert_eq!(t.endpoint, 1);
        b.observe(&t, ms(5 + i), Signal::Failure);
        b.release(t);
    }
    assert_eq!(b.views(ms(20))[1].state, "in_service");
    // At 1004 a's probe is due: it is picked first, one request at a time.
    let probe = b.pick(ms(1004), "m", 0).unwrap();
    assert_eq!(probe.endpoint, 0);
    assert_eq!(b.pick(ms(1004), "m", 0).unwrap().endpoint, 1);
    b.observe(&probe, ms(1010), Signal::Success { spent: None });
    b.release(probe);
    assert_eq!(b.views(ms(1010))[0].state, "in_service");
    assert_eq!(b.capacity(ms(1010)), 8);
}

#[test]
fn a_reload_keeps_what_the_same_endpoints_learned() {
    let mut b = pool(vec![spec("a", 8, 0)]);
    let ts: Vec<Ticket> = (0..8).map(|_| b.pick(ms(0), "m", 0).unwrap()).collect();
    b.observe(
        &ts[4],
        ms(0),
        Signal::Overload {
            wait: None,
            failed: false,
        },
    );
    b.reconfigure(vec![spec("a", 16, 0)], 16, Rules::default());
    assert_eq!(b.views(ms(0))[0].limit, 4, "learned limit kept");
    assert_eq!(b.views(ms(0))[0].in_flight, 8, "in-flight kept");
    b.reconfigure(vec![spec("x", 4, 0), spec("y", 4, 0)], 8, Rules::default());
    for t in ts {
        b.release(t);
    }
    assert!(
        b.views(ms(0)).iter().all(|v| v.in_flight == 0),
        "old tickets ignored"
    );
}

#[derive(Clone, Debug)]
enum Op {
    Pick { model: u8, exclude: u64 },
    Release(usize),
    Observe(usize, u8, u16),
    Advance(u16),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..3, 0u64..16).prop_map(|(model, exclude)| Op::Pick { model, exclude }),
        3 => any::<usize>().prop_map(Op::Release),
        3 => (any::<usize>(), 0u8..6, 0u16..2000).prop_map(|(t, s, w)| Op::Observe(t, s, w)),
        1 => (0u16..3000).prop_map(Op::Advance),
    ]
}

fn specs() -> impl Strategy<Value = Vec<Spec>> {
    prop::collection::vec((1u32..8, 0u32..3, 1u32..4), 1..5).prop_map(|v| {
        v.into_iter()
            .enumerate()
            .map(|(i, (max, priority, w))| Spec {
                name: Arc::from(format!("e{i}")),
                max,
                priority,
                weight: f64::from(w),
            })
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Whatever the answers, no endpoint is ever sent more than its limit, an ejected one
    /// (probe not due) gets nothing, a backup is picked only when no lower level had a free
    /// unpaused endpoint, the capacity stays within the pool's size, and one endpoint at
    /// least stays in service.
    #[test]
    fn the_pool_never_sends_an_endpoint_more_than_its_limit(
        specs in specs(),
        ops in prop::collection::vec(op(), 1..300),
    ) {
        let models = ["a", "b", "c"];
        let mut b = pool(specs.clone());
        let mut now = Duration::ZERO;
        let mut out: Vec<Ticket> = Vec::new();
        for op in ops {
            match op {
                Op::Pick { model, exclude } => {
                    let model = models[model as usize];
                    let before = b.views(now);
                    let unpaused: Vec<bool> = b
                        .endpoints
                        .iter()
                        .map(|e| e.paused_until(model, now).is_zero())
                        .collect();
                    let free_unpaused = |v: &View, i: usize| {
                        exclude & (1 << i) == 0
                            && v.state != "ejected"
                            && v.in_flight < v.limit
                            && unpaused[i]
                    };
                    match b.pick(now, model, exclude) {
                        Ok(t) => {
                            let i = t.endpoint;
                            prop_assert!(exclude & (1 << i) == 0, "an excluded endpoint");
                            prop_assert!(before[i].state != "ejected", "an ejected endpoint");
                            prop_assert!(before[i].in_flight < before[i].limit, "past its limit");
                            let best = before
                                .iter()
                                .enumerate()
                                .filter(|(j, v)| free_unpaused(v, *j))
                                .map(|(_, v)| v.priority)
                                .min();
                            if let Some(p) = best {
                                prop_assert!(before[i].priority == p, "a backup while a primary could");
                            }
                            out.push(t);
                        }
                        Err(NoPick::Busy) => prop_assert!(before
                            .iter()
                            .enumerate()
                            .all(|(j, v)| !free_unpaused(v, j))),
                        Err(NoPick::None) => prop_assert!(before
                            .iter()
                            .enumerate()
                            .all(|(j, v)| exclude & (1 << j) != 0 || v.state == "ejected")),
                    }
                }
                Op::Release(k) if !out.is_empty() => {
                    let t = out.swap_remove(k % out.len());
                    b.release(t);
                }
                Op::Observe(k, s, w) if !out.is_empty() => {
                    let t = &out[k % out.len()];
                    let wait = ms(u64::from(w));
                    let signal = match s {
                        0 => Signal::Success { spent: None },
                        1 => Signal::Alive,
                        2 => Signal::Overload { wait: Some(wait), failed: false },
                        3 => Signal::Overload { wait: None, failed: true },
                        4 => Signal::ModelLimited { model: models[w as usize % 3].into(), wait },
                        _ => Signal::Failure,
                    };
                    b.observe(t, now, signal);
                }
                Op::Advance(d) => now += ms(u64::from(d)),
                _ => {}
            }
            let views = b.views(now);
            for (v, e) in views.iter().zip(&b.endpoints) {
                prop_assert_eq!(v.in_flight as usize, e.wire.len());
                prop_assert!(v.limit <= v.max);
            }
            prop_assert!(b.capacity(now) <= b.max());
            prop_assert!(views.iter().any(|v| v.state != "ejected"), "every endpoint ejected");
        }
        for t in out {
            b.release(t);
        }
        prop_assert!(b.views(now).iter().all(|v| v.in_flight == 0));
    }
}
