//! The events of one stream, skimmed with what the events before them had in common: a
//! provider writes every chunk of a stream the same way (`{"id":…,"object":…,"created":…,
//! "model":…,"choices":[{"index":0,"delta":{"content":"…"},"finish_reason":null}]}`), so most of
//! an event's bytes were already walked, in the same place, one event earlier.
//!
//! [`Memo`] keeps two things from the events walked so far:
//! - the **prefix**: the bytes before the first member of the outermost object that
//!   accounting reads, when it is not the first member (the `id`, `object`, `created`, `model`
//!   members above). An event that begins with the same bytes is walked from there;
//! - the **shape**: the last event that held exactly one text, unescaped, without that text,
//!   and what its skim found. An event that begins with the shape's bytes up to the text's
//!   opening quote, ends with its bytes from the closing quote, and holds neither `"` nor `\`
//!   between them, is that event with another text: its skim finds the same, and the text is
//!   the bytes between.
//!
//! Invariants:
//! - Exact: [`skim_after`] with any memo finds what [`skim`](super::skim) finds alone and hands
//!   out the same texts (a walk is a function of the bytes it reads: equal bytes, equal steps;
//!   proptest `walking_on_from_what_a_stream_had_in_common_sees_what_a_whole_walk_sees`).
//! - Bounded: at most [`MAX_KEPT`] bytes of prefix and twice that of shape per stream,
//!   allocated on its first event and reused after.

use memchr::memchr2;

use super::{Role, Skim, Walk};

/// What the events of a stream so far had in common; see the module docs.
#[derive(Debug, Default)]
pub struct Memo(pub(super) Option<Box<Kept>>);

#[derive(Debug, Default)]
pub(super) struct Kept {
    pub(super) prefix: Vec<u8>,
    /// The shape's bytes before its text (through the opening quote) and after it (from the
    /// closing quote), `head` of them before.
    pub(super) shape: Vec<u8>,
    pub(super) head: usize,
    /// What the shape's event held, and its length.
    found: Skim,
    len: usize,
}

/// Longest prefix, and longest part of a shape, kept.
const MAX_KEPT: usize = 1024;

/// [`skim`](super::skim) of the next event of a stream whose earlier events left `memo`.
pub fn skim_after(
    json: &[u8],
    memo: &mut Memo,
    text: &mut impl FnMut(&[u8], bool),
) -> Option<Skim> {
    let kept = memo.0.get_or_insert_with(Box::default);
    if !kept.shape.is_empty() && json.len() >= kept.shape.len() {
        let (head, tail) = kept.shape.split_at(kept.head);
        let between = &json[head.len()..json.len() - tail.len()];
        if json.starts_with(head) && json.ends_with(tail) && memchr2(b'"', b'\\', between).is_none()
        {
            text(between, false);
            let mut found = kept.found;
            // A null usage after the text moves with the text's end.
            if let Some(at) = found.null_usage.filter(|&at| at >= kept.head) {
                found.null_usage = Some(at + json.len() - kept.len);
            }
            return Some(found);
        }
    }
    let mut w = Walk::new(json, text);
    let known = !kept.prefix.is_empty() && json.starts_with(&kept.prefix);
    if known {
        w.i = kept.prefix.len();
        w.members(Role::Root)?;
    } else {
        w.ws();
        if w.peek()? != b'{' {
            return None;
        }
        w.object(Role::Root)?;
    }
    let found = w.end()?;
    if let (false, Some(cut)) = (known, w.first.filter(|&c| c <= MAX_KEPT)) {
        kept.prefix.clear();
        kept.prefix.extend_from_slice(&json[..cut]);
    }
    let (s, e, escaped) = w.text_at;
    if w.texts == 1 && !escaped && s <= MAX_KEPT && json.len() - e <= MAX_KEPT {
        kept.shape.clear();
        kept.shape.extend_from_slice(&json[..s]);
        kept.shape.extend_from_slice(&json[e..]);
        kept.head = s;
        kept.found = found;
        kept.len = json.len();
    }
    Some(found)
}
