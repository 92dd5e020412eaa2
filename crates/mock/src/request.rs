//! What a mock request asks for: the parsed body fields and the `x-mock-*` header overrides.
//!
//! Invariants:
//! - Parsing borrows the body and never builds a JSON tree; text is only *measured*.
//! - Prompt tokens = ceil(text bytes / 4), at least 1; text is every string under `messages`
//!   content / `prompt` / `input` (numbers in token arrays count as one token each).
//! - Output tokens: `x-mock-output-tokens`, else `mock_output_tokens`, else `max_tokens`
//!   (or `max_completion_tokens` / `max_output_tokens`) capped at [`MAX_TOKENS_CAP`], else the
//!   configured default; then always min(chosen, max_tokens) and never above [`HARD_CAP`].

use std::fmt;
use std::time::Duration;

use http::HeaderMap;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

/// `max_tokens` alone generates at most this many tokens (a real model stops well before).
pub const MAX_TOKENS_CAP: u32 = 4096;
/// No request generates more than this many tokens, whatever it asks.
pub const HARD_CAP: u32 = 100_000;

/// The body fields the mock looks at; everything else is ignored.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct MockRequest<'a> {
    #[serde(borrow, default)]
    pub model: Option<std::borrow::Cow<'a, str>>,
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    #[serde(default)]
    pub max_tokens: Option<u32>,
    #[serde(default)]
    pub max_completion_tokens: Option<u32>,
    #[serde(default)]
    pub max_output_tokens: Option<u32>,
    #[serde(default)]
    pub mock_output_tokens: Option<u32>,
    #[serde(default)]
    pub messages: TextBytes,
    #[serde(default)]
    pub prompt: TextBytes,
    #[serde(default)]
    pub input: TextBytes,
}

/// `stream_options` of chat and completions requests.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct StreamOptions {
    #[serde(default)]
    pub include_usage: Option<bool>,
}

impl MockRequest<'_> {
    pub fn stream(&self) -> bool {
        self.stream.unwrap_or(false)
    }
    pub fn include_usage(&self) -> bool {
        self.stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false)
    }
    pub fn limit(&self) -> Option<u32> {
        self.max_tokens
            .or(self.max_completion_tokens)
            .or(self.max_output_tokens)
    }
    /// Deterministic prompt estimate: ceil(bytes / 4), min 1.
    pub fn prompt_tokens(&self) -> u32 {
        let bytes = self.messages.0 + self.prompt.0 + self.input.0;
        u32::try_from(bytes.div_ceil(4)).unwrap_or(u32::MAX).max(1)
    }
    /// How many tokens to generate, given the header override and the configured default.
    pub fn output_tokens(&self, header: Option<u32>, default: u32) -> u32 {
        let limit = self.limit();
        let chosen = header
            .or(self.mock_output_tokens)
            .or(limit.map(|l| l.min(MAX_TOKENS_CAP)))
            .unwrap_or(default);
        chosen.min(limit.unwrap_or(u32::MAX)).min(HARD_CAP)
    }
}

/// The number of text bytes found in a JSON value (see the module doc).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TextBytes(pub usize);

impl<'de> Deserialize<'de> for TextBytes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(TextVisitor).map(TextBytes)
    }
}

struct TextVisitor;

