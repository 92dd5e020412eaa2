//! What a response says about its cost: `usage` in any of OpenAI's shapes, and the generated
//! text (for counting when usage never comes).
//!
//! Shapes: chat/completions `usage.prompt_tokens`/`completion_tokens`; Responses API
//! `usage.input_tokens`/`output_tokens` (top level, or under `response` in streamed events);
//! embeddings `usage.prompt_tokens` only; Groq's streams `x_groq.usage` (on the last chunk). Text: `choices[].delta.content` (chat chunks),
//! `choices[].message.content` (chat JSON), `choices[].text` (completions), a string `delta`
//! (Responses `*.delta` events), and tool-call arguments.
//!
//! An SSE event is skimmed (`skim`: no parse but of a `usage` object on its path); a whole JSON
//! body is first read for its top-level `usage` from its end
//! ([`usage_from_end`]: the last `"usage"` key, checked to belong to the outermost object by a
//! scan of what follows it), which skips everything before it; a body where that does not find
//! a usage with output tokens is parsed whole.
//!
//! Invariants: parsing never fails loudly (a document that does not parse says nothing, except
//! that the from-the-end read does not validate the bytes before the `usage` key); the kept text
//! is bounded by `max_text` bytes, the bytes past it are only counted.

use std::borrow::Cow;

use serde::Deserialize;

/// Token counts from a `usage` object.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct Usage {
    /// `prompt_tokens` or `input_tokens`.
    #[serde(alias = "input_tokens", default)]
    pub prompt_tokens: Option<u64>,
    /// `completion_tokens` or `output_tokens`.
    #[serde(alias = "output_tokens", default)]
    pub completion_tokens: Option<u64>,
    /// `prompt_tokens_details` or `input_tokens_details` (their `cached_tokens`).
    #[serde(alias = "input_tokens_details", default)]
    pub prompt_tokens_details: Option<Details>,
}

/// `prompt_tokens_details` / `input_tokens_details`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct Details {
    /// Input tokens read from the provider's prompt cache.
    #[serde(default)]
    pub cached_tokens: Option<u64>,
}

impl Usage {
    /// Cached input tokens (0 when the provider did not say).
    pub fn cached_tokens(&self) -> u64 {
        self.prompt_tokens_details
            .and_then(|d| d.cached_tokens)
            .unwrap_or(0)
    }
}

#[derive(Debug, Default, Deserialize)]
struct Doc<'a> {
    #[serde(default)]
    usage: Option<Usage>,
    #[serde(default)]
    response: Option<Inner>,
    #[serde(default)]
    x_groq: Option<Inner>,
    #[serde(default, borrow)]
    choices: Option<Vec<Choice<'a>>>,
    #[serde(default, borrow)]
    delta: Option<StrOrAny<'a>>,
}

#[derive(Debug, Default, Deserialize)]
struct Inner {
    #[serde(default)]
    usage: Option<Usage>,
}

#[derive(Debug, Default, Deserialize)]
struct Choice<'a> {
    #[serde(default, borrow)]
    delta: Option<Message<'a>>,
    #[serde(default, borrow)]
    message: Option<Message<'a>>,
    #[serde(default, borrow)]
    text: Option<Cow<'a, str>>,
}

#[derive(Debug, Default, Deserialize)]
struct Message<'a> {
    #[serde(default, borrow)]
    content: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    tool_calls: Option<Vec<ToolCall<'a>>>,
}

#[derive(Debug, Default, Deserialize)]
struct ToolCall<'a> {
    #[serde(default, borrow)]
    function: Option<Function<'a>>,
}

#[derive(Debug, Default, Deserialize)]
struct Function<'a> {
    #[serde(default, borrow)]
    arguments: Option<Cow<'a, str>>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum StrOrAny<'a> {
    Str(#[serde(borrow)] Cow<'a, str>),
    Any(serde::de::IgnoredAny),
}

/// What one JSON document (a body or an SSE event) held.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Seen {
    /// Its usage, if non-null.
    pub usage: Option<Usage>,
    /// A usage-only chunk: `choices: []` with a usage (removed when usage was asked for us).
    pub usage_only: bool,
    /// Where a top-level `,"usage":null` begins (an SSE event's; what strip mode removes).
    pub null_usage: Option<usize>,
}

/// Accumulates usage and generated text over a response.
#[derive(Debug)]
pub struct Tally {
    /// The last usage seen.
    pub usage: Option<Usage>,
    /// Generated text kept for counting (at most `max_text` bytes).
    pub text: String,
    /// Generated text bytes past `max_text` (counted, not kept).
    pub extra_bytes: u64,
    /// JSON documents that did not parse.
    pub malformed: u64,
    /// The answer's id, model and finish reasons, read only when asked for (recorded requests).
    pub meta: Option<Box<super::meta::Collector>>,
    max_text: usize,
    /// What the stream's events had in common (the skim walks on from there).
    memo: super::skim::Memo,
}

