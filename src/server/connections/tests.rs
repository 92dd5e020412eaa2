use super::*;

fn ip(last: u8) -> IpAddr {
    IpAddr::from([127, 0, 0, last])
}

#[tokio::test(start_paused = true)]
async fn the_per_ip_cap_refuses_only_that_address() {
    let r = Registry::new(100, Some(2), Handles::noop());
    let _a = [r.admit(ip(1)).unwrap(), r.admit(ip(1)).unwrap()];
    assert_eq!(r.admit(ip(1)).err(), Some(Refusal::PerIp));
    let b = r.admit(ip(2)).unwrap();
    drop(b);
    assert_eq!(r.open(), 2);
}

#[tokio::test(start_paused = true)]
async fn at_the_cap_the_oldest_idle_connection_is_shed_and_busy_ones_are_kept() {
    let r = Registry::new(3, None, Handles::noop());
    let busy = r.admit(ip(1)).unwrap();
    let _request = busy.entry.begin();
    tokio::time::advance(Duration::from_secs(1)).await;
    let old = r.admit(ip(1)).unwrap();
    tokio::time::advance(Duration::from_secs(1)).await;
    let young = r.admit(ip(1)).unwrap();
    tokio::time::advance(Duration::from_secs(1)).await;
    // Full: the newcomer takes the place of the oldest idle connection, which is asked to go.
    let newcomer = r.admit(ip(2)).unwrap();
    tokio::time::timeout(Duration::from_millis(1), old.entry.shed_requested())
        .await
        .expect("the oldest idle connection is asked to close");
    assert!(young.entry.idle_deadline(Duration::ZERO).is_some());
    tokio::time::advance(Duration::from_secs(1)).await;
    // Still full (the shed one has not closed yet, but no longer counts): `young` goes next.
    let _second = r.admit(ip(2)).unwrap();
    tokio::time::timeout(Duration::from_millis(1), young.entry.shed_requested())
        .await
        .expect("then the next oldest");
    // Only busy or fresh connections left that are not already shed: `newcomer` is idle.
    let _third = r.admit(ip(3)).unwrap();
    tokio::time::timeout(Duration::from_millis(1), newcomer.entry.shed_requested())
        .await
        .expect("then the newcomer");
    drop((old, young));
    assert_eq!(r.open(), 4);
}

#[tokio::test(start_paused = true)]
async fn with_every_connection_busy_the_newcomer_is_refused() {
    let r = Registry::new(1, None, Handles::noop());
    let busy = r.admit(ip(1)).unwrap();
    let request = busy.entry.begin();
    assert_eq!(r.admit(ip(2)).err(), Some(Refusal::MaxConnections));
    drop(request);
    assert!(r.admit(ip(2)).is_ok());
}

#[tokio::test(start_paused = true)]
async fn idle_deadline_counts_from_the_end_of_the_last_request() {
    let r = Registry::new(10, None, Handles::noop());
    let g = r.admit(ip(1)).unwrap();
    let keepalive = Duration::from_secs(75);
    let opened = Instant::now();
    assert_eq!(g.entry.idle_deadline(keepalive), Some(opened + keepalive));
    let request = g.entry.begin();
    assert_eq!(g.entry.idle_deadline(keepalive), None);
    tokio::time::advance(Duration::from_secs(5)).await;
    drop(request);
    let deadline = g.entry.idle_deadline(keepalive).unwrap();
    assert_eq!(deadline, opened + Duration::from_secs(5) + keepalive);
}

#[tokio::test(start_paused = true)]
async fn shedding_for_descriptors_takes_the_oldest_idle_ones() {
    let r = Registry::new(10, None, Handles::noop());
    let mut conns = Vec::new();
    for _ in 0..5 {
        conns.push(r.admit(ip(1)).unwrap());
        tokio::time::advance(Duration::from_secs(1)).await;
    }
    let _request = conns[0].entry.begin();
    assert_eq!(r.shed_idle(2), 2);
    for (i, c) in conns.iter().enumerate() {
        let asked = tokio::time::timeout(Duration::from_millis(1), c.entry.shed_requested())
            .await
            .is_ok();
        assert_eq!(asked, i == 1 || i == 2, "connection {i}");
    }
    assert_eq!(r.shed_idle(10), 2);
    assert_eq!(r.shed_idle(10), 0);
}
