//! A pool of several mock upstreams under one fair queue: spreading by free capacity, a 429ing
//! endpoint that teaches only itself, a slow one, a dead one ejected, one coming back, backup
//! priorities, failover before any byte, Azure-style endpoints and tenant keys per endpoint —
//! over raw HTTP and the official async-openai client.

use std::net::SocketAddr;
use std::time::Duration;

use crate::support::*;
use fairgate_mock::{MockConfig, MockServer};

/// One `[[upstreams.endpoints]]` table.
struct Ep<'a> {
    name: &'a str,
    base_url: String,
    max: u32,
    extra: &'a str,
}

fn ep<'a>(name: &'a str, base_url: String, max: u32) -> Ep<'a> {
    Ep {
        name,
        base_url,
        max,
        extra: "",
    }
}

/// Two tenants (`a`, `b`) and one pool `pool` over `endpoints`; `upstream` is added to the
/// `[[upstreams]]` table, `tenant_b` to tenant b's.
fn pool_config(endpoints: &[Ep<'_>], upstream: &str, tenant_b: &str) -> String {
    let mut t = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n\
         [admission]\nmax_retries = 3\n\
         [[upstreams]]\nname = \"pool\"\n{upstream}\n"
    );
    for e in endpoints {
        t.push_str(&format!(
            "[[upstreams.endpoints]]\nname = \"{}\"\nbase_url = \"{}\"\nmax_concurrency = {}\n{}\n",
            e.name, e.base_url, e.max, e.extra
        ));
    }
    t.push_str(&format!(
        "[[tenants]]\nid = \"a\"\napi_keys = [\"{KEY_A}\"]\n\
         [[tenants]]\nid = \"b\"\napi_keys = [\"{KEY_B}\"]\n{tenant_b}\n"
    ));
    t
}

/// A local address nothing listens on (a dead endpoint), and its base URL.
async fn dead() -> (SocketAddr, String) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    (addr, format!("http://{addr}/v1"))
}

/// `n` chat requests at once from tenant a (each asking the mock for `delay_ms`), their
/// statuses.
async fn burst(proxy: SocketAddr, n: usize, delay_ms: u64) -> Vec<u16> {
    let delay = delay_ms.to_string();
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let req = post(
                proxy,
                "/v1/chat/completions",
                Some(KEY_A),
                &chat("gpt-4o-mini"),
                &[("x-mock-delay-ms", &delay)],
            );
            tokio::spawn(async move { send(req).await.status })
        })
        .collect();
    let mut out = Vec::with_capacity(n);
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

/// One chat request of tenant a.
async fn chat_a(proxy: SocketAddr) -> Collected {
    send(post(
        proxy,
        "/v1/chat/completions",
        Some(KEY_A),
        &chat("m"),
        &[],
    ))
    .await
}

fn endpoint_value(metrics: &str, name: &str, endpoint: &str) -> f64 {
    value(
        metrics,
        name,
        &[("upstream", "pool"), ("endpoint", endpoint)],
    )
    .unwrap_or_else(|| panic!("{name}{{endpoint={endpoint}}} missing:\n{metrics}"))
}

fn state(metrics: &str, endpoint: &str) -> String {
    ["in_service", "paused", "probing", "ejected"]
        .into_iter()
        .find(|s| {
            value(
                metrics,
                "fairgate_endpoint_state",
                &[("endpoint", endpoint), ("state", s)],
            ) == Some(1.0)
        })
        .unwrap_or("none")
        .to_owned()
}

