//! The per-profile parts of the mock's bodies: how `usage` is written, where a stream carries it,
//! the `rough` profile's SSE framing, and mid-stream error events.
//!
//! - OpenAI writes `prompt_tokens_details.cached_tokens` and
//!   `completion_tokens_details.reasoning_tokens` in every usage (zeros for a plain chat model);
//!   `rough` makes them non-zero (cached = prompt/2, reasoning = completion/2; reasoning tokens are
//!   part of `completion_tokens`, as OpenAI counts them) so accounting must read the totals.
//! - Groq adds timing fields to `usage`, and in streams puts it under `x_groq.usage` on the chunk
//!   that carries `finish_reason` (the first chunk carries `x_groq.id` alone).
//! - vLLM/TGI attach `usage` to the final content chunk instead of sending a separate one.
//! - `rough`: every line ends in CRLF, and `: keep-alive` comment lines (as proxies and some
//!   providers send while a model thinks) come before the first event and before the final chunk.
//! - A provider that fails mid-stream sends an error event and stops: `data: {"error":…}` for chat
//!   and completions, `event: error` for the Responses API; no `[DONE]` follows.
//!
//! Invariants: every JSON text stays valid after the CRLF rewrite (the mock's JSON has no raw
//! newline); the totals are always prompt + completion.

use bytes::Bytes;

use super::format::{error_json, Reply};
use super::profile::{StreamUsage, UsageStyle};

/// An SSE comment line, as keep-alives are sent.
pub(crate) const KEEP_ALIVE: &str = ": keep-alive\n\n";

impl Reply {
    /// The `usage` object in this reply's style.
    pub(crate) fn usage(&self) -> String {
        let (p, c) = (self.prompt, self.output);
        let total = u64::from(p) + u64::from(c);
        match self.usage_style {
            UsageStyle::Plain => {
                format!(r#"{{"prompt_tokens":{p},"completion_tokens":{c},"total_tokens":{total}}}"#)
            }
            UsageStyle::Details { nonzero } => {
                let (cached, reasoning) = if nonzero { (p / 2, c / 2) } else { (0, 0) };
                format!(
                    r#"{{"prompt_tokens":{p},"completion_tokens":{c},"total_tokens":{total},"prompt_tokens_details":{{"cached_tokens":{cached},"audio_tokens":0}},"completion_tokens_details":{{"reasoning_tokens":{reasoning},"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}}}}"#
                )
            }
            UsageStyle::GroqTimes => format!(
                r#"{{"queue_time":0.001,"prompt_tokens":{p},"prompt_time":0.002,"completion_tokens":{c},"completion_time":0.01,"total_tokens":{total},"total_time":0.012}}"#
            ),
        }
    }

    /// Extra members of a non-streamed body (Groq's `x_groq`).
    pub(crate) fn json_extra(&self) -> String {
        match self.usage_style {
            UsageStyle::GroqTimes => format!(r#","x_groq":{{"id":"req_mock_{}"}}"#, self.id),
            _ => String::new(),
        }
    }

    /// (suffix of the first chunk, of the other token chunks, of the finish chunk, and the suffix
    /// of a separate usage chunk) for a stream whose usage goes to `placement`.
    pub(crate) fn stream_suffixes(
        &self,
        placement: Option<StreamUsage>,
    ) -> (String, String, String, Option<String>) {
        let usage = self.usage();
        match placement {
            None => Default::default(),
            Some(StreamUsage::SeparateChunk) => {
                let null = ",\"usage\":null".to_owned();
                (
                    null.clone(),
                    null.clone(),
                    null,
                    Some(format!(",\"usage\":{usage}")),
                )
            }
            Some(StreamUsage::FinalChunk) => (
                String::new(),
                String::new(),
                format!(",\"usage\":{usage}"),
                None,
            ),
            Some(StreamUsage::XGroq) => (
                format!(r#","x_groq":{{"id":"req_mock_{}"}}"#, self.id),
                String::new(),
                format!(
                    r#","x_groq":{{"id":"req_mock_{}","usage":{usage}}}"#,
                    self.id
                ),
                None,
            ),
        }
    }
}

/// The error event that ends a stream early; `responses` selects the Responses API's form.
pub(crate) fn error_event(responses: bool, after: u32) -> String {
    let message = format!("mock upstream: the model failed after {after} tokens");
    if responses {
        let esc = serde_json::to_string(&message).unwrap_or_else(|_| "\"\"".into());
        format!(
            "event: error\ndata: {{\"type\":\"error\",\"code\":\"server_error\",\"message\":{esc},\"param\":null}}\n\n"
        )
    } else {
        let body = error_json(&message, "server_error", Some("mock_stream_error"));
        format!("data: {body}\n\n")
    }
}

/// The frames of a stream as sent on the wire: `rough` rewrites line ends to CRLF and adds
/// keep-alive comments before the first frame and before the first tail frame.
pub(crate) fn frames(
    rough: bool,
    pre: Option<String>,
    first: String,
    rest: String,
    tail: Vec<String>,
) -> (Option<Bytes>, Bytes, Bytes, Vec<Bytes>) {
    if !rough {
        let tail = tail.into_iter().map(Bytes::from).collect();
        return (pre.map(Bytes::from), first.into(), rest.into(), tail);
    }
    let crlf = |s: String| Bytes::from(s.replace('\n', "\r\n"));
    let (pre, first) = match pre {
        Some(pre) => (Some(crlf(format!("{KEEP_ALIVE}{pre}"))), crlf(first)),
        None => (None, crlf(format!("{KEEP_ALIVE}{first}"))),
    };
    let tail = tail
        .into_iter()
        .enumerate()
        .map(|(i, f)| {
            crlf(if i == 0 {
                format!("{KEEP_ALIVE}{f}")
            } else {
                f
            })
        })
        .collect();
    (pre, first, crlf(rest), tail)
}
