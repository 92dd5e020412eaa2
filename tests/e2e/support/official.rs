//! The official client (async-openai) pointed at a fairgate, and the chat request the tests send
//! with it.

use std::net::SocketAddr;

use async_openai::config::OpenAIConfig;
use async_openai::types::chat::{
    ChatCompletionRequestUserMessageArgs, CreateChatCompletionRequest,
    CreateChatCompletionRequestArgs,
};

/// A client on `http://ADDR/v1` with a tenant's key (its retries as shipped).
pub fn client(addr: SocketAddr, key: &str) -> async_openai::Client<OpenAIConfig> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    async_openai::Client::with_config(
        OpenAIConfig::new()
            .with_api_base(format!("http://{addr}/v1"))
            .with_api_key(key),
    )
}

/// "hello" to `model`, with `max_completion_tokens` when given.
pub fn hello(model: &str, max_completion_tokens: Option<u32>) -> CreateChatCompletionRequest {
    let mut args = CreateChatCompletionRequestArgs::default();
    args.model(model)
        .messages([ChatCompletionRequestUserMessageArgs::default()
            .content("hello")
            .build()
            .unwrap()
            .into()]);
    if let Some(n) = max_completion_tokens {
        args.max_completion_tokens(n);
    }
    args.build().unwrap()
}
