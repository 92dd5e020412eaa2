//! A real OpenAI client (async-openai) against fairgate in front of the mock upstream.

mod common;

use std::time::Duration;

use async_openai::config::OpenAIConfig;
use async_openai::types::chat::{
    ChatCompletionRequestUserMessageArgs, CreateChatCompletionRequest,
    CreateChatCompletionRequestArgs,
};
use async_openai::types::embeddings::CreateEmbeddingRequestArgs;
use async_openai::Client;
use common::*;
use fairgate::mock::MockConfig;
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
    let proxy = proxy(&config(&mock.base_url(), "", "", "")).await;
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
    let toml = config(
        &mock.base_url(),
        "",
        "models = [\"gpt-4o\", \"gpt-4o-mini\", \"o*\"]",
        "",
    );
    let proxy = proxy(&toml).await;
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
    assert_eq!(mock.stats.requests(), 0);
}