impl<'de> Visitor<'de> for TextVisitor {
    type Value = usize;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<usize, E> {
        Ok(v.len())
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<usize, E> {
        Ok(4)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<usize, E> {
        Ok(4)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<usize, E> {
        Ok(4)
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<usize, E> {
        Ok(0)
    }
    fn visit_unit<E: de::Error>(self) -> Result<usize, E> {
        Ok(0)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<usize, A::Error> {
        let mut total = 0;
        while let Some(TextBytes(n)) = seq.next_element()? {
            total += n;
        }
        Ok(total)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<usize, A::Error> {
        let mut total = 0;
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            if matches!(&*key, "content" | "text" | "input") {
                total += map.next_value::<TextBytes>()?.0;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(total)
    }
}

/// Per-request behaviour chosen by `x-mock-*` headers.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Overrides {
    pub output_tokens: Option<u32>,
    pub delay: Option<Duration>,
    pub token_delay: Option<Duration>,
    pub status: Option<http::StatusCode>,
    pub abort_after: Option<u32>,
    /// `x-mock-error-after: N`: the stream ends after N tokens with an error event.
    pub error_after: Option<u32>,
    /// `x-mock-usage: omit`: a complete stream without usage.
    pub omit_usage: bool,
}

fn header_u64(headers: &HeaderMap, name: &str) -> Option<u64> {
    headers.get(name)?.to_str().ok()?.trim().parse().ok()
}

impl Overrides {
    pub fn from_headers(headers: &HeaderMap) -> Self {
        let u32_of = |name| header_u64(headers, name).map(|n| n.min(u64::from(u32::MAX)) as u32);
        Overrides {
            output_tokens: u32_of("x-mock-output-tokens"),
            delay: header_u64(headers, "x-mock-delay-ms").map(Duration::from_millis),
            token_delay: header_u64(headers, "x-mock-token-delay-ms").map(Duration::from_millis),
            status: header_u64(headers, "x-mock-status")
                .and_then(|s| u16::try_from(s).ok())
                .and_then(|s| http::StatusCode::from_u16(s).ok()),
            abort_after: u32_of("x-mock-abort-after"),
            error_after: u32_of("x-mock-error-after"),
            omit_usage: headers
                .get("x-mock-usage")
                .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"omit")),
        }
    }
}

/// The fields of an embeddings request.
#[derive(Debug, Deserialize)]
pub(crate) struct EmbeddingsRequest {
    #[serde(default)]
    pub model: Option<String>,
    pub input: EmbedInput,
    #[serde(default)]
    pub dimensions: Option<u32>,
}

/// The accepted shapes of `input`: text(s) or token array(s).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum EmbedInput {
    One(String),
    Many(Vec<String>),
    Tokens(Vec<u64>),
    TokenLists(Vec<Vec<u64>>),
}

impl EmbedInput {
    /// One deterministic seed per input item (FNV-1a of its content) and the prompt tokens.
    pub fn seeds_and_prompt(&self) -> (Vec<u64>, u32) {
        fn fnv(bytes: impl IntoIterator<Item = u8>) -> u64 {
            bytes.into_iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
            })
        }
        let text = |s: &String| (fnv(s.bytes()), s.len());
        let tokens = |t: &Vec<u64>| (fnv(t.iter().flat_map(|n| n.to_le_bytes())), t.len() * 4);
        let items: Vec<(u64, usize)> = match self {
            EmbedInput::One(s) => vec![text(s)],
            EmbedInput::Many(v) => v.iter().map(text).collect(),
            EmbedInput::Tokens(t) => vec![tokens(t)],
            EmbedInput::TokenLists(v) => v.iter().map(tokens).collect(),
        };
        let bytes: usize = items.iter().map(|&(_, n)| n).sum();
        let prompt = u32::try_from(bytes.div_ceil(4)).unwrap_or(u32::MAX).max(1);
        (items.into_iter().map(|(seed, _)| seed).collect(), prompt)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> MockRequest<'_> {
        serde_json::from_str(json).expect("valid request")
    }

    #[test]
    fn prompt_tokens_count_content_text_only() {
        let r = parse(
            r#"{"model":"m","messages":[{"role":"system","content":"12345678"},
            {"role":"user","content":[{"type":"text","text":"abcd"},{"type":"image_url","image_url":{"url":"xxxxxxxx"}}]}]}"#,
        );
        assert_eq!(r.prompt_tokens(), 3);
        assert_eq!(parse(r#"{"prompt":"a"}"#).prompt_tokens(), 1);
        assert_eq!(parse(r#"{}"#).prompt_tokens(), 1);
        assert_eq!(parse(r#"{"input":[[1,2,3],"abcd"]}"#).prompt_tokens(), 4);
    }

    #[test]
    fn output_token_precedence() {
        let r = parse(r#"{"mock_output_tokens":7,"max_tokens":5}"#);
        assert_eq!(r.output_tokens(None, 16), 5);
        assert_eq!(r.output_tokens(Some(3), 16), 3);
        let r = parse(r#"{"mock_output_tokens":7}"#);
        assert_eq!(r.output_tokens(Some(9), 16), 9);
        assert_eq!(r.output_tokens(None, 16), 7);
        assert_eq!(
            parse(r#"{"max_completion_tokens":9}"#).output_tokens(None, 16),
            9
        );
        assert_eq!(
            parse(r#"{"max_tokens":100000}"#).output_tokens(None, 16),
            MAX_TOKENS_CAP
        );
        assert_eq!(parse(r#"{}"#).output_tokens(None, 16), 16);
    }

    #[test]
    fn overrides_parse_and_ignore_garbage() {
        let mut h = HeaderMap::new();
        h.insert("x-mock-output-tokens", "12".parse().expect("value"));
        h.insert("x-mock-status", "503".parse().expect("value"));
        h.insert("x-mock-delay-ms", "nope".parse().expect("value"));
        let o = Overrides::from_headers(&h);
        assert_eq!(o.output_tokens, Some(12));
        assert_eq!(o.status, Some(http::StatusCode::SERVICE_UNAVAILABLE));
        assert_eq!(o.delay, None);
    }
}
