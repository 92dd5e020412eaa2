//! Response texts of the mock in OpenAI's shapes: JSON bodies, SSE chunks, errors.
//!
//! Invariants: every body is valid JSON built by direct formatting (no JSON tree); the only
//! caller-controlled string, the model name, is JSON-escaped once in [`Reply::new`]; every
//! completion-like body carries a `usage` whose total is prompt + completion.

use std::fmt::Write as _;

use super::profile::{StreamUsage, UsageStyle};

/// One generated token's text.
pub(crate) const TOKEN: &str = "tok ";

/// What one reply says, shared by its JSON body and its SSE chunks.
#[derive(Debug)]
pub(crate) struct Reply {
    pub id: u64,
    pub created: u64,
    /// JSON-escaped, quoted model name.
    pub model: String,
    pub prompt: u32,
    pub output: u32,
    pub finish: &'static str,
    /// How `usage` is written (per profile; see `dialect.rs`).
    pub usage_style: UsageStyle,
}

impl Reply {
    pub fn new(id: u64, model: &str, prompt: u32, output: u32, hit_limit: bool) -> Self {
        let created = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Reply {
            id,
            created,
            model: serde_json::to_string(model).unwrap_or_else(|_| "\"mock\"".into()),
            prompt,
            output,
            finish: if hit_limit { "length" } else { "stop" },
            usage_style: UsageStyle::Plain,
        }
    }

    fn text(&self) -> String {
        TOKEN.repeat(self.output as usize)
    }

    pub fn chat_json(&self) -> String {
        let (id, created, model, finish) = (self.id, self.created, &self.model, self.finish);
        format!(
            r#"{{"id":"chatcmpl-mock-{id}","object":"chat.completion","created":{created},"model":{model},"choices":[{{"index":0,"message":{{"role":"assistant","content":"{}","refusal":null}},"logprobs":null,"finish_reason":"{finish}"}}],"usage":{},"system_fingerprint":"fp_mock"{}}}"#,
            self.text(),
            self.usage(),
            self.json_extra()
        )
    }

    /// A `chat.completion.chunk` SSE frame; `choices` is the inner JSON of the choices array.
    fn chat_chunk(&self, choices: &str, usage: &str) -> String {
        let (id, created, model) = (self.id, self.created, &self.model);
        format!(
            "data: {{\"id\":\"chatcmpl-mock-{id}\",\"object\":\"chat.completion.chunk\",\"created\":{created},\"model\":{model},\"system_fingerprint\":\"fp_mock\",\"choices\":[{choices}]{usage}}}\n\n"
        )
    }

