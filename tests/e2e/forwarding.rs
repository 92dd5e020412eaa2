//! End-to-end forwarding: keys, headers, upstream failures, streaming cancellation, shutdown.

use std::time::Duration;

use crate::support::*;
use bytes::Bytes;
use http_body_util::BodyExt;

#[tokio::test]
async fn tenant_key_never_goes_upstream_and_upstream_key_does() {
    let mock = mock().await;
    let var = unique_env("UP");
    let proxy = Conf::new(&mock.base_url())
        .upstream("api_key_env", &var)
        .start_with_env(&[(&var, "sk-upstream")])
        .await;
    let r = send(post(
        proxy.addr,
        "/v1/chat/completions",
        Some(KEY_A),
        &chat("gpt-4o"),
        &[],
    ))
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(
        mock.stats.seen_authorization(),
        vec![Some("Bearer sk-upstream".to_owned())]
    );
    for h in mock.stats.seen_headers() {
        for v in h.values() {
            assert!(!v
                .as_bytes()
                .windows(KEY_A.len())
                .any(|w| w == KEY_A.as_bytes()));
        }
    }
}

#[tokio::test]
async fn no_key_configured_sends_no_authorization() {
    let (mock, proxy) = pair().await;
    let r = send(post(
        proxy.addr,
        "/v1/chat/completions",
        Some(KEY_A),
        &chat("gpt-4o"),
        &[],
    ))
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(mock.stats.seen_authorization(), vec![None]);
}

#[tokio::test]
async fn per_tenant_provider_key_is_used() {
    let mock = mock().await;
    let (up, own) = (unique_env("UP"), unique_env("OWN"));
    let proxy = Conf::new(&mock.base_url())
        .upstream("api_key_env", &up)
        .tenant("b", "upstream_api_key_env", &own)
        .start_with_env(&[(&up, "sk-shared"), (&own, "sk-tenant-b")])
        .await;
    for key in [KEY_A, KEY_B] {
        let r = send(post(
            proxy.addr,
            "/v1/chat/completions",
            Some(key),
            &chat("gpt-4o"),
            &[],
        ))
        .await;
        assert_eq!(r.status, 200);
    }
    assert_eq!(
        mock.stats.seen_authorization(),
        vec![
            Some("Bearer sk-shared".to_owned()),
            Some("Bearer sk-tenant-b".to_owned())
        ]
    );
}

#[tokio::test]
async fn hop_by_hop_headers_are_stripped_and_body_forwarded_as_is() {
    let (mock, proxy) = pair().await;
    let body = r#"{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"x_extra":1}"#;
    let headers = [
        ("connection", "x-drop-me"),
        ("x-drop-me", "1"),
        ("te", "trailers"),
        ("proxy-authorization", "Basic abc"),
        ("x-fairgate-priority", "batch"),
        ("x-keep-me", "yes"),
    ];
    let r = send(post(
        proxy.addr,
        "/v1/chat/completions?trace=1",
        Some(KEY_A),
        body,
        &headers,
    ))
    .await;
    assert_eq!(r.status, 200);
    let seen = mock.stats.seen_headers();
    let h = &seen[0];
    for gone in [
        "x-drop-me",
        "te",
        "proxy-authorization",
        "x-fairgate-priority",
    ] {
        assert!(!h.contains_key(gone), "{gone} forwarded: {h:?}");
    }
    assert_eq!(h["x-keep-me"], "yes");
    assert_eq!(mock.stats.seen_bodies()[0]["x_extra"], 1);
    assert_eq!(r.headers["x-fairgate-queue-ms"], "0");
}

#[tokio::test]
async fn upstream_down_is_502() {
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = dead.local_addr().unwrap();
    drop(dead);
    let proxy = Conf::new(&format!("http://{addr}/v1")).start().await;
    let r = send(post(
        proxy.addr,
        "/v1/chat/completions",
        Some(KEY_A),
        &chat("gpt-4o"),
        &[],
    ))
    .await;
    r.assert_error(502, "upstream_unavailable");
}

