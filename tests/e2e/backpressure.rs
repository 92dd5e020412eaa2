//! Upstream backpressure, table-driven across every provider profile of the mock: a provider
//! that takes one request at a time and refuses the rest the way that provider does (OpenAI's
//! 429 with `retry-after-ms`, vLLM's 503, Groq's 429, the rough profile's 429 after reading the
//! whole body with an HTTP-date `Retry-After`). fairgate learns the limit, retries inside the
//! permit, and every client request is answered 200; the provider never sees more than its one.
//! Assertions are on counts, never on time.

use std::time::Duration;

use crate::support::*;
use fairgate_mock::{MockConfig, Profile};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_profile_overload_is_absorbed_by_retries_and_the_learned_limit() {
    for profile in [
        Profile::Ideal,
        Profile::Openai,
        Profile::Vllm,
        Profile::Groq,
        Profile::Rough,
    ] {
        let mock = mock_with(MockConfig {
            profile,
            max_concurrency: Some(1),
            retry_after: Duration::from_millis(200),
            base_latency: Duration::from_millis(30),
            record_requests: false,
            ..MockConfig::default()
        })
        .await;
        let proxy = Conf::new(&mock.base_url())
            .upstream("max_concurrency", 4)
            .set("admission.max_retries", 8)
            .set("admission.retry_backoff_ms", 20)
            .set("admission.retry_backoff_max_ms", 200)
            .set("admission.max_retry_wait_ms", 10000)
            .start()
            .await;
        let addr = proxy.addr;
        let clients: Vec<_> = (0..8)
            .map(|i| {
                let key = if i % 2 == 0 { KEY_A } else { KEY_B };
                tokio::spawn(async move {
                    send(post(
                        addr,
                        "/v1/chat/completions",
                        Some(key),
                        &chat("gpt-4o-mini"),
                        &[],
                    ))
                    .await
                    .status
                })
            })
            .collect();
        let mut statuses = Vec::new();
        for c in clients {
            statuses.push(c.await.unwrap());
        }
        let refused = mock.stats.rejected_429();
        let learned = proxy.admission.capacity[0].limit();
        println!(
            "{profile:?}: client statuses {statuses:?}; provider refusals {refused}; max in flight \
             {}; learned limit {learned}",
            mock.stats.max_in_flight()
        );
        assert!(
            statuses.iter().all(|s| *s == 200),
            "{profile:?}: {statuses:?}"
        );
        assert_eq!(mock.stats.completed(), 8, "{profile:?}");
        assert!(refused >= 1, "{profile:?}: the provider refused some");
        assert!(
            learned < 4,
            "{profile:?}: the limit was learned ({learned})"
        );
    }
}
