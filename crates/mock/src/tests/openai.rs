//! The mock as a real OpenAI client sees it: async-openai must parse every shape we send.

use async_openai::config::OpenAIConfig;
use async_openai::types::chat::{
    ChatCompletionRequestUserMessage, ChatCompletionStreamOptions, CreateChatCompletionRequestArgs,
};
use async_openai::types::embeddings::CreateEmbeddingRequestArgs;
use async_openai::Client;
use futures_util::StreamExt;

use crate::{MockConfig, MockServer};

async fn setup() -> (MockServer, Client<OpenAIConfig>) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let addr = "127.0.0.1:0".parse().expect("addr");
    let server = MockServer::start(addr, MockConfig::default())
        .await
        .expect("mock starts");
    let config = OpenAIConfig::new()
        .with_api_base(server.base_url())
        .with_api_key("upstream-key");
    (server, Client::with_config(config))
}

fn chat(stream: bool) -> async_openai::types::chat::CreateChatCompletionRequest {
    let mut args = CreateChatCompletionRequestArgs::default();
    args.model("gpt-4o-mini")
        .max_completion_tokens(5u32)
        .messages([ChatCompletionRequestUserMessage::from("hello world!").into()]);
    if stream {
        args.stream(true)
            .stream_options(ChatCompletionStreamOptions {
                include_usage: Some(true),
                ..Default::default()
            });
    }
    args.build().expect("request")
}

#[tokio::test]
async fn async_openai_parses_chat_json_and_stream() {
    let (server, client) = setup().await;
    let resp = client.chat().create(chat(false)).await.expect("chat");
    let usage = resp.usage.expect("usage");
    assert_eq!((usage.prompt_tokens, usage.completion_tokens), (3, 5));

    let mut stream = client
        .chat()
        .create_stream(chat(true))
        .await
        .expect("stream");
    let (mut tokens, mut usage) = (0, None);
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.expect("chunk parses");
        tokens += chunk
            .choices
            .iter()
            .filter(|c| c.delta.content.is_some())
            .count();
        usage = usage.or(chunk.usage);
    }
    assert_eq!(tokens, 5);
    assert_eq!(usage.map(|u| u.total_tokens), Some(8));
    assert_eq!(server.stats.completed(), 2);
}

#[tokio::test]
async fn async_openai_parses_models_and_embeddings() {
    let (_server, client) = setup().await;
    let models = client.models().list().await.expect("models");
    assert_eq!(models.data.len(), 3);
    let req = CreateEmbeddingRequestArgs::default()
        .model("text-embedding-3-small")
        .input(["abcd", "efgh"])
        .build()
        .expect("request");
    let resp = client.embeddings().create(req).await.expect("embeddings");
    assert_eq!(resp.data.len(), 2);
    assert_eq!(resp.usage.total_tokens, 2);
}