    /// (first token chunk, other token chunks, tail frames) of a streamed chat completion whose
    /// usage goes to `placement` (`None`: no usage).
    pub fn chat_stream(&self, placement: Option<StreamUsage>) -> (String, String, Vec<String>) {
        let (first_sfx, rest_sfx, finish_sfx, usage_chunk) = self.stream_suffixes(placement);
        let delta = |role: &str| {
            format!(
                r#"{{"index":0,"delta":{{{role}"content":"{TOKEN}"}},"logprobs":null,"finish_reason":null}}"#
            )
        };
        let first = self.chat_chunk(&delta(r#""role":"assistant","#), &first_sfx);
        let rest = self.chat_chunk(&delta(""), &rest_sfx);
        let finish = format!(
            r#"{{"index":0,"delta":{{}},"logprobs":null,"finish_reason":"{}"}}"#,
            self.finish
        );
        let mut tail = vec![self.chat_chunk(&finish, &finish_sfx)];
        if let Some(usage) = usage_chunk {
            tail.push(self.chat_chunk("", &usage));
        }
        tail.push(DONE.to_owned());
        (first, rest, tail)
    }

    pub fn completion_json(&self) -> String {
        let (id, created, model, finish) = (self.id, self.created, &self.model, self.finish);
        format!(
            r#"{{"id":"cmpl-mock-{id}","object":"text_completion","created":{created},"model":{model},"choices":[{{"text":"{}","index":0,"logprobs":null,"finish_reason":"{finish}"}}],"usage":{}{}}}"#,
            self.text(),
            self.usage(),
            self.json_extra()
        )
    }

    fn completion_chunk(&self, choices: &str, usage: &str) -> String {
        let (id, created, model) = (self.id, self.created, &self.model);
        format!(
            "data: {{\"id\":\"cmpl-mock-{id}\",\"object\":\"text_completion\",\"created\":{created},\"model\":{model},\"choices\":[{choices}]{usage}}}\n\n"
        )
    }

    /// (first token chunk, other token chunks, tail frames) of a streamed legacy completion.
    pub fn completion_stream(
        &self,
        placement: Option<StreamUsage>,
    ) -> (String, String, Vec<String>) {
        let (first_sfx, rest_sfx, finish_sfx, usage_chunk) = self.stream_suffixes(placement);
        let choice = |text: &str, finish: &str| {
            format!(r#"{{"text":"{text}","index":0,"logprobs":null,"finish_reason":{finish}}}"#)
        };
        let first = self.completion_chunk(&choice(TOKEN, "null"), &first_sfx);
        let rest = self.completion_chunk(&choice(TOKEN, "null"), &rest_sfx);
        let finish = format!("\"{}\"", self.finish);
        let mut tail = vec![self.completion_chunk(&choice("", &finish), &finish_sfx)];
        if let Some(usage) = usage_chunk {
            tail.push(self.completion_chunk("", &usage));
        }
        tail.push(DONE.to_owned());
        (first, rest, tail)
    }

    /// A Responses API object; `done` selects the final (completed) or initial (in progress) form.
    pub fn response_object(&self, done: bool) -> String {
        let (id, created, model) = (self.id, self.created, &self.model);
        let (status, output, usage) = if done {
            let (p, c) = (self.prompt, self.output);
            (
                "completed",
                format!(
                    r#"[{{"type":"message","id":"msg_mock_{id}","status":"completed","role":"assistant","content":[{{"type":"output_text","text":"{}","annotations":[]}}]}}]"#,
                    self.text()
                ),
                format!(
                    r#"{{"input_tokens":{p},"input_tokens_details":{{"cached_tokens":0}},"output_tokens":{c},"output_tokens_details":{{"reasoning_tokens":0}},"total_tokens":{}}}"#,
                    u64::from(p) + u64::from(c)
                ),
            )
        } else {
            ("in_progress", "[]".to_owned(), "null".to_owned())
        };
        format!(
            r#"{{"id":"resp_mock_{id}","object":"response","created_at":{created},"status":"{status}","model":{model},"output":{output},"usage":{usage}}}"#
        )
    }

    /// (created event, token delta event, tail frames) of a streamed Responses API call.
    pub fn response_stream(&self) -> (String, String, Vec<String>) {
        let event = |name: &str, data: &str| format!("event: {name}\ndata: {data}\n\n");
        let created = event(
            "response.created",
            &format!(
                r#"{{"type":"response.created","response":{}}}"#,
                self.response_object(false)
            ),
        );
        let delta = event(
            "response.output_text.delta",
            &format!(
                r#"{{"type":"response.output_text.delta","item_id":"msg_mock_{}","output_index":0,"content_index":0,"delta":"{TOKEN}"}}"#,
                self.id
            ),
        );
        let completed = event(
            "response.completed",
            &format!(
                r#"{{"type":"response.completed","response":{}}}"#,
                self.response_object(true)
            ),
        );
        (created, delta, vec![completed])
    }
}

/// The SSE stream terminator of chat and completions.
pub(crate) const DONE: &str = "data: [DONE]\n\n";

/// An OpenAI-shaped error body.
pub(crate) fn error_json(message: &str, kind: &str, code: Option<&str>) -> String {
    let esc = |s: &str| serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into());
    let code = code.map_or_else(|| "null".to_owned(), esc);
    format!(
        r#"{{"error":{{"message":{},"type":{},"param":null,"code":{code}}}}}"#,
        esc(message),
        esc(kind)
    )
}

/// The `GET /v1/models` list.
pub(crate) fn models_json(models: &[String]) -> String {
    let mut out = String::from(r#"{"object":"list","data":["#);
    for (i, m) in models.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&model_json(m));
    }
    out.push_str("]}");
    out
}

/// One model object.
pub(crate) fn model_json(model: &str) -> String {
    let id = serde_json::to_string(model).unwrap_or_else(|_| "\"mock\"".into());
    format!(r#"{{"id":{id},"object":"model","created":1700000000,"owned_by":"fairgate-mock"}}"#)
}

/// An embeddings list: one deterministic vector of `dims` floats per input text.
pub(crate) fn embeddings_json(model: &str, inputs: &[u64], dims: usize, prompt: u32) -> String {
    let model = serde_json::to_string(model).unwrap_or_else(|_| "\"mock\"".into());
    let mut out = String::from(r#"{"object":"list","data":["#);
    for (index, &seed) in inputs.iter().enumerate() {
        if index > 0 {
            out.push(',');
        }
        let _ = write!(
            out,
            r#"{{"object":"embedding","index":{index},"embedding":["#
        );
        let mut x = seed | 1;
        for d in 0..dims {
            // xorshift64: deterministic, cheap, spread over [-1, 1).
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let v = (x >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0;
            let sep = if d > 0 { "," } else { "" };
            let _ = write!(out, "{sep}{v:.6}");
        }
        out.push_str("]}");
    }
    let _ = write!(
        out,
        r#"],"model":{model},"usage":{{"prompt_tokens":{prompt},"total_tokens":{prompt}}}}}"#
    );
    out
}
