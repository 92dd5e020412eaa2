//! OpenTelemetry's GenAI semantic conventions, as fairgate applies them (shared by the spans
//! and the `gen_ai_client_*` metrics): the operation of an endpoint, the provider and server
//! address of an upstream. Static strings only: nothing here allocates per request.
//!
//! - `gen_ai.operation.name`: `chat` (`/v1/chat/completions`, `/v1/responses`),
//!   `text_completion` (`/v1/completions`), `embeddings` (`/v1/embeddings`).
//! - `gen_ai.provider.name`: the well-known value of the upstream's host where there is one
//!   (`api.openai.com` → `openai`, `*.openai.azure.com` → `azure.ai.openai`, Groq, Mistral,
//!   DeepSeek, xAI, Perplexity, Gemini, Vertex AI, Anthropic, Cohere); any other host —
//!   vLLM, llama.cpp, a gateway — speaks OpenAI's API, so `openai`, the telemetry flavor the
//!   conventions key on (`server.address` tells the hosts apart).
//! - `server.address` / `server.port`: the upstream's host and port (the scheme's default when
//!   the URL has none).

use crate::context::Endpoint;

/// `gen_ai.operation.name` of an endpoint.
pub fn operation(endpoint: Endpoint) -> &'static str {
    match endpoint {
        Endpoint::Chat | Endpoint::Responses => "chat",
        Endpoint::Completions => "text_completion",
        Endpoint::Embeddings => "embeddings",
    }
}

/// The GenAI server behind an upstream: its provider name, address and port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// `gen_ai.provider.name`.
    pub provider: &'static str,
    /// `server.address`.
    pub address: String,
    /// `server.port`.
    pub port: u16,
}

impl Peer {
    /// The peer of an upstream `base_url` (`None` if it is not an http(s) URL with a host).
    pub fn of_url(base_url: &str) -> Option<Self> {
        let uri: http::Uri = base_url.parse().ok()?;
        let host = uri.host()?.trim_start_matches('[').trim_end_matches(']');
        let port = uri.port_u16().unwrap_or(match uri.scheme_str() {
            Some("https") => 443,
            _ => 80,
        });
        Some(Self {
            provider: provider(host),
            address: host.to_ascii_lowercase(),
            port,
        })
    }
}

/// `gen_ai.provider.name` of a host; see the module docs.
pub fn provider(host: &str) -> &'static str {
    let host = host.to_ascii_lowercase();
    let is = |domain: &str| host == domain || host.ends_with(&format!(".{domain}"));
    if is("openai.azure.com") {
        "azure.ai.openai"
    } else if is("services.ai.azure.com") || is("models.ai.azure.com") {
        "azure.ai.inference"
    } else if is("groq.com") {
        "groq"
    } else if is("mistral.ai") {
        "mistral_ai"
    } else if is("deepseek.com") {
        "deepseek"
    } else if is("x.ai") {
        "x_ai"
    } else if is("perplexity.ai") {
        "perplexity"
    } else if is("generativelanguage.googleapis.com") {
        "gcp.gemini"
    } else if is("aiplatform.googleapis.com") {
        "gcp.vertex_ai"
    } else if is("anthropic.com") {
        "anthropic"
    } else if is("cohere.com") || is("cohere.ai") {
        "cohere"
    } else {
        "openai"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_of_known_and_unknown_hosts() {
        let p = Peer::of_url("https://api.openai.com/v1").unwrap();
        assert_eq!(
            (p.provider, p.address.as_str(), p.port),
            ("openai", "api.openai.com", 443)
        );
        let p = Peer::of_url("https://myres.openai.azure.com/openai/v1").unwrap();
        assert_eq!(p.provider, "azure.ai.openai");
        let p = Peer::of_url("https://api.groq.com/openai/v1").unwrap();
        assert_eq!(p.provider, "groq");
        let p = Peer::of_url("http://vllm.internal:8000/v1").unwrap();
        assert_eq!(
            (p.provider, p.address.as_str(), p.port),
            ("openai", "vllm.internal", 8000)
        );
        let p = Peer::of_url("http://127.0.0.1/v1").unwrap();
        assert_eq!(p.port, 80);
        assert!(Peer::of_url("not a url").is_none());
        assert_eq!(
            provider("notgroq.com"),
            "openai",
            "a suffix is not a subdomain"
        );
        assert_eq!(operation(Endpoint::Completions), "text_completion");
    }
}