impl Tally {
    /// A tally keeping at most `max_text` bytes of text.
    pub fn new(max_text: usize) -> Self {
        Self {
            usage: None,
            text: String::new(),
            extra_bytes: 0,
            malformed: 0,
            meta: None,
            max_text,
            memo: Default::default(),
        }
    }

    /// Keeps the raw content of a JSON string (`escaped`: it holds `\` escapes).
    fn push_raw(&mut self, raw: &[u8], escaped: bool) {
        if !escaped {
            if let Ok(s) = std::str::from_utf8(raw) {
                self.push_text(s);
            }
            return;
        }
        // Decoded straight into the kept text (no copy, nothing allocated per event): pieces
        // while they fit, the rest only counted, all of it taken back if the string is invalid.
        let (start, extra) = (self.text.len(), self.extra_bytes);
        let mut full = false;
        let valid = super::skim::unescape_with(raw, &mut |s| {
            if full {
                self.extra_bytes = self.extra_bytes.saturating_add(s.len() as u64);
            } else {
                let before = self.text.len();
                self.push_text(s);
                full = self.text.len() - before < s.len();
            }
        });
        if valid.is_none() {
            self.text.truncate(start);
            self.extra_bytes = extra;
        }
    }

    fn push_text(&mut self, s: &str) {
        let room = self.max_text.saturating_sub(self.text.len());
        if s.len() <= room {
            self.text.push_str(s);
        } else {
            let mut cut = room;
            while !s.is_char_boundary(cut) {
                cut -= 1;
            }
            self.text.push_str(&s[..cut]);
            self.extra_bytes = self.extra_bytes.saturating_add((s.len() - cut) as u64);
        }
    }

    /// Observes a whole JSON response body. A body whose top-level usage, read from its end,
    /// gives the output tokens is read for that alone (its text is never needed: counting is
    /// the fallback when usage lacks them); any other body is observed in full, once.
    pub fn observe_body(&mut self, json: &[u8]) -> Seen {
        if let Some(m) = &mut self.meta {
            m.see(json);
        }
        let usage = usage_from_end(json);
        if let Some(u) = usage.filter(|u| u.completion_tokens.is_some()) {
            self.usage = Some(u);
            return Seen {
                usage,
                ..Seen::default()
            };
        }
        self.observe_doc(json)
    }

    /// Observes one JSON document (an SSE event's data) by a skim: its usage parsed only when
    /// it has one, its text read without a parse.
    pub fn observe(&mut self, json: &[u8]) -> Seen {
        if let Some(m) = &mut self.meta {
            m.see(json);
        }
        let mut memo = std::mem::take(&mut self.memo);
        let found = super::skim::skim_after(json, &mut memo, &mut |raw, escaped| {
            self.push_raw(raw, escaped)
        });
        self.memo = memo;
        let Some(found) = found else {
            self.malformed += 1;
            return Seen::default();
        };
        let usage = found.usage;
        if usage.is_some() {
            self.usage = usage;
        }
        Seen {
            usage,
            usage_only: usage.is_some() && !found.choices,
            null_usage: found.null_usage,
        }
    }

    /// Observes one JSON document by a full parse (a body whose usage the read from its end
    /// did not find; and what the skim is tested against).
    pub(super) fn observe_doc(&mut self, json: &[u8]) -> Seen {
        let Ok(doc) = serde_json::from_slice::<Doc<'_>>(json) else {
            self.malformed += 1;
            return Seen::default();
        };
        let usage = doc
            .usage
            .or(doc.response.and_then(|r| r.usage))
            .or(doc.x_groq.and_then(|g| g.usage));
        let choices = doc.choices.unwrap_or_default();
        let usage_only = usage.is_some() && choices.is_empty();
        for c in &choices {
            if let Some(t) = &c.text {
                self.push_text(t);
            }
            for m in [&c.delta, &c.message].into_iter().flatten() {
                if let Some(t) = &m.content {
                    self.push_text(t);
                }
                for call in m.tool_calls.iter().flatten() {
                    if let Some(a) = call.function.as_ref().and_then(|f| f.arguments.as_ref()) {
                        self.push_text(a);
                    }
                }
            }
        }
        if let Some(StrOrAny::Str(d)) = &doc.delta {
            self.push_text(d);
        }
        if usage.is_some() {
            self.usage = usage;
        }
        Seen {
            usage,
            usage_only,
            null_usage: None,
        }
    }
}

