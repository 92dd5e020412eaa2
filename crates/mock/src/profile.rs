//! Provider profiles: which real provider's wire dialect the mock speaks (`--profile`).
//!
//! Real OpenAI-compatible providers agree on the JSON shapes and disagree on everything a proxy
//! must get right around them: where a stream's `usage` is, whether bodies are compressed, what an
//! overload looks like and how long to back off. Each profile imitates one provider's habits:
//!
//! - `ideal` (the default): the mock as it always was — OpenAI's shapes, a separate usage chunk
//!   when `stream_options.include_usage`, instant 429s with `Retry-After` and `retry-after-ms`.
//! - `openai`: api.openai.com — compressed JSON and SSE when `Accept-Encoding` allows
//!   (`encoding.rs`), `x-ratelimit-{limit,remaining,reset}-{requests,tokens}` on every answer with
//!   resets written `1m30s` / `250ms` (`limits.rs`), usage details (zero), a usage chunk with
//!   `choices: []` before `[DONE]`.
//! - `vllm`: a self-hosted vLLM/TGI server — usage on the final content chunk (the one carrying
//!   `finish_reason`), never compressed, overload answered `503` with `Retry-After`.
//! - `groq`: Groq — the stream's usage under `x_groq.usage` in its last chunk (asked for or not),
//!   timing fields in `usage`, `x_groq.id`, the OpenAI rate-limit headers.
//! - `rough`: the awkward corners several providers and gateways show — CRLF line ends, `:
//!   keep-alive` comment lines, usage details with non-zero `cached_tokens` / `reasoning_tokens`,
//!   429s sent only after the whole body was read and a delay, `Retry-After` as an HTTP-date,
//!   limit headers per model (`dialect.rs`, `limits.rs`).
//!
//! Two per-request knobs work in every profile (see the module doc of `mock`):
//! `x-mock-error-after: N` ends a stream after N tokens with an error event, and
//! `x-mock-usage: omit` sends a complete stream (`finish_reason`, `[DONE]`) without any usage.

use std::time::Duration;

use http::StatusCode;

/// A provider dialect of the mock (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Profile {
    /// The idealised OpenAI dialect the mock always spoke.
    #[default]
    Ideal,
    /// api.openai.com: compression, rate-limit headers with `1m30s` resets, usage chunk.
    Openai,
    /// vLLM/TGI: usage on the final content chunk, no compression, 503 when overloaded.
    Vllm,
    /// Groq: `x_groq.usage` in the last stream chunk.
    Groq,
    /// CRLF, keep-alive comments, slow 429s after the body, HTTP-date `Retry-After`, details.
    Rough,
}

/// Where a stream carries its usage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StreamUsage {
    /// A last chunk with `choices: []` and `usage` (other chunks say `"usage":null`).
    SeparateChunk,
    /// `usage` on the chunk that carries `finish_reason`.
    FinalChunk,
    /// `x_groq.usage` on the chunk that carries `finish_reason`.
    XGroq,
}

/// How `usage` objects are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UsageStyle {
    Plain,
    /// `prompt_tokens_details` / `completion_tokens_details`; `nonzero` picks cached = prompt/2
    /// and reasoning = completion/2 instead of zeros.
    Details {
        nonzero: bool,
    },
    /// Groq's timing fields beside the counts.
    GroqTimes,
}

/// How a refusal says when to come back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RetryStyle {
    /// `Retry-After` in whole seconds (min 1) and `retry-after-ms`.
    SecondsAndMs,
    /// `Retry-After` in whole seconds only.
    Seconds,
    /// `Retry-After` as an HTTP-date.
    HttpDate,
}

/// Which rate-limit headers every answer carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LimitHeaders {
    /// None (429s still say `x-ratelimit-remaining-requests: 0`).
    None,
    /// OpenAI's six `x-ratelimit-*` headers.
    Standard,
    /// OpenAI's six plus `x-ratelimit-{limit,remaining}-{requests,tokens}-<model>`.
    PerModel,
}

/// How long the `rough` profile holds a refused request (after reading its body) before its 429.
pub const ROUGH_REJECT_DELAY: Duration = Duration::from_millis(100);

impl Profile {
    /// Where a stream's usage goes; `None`: the stream carries none.
    pub(crate) fn stream_usage(self, include_usage: bool) -> Option<StreamUsage> {
        match self {
            Profile::Groq => Some(StreamUsage::XGroq),
            Profile::Vllm => include_usage.then_some(StreamUsage::FinalChunk),
            Profile::Ideal | Profile::Openai | Profile::Rough => {
                include_usage.then_some(StreamUsage::SeparateChunk)
            }
        }
    }

    pub(crate) fn usage_style(self) -> UsageStyle {
        match self {
            Profile::Ideal | Profile::Vllm => UsageStyle::Plain,
            Profile::Openai => UsageStyle::Details { nonzero: false },
            Profile::Rough => UsageStyle::Details { nonzero: true },
            Profile::Groq => UsageStyle::GroqTimes,
        }
    }

    /// Whether answers are compressed when the request accepts it.
    pub(crate) fn compresses(self) -> bool {
        self == Profile::Openai
    }

    /// The status of a refusal for capacity.
    pub(crate) fn overload_status(self) -> StatusCode {
        match self {
            Profile::Vllm => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::TOO_MANY_REQUESTS,
        }
    }

    pub(crate) fn retry_style(self) -> RetryStyle {
        match self {
            Profile::Vllm => RetryStyle::Seconds,
            Profile::Rough => RetryStyle::HttpDate,
            Profile::Ideal | Profile::Openai | Profile::Groq => RetryStyle::SecondsAndMs,
        }
    }

    pub(crate) fn limit_headers(self) -> LimitHeaders {
        match self {
            Profile::Ideal | Profile::Vllm => LimitHeaders::None,
            Profile::Openai | Profile::Groq => LimitHeaders::Standard,
            Profile::Rough => LimitHeaders::PerModel,
        }
    }

    /// Refusals wait for the whole request body and then this long (`None`: refused at once).
    pub(crate) fn slow_refusal(self) -> Option<Duration> {
        (self == Profile::Rough).then_some(ROUGH_REJECT_DELAY)
    }

    /// CRLF line ends and `: keep-alive` comments in streams.
    pub(crate) fn rough_sse(self) -> bool {
        self == Profile::Rough
    }
}
