//! The JSON member names accounting reads, and where in a document each one counts: the one
//! table [`skim`](super::skim) walks by, so a member is only looked at on its own path.
//!
//! Paths (OpenAI's shapes; see `extract` for which API uses which):
//! - usage: `usage`, `response.usage` (Responses API events), `x_groq.usage` (Groq streams), in
//!   that order of preference;
//! - text: `choices[].text`, `choices[].delta.content`, `choices[].message.content`,
//!   `choices[].{delta,message}.tool_calls[].function.arguments`, and a string `delta` at the
//!   top (Responses API `*.delta` events).
//!
//! Invariant: a name matches only byte for byte (a key written with escapes is another key).

/// Where in a document the walker is, as far as accounting cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Role {
    /// The outermost object.
    Root,
    /// An object holding a `usage` of the given preference (`response`, `x_groq`).
    Wrapper(u8),
    /// A `usage` value of the given preference (0 is preferred).
    Usage(u8),
    /// The top-level `choices` array.
    Choices,
    /// An element of `choices`.
    Choice,
    /// A choice's `delta` or `message`.
    Message,
    /// A message's `tool_calls` array.
    ToolCalls,
    /// An element of `tool_calls`.
    ToolCall,
    /// A tool call's `function`.
    Function,
    /// Generated text, when the value is a string.
    Text,
    /// Anything else: skipped unread.
    Other,
}

/// How many usage preferences there are (`usage`, `response.usage`, `x_groq.usage`).
pub(super) const USAGE_SLOTS: usize = 3;

impl Role {
    /// The role of the value of member `key` of an object in this role.
    pub(super) fn member(self, key: &[u8]) -> Role {
        match (self, key) {
            (Role::Root, b"choices") => Role::Choices,
            (Role::Root, b"usage") => Role::Usage(0),
            (Role::Root, b"response") => Role::Wrapper(1),
            (Role::Root, b"x_groq") => Role::Wrapper(2),
            (Role::Root, b"delta") => Role::Text,
            (Role::Wrapper(p), b"usage") => Role::Usage(p),
            (Role::Choice, b"text") => Role::Text,
            (Role::Choice, b"delta" | b"message") => Role::Message,
            (Role::Message, b"content") => Role::Text,
            (Role::Message, b"tool_calls") => Role::ToolCalls,
            (Role::ToolCall, b"function") => Role::Function,
            (Role::Function, b"arguments") => Role::Text,
            _ => Role::Other,
        }
    }

    /// The role of the elements of an array in this role.
    pub(super) fn element(self) -> Role {
        match self {
            Role::Choices => Role::Choice,
            Role::ToolCalls => Role::ToolCall,
            _ => Role::Other,
        }
    }

    /// Whether a value in this role is walked into (an object or array in it can hold
    /// something accounting reads).
    pub(super) fn walked(self) -> bool {
        !matches!(self, Role::Other | Role::Text | Role::Usage(_))
    }
}
