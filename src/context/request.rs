//! What the request asks for: its parsed body ([`Parsed`], by `body`), its pool ([`Route`], by
//! `route`) and its counted cost ([`Estimate`], by `estimate`).

use std::sync::Arc;

use crate::domain::{Charge, Encoding, OutputKey, Weight};

/// The parsed JSON request of a JSON endpoint.
#[derive(Debug, Clone)]
pub struct Parsed {
    /// The requested model.
    pub model: String,
    /// `stream: true`.
    pub stream: bool,
    /// `stream_options.include_usage: true`.
    pub include_usage: bool,
    /// The output cap: the largest of `max_tokens`, `max_completion_tokens` and
    /// `max_output_tokens` (each a non-negative integer, checked by `body`).
    pub max_tokens: Option<u64>,
    /// The field that gave [`Parsed::max_tokens`] (for errors).
    pub max_tokens_param: &'static str,
    /// Choices generated per prompt: the larger of `n` and `best_of` (1 when neither).
    pub choices: u64,
    /// The field that gave [`Parsed::choices`], if not the default.
    pub choices_param: Option<&'static str>,
    /// The fields of the document fairgate reads (`body::KEPT_FIELDS`; kept once, shared),
    /// until `estimate` has counted them. Every other field stays only in the body bytes, which
    /// are forwarded as received.
    pub value: Document,
    /// Bytes `value` held (measured by `body::value_bytes`), counted with the body in the
    /// byte budget (`queue::bytes`) for the request's life: the budget counts what the request
    /// held at its largest.
    pub kept_bytes: u64,
}

/// The parsed document of a request, kept until the last stage that reads it (`estimate`) has
/// counted it, then released ([`Document::release`]): a request waiting in the fair queue holds
/// its body bytes and the scalars of [`Parsed`], not a second, parsed copy of its messages.
#[derive(Debug, Default)]
pub struct Document(arc_swap::ArcSwapOption<serde_json::Value>);

impl Document {
    /// Keeps `value`.
    pub fn new(value: serde_json::Value) -> Self {
        Self(arc_swap::ArcSwapOption::from_pointee(value))
    }

    /// The document, unless it was released.
    pub fn get(&self) -> Option<Arc<serde_json::Value>> {
        self.0.load_full()
    }

    /// Drops the document (once every reader has read it); a holder of [`Document::get`]'s
    /// `Arc` keeps it until that is dropped.
    pub fn release(&self) {
        self.0.store(None);
    }

    /// Whether [`Document::release`] was called.
    pub fn is_released(&self) -> bool {
        self.0.load().is_none()
    }
}

impl Clone for Document {
    fn clone(&self) -> Self {
        Self(arc_swap::ArcSwapOption::new(self.get()))
    }
}

/// The chosen upstream pool.
#[derive(Debug, Clone, Copy)]
pub struct Route {
    /// Its index in `[[upstreams]]` (and in the pools' fair queues).
    pub pool: usize,
}

/// Which endpoint a body is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Completions,
    /// `/v1/embeddings` (no output).
    Embeddings,
    /// `/v1/responses`.
    Responses,
}

impl Endpoint {
    /// The endpoint of a request path, if it is one fairgate counts.
    pub fn of_path(path: &str) -> Option<Self> {
        Some(match path {
            "/v1/chat/completions" => Endpoint::Chat,
            "/v1/completions" => Endpoint::Completions,
            "/v1/embeddings" => Endpoint::Embeddings,
            "/v1/responses" => Endpoint::Responses,
            _ => return None,
        })
    }
}

/// What counting a body found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Input {
    /// Input tokens.
    pub tokens: u64,
    /// Tool calls the request allows (for the tool budget).
    pub tool_calls: u64,
    /// Whether part of the count was extrapolated (hostile or huge text).
    pub extrapolated: bool,
}

/// A request's estimate: the one the fair queue prices at dispatch, admission charges the
/// tenant's buckets with, and `usage` reconciles against.
#[derive(Clone, Debug)]
pub struct Estimate {
    /// The endpoint.
    pub endpoint: Endpoint,
    /// Counted input tokens.
    pub input: Input,
    /// The request's output cap per choice, if any (0 for embeddings).
    pub max_output_tokens: Option<u64>,
    /// Completions generated: `n`/`best_of`, times the prompts of a completions request with
    /// an array `prompt` (≥ 1). Multiplies the output estimate, the cap check and the charge.
    pub choices: u64,
    /// Whose output history applies.
    pub key: OutputKey,
    /// The model's cost weight.
    pub model_weight: Weight,
    /// The model's encoding (also used to count streamed output when usage never comes).
    pub encoding: Encoding,
    /// The response is SSE.
    pub stream: bool,
    /// Usage was asked for on the client's behalf: remove the usage-only chunk.
    pub strip_usage: bool,
    /// What the tenant's token buckets are charged at admission, in raw tokens: the counted
    /// input, and the output cap or `[estimate] default_output_tokens`, times the choices.
    pub charge: Charge,
}
