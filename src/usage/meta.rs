//! What a provider's answer says about itself — its `id`, `model` and each choice's
//! `finish_reason` (a Responses API answer: `response.id`, `response.model` and its status) —
//! read for OpenTelemetry's `gen_ai.response.*` only when the request's spans are recorded
//! (`Ctx::recorded`), so an unsampled request pays nothing.
//!
//! Invariants: a document that does not parse says nothing; kept strings are bounded
//! ([`ResponseMeta::MAX_LEN`], [`ResponseMeta::MAX_REASONS`]); once the id and model are known,
//! an SSE event is parsed again only if it may carry a finish reason (most chunks say
//! `"finish_reason":null` and are skipped by a byte scan).

use std::borrow::Cow;

use serde::Deserialize;

use crate::context::ResponseMeta;

#[derive(Deserialize)]
struct Doc<'a> {
    #[serde(default, borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    model: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    choices: Option<Vec<Choice<'a>>>,
    #[serde(default, borrow)]
    response: Option<Resp<'a>>,
}

#[derive(Deserialize)]
struct Choice<'a> {
    #[serde(default, borrow)]
    finish_reason: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct Resp<'a> {
    #[serde(default, borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    model: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    status: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    incomplete_details: Option<Incomplete<'a>>,
}

#[derive(Deserialize)]
struct Incomplete<'a> {
    #[serde(default, borrow)]
    reason: Option<Cow<'a, str>>,
}

fn bounded(s: &str) -> String {
    let mut end = s.len().min(ResponseMeta::MAX_LEN);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    memchr::memmem::find(hay, needle).is_some()
}

/// Collects a response's [`ResponseMeta`] over its body or events.
#[derive(Debug, Default)]
pub struct Collector {
    meta: ResponseMeta,
}

impl Collector {
    /// Reads one JSON document (a whole body, or one SSE event's data).
    pub fn see(&mut self, json: &[u8]) {
        let known = self.meta.id.is_some() && self.meta.model.is_some();
        if known
            && (!contains(json, b"finish_reason") || contains(json, b"\"finish_reason\":null"))
            && !contains(json, b"\"status\"")
        {
            return;
        }
        let Ok(doc) = serde_json::from_slice::<Doc<'_>>(json) else {
            return;
        };
        let m = &mut self.meta;
        let (id, model) = match &doc.response {
            Some(r) => (r.id.as_deref(), r.model.as_deref()),
            None => (doc.id.as_deref(), doc.model.as_deref()),
        };
        if m.id.is_none() {
            m.id = id.map(bounded);
        }
        if m.model.is_none() {
            m.model = model.map(bounded);
        }
        let mut push = |r: &str| {
            if m.finish_reasons.len() < ResponseMeta::MAX_REASONS {
                m.finish_reasons.push(bounded(r));
            }
        };
        for c in doc.choices.iter().flatten() {
            if let Some(r) = &c.finish_reason {
                push(r);
            }
        }
        if let Some(r) = &doc.response {
            match r.status.as_deref() {
                Some("completed") => push("stop"),
                Some("incomplete") => push(
                    r.incomplete_details
                        .as_ref()
                        .and_then(|d| d.reason.as_deref())
                        .unwrap_or("incomplete"),
                ),
                Some("failed") => push("error"),
                _ => {}
            }
        }
    }

    /// What was read.
    pub fn finish(self) -> ResponseMeta {
        self.meta
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_json_sse_and_responses_shapes() {
        let mut c = Collector::default();
        c.see(br#"{"id":"chatcmpl-1","object":"chat.completion","model":"gpt-4o-2024","choices":[{"index":0,"message":{"content":"x"},"finish_reason":"stop"},{"index":1,"finish_reason":"length"}],"usage":{}}"#);
        let m = c.finish();
        assert_eq!(m.id.as_deref(), Some("chatcmpl-1"));
        assert_eq!(m.model.as_deref(), Some("gpt-4o-2024"));
        assert_eq!(m.finish_reasons, ["stop", "length"]);

        let mut c = Collector::default();
        c.see(br#"{"id":"c2","model":"m","choices":[{"delta":{"content":"a"},"finish_reason":null}]}"#);
        c.see(br#"{"id":"c2","model":"m","choices":[{"delta":{},"finish_reason":"tool_calls"}]}"#);
        c.see(br#"{"id":"c2","model":"m","choices":[],"usage":{"prompt_tokens":1}}"#);
        c.see(b"not json");
        let m = c.finish();
        assert_eq!(
            (m.id.as_deref(), m.finish_reasons.as_slice()),
            (Some("c2"), &["tool_calls".to_owned()][..])
        );

        let mut c = Collector::default();
        c.see(br#"{"type":"response.completed","response":{"id":"resp_1","model":"gpt-5","status":"completed"}}"#);
        let m = c.finish();
        assert_eq!(
            (m.id.as_deref(), m.model.as_deref()),
            (Some("resp_1"), Some("gpt-5"))
        );
        assert_eq!(m.finish_reasons, ["stop"]);

        let mut c = Collector::default();
        let long = format!(r#"{{"id":"{}","model":"m"}}"#, "x".repeat(1000));
        c.see(long.as_bytes());
        assert_eq!(c.finish().id.unwrap().len(), ResponseMeta::MAX_LEN);
    }
}
