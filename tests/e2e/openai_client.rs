//! A real OpenAI client (async-openai) against fairgate in front of the mock upstream.

use std::time::Duration;

use crate::support::*;
use async_openai::config::OpenAIConfig;
use async_openai::types::chat::{
    ChatCompletionRequestUserMessageArgs, CreateChatCompletionRequest,
    CreateChatCompletionRequestArgs,
};
use async_openai::types::embeddings::CreateEmbeddingRequestArgs;
use async_openai::Client;
use fairgate_mock::MockConfig;
use futures_util::StreamExt;

fn openai(addr: std::net::SocketAddr, key: &str) -> Client<OpenAIConfig> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let config = OpenAIConfig::new()
        .with_api_base(format!("http://{addr}/v1"))
        .with_api_key(key);
    Client::with_config(config)
}

fn request(model: &str) -> CreateChatCompletionRequest {
    CreateChatCompletionRequestArgs::default()
        .model(model)
        .messages([ChatCompletionRequestUserMessageArgs::default()
            .content("Say hello")
            .build()
            .unwrap()
            .into()])
        .build()
        .unwrap()
}

#[tokio::test]
async fn chat_completion() {
    let (mock, proxy) = pair().await;
    let res = openai(proxy.addr, KEY_A)
        .chat()
        .create(request("gpt-4o-mini"))
        .await
        .unwrap();
    assert!(!res.choices.is_empty());
    assert!(res.usage.is_some_and(|u| u.completion_tokens > 0));
    assert_eq!(mock.stats.seen_bodies()[0]["model"], "gpt-4o-mini");
}

#[tokio::test]
async fn chat_stream_arrives_while_upstream_still_generates() {
    let mock = mock_with(MockConfig {
        per_token: Duration::from_millis(50),
        default_output_tokens: 20,
        ..MockConfig::default()
    })
    .await;
    let proxy = Conf::new(&mock.base_url()).start().await;
    let mut stream = openai(proxy.addr, KEY_A)
        .chat()
        .create_stream(request("gpt-4o-mini"))
        .await
        .unwrap();
    let first = tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(!first.choices.is_empty() || first.usage.is_some());
    // The first chunk is here while the upstream has not finished: nothing buffered the stream.
    assert_eq!(
        mock.stats.completed(),
        0,
        "stream was buffered until the upstream finished"
    );
    let mut chunks = 1;
    while let Some(chunk) = tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .unwrap()
    {
        chunk.unwrap();
        chunks += 1;
        assert!(chunks < 1000);
    }
    assert!(chunks > 2, "only {chunks} chunks");
    assert!(eventually(|| mock.stats.completed() == 1).await);
}

#[tokio::test]
async fn embeddings() {
    let (_mock, proxy) = pair().await;
    let req = CreateEmbeddingRequestArgs::default()
        .model("text-embedding-3-small")
        .input(["one", "two"])
        .build()
        .unwrap();
    let res = openai(proxy.addr, KEY_B)
        .embeddings()
        .create(req)
        .await
        .unwrap();
    assert_eq!(res.data.len(), 2);
    assert!(!res.data[0].embedding.is_empty());
}

#[tokio::test]
async fn models_are_listed_from_config() {
    let mock = mock().await;
    let proxy = Conf::new(&mock.base_url())
        .upstream("models", ["gpt-4o", "gpt-4o-mini", "o*"])
        .start()
        .await;
    let list = openai(proxy.addr, KEY_A).models().list().await.unwrap();
    let ids: Vec<&str> = list.data.iter().map(|m| m.id.as_str()).collect();
    assert_eq!(ids, ["gpt-4o", "gpt-4o-mini"]);
    let one = openai(proxy.addr, KEY_A)
        .models()
        .retrieve("gpt-4o")
        .await
        .unwrap();
    assert_eq!(one.id, "gpt-4o");
    let denied = openai(proxy.addr, "wrong").models().list().await;
    assert!(denied.is_err());
    // `o*` is a wildcard: the provider's list was fetched once (cached since), and none of
    // its models routes here by `o*` before an explicit name.
    assert_eq!(mock.stats.requests(), 1);
}

