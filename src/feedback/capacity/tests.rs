use super::*;

fn queue() -> Arc<FairQueue> {
    crate::queue::FairQueue::new(
        crate::queue::QueueSettings {
            scheduler: crate::scheduler::Config {
                capacity: 16,
                reserved_slots: 1,
                ..Default::default()
            },
            estimator: Arc::new(crate::estimate::Estimator::new(
                &Default::default(),
                &Default::default(),
            )),
        },
        &[],
    )
}

fn pool(max: u32, reserved: u32) -> Arc<PoolCapacity> {
    PoolCapacity::new(queue(), max, reserved)
}

fn upstream(toml: &str) -> UpstreamConfig {
    toml::from_str::<UpstreamConfig>(toml).unwrap().resolved()
}

async fn send(cap: &Arc<PoolCapacity>) -> WireTicket {
    cap.pick("m", 0, Duration::ZERO).await.unwrap()
}

use crate::feedback::signals::header_map as h;

#[tokio::test]
async fn a_refusal_cuts_the_limit_to_the_requests_sent_before_it_still_on_the_wire() {
    let cap = pool(16, 0);
    // A burst of 16: the provider (K = 4) holds the first four and refuses the rest at once.
    let mut tickets = Vec::new();
    for _ in 0..16 {
        tickets.push(send(&cap).await);
    }
    let none = HeaderMap::new();
    cap.observe(&tickets[15], StatusCode::TOO_MANY_REQUESTS, &none, "m");
    assert_eq!(cap.limit(), 15, "the 16th came back first: 15 ahead of it");
    // The rest come back out of order; the lowest count wins, in the same round trip.
    for i in [9, 4, 12, 7] {
        cap.observe(&tickets[i], StatusCode::TOO_MANY_REQUESTS, &none, "m");
    }
    assert_eq!(
        cap.limit(),
        4,
        "the fifth was refused behind four accepted ones"
    );
    assert_eq!(cap.throttled(), 5);
}

#[tokio::test(start_paused = true)]
async fn overload_lowers_capacity_pauses_and_the_timer_restores_it() {
    let cap = pool(16, 1);
    let wait = h(&[("retry-after-ms", "300")]);
    let first = send(&cap).await;
    let t = send(&cap).await;
    cap.observe(&t, StatusCode::TOO_MANY_REQUESTS, &wait, "m");
    assert_eq!(cap.limit(), 1, "one ahead of it on the wire");
    assert_eq!(
        cap.effective(),
        2,
        "the first overload of a round trip only slows"
    );
    cap.observe(&t, StatusCode::TOO_MANY_REQUESTS, &wait, "m");
    assert_eq!(cap.effective(), 1, "paused: only the recovery reservation");
    assert!(cap.paused_for() > Duration::ZERO);
    tokio::time::sleep(Duration::from_millis(301)).await;
    tokio::task::yield_now().await;
    assert_eq!(cap.effective(), 2, "the timer restored the learned limit");
    assert_eq!(cap.paused_for(), Duration::ZERO);
    drop((first, t));
    // Successes climb back, at most to the configured size.
    let t = send(&cap).await;
    for _ in 0..5000 {
        cap.observe(&t, StatusCode::OK, &HeaderMap::new(), "m");
    }
    assert_eq!(cap.effective(), 16);
}

#[tokio::test]
async fn reconfigure_resizes_in_place_and_keeps_a_learned_limit() {
    let cap = pool(16, 0);
    let one = |max: u32| {
        upstream(&format!(
            "name = \"u\"\nbase_url = \"http://a\"\nmax_concurrency = {max}\n"
        ))
    };
    // The single endpoint keeps the name it was built with only if the config names it the
    // same: a plain upstream's endpoint is named after the upstream.
    let named = PoolCapacity::for_upstream(queue(), &one(16), 0);
    named.reconfigure(&one(32), 1);
    assert_eq!(
        (named.limit(), named.effective()),
        (32, 32),
        "nothing learned: follows"
    );
    let a = send(&named).await;
    let b = send(&named).await;
    named.observe(&b, StatusCode::TOO_MANY_REQUESTS, &HeaderMap::new(), "m");
    drop((a, b));
    let learned = named.limit();
    assert!(learned < 32);
    named.reconfigure(&one(64), 1);
    assert_eq!(named.limit(), learned, "a learned limit is kept");
    named.reconfigure(&one(4), 1);
    assert_eq!(named.configured(), 4);
    drop(cap);
}

#[tokio::test(start_paused = true)]
async fn a_pool_of_endpoints_spreads_fails_over_and_waits_only_when_all_are_full() {
    let cap = PoolCapacity::for_upstream(
        queue(),
        &upstream(
            "name = \"p\"\n[[endpoints]]\nname = \"a\"\nbase_url = \"http://a\"\nmax_concurrency = 1\n\
             [[endpoints]]\nname = \"b\"\nbase_url = \"http://b\"\nmax_concurrency = 1\n",
        ),
        0,
    );
    assert_eq!(
        (cap.configured(), cap.effective(), cap.endpoints()),
        (2, 2, 2)
    );
    let a = send(&cap).await;
    let b = send(&cap).await;
    assert_ne!(a.endpoint(), b.endpoint());
    assert!(matches!(
        cap.pick("m", 0, Duration::from_millis(50)).await,
        Err(NoPick::Busy)
    ));
    // A waiter gets the slot freed by a release.
    let waiter = tokio::spawn({
        let cap = cap.clone();
        async move {
            cap.pick("m", 0, Duration::from_secs(5))
                .await
                .map(|t| t.endpoint())
        }
    });
    tokio::task::yield_now().await;
    let freed = a.endpoint();
    drop(a);
    assert_eq!(waiter.await.unwrap(), Ok(freed));
    // Failures eject one endpoint: the pool's capacity follows, the other is picked.
    let other = b.endpoint();
    drop(b);
    for _ in 0..5 {
        let t = cap
            .pick("m", 1 << (1 - other), Duration::ZERO)
            .await
            .unwrap();
        cap.fail(&t);
    }
    assert_eq!(cap.effective(), 1);
    assert!(!cap.has_other(1 << (1 - other)));
    assert_eq!(cap.views()[other].state, "ejected");
    // Its probe falls due after eject_ms: the timer gives the slot back.
    tokio::time::sleep(Duration::from_millis(1001)).await;
    tokio::task::yield_now().await;
    assert_eq!(cap.effective(), 2);
    assert_eq!(cap.views()[other].state, "probing");
}

#[test]
fn the_health_defaults_are_the_configs() {
    assert_eq!(rules(&Default::default()), Rules::default());
}
