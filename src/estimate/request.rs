//! Input tokens of a request body, per endpoint, following OpenAI's counting.
//!
//! Chat (OpenAI cookbook `num_tokens_from_messages`): 3 tokens per message, the tokens of every
//! string field of the message (role, content, name, tool_call_id, …), +1 per `name`, +3 to
//! prime the reply. Content-part arrays count their `text`/`refusal` parts; images count a fixed
//! [`IMAGE_TOKENS`] (85 with `detail: "low"`), audio and files [`MEDIA_TOKENS`]. Tool calls count
//! their function name and arguments; tool definitions count their JSON text plus
//! [`TOOL_OVERHEAD`] each. Completions count `prompt`, embeddings `input` (strings, or token
//! arrays counted by length), Responses `instructions` and `input` (a string, or items counted
//! like messages).
//!
//! Invariants: never panics on any JSON; a shape OpenAI would reject (a content part that is not
//! an object or lacks its text, content that is neither a string, an array nor null, a prompt
//! that is an object) is an [`Error`] (400); all text goes through one [`Budget`], so the whole
//! request costs at most `max_exact_bytes` of BPE work.

use serde_json::Value;

use super::tokens::{count, Budget, Cache, Encoding};
use super::Error;

/// Tokens assumed for an image part (a high-detail 1024×1024 image).
pub const IMAGE_TOKENS: u64 = 765;
/// Tokens assumed for an audio or file part.
pub const MEDIA_TOKENS: u64 = 200;
/// Extra tokens per tool definition (its framing in the prompt).
pub const TOOL_OVERHEAD: u64 = 8;

pub use crate::context::{Endpoint, Input};

/// Counts a request body's input tokens.
pub struct Counter<'a> {
    enc: Encoding,
    budget: Budget,
    cache: Option<&'a Cache>,
    tokens: u64,
}

impl<'a> Counter<'a> {
    /// A counter with `enc`, counting at most `max_exact_bytes` exactly.
    pub fn new(enc: Encoding, max_exact_bytes: usize, cache: Option<&'a Cache>) -> Self {
        Self {
            enc,
            budget: Budget::new(max_exact_bytes),
            cache,
            tokens: 0,
        }
    }

    fn text(&mut self, s: &str) {
        self.tokens = self
            .tokens
            .saturating_add(count(self.enc, s, &mut self.budget, self.cache).tokens);
    }

    /// Counts `body` as a request to `endpoint`.
    pub fn body(mut self, endpoint: Endpoint, body: &Value) -> Result<Input, Error> {
        match endpoint {
            Endpoint::Chat => {
                self.messages(body.get("messages"))?;
                self.tools(body.get("tools"))?;
                self.tools(body.get("functions"))?;
            }
            Endpoint::Completions => self.prompt(body.get("prompt"), "prompt")?,
            Endpoint::Embeddings => self.prompt(body.get("input"), "input")?,
            Endpoint::Responses => {
                if let Some(i) = body.get("instructions").and_then(Value::as_str) {
                    self.text(i);
                }
                match body.get("input") {
                    Some(Value::String(s)) => self.text(s),
                    Some(Value::Array(items)) => {
                        for item in items {
                            self.item(item)?;
                        }
                        self.tokens += 3;
                    }
                    None | Some(Value::Null) => {}
                    Some(_) => return Err(Error::Malformed("input")),
                }
                self.tools(body.get("tools"))?;
            }
        }
        Ok(Input {
            tokens: self.tokens,
            tool_calls: allowed_tool_calls(body),
            extrapolated: self.budget.extrapolated,
        })
    }

    fn messages(&mut self, messages: Option<&Value>) -> Result<(), Error> {
        let Some(messages) = messages else {
            return Ok(());
        };
        let messages = messages.as_array().ok_or(Error::Malformed("messages"))?;
        for m in messages {
            self.item(m)?;
        }
        self.tokens += 3;
        Ok(())
    }