/// A wildcard upstream lists its provider's own models, filtered by routing (first match
/// wins), fetched once with the upstream's key, cached, and never on a completion's path.
#[tokio::test]
async fn wildcard_routes_list_the_providers_models() {
    let a = mock().await; // gpt-4o-mini, gpt-4o, text-embedding-3-small
    let b = mock_with(MockConfig {
        models: ["text-embedding-3-large", "gpt-from-b"]
            .map(String::from)
            .into(),
        ..MockConfig::default()
    })
    .await;
    let fixed = mock().await;
    let var = unique_env("MODELS");
    let upstream = |name: &str, mock: &fairgate_mock::MockServer, models: &[&str]| {
        entry("name", name)
            .with("base_url", mock.base_url())
            .with("models", models.to_vec())
    };
    let proxy = Conf::bare()
        .push(
            "upstreams",
            upstream("fixed", &fixed, &["special-model", "gpt-4o"]),
        )
        .push("upstreams", upstream("emb", &b, &["text-embedding-*"]))
        .push(
            "upstreams",
            upstream("all", &a, &["*"]).with("api_key_env", &var),
        )
        .add_tenant("a", KEY_A)
        .start_with_env(&[(var.as_str(), "sk-upstream-all")])
        .await;
    // A completion first: it fetches no list.
    let res = openai(proxy.addr, KEY_A)
        .chat()
        .create(request("gpt-4o-mini"))
        .await
        .unwrap();
    assert!(!res.choices.is_empty());
    assert_eq!((a.stats.requests(), b.stats.requests()), (1, 0));
    let client = openai(proxy.addr, KEY_A);
    for _ in 0..3 {
        let list = client.models().list().await.unwrap();
        let ids: Vec<&str> = list.data.iter().map(|m| m.id.as_str()).collect();
        // fixed's explicit names; emb's list filtered by `text-embedding-*` (gpt-from-b is not
        // emb's); all's list without gpt-4o (routed to fixed) and text-embedding-3-small
        // (routed to emb).
        assert_eq!(
            ids,
            [
                "special-model",
                "gpt-4o",
                "text-embedding-3-large",
                "gpt-4o-mini"
            ]
        );
    }
    let one = client
        .models()
        .retrieve("text-embedding-3-large")
        .await
        .unwrap();
    assert_eq!(one.id, "text-embedding-3-large");
    assert!(client.models().retrieve("gpt-from-b").await.is_err());
    // One fetch each (the TTL has not run out), none at the explicit-only upstream.
    assert_eq!((a.stats.requests(), b.stats.requests()), (2, 1));
    assert_eq!(fixed.stats.requests(), 0);
    let auth = a.stats.seen_authorization();
    assert_eq!(auth[1].as_deref(), Some("Bearer sk-upstream-all"));
    assert_eq!(b.stats.seen_authorization()[0], None);
}

/// A provider whose list fails (connection refused) or does not come within
/// `models_list_timeout_ms` leaves the explicit names listed; `/v1/models` answers anyway.
#[tokio::test]
async fn a_failing_or_slow_provider_leaves_the_explicit_names() {
    let fixed = mock().await;
    let slow = mock_with(MockConfig {
        base_latency: Duration::from_secs(30),
        ..MockConfig::default()
    })
    .await;
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!("http://{}/v1", closed.local_addr().unwrap());
    drop(closed);
    let proxy = Conf::bare()
        .add_upstream("fixed", &fixed.base_url())
        .upstream("models", ["special-model"])
        .push(
            "upstreams",
            entry("name", "dead")
                .with("base_url", dead)
                .with("models", ["*"]),
        )
        .push(
            "upstreams",
            entry("name", "slow")
                .with("base_url", slow.base_url())
                .with("models", ["x-*"])
                .with("models_list_timeout_ms", 200),
        )
        .add_tenant("a", KEY_A)
        .start()
        .await;
    let client = openai(proxy.addr, KEY_A);
    for _ in 0..2 {
        let list = client.models().list().await.unwrap();
        let ids: Vec<&str> = list.data.iter().map(|m| m.id.as_str()).collect();
        assert_eq!(ids, ["special-model"]);
    }
    // The slow provider was asked once (the failed fetch is retried after the TTL only).
    assert_eq!(slow.stats.requests(), 1);
}