#[tokio::test]
async fn upstream_too_slow_is_504() {
    let mock = mock().await;
    let proxy = Conf::new(&mock.base_url())
        .upstream("first_byte_timeout_ms", 100)
        .start()
        .await;
    let slow = [("x-mock-delay-ms", "5000")];
    let r = send(post(
        proxy.addr,
        "/v1/chat/completions",
        Some(KEY_A),
        &chat("gpt-4o"),
        &slow,
    ))
    .await;
    r.assert_error(504, "upstream_timeout");
}

#[tokio::test]
async fn upstream_error_status_and_body_pass_through() {
    let (_mock, proxy) = pair().await;
    let h = [("x-mock-status", "503")];
    let r = send(post(
        proxy.addr,
        "/v1/chat/completions",
        Some(KEY_A),
        &chat("gpt-4o"),
        &h,
    ))
    .await;
    assert_eq!(r.status, 503);
    assert!(r.json()["error"].is_object(), "{:?}", r.body);
    assert!(r.headers.contains_key("x-fairgate-queue-ms"));
}

fn stream_body() -> String {
    r#"{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"hi"}]}"#.to_owned()
}

#[tokio::test]
async fn client_disconnect_mid_stream_cancels_upstream() {
    let (mock, proxy) = pair().await;
    let h = [
        ("x-mock-output-tokens", "200"),
        ("x-mock-token-delay-ms", "20"),
    ];
    let req = post(
        proxy.addr,
        "/v1/chat/completions",
        Some(KEY_A),
        &stream_body(),
        &h,
    );
    let res = tokio::time::timeout(Duration::from_secs(10), client().request(req))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(res.status(), 200);
    let mut body = res.into_body();
    let first = tokio::time::timeout(Duration::from_secs(10), body.frame())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(first.is_data());
    assert!(mock.stats.in_flight() >= 1);
    drop(body);
    assert!(
        eventually(|| mock.stats.cancelled() == 1).await,
        "mock never saw the cancel"
    );
    assert!(eventually(|| mock.stats.in_flight() == 0).await);
    assert_eq!(mock.stats.completed(), 0);
}

#[tokio::test]
async fn graceful_shutdown_drains_an_open_stream() {
    let (mock, proxy) = pair().await;
    let h = [
        ("x-mock-output-tokens", "10"),
        ("x-mock-token-delay-ms", "20"),
    ];
    let req = post(
        proxy.addr,
        "/v1/chat/completions",
        Some(KEY_A),
        &stream_body(),
        &h,
    );
    let res = client().request(req).await.unwrap();
    assert_eq!(res.status(), 200);
    proxy.shutdown();
    let body: Bytes = tokio::time::timeout(Duration::from_secs(10), res.into_body().collect())
        .await
        .unwrap()
        .unwrap()
        .to_bytes();
    assert!(String::from_utf8_lossy(&body).contains("[DONE]"));
    tokio::time::timeout(Duration::from_secs(10), proxy.join())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(mock.stats.completed(), 1);
}

#[tokio::test]
async fn h2c_prior_knowledge_is_served() {
    let (mock, proxy) = pair().await;
    let h2 = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build_http::<http_body_util::Full<Bytes>>();
    let req = post(
        proxy.addr,
        "/v1/chat/completions",
        Some(KEY_A),
        &chat("gpt-4o"),
        &[],
    );
    let res = tokio::time::timeout(Duration::from_secs(10), h2.request(req))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(res.version(), http::Version::HTTP_2);
    assert_eq!(res.status(), 200);
    assert!(res.headers().contains_key("x-fairgate-queue-ms"));
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert!(serde_json::from_slice::<serde_json::Value>(&body).unwrap()["choices"].is_array());
    assert_eq!(mock.stats.completed(), 1);
}

#[tokio::test]
async fn missing_tls_files_stop_startup_naming_the_key() {
    let config = Conf::new("http://127.0.0.1:9/v1")
        .set("server.tls.cert", "/nonexistent/cert.pem")
        .set("server.tls.key", "/nonexistent/key.pem")
        .config();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let e = fairgate::server::start(config, listener).await.unwrap_err();
    assert!(e.to_string().starts_with("server.tls.cert"), "{e}");
}

