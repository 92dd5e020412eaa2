//! Operations data is not served to tenants: on the main listener `/metrics` answers only the
//! admin token's bearer or a peer in `[server] trusted_sources`; with no credential, or with a
//! tenant's key, a caller gets 401 and no tenant's figures. The probes stay open.

use http::Request;
use http_body_util::Full;

use crate::support::*;

fn get(
    addr: std::net::SocketAddr,
    path: &str,
    bearer: Option<&str>,
) -> Request<Full<bytes::Bytes>> {
    let mut b = Request::get(format!("http://{addr}{path}"));
    if let Some(t) = bearer {
        b = b.header("authorization", format!("Bearer {t}"));
    }
    b.body(Full::default()).unwrap()
}

#[tokio::test]
async fn metrics_on_the_main_listener_need_the_admin_token_or_a_trusted_peer() {
    let mock = mock().await;
    let var = unique_env("OPS");
    // No trusted peer at all: the test connects from loopback like a tenant would.
    let proxy = Conf::new(&mock.base_url())
        .server("trusted_sources", Vec::<&str>::new())
        .set("admin.token_env", &var)
        .start_with_env(&[(&var, "tok-ops")])
        .await;
    for key in [KEY_A, KEY_B] {
        let r = send(post(
            proxy.addr,
            "/v1/chat/completions",
            Some(key),
            &chat("gpt-4o-mini"),
            &[],
        ))
        .await;
        assert_eq!(r.status, 200);
    }
    for (who, bearer) in [("no credential", None), ("tenant a's key", Some(KEY_A))] {
        let r = send(get(proxy.addr, "/metrics", bearer)).await;
        r.assert_error(401, "invalid_admin_token");
        let text = String::from_utf8_lossy(&r.body);
        assert!(
            !text.contains("tenant=\"a\"") && !text.contains("tenant=\"b\""),
            "{who} read tenants' figures: {text}"
        );
    }
    let r = send(get(proxy.addr, "/metrics", Some("tok-ops"))).await;
    assert_eq!(r.status, 200);
    let text = String::from_utf8_lossy(&r.body);
    assert!(
        text.contains("tenant=\"a\"") && text.contains("tenant=\"b\""),
        "{text}"
    );
    // Probes are where probes find them, with no credential.
    assert_eq!(send(get(proxy.addr, "/healthz", None)).await.status, 200);
}

#[tokio::test]
async fn a_trusted_peer_scrapes_without_a_token() {
    let (_mock, proxy) = pair().await;
    // The default `trusted_sources` is loopback: the operator's own host scrapes as before.
    assert!(scrape(proxy.addr).await.contains("fairgate_"));
}