/// The top-level `usage` of a JSON object, read from its end: the last unescaped `"usage"`
/// key, whose object must parse as a [`Usage`] and be followed by nothing but further members
/// of the outermost object. `None` otherwise (the caller then parses the whole body).
fn usage_from_end(json: &[u8]) -> Option<Usage> {
    const KEY: &[u8] = b"\"usage\"";
    let mut end = json.len();
    loop {
        let at = memchr::memmem::rfind(&json[..end], KEY)?;
        end = at;
        let backslashes = json[..at].iter().rev().take_while(|&&b| b == b'\\').count();
        let mut i = at + KEY.len();
        while json.get(i).is_some_and(u8::is_ascii_whitespace) {
            i += 1;
        }
        if backslashes % 2 == 1 || json.get(i) != Some(&b':') {
            continue; // not a key: text, or a string value "usage"
        }
        let mut values = serde_json::Deserializer::from_slice(&json[i + 1..]).into_iter::<Usage>();
        let usage = values.next()?.ok()?;
        let after = i + 1 + values.byte_offset();
        return closes_outermost(&json[after..]).then_some(usage);
    }
}

/// Whether `rest` (what follows a member's value) closes the object holding that member with
/// a `}` that ends the document: its brackets, outside strings, never close more than that.
fn closes_outermost(rest: &[u8]) -> bool {
    let (mut depth, mut in_string, mut escaped) = (0u32, false, false);
    for (i, &b) in rest.iter().enumerate() {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => depth += 1,
            b'}' | b']' if depth > 0 => depth -= 1,
            b'}' => return rest[i + 1..].iter().all(u8::is_ascii_whitespace),
            b']' => return false,
            _ => {}
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groq_streams_carry_usage_under_x_groq() {
        let mut t = Tally::new(1 << 10);
        let chunk = br#"{"choices":[{"delta":{},"finish_reason":"stop"}],"x_groq":{"id":"req_1","usage":{"prompt_tokens":12,"completion_tokens":30,"total_tokens":42}}}"#;
        let seen = t.observe(chunk);
        assert_eq!(
            seen.usage,
            Some(Usage {
                prompt_tokens: Some(12),
                completion_tokens: Some(30),
                prompt_tokens_details: None,
            })
        );
        assert!(!seen.usage_only, "a content chunk, never stripped");
    }

    #[test]
    fn reads_every_usage_shape_and_text() {
        let mut t = Tally::new(1000);
        let s = t.observe(br#"{"choices":[{"message":{"content":"hi \"x\""}}],"usage":{"prompt_tokens":5,"completion_tokens":3}}"#);
        assert_eq!(s.usage.unwrap().completion_tokens, Some(3));
        assert!(!s.usage_only);
        assert_eq!(t.text, "hi \"x\"");
        let s = t.observe(br#"{"type":"response.completed","response":{"usage":{"input_tokens":7,"output_tokens":9}}}"#);
        assert_eq!(
            s.usage,
            Some(Usage {
                prompt_tokens: Some(7),
                completion_tokens: Some(9),
                prompt_tokens_details: None,
            })
        );
        let s = t.observe(
            br#"{"object":"list","data":[],"usage":{"prompt_tokens":4,"total_tokens":4}}"#,
        );
        assert_eq!(s.usage.unwrap().completion_tokens, None);
        let s = t.observe(br#"{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}"#);
        assert!(s.usage_only);
        let s = t.observe(br#"{"choices":[{"delta":{"content":"ab"}}],"usage":null}"#);
        assert_eq!(
            (s.usage, s.usage_only, s.null_usage),
            (None, false, Some(39))
        );
        t.observe(br#"{"type":"response.output_text.delta","delta":"cd"}"#);
        t.observe(br#"{"choices":[{"text":"ef"}]}"#);
        t.observe(br#"{"choices":[{"delta":{"tool_calls":[{"function":{"arguments":"{}"}}]}}]}"#);
        t.observe(b"not json");
        assert_eq!(t.text, "hi \"x\"abcdef{}");
    }

    #[test]
    fn a_body_with_output_usage_is_read_for_usage_only() {
        let mut t = Tally::new(1000);
        let s = t.observe_body(br#"{"choices":[{"message":{"content":"skipped"}}],"usage":{"prompt_tokens":5,"completion_tokens":3}}"#);
        assert_eq!(s.usage.unwrap().completion_tokens, Some(3));
        assert_eq!((t.usage, t.text.as_str()), (s.usage, ""));
        let s = t.observe_body(
            br#"{"object":"response","output":[],"usage":{"input_tokens":7,"output_tokens":9}}"#,
        );
        assert_eq!(s.usage.unwrap().prompt_tokens, Some(7));
        // Without output tokens the text is kept for counting, as `observe` does.
        let mut t = Tally::new(1000);
        let s = t.observe_body(
            br#"{"choices":[{"message":{"content":"kept"}}],"usage":{"prompt_tokens":5}}"#,
        );
        assert_eq!(
            (s.usage.unwrap().prompt_tokens, t.text.as_str()),
            (Some(5), "kept")
        );
        let mut t = Tally::new(1000);
        let s = t.observe_body(br#"{"choices":[{"text":"no usage"}],"usage":null}"#);
        assert_eq!((s, t.text.as_str()), (Seen::default(), "no usage"));
        assert_eq!(Tally::new(8).observe_body(b"{oops"), Seen::default());
    }

    #[test]
    fn cached_input_tokens_are_read_from_either_details_layout() {
        let mut t = Tally::new(64);
        let chat = t.observe(br#"{"usage":{"prompt_tokens":10,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":4}}}"#);
        assert_eq!(chat.usage.unwrap().cached_tokens(), 4);
        let responses = t.observe(br#"{"type":"response.completed","response":{"usage":{"input_tokens":9,"input_tokens_details":{"cached_tokens":3},"output_tokens":1}}}"#);
        assert_eq!(responses.usage.unwrap().cached_tokens(), 3);
        let none = t.observe(br#"{"usage":{"prompt_tokens":10,"completion_tokens":2}}"#);
        assert_eq!(none.usage.unwrap().cached_tokens(), 0);
        let end = usage_from_end(br#"{"a":1,"usage":{"prompt_tokens":5,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":2,"audio_tokens":0}}}"#);
        assert_eq!(end.unwrap().cached_tokens(), 2);
    }

    #[test]
    fn usage_is_read_from_the_end_only_when_it_is_a_top_level_member() {
        let u = |p, c| {
            Some(Usage {
                prompt_tokens: Some(p),
                completion_tokens: Some(c),
                prompt_tokens_details: None,
            })
        };
        let end = |s: &str| usage_from_end(s.as_bytes());
        assert_eq!(
            end(r#"{"a":1,"usage":{"prompt_tokens":5,"completion_tokens":3}}"#),
            u(5, 3)
        );
        assert_eq!(
            end(
                r#"{"usage" : {"prompt_tokens":5,"completion_tokens":3} , "fp":"x}]\"{", "n":[{}]} "#
            ),
            u(5, 3)
        );
        // A `usage` nested in a member, or inside a string, is not the top-level one.
        assert_eq!(
            end(r#"{"a":{"usage":{"prompt_tokens":1,"completion_tokens":1}}}"#),
            None
        );
        assert_eq!(
            end(r#"[{"usage":{"prompt_tokens":1,"completion_tokens":1}}]"#),
            None
        );
        assert_eq!(
            end(r#"{"t":"\"usage\":{\"completion_tokens\":9}","x":1}"#),
            None
        );
        assert_eq!(end(r#"{"k":"usage","v":2}"#), None);
        // A string value "usage" after the key does not hide the key.
        assert_eq!(
            end(r#"{"usage":{"prompt_tokens":2,"completion_tokens":4},"k":"usage"}"#),
            u(2, 4)
        );
        assert_eq!(end(r#"{"usage":null}"#), None);
        assert_eq!(
            end(r#"{"usage":{"prompt_tokens":2,"completion_tokens":4}"#),
            None
        );
        assert_eq!(
            end(r#"{"usage":{"prompt_tokens":2,"completion_tokens":4}}}"#),
            None
        );
        // Whatever the from-the-end read refuses, the whole parse still finds.
        let mut t = Tally::new(100);
        let s = t.observe_body(
            br#"{"usage":{"prompt_tokens":2,"completion_tokens":4},"k":{"usage":null}}"#,
        );
        assert_eq!(s.usage, u(2, 4));
    }

    #[test]
    fn text_is_bounded() {
        let mut t = Tally::new(4);
        t.observe(br#"{"choices":[{"text":"abcdef"}]}"#);
        assert_eq!((t.text.as_str(), t.extra_bytes), ("abcd", 2));
        // Escaped text: decoded into the kept text while it fits, cut at a character, the rest
        // counted; an invalid string adds nothing.
        let mut t = Tally::new(4);
        t.observe(br#"{"choices":[{"text":"a\u00e9\"\u00e9z"}]}"#);
        assert_eq!((t.text.as_str(), t.extra_bytes), ("a\u{e9}\"", 3));
        let mut t = Tally::new(3);
        t.observe(br#"{"choices":[{"text":"\u00e9\u00e9"}]}"#);
        t.observe(br#"{"choices":[{"text":"x\u00e9\ud800"}]}"#);
        assert_eq!((t.text.as_str(), t.extra_bytes), ("\u{e9}", 2));
        t.observe(br#"{"choices":[{"text":"\n"}]}"#);
        assert_eq!((t.text.as_str(), t.extra_bytes), ("\u{e9}\n", 2));
    }
}
