//! Which headers of the provider's answer reach a tenant (`upstream::answer`), end to end with
//! the mock in its `openai` profile, which sends what api.openai.com sends on every answer: the
//! key's `openai-organization` and `openai-project`, Cloudflare's `__cf_bm` cookie, `server`,
//! `cf-ray`, and the shared key's `x-ratelimit-*`. Checked on a JSON answer, an SSE answer and
//! a 429 passed on, for a tenant on the pool's key (`a`), a rate-limited one (`b`: its own
//! `x-ratelimit-*`) and one on its own provider key (`c`: that key's `x-ratelimit-*`).

use crate::support::*;
use fairgate_mock::Profile;

/// Headers of the operator's account or the provider's edge: never for a tenant.
const NEVER: [&str; 9] = [
    "openai-organization",
    "openai-project",
    "set-cookie",
    "server",
    "cf-ray",
    "cf-cache-status",
    "strict-transport-security",
    "alt-svc",
    "access-control-expose-headers",
];

const KEY_C: &str = "fg-test-c";

fn assert_isolated(r: &Collected, what: &str) {
    for name in NEVER {
        assert!(
            !r.headers.contains_key(name),
            "{what}: {name} reached the tenant: {:?}",
            r.headers.get(name)
        );
    }
    // The provider's request id and timing are the tenant's to see.
    assert!(r.headers.contains_key("x-request-id"), "{what}");
}

fn ratelimit(r: &Collected, name: &str) -> Option<String> {
    r.headers.get(name).map(|v| v.to_str().unwrap().to_owned())
}

#[tokio::test]
async fn the_operators_account_headers_cookies_and_shared_limits_never_reach_a_tenant() {
    let mock = mock_profile(Profile::Openai).await;
    // `PATH` is set in every test process: c's own provider key is its value (no set_var).
    let proxy = Conf::new(&mock.base_url())
        .set("admission.max_retries", 0)
        .tenant("b", "requests_per_minute", 1000)
        .add_tenant("c", KEY_C)
        .tenant("c", "upstream_api_key_env", "PATH")
        .start()
        .await;
    let stream =
        r#"{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let json = chat("gpt-4o-mini");
    for (body, extra, status, what) in [
        (json.as_str(), &[][..], 200, "json"),
        (stream, &[][..], 200, "sse"),
        (json.as_str(), &[("x-mock-status", "429")][..], 429, "429"),
    ] {
        let send_as = |key| {
            send(post(
                proxy.addr,
                "/v1/chat/completions",
                Some(key),
                body,
                extra,
            ))
        };
        let (a, b, c) = (
            send_as(KEY_A).await,
            send_as(KEY_B).await,
            send_as(KEY_C).await,
        );
        for (r, who) in [(&a, "a"), (&b, "b"), (&c, "c")] {
            assert_eq!(r.status, status, "{what} {who}: {:?}", r.body);
            assert_isolated(r, &format!("{what} {who}"));
        }
        if status == 200 {
            assert!(a.headers.contains_key("openai-processing-ms"), "{what}");
            assert!(a.headers.contains_key("content-type"), "{what}");
        } else {
            assert!(a.headers.contains_key("retry-after"), "{what}");
        }
        // a: on the pool's key, no limits of its own: no x-ratelimit-* at all (the shared
        // key's budget is the operator's).
        assert!(
            !a.headers
                .keys()
                .any(|k| k.as_str().starts_with("x-ratelimit-")),
            "{what}: the shared key's limits reached a: {:?}",
            a.headers
        );
        // b: its own bucket, as fairgate counts it (1000 a minute), not the key's (10 000).
        assert_eq!(
            ratelimit(&b, "x-ratelimit-limit-requests").as_deref(),
            Some("1000"),
            "{what}"
        );
        assert!(
            ratelimit(&b, "x-ratelimit-limit-tokens").is_none(),
            "{what}"
        );
        // c: on its own provider key, that key's headers.
        assert!(
            ratelimit(&c, "x-ratelimit-remaining-tokens").is_some(),
            "{what}: c's own key's limits: {:?}",
            c.headers
        );
    }
}
