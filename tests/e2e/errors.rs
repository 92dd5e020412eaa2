//! End-to-end rejections: every one OpenAI-shaped, with the right status, before the upstream.

use crate::support::*;

#[tokio::test]
async fn unknown_and_missing_key_are_401() {
    let (mock, proxy) = pair().await;
    let r = send(post(
        proxy.addr,
        "/v1/chat/completions",
        Some("nope"),
        &chat("gpt-4o"),
        &[],
    ))
    .await;
    r.assert_error(401, "invalid_api_key");
    let r = send(post(
        proxy.addr,
        "/v1/chat/completions",
        None,
        &chat("gpt-4o"),
        &[],
    ))
    .await;
    r.assert_error(401, "invalid_api_key");
    assert_eq!(mock.stats.requests(), 0);
}

#[tokio::test]
async fn sidecar_header_names_the_tenant() {
    let mock = mock().await;
    let proxy = Conf::new(&mock.base_url())
        .server("tenant_header", "x-tenant-id")
        .start()
        .await;
    let ok = send(post(
        proxy.addr,
        "/v1/chat/completions",
        None,
        &chat("gpt-4o"),
        &[("x-tenant-id", "b")],
    ))
    .await;
    assert_eq!(ok.status, 200, "{:?}", ok.body);
    let seen = mock.stats.seen_headers();
    assert!(
        seen.iter().all(|h| !h.contains_key("x-tenant-id")),
        "sidecar header forwarded"
    );
    let unknown = send(post(
        proxy.addr,
        "/v1/chat/completions",
        None,
        &chat("gpt-4o"),
        &[("x-tenant-id", "zz")],
    ))
    .await;
    unknown.assert_error(401, "invalid_api_key");
    let missing = send(post(
        proxy.addr,
        "/v1/chat/completions",
        Some(KEY_A),
        &chat("gpt-4o"),
        &[],
    ))
    .await;
    missing.assert_error(401, "invalid_api_key");
    assert_eq!(mock.stats.requests(), 1);
}

/// Sidecar mode is safe by default: the tenant header is trusted only from `[server]
/// trusted_sources` (default loopback). Here loopback is not trusted, so the header alone is a
/// 401, a key decides the tenant whatever the header says, and each is counted.
#[tokio::test]
async fn sidecar_header_from_an_untrusted_peer_is_ignored_and_counted() {
    let mock = mock().await;
    // Loopback is not trusted here: the scrape below carries the admin token.
    let var = unique_env("SIDECAR_ADMIN");
    let proxy = Conf::new(&mock.base_url())
        .server("tenant_header", "x-tenant-id")
        .server("trusted_sources", ["10.0.0.0/8"])
        .set("admin.token_env", &var)
        .start_with_env(&[(&var, "tok-sidecar")])
        .await;
    let claim = [("x-tenant-id", "b")];
    let r = send(post(
        proxy.addr,
        "/v1/chat/completions",
        None,
        &chat("gpt-4o"),
        &claim,
    ))
    .await;
    r.assert_error(401, "invalid_api_key");
    let r = send(post(
        proxy.addr,
        "/v1/chat/completions",
        Some(KEY_A),
        &chat("gpt-4o"),
        &claim,
    ))
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(mock.stats.requests(), 1);
    assert!(mock.stats.seen_headers()[0].get("x-tenant-id").is_none());
    let text = String::from_utf8(
        send(
            http::Request::get(format!("http://{}/metrics", proxy.addr))
                .header("authorization", "Bearer tok-sidecar")
                .body(Default::default())
                .unwrap(),
        )
        .await
        .body
        .to_vec(),
    )
    .unwrap();
    assert!(
        text.lines()
            .any(|l| l == "fairgate_untrusted_tenant_header_total 2"),
        "{text}"
    );
    assert!(
        text.contains("fairgate_requests_total{tenant=\"a\",status=\"200\"} 1"),
        "the key's tenant was served"
    );
}

#[tokio::test]
async fn bad_bodies_are_rejected() {
    let (mock, proxy) = pair().await;
    let malformed = send(post(
        proxy.addr,
        "/v1/chat/completions",
        Some(KEY_A),
        "{\"model\":",
        &[],
    ))
    .await;
    malformed.assert_error(400, "invalid_json");
    let no_model = send(post(
        proxy.addr,
        "/v1/embeddings",
        Some(KEY_A),
        r#"{"input":"x"}"#,
        &[],
    ))
    .await;
    no_model.assert_error(400, "missing_model");
    let mut wrong_type = post(
        proxy.addr,
        "/v1/chat/completions",
        Some(KEY_A),
        &chat("gpt-4o"),
        &[],
    );
    wrong_type
        .headers_mut()
        .insert("content-type", "text/plain".parse().unwrap());
    send(wrong_type)
        .await
        .assert_error(415, "unsupported_media_type");
    assert_eq!(mock.stats.requests(), 0);
}

#[tokio::test]
async fn oversize_bodies_are_413() {
    let mock = mock().await;
    let proxy = Conf::new(&mock.base_url())
        .server("max_body_bytes", 1024)
        .start()
        .await;
    // Declared too large: answered without the body ever being sent.
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nconnection: close\r\nauthorization: Bearer {KEY_A}\r\n\
         content-type: application/json\r\ncontent-length: 100000000\r\n\r\n{{\"model\""
    );
    let res = raw(proxy.addr, head.as_bytes()).await;
    assert!(res.starts_with("HTTP/1.1 413"), "{res}");
    assert!(res.contains("request_too_large"), "{res}");
    // Chunked, no length: cut at the cap.
    let big = format!("{{\"model\":\"gpt-4o\",\"pad\":\"{}\"}}", "x".repeat(4000));
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nconnection: close\r\nauthorization: Bearer {KEY_A}\r\n\
         content-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{big}\r\n0\r\n\r\n",
        big.len()
    );
    let res = raw(proxy.addr, req.as_bytes()).await;
    assert!(res.starts_with("HTTP/1.1 413"), "{res}");
    assert_eq!(mock.stats.requests(), 0);
}

#[tokio::test]
async fn unknown_model_and_path_are_404() {
    let mock = mock().await;
    let proxy = Conf::new(&mock.base_url())
        .upstream("models", ["gpt-*"])
        .start()
        .await;
    let r = send(post(
        proxy.addr,
        "/v1/chat/completions",
        Some(KEY_A),
        &chat("claude-3"),
        &[],
    ))
    .await;
    r.assert_error(404, "model_not_found");
    let r = send(post(
        proxy.addr,
        "/v1/nothing-here",
        Some(KEY_A),
        &chat("gpt-4o"),
        &[],
    ))
    .await;
    r.assert_error(404, "unknown_url");
    let ok = send(post(
        proxy.addr,
        "/v1/chat/completions",
        Some(KEY_A),
        &chat("gpt-4o"),
        &[],
    ))
    .await;
    assert_eq!(ok.status, 200);
    assert_eq!(mock.stats.requests(), 1);
}

#[tokio::test]
async fn health_endpoints_answer_without_a_key() {
    let (_mock, proxy) = pair().await;
    for path in ["/healthz", "/readyz"] {
        let req = http::Request::get(format!("http://{}{path}", proxy.addr))
            .body(Default::default())
            .unwrap();
        assert_eq!(send(req).await.status, 200, "{path}");
    }
}
