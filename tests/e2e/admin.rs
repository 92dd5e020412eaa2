//! The admin API end to end: off (404) without `[admin] token_env`, 401 without the right
//! bearer token, and `GET /admin/tenants` showing a flood tenant's live queue.

use std::net::SocketAddr;

use crate::support::*;
use bytes::Bytes;
use fairgate_mock::MockConfig;
use http::Request;
use http_body_util::Full;

async fn get(addr: SocketAddr, path: &str, token: Option<&str>) -> Collected {
    let mut b = Request::get(format!("http://{addr}{path}"));
    if let Some(t) = token {
        b = b.header("authorization", format!("Bearer {t}"));
    }
    send(b.body(Full::<Bytes>::default()).unwrap()).await
}

#[tokio::test]
async fn admin_api_is_off_without_a_token() {
    let (_mock, proxy) = pair().await;
    get(proxy.addr, "/admin/tenants", Some("x"))
        .await
        .assert_error(404, "not_found");
}

#[tokio::test]
async fn admin_tenants_needs_the_token_and_shows_live_queues() {
    let var = unique_env("ADMIN");
    let token = "admin-token-xyzzy";
    let mock = mock_with(MockConfig::default()).await;
    let proxy = Conf::bare()
        .set("admin.token_env", &var)
        .add_upstream("mock", &mock.base_url())
        .upstream("max_concurrency", 1)
        .add_tenant("flood", "key-flood")
        .tenant("flood", "weight", 2.0)
        .add_tenant("quiet", "key-quiet")
        .start_with_env(&[(&var, token)])
        .await;
    let addr = proxy.addr;
    get(addr, "/admin/tenants", None)
        .await
        .assert_error(401, "invalid_admin_token");
    get(addr, "/admin/tenants", Some("wrong"))
        .await
        .assert_error(401, "invalid_admin_token");
    // A tenant key is not an admin token.
    get(addr, "/admin/tenants", Some("key-flood"))
        .await
        .assert_error(401, "invalid_admin_token");

    let slow = [("x-mock-delay-ms", "300")];
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(tokio::spawn(async move {
            send(post(
                addr,
                "/v1/chat/completions",
                Some("key-flood"),
                &chat("gpt-4o-mini"),
                &slow,
            ))
            .await
        }));
    }
    assert!(eventually(|| proxy.pools[0].load() == (2, 1)).await);
    let r = get(addr, "/admin/tenants", Some(token)).await;
    assert_eq!(r.status, 200);
    let v = r.json();
    let tenants = v["tenants"].as_array().unwrap();
    let flood = tenants.iter().find(|t| t["tenant"] == "flood").unwrap();
    assert_eq!(flood["pool"], "mock");
    assert_eq!(flood["queued"], 2);
    assert_eq!(flood["in_flight"], 1);
    assert_eq!(flood["weight"], 2.0);
    assert!((flood["entitled_share"].as_f64().unwrap() - 2.0 / 3.0).abs() < 1e-9);
    assert_eq!(flood["served_share"], 1.0);
    assert!(flood["credit"].is_i64());
    let quiet = tenants.iter().find(|t| t["tenant"] == "quiet").unwrap();
    assert_eq!(quiet["queued"], 0);
    assert_eq!(quiet["served_tokens"], 0);
    for h in held {
        assert_eq!(h.await.unwrap().status, 200);
    }
    let v = get(addr, "/admin/tenants", Some(token)).await.json();
    let flood = v["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["tenant"] == "flood")
        .cloned()
        .unwrap();
    assert_eq!(flood["reconciled"], 3);
    assert!(flood["estimate_error_mean"].as_f64().unwrap() > 0.0);
    let r = send(
        Request::put(format!("http://{addr}/admin/tenants"))
            .header("authorization", format!("Bearer {token}"))
            .body(Full::<Bytes>::default())
            .unwrap(),
    )
    .await;
    r.assert_error(405, "method_not_allowed");
}

#[tokio::test]
async fn admin_listen_moves_metrics_and_admin_off_the_main_listener() {
    let var = unique_env("ADMIN_LISTEN");
    let mock = mock_with(MockConfig::default()).await;
    let proxy = Conf::new(&mock.base_url())
        .set("admin.listen", "127.0.0.1:0")
        .set("admin.token_env", &var)
        .start_with_env(&[(&var, "tok-listen")])
        .await;
    let ops = proxy.admin_addr.expect("an operations listener");
    assert_ne!(ops, proxy.addr);
    let r = send(post(
        proxy.addr,
        "/v1/chat/completions",
        Some(KEY_A),
        &chat("gpt-4o-mini"),
        &[],
    ))
    .await;
    assert_eq!(r.status, 200);
    let m = get(ops, "/metrics", None).await;
    assert_eq!(m.status, 200);
    assert!(String::from_utf8_lossy(&m.body).contains("fairgate_requests_total{"));
    assert_eq!(
        get(ops, "/admin/tenants", Some("tok-listen")).await.status,
        200
    );
    get(ops, "/v1/models", Some(KEY_A))
        .await
        .assert_error(404, "not_found");
    // Probes answer on both (a sidecar's proxy listens on loopback, out of the kubelet's reach).
    for addr in [ops, proxy.addr] {
        assert_eq!(get(addr, "/healthz", None).await.status, 200);
        assert_eq!(get(addr, "/readyz", None).await.status, 200);
    }
    // The main listener no longer answers them: without a tenant key they are 401.
    assert_eq!(get(proxy.addr, "/metrics", None).await.status, 401);
    assert_eq!(
        get(proxy.addr, "/admin/tenants", Some("tok-listen"))
            .await
            .status,
        401
    );
}
