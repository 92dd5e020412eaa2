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
//!   the bytes between. A shape whose event held one usage object after its text (a provider
//!   that reports usage on every chunk) keeps a hole there: the bytes before the hole must
//!   match, the usage object in it is read as the walk reads it (`flat`, else serde), and the
//!   bytes after it must match too.
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
    /// The shape's bytes before its text (through the opening quote), `head` of them, then
    /// those after it (from the closing quote).
    pub(super) shape: Vec<u8>,
    pub(super) head: usize,
    /// A shape with a usage object after its text: how many of the bytes after the text come
    /// before that object (the rest follow it); the object itself is read anew in each event.
    hole: Option<usize>,
    /// What the shape's event held, and its length.
    found: Skim,
    len: usize,
}

/// Longest prefix, and longest part of a shape, kept.
const MAX_KEPT: usize = 1024;

/// What `json` holds when it is in `kept`'s shape (its text handed to `text`), else `None`.
fn in_shape(json: &[u8], kept: &Kept, text: &mut impl FnMut(&[u8], bool)) -> Option<Skim> {
    let (head, after) = kept.shape.split_at(kept.head);
    if kept.shape.is_empty() || !json.starts_with(head) {
        return None;
    }
    // The text's end, as the walk finds it: the first quote or backslash.
    let close = head.len() + memchr2(b'"', b'\\', &json[head.len()..])?;
    if json[close] != b'"' {
        return None;
    }
    let rest = &json[close..];
    let mut found = kept.found;
    match kept.hole {
        None if rest == after => {
            // A null usage after the text moves with the text's end.
            if let Some(at) = found.null_usage.filter(|&at| at >= kept.head) {
                found.null_usage = Some(at + json.len() - kept.len);
            }
        }
        Some(mid) if rest.starts_with(&after[..mid]) => {
            let at = close + mid;
            let (usage, len) = super::usage(&json[at..]).ok()?;
            if json[at + len..] != after[mid..] {
                return None;
            }
            found.usage = Some(usage);
        }
        _ => return None,
    }
    text(&json[head.len()..close], false);
    Some(found)
}

/// [`skim`](super::skim) of the next event of a stream whose earlier events left `memo`.
pub fn skim_after(
    json: &[u8],
    memo: &mut Memo,
    text: &mut impl FnMut(&[u8], bool),
) -> Option<Skim> {
    let kept = memo.0.get_or_insert_with(Box::default);
    if let Some(found) = in_shape(json, kept, text) {
        return Some(found);
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
    if w.texts == 1 && !escaped && s <= MAX_KEPT {
        let hole = w
            .usage_at
            .filter(|&(at, _)| w.usages == 1 && at > e && found.null_usage.is_none());
        let (mid, rest) = match hole {
            Some((at, end)) => (at - e, end),
            None => (json.len() - e, json.len()),
        };
        if mid <= MAX_KEPT && json.len() - rest <= MAX_KEPT {
            kept.shape.clear();
            kept.shape.extend_from_slice(&json[..s]);
            kept.shape.extend_from_slice(&json[e..e + mid]);
            kept.shape.extend_from_slice(&json[rest..]);
            kept.head = s;
            kept.hole = hole.map(|_| mid);
            kept.found = found;
            kept.len = json.len();
        }
    }
    Some(found)
}