#[tokio::test]
async fn silent_upstream_stream_is_cut_after_idle_timeout() {
    let mock = mock().await;
    let proxy = Conf::new(&mock.base_url())
        .upstream("idle_timeout_ms", 100)
        .start()
        .await;
    let h = [
        ("x-mock-output-tokens", "5"),
        ("x-mock-token-delay-ms", "5000"),
    ];
    let req = post(
        proxy.addr,
        "/v1/chat/completions",
        Some(KEY_A),
        &stream_body(),
        &h,
    );
    let res = client().request(req).await.unwrap();
    assert_eq!(res.status(), 200);
    let collected = tokio::time::timeout(Duration::from_secs(10), res.into_body().collect())
        .await
        .expect("the proxy cuts the stream instead of waiting");
    assert!(collected.is_err(), "a cut stream must not look complete");
    assert!(eventually(|| mock.stats.in_flight() == 0).await);
}

/// Every response carries `x-request-id`: the client's own (also sent upstream), else the
/// provider's, else one fairgate generated (also sent upstream, for correlation) — refusals too.
#[tokio::test]
async fn every_response_carries_a_request_id() {
    use fairgate_mock::Profile;
    let id = |r: &Collected| r.headers["x-request-id"].to_str().unwrap().to_owned();
    // Ideal mock (no ids of its own): generated, and the provider saw the same one.
    let mock = mock().await;
    let proxy = Conf::new(&mock.base_url()).start().await;
    let r = send(post(
        proxy.addr,
        "/v1/chat/completions",
        Some(KEY_A),
        &chat("gpt-4o"),
        &[],
    ))
    .await;
    assert_eq!(r.status, 200);
    let generated = id(&r);
    assert!(generated.starts_with("fg-"), "{generated}");
    let seen = mock.stats.seen_headers();
    assert_eq!(seen.last().unwrap()["x-request-id"], generated.as_str());
    // The client's own is kept and forwarded.
    let r = send(post(
        proxy.addr,
        "/v1/chat/completions",
        Some(KEY_A),
        &chat("gpt-4o"),
        &[("x-request-id", "client-42")],
    ))
    .await;
    assert_eq!(id(&r), "client-42");
    assert_eq!(
        mock.stats.seen_headers().last().unwrap()["x-request-id"],
        "client-42"
    );
    // A refusal (no provider involved) gets one too.
    let r = send(post(
        proxy.addr,
        "/v1/chat/completions",
        Some("nope"),
        &chat("gpt-4o"),
        &[],
    ))
    .await;
    assert_eq!(r.status, 401);
    assert!(id(&r).starts_with("fg-"));
    // A provider that names its answers: the client sees the provider's id.
    let openai = mock_profile(Profile::Openai).await;
    let named = crate::support::Conf::new(&openai.base_url()).start().await;
    let r = send(post(
        named.addr,
        "/v1/chat/completions",
        Some(KEY_A),
        &chat("gpt-4o"),
        &[],
    ))
    .await;
    assert_eq!(r.status, 200);
    assert!(id(&r).starts_with("req_"), "{}", id(&r));
}

#[tokio::test]
async fn client_headers_cannot_select_the_operators_account_unless_allowed() {
    let mock = mock().await;
    let proxy = Conf::new(&mock.base_url())
        .tenant("b", "forward_headers", ["openai-project"])
        .start()
        .await;
    let headers = [
        ("openai-organization", "org-operator"),
        ("openai-project", "proj-x"),
        ("x-api-key", "sk-smuggled"),
        ("x-goog-api-key", "g"),
        ("proxy-authorization", "Basic abc"),
        ("x-fairgate-priority", "batch"),
    ];
    for key in [KEY_A, KEY_B] {
        let r = send(post(
            proxy.addr,
            "/v1/chat/completions",
            Some(key),
            &chat("gpt-4o"),
            &headers,
        ))
        .await;
        assert_eq!(r.status, 200);
    }
    let seen = mock.stats.seen_headers();
    let names = |h: &http::HeaderMap| {
        let mut v: Vec<String> = h
            .keys()
            .map(|k| k.as_str().to_owned())
            .filter(|k| headers.iter().any(|(n, _)| n == k))
            .collect();
        v.sort();
        v
    };
    assert_eq!(names(&seen[0]), Vec::<String>::new(), "tenant a: none");
    assert_eq!(
        names(&seen[1]),
        vec!["openai-project"],
        "tenant b: its allowed one"
    );
}