#[tokio::test]
async fn a_pool_of_mixed_endpoints_answers_every_request_and_takes_back_a_returning_one() {
    // a: accepts 2 at once and 429s beyond (configured 6: it must learn 2); b: slow; c: dead;
    // d: dead at first, started later on the same address.
    let a = mock_with(MockConfig {
        max_concurrency: Some(2),
        retry_after: Duration::from_millis(50),
        ..MockConfig::default()
    })
    .await;
    let b = mock_slow(150).await;
    let (_, c_url) = dead().await;
    let (d_addr, d_url) = dead().await;
    let toml = pool_config(
        &[
            ep("a", a.base_url(), 6),
            ep("b", b.base_url(), 4),
            ep("c", c_url, 4),
            ep("d", d_url, 4),
        ],
        "",
        "",
    );
    let proxy = proxy(&toml).await;
    let statuses = burst(proxy.addr, 40, 30).await;
    assert!(statuses.iter().all(|&s| s == 200), "{statuses:?}");
    let m = scrape(proxy.addr).await;
    assert_eq!(state(&m, "c"), "ejected", "{m}");
    assert!(endpoint_value(&m, "fairgate_endpoint_ejections_total", "c") >= 1.0);
    assert!(endpoint_value(&m, "fairgate_endpoint_failovers_total", "c") >= 1.0);
    // a refused some (429) and learned a limit below its configured 6; b learned nothing.
    assert!(a.stats.rejected_429() > 0);
    let learned = endpoint_value(&m, "fairgate_endpoint_limit", "a");
    assert!(learned < 6.0, "a learned its own wall: {learned}");
    assert_eq!(
        endpoint_value(&m, "fairgate_endpoint_limit", "b"),
        4.0,
        "b untouched"
    );
    assert!(a.stats.requests() > 0 && b.stats.requests() > 0);
    // d comes back: it is probed and used again while traffic flows; no client error.
    let d = MockServer::start(d_addr, MockConfig::default())
        .await
        .unwrap();
    let mut rounds = 0;
    while d.stats.completed() == 0 {
        rounds += 1;
        assert!(rounds < 100, "d was never used again");
        let statuses = burst(proxy.addr, 8, 20).await;
        assert!(statuses.iter().all(|&s| s == 200), "{statuses:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(eventually(|| true).await);
    let m = scrape(proxy.addr).await;
    assert_ne!(state(&m, "d"), "ejected", "{m}");
}

#[tokio::test]
async fn the_pool_never_sends_an_endpoint_more_than_its_limit() {
    // A dead endpoint of 5 besides them: the requests it fails (until it is ejected) are sent
    // on to a and b, which must then wait for their own slots rather than take more.
    let a = mock().await;
    let b = mock().await;
    let (_, dead_url) = dead().await;
    let toml = pool_config(
        &[
            ep("dead", dead_url, 5),
            ep("a", a.base_url(), 2),
            ep("b", b.base_url(), 3),
        ],
        "",
        "",
    );
    let proxy = proxy(&toml).await;
    let statuses = burst(proxy.addr, 30, 100).await;
    assert!(statuses.iter().all(|&s| s == 200), "{statuses:?}");
    assert!(
        a.stats.max_in_flight() <= 2,
        "a saw {}",
        a.stats.max_in_flight()
    );
    assert!(
        b.stats.max_in_flight() <= 3,
        "b saw {}",
        b.stats.max_in_flight()
    );
    assert_eq!(
        a.stats.requests() + b.stats.requests(),
        30,
        "each sent once"
    );
    assert_eq!(
        a.stats.max_in_flight() + b.stats.max_in_flight(),
        5,
        "both filled"
    );
}

#[tokio::test]
async fn a_backup_takes_only_the_overflow_and_all_traffic_when_the_primary_dies() {
    let primary = mock().await;
    let backup = mock().await;
    let toml = pool_config(
        &[
            ep("primary", primary.base_url(), 2),
            Ep {
                extra: "priority = 1",
                ..ep("backup", backup.base_url(), 8)
            },
        ],
        "",
        "",
    );
    let proxy = proxy(&toml).await;
    for _ in 0..4 {
        let r = chat_a(proxy.addr).await;
        assert_eq!(r.status, 200);
    }
    assert_eq!((primary.stats.requests(), backup.stats.requests()), (4, 0));
    // Six at once: the primary holds two, the backup takes the overflow.
    let statuses = burst(proxy.addr, 6, 200).await;
    assert!(statuses.iter().all(|&s| s == 200));
    assert_eq!(primary.stats.max_in_flight(), 2);
    assert!(backup.stats.requests() >= 4, "{}", backup.stats.requests());
    // The primary dies: every request still succeeds, on the backup.
    primary.shutdown().await;
    let before = backup.stats.completed();
    let statuses = burst(proxy.addr, 10, 0).await;
    assert!(statuses.iter().all(|&s| s == 200), "{statuses:?}");
    assert_eq!(backup.stats.completed() - before, 10);
}

#[tokio::test]
async fn a_refusal_before_any_byte_goes_to_another_endpoint_charged_once() {
    let full = mock().await;
    let ok = mock().await;
    let toml = pool_config(
        &[ep("full", full.base_url(), 4), ep("ok", ok.base_url(), 1)],
        "",
        "",
    );
    let proxy = proxy(&toml).await;
    // The first pick is `full` (more free capacity); it answers 503 (no wait): sent on.
    let r = send(post(
        proxy.addr,
        "/v1/chat/completions",
        Some(KEY_A),
        &chat("m"),
        &[("x-mock-status", "503")],
    ))
    .await;
    // The mock applies x-mock-status everywhere: the request tried both, then backed off.
    assert!(full.stats.requests() >= 1 && ok.stats.requests() >= 1);
    assert_eq!(r.status, 503);
    let m = scrape(proxy.addr).await;
    assert!(value(&m, "fairgate_upstream_failovers_total", &[]).unwrap() >= 1.0);
    // Retries (charged) are counted apart from failovers (not charged).
    let retries = value(&m, "fairgate_upstream_retries_total", &[]).unwrap();
    let failovers = value(&m, "fairgate_upstream_failovers_total", &[]).unwrap();
    let sent = (full.stats.requests() + ok.stats.requests()) as f64;
    assert_eq!(sent, 1.0 + retries + failovers, "{m}");
}

#[tokio::test]
async fn a_dead_endpoint_costs_no_client_error_even_without_retries() {
    let ok = mock().await;
    let (_, dead_url) = dead().await;
    let toml = pool_config(
        &[ep("dead", dead_url, 8), ep("ok", ok.base_url(), 1)],
        "",
        "",
    )
    .replace("max_retries = 3", "max_retries = 0");
    let proxy = proxy(&toml).await;
    for _ in 0..8 {
        let r = chat_a(proxy.addr).await;
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    }
    assert_eq!(ok.stats.completed(), 8);
    let m = scrape(proxy.addr).await;
    assert_eq!(value(&m, "fairgate_upstream_retries_total", &[]), Some(0.0));
    // Five failures in a row ejected it: no request was sent to it after that.
    assert_eq!(
        endpoint_value(&m, "fairgate_endpoint_failovers_total", "dead"),
        5.0
    );
    assert_eq!(state(&m, "dead"), "ejected");
}

#[tokio::test]
async fn azure_style_endpoints_get_their_key_header_query_and_deployment_name() {
    let azure = mock_with(MockConfig {
        models: vec!["my-4o-deployment".into()],
        ..MockConfig::default()
    })
    .await;
    let var = unique_env("AZURE");
    let toml = pool_config(
        &[Ep {
            extra: &format!(
                "api_key_env = \"{var}\"\nauth_header = \"api-key\"\n\
                 query = {{ \"api-version\" = \"2024-10-21\" }}\n\
                 models_map = {{ \"gpt-4o\" = \"my-4o-deployment\" }}"
            ),
            ..ep("eastus", azure.base_url(), 4)
        }],
        "",
        "",
    );
    let proxy = proxy_with_env(&toml, &[(&var, "azure-secret")]).await;
    let client = official::client(proxy.addr, KEY_A);
    let req = official::hello("gpt-4o", None);
    let res = client.chat().create(req).await.unwrap();
    assert_eq!(
        res.model, "my-4o-deployment",
        "the provider's own model name"
    );
    let seen = &azure.stats.seen_headers()[0];
    assert_eq!(seen["api-key"], "azure-secret");
    assert!(
        seen.get("authorization").is_none(),
        "no tenant key upstream"
    );
    assert_eq!(azure.stats.seen_bodies()[0]["model"], "my-4o-deployment");
}

#[tokio::test]
async fn a_tenant_key_replaces_the_endpoint_key_where_configured() {
    let x = mock().await;
    let y = mock().await;
    let (shared, own, admin) = (unique_env("SHARED"), unique_env("OWN"), unique_env("ADMIN"));
    let toml = format!("[admin]\ntoken_env = \"{admin}\"\n")
        + &pool_config(
            &[
                Ep {
                    extra: &format!("api_key_env = \"{shared}\""),
                    ..ep("x", x.base_url(), 2)
                },
                Ep {
                    extra: &format!("api_key_env = \"{shared}\""),
                    ..ep("y", y.base_url(), 2)
                },
            ],
            "",
            &format!("upstream_api_key_envs = {{ \"x\" = \"{own}\" }}"),
        );
    let env = [
        (&*shared, "sk-shared"),
        (&*own, "sk-own-b"),
        (&*admin, "tok"),
    ];
    let proxy = proxy_with_env(&toml, &env).await;
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let req = post(
                proxy.addr,
                "/v1/chat/completions",
                Some(KEY_B),
                &chat("m"),
                &[("x-mock-delay-ms", "200")],
            );
            tokio::spawn(async move { send(req).await.status })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap(), 200);
    }
    let on_x = x.stats.seen_authorization();
    let on_y = y.stats.seen_authorization();
    assert_eq!(on_x.len() + on_y.len(), 4);
    assert!(
        on_x.iter().all(|a| a.as_deref() == Some("Bearer sk-own-b")),
        "{on_x:?}"
    );
    assert!(
        on_y.iter()
            .all(|a| a.as_deref() == Some("Bearer sk-shared")),
        "{on_y:?}"
    );
    // The console shows a row per endpoint.
    let state = send(
        http::Request::get(format!("http://{}/admin/state", proxy.addr))
            .header("authorization", "Bearer tok")
            .body(Default::default())
            .unwrap(),
    )
    .await;
    assert_eq!(state.status, 200);
    let v = state.json();
    let rows = v["pools"][0]["endpoints"].as_array().unwrap().clone();
    let names: Vec<&str> = rows.iter().map(|e| e["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["x", "y"]);
    assert!(
        rows.iter()
            .all(|e| e["state"] == "in_service" && e["configured"] == 2),
        "{v}"
    );
}