    /// A chat message or a Responses input item.
    fn item(&mut self, m: &Value) -> Result<(), Error> {
        let m = m.as_object().ok_or(Error::Malformed("messages"))?;
        self.tokens += 3;
        for (k, v) in m {
            match (k.as_str(), v) {
                ("content", v) => self.content(v)?,
                ("tool_calls", Value::Array(calls)) => {
                    for call in calls {
                        let f = call.get("function").unwrap_or(call);
                        for key in ["name", "arguments"] {
                            if let Some(s) = f.get(key).and_then(Value::as_str) {
                                self.text(s);
                            }
                        }
                    }
                }
                ("function_call", Value::Object(f)) => {
                    for key in ["name", "arguments"] {
                        if let Some(s) = f.get(key).and_then(Value::as_str) {
                            self.text(s);
                        }
                    }
                }
                ("type" | "id" | "call_id" | "status", _) => {}
                (k, Value::String(s)) => {
                    self.text(s);
                    if k == "name" {
                        self.tokens += 1;
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn content(&mut self, v: &Value) -> Result<(), Error> {
        match v {
            Value::String(s) => self.text(s),
            Value::Null => {}
            Value::Array(parts) => {
                for p in parts {
                    self.part(p)?;
                }
            }
            _ => return Err(Error::Malformed("content")),
        }
        Ok(())
    }

    fn part(&mut self, p: &Value) -> Result<(), Error> {
        let p = p.as_object().ok_or(Error::Malformed("content part"))?;
        let kind = p
            .get("type")
            .and_then(Value::as_str)
            .ok_or(Error::Malformed("content part type"))?;
        let text = |key: &'static str| p.get(key).and_then(Value::as_str).ok_or(Error::Text(key));
        match kind {
            "text" | "input_text" | "output_text" => self.text(text("text")?),
            "refusal" => self.text(text("refusal")?),
            "image_url" | "input_image" => {
                let low = p
                    .get("image_url")
                    .and_then(|u| u.get("detail"))
                    .or_else(|| p.get("detail"))
                    .and_then(Value::as_str)
                    == Some("low");
                self.tokens += if low { 85 } else { IMAGE_TOKENS };
            }
            _ => self.tokens += MEDIA_TOKENS,
        }
        Ok(())
    }

    fn tools(&mut self, tools: Option<&Value>) -> Result<(), Error> {
        match tools {
            None | Some(Value::Null) => Ok(()),
            Some(Value::Array(tools)) => {
                for t in tools {
                    let def = t.get("function").unwrap_or(t);
                    self.text(&def.to_string());
                    self.tokens += TOOL_OVERHEAD;
                }
                Ok(())
            }
            Some(_) => Err(Error::Malformed("tools")),
        }
    }

    /// A completions `prompt` or embeddings `input`.
    fn prompt(&mut self, v: Option<&Value>, field: &'static str) -> Result<(), Error> {
        match v {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) => self.text(s),
            Some(Value::Array(items)) => {
                for item in items {
                    match item {
                        Value::String(s) => self.text(s),
                        Value::Number(_) => self.tokens += 1,
                        Value::Array(ids) => {
                            self.tokens = self.tokens.saturating_add(ids.len() as u64)
                        }
                        _ => return Err(Error::Malformed(field)),
                    }
                }
            }
            Some(_) => return Err(Error::Malformed(field)),
        }
        Ok(())
    }
}

/// The prompts of a completions request (each gets its own `n` completions): the elements of
/// an array of strings or of token arrays; 1 for a string or a single token array.
pub fn prompts(body: &Value) -> u64 {
    match body.get("prompt") {
        Some(Value::Array(items)) if items.iter().any(|i| !i.is_number()) => {
            (items.len() as u64).max(1)
        }
        _ => 1,
    }
}

/// `max_tool_calls` when given; else 1 when tools are offered and `tool_choice` is not `none`.
fn allowed_tool_calls(body: &Value) -> u64 {
    if let Some(n) = body.get("max_tool_calls").and_then(Value::as_u64) {
        return n;
    }
    let offered = ["tools", "functions"].iter().any(|k| {
        body.get(*k)
            .and_then(Value::as_array)
            .is_some_and(|t| !t.is_empty())
    });
    let none = body.get("tool_choice").and_then(Value::as_str) == Some("none");
    u64::from(offered && !none)
}
