//! A skim of one JSON document (an SSE event's data) for what accounting reads — its `usage`
//! and its generated text — without parsing it: one pass that walks only the members on the
//! paths of [`keys`](super::keys), skips every other value with `memchr` over its strings, and
//! parses nothing but a `usage` object found on its path (exactly as serde does: its flat form
//! by [`flat`](super::flat), any other with serde). The events of one stream are skimmed with
//! what the ones before them had in common ([`stream`]: a known prefix is compared, not walked;
//! an event in the last one's shape with another text is not walked at all).
//!
//! Invariants:
//! - No allocation: text is handed to the caller as the raw bytes between its quotes (with
//!   whether it holds escapes; [`unescape`] decodes them as JSON does).
//! - Bounded recursion: only the values on an accounting path are walked into (at most seven
//!   levels); every other value is skipped by an iterative bracket count.
//! - A document that is not one well-bracketed JSON object says nothing (`None`), though text met
//!   before the fault was already handed out; numbers and literals are not validated.

use memchr::{memchr, memchr2};

use super::extract::Usage;
use super::keys::{Role, USAGE_SLOTS};

pub mod stream;
pub use stream::{skim_after, Memo};

/// What a skimmed document held.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Skim {
    /// Its usage (`usage`, else `response.usage`, else `x_groq.usage`), if an object.
    pub usage: Option<Usage>,
    /// Whether its top-level `choices` array had an element.
    pub choices: bool,
    /// Where its top-level `"usage":null` member begins, when it is written `,"usage":null`
    /// (the offset of that comma): what strip mode removes.
    pub null_usage: Option<usize>,
}

/// A top-level null usage as providers write it (never the first member).
pub const NULL_USAGE: &[u8] = b",\"usage\":null";

/// Skims `json`; `text(raw, escaped)` gets each generated text string (the bytes between its
/// quotes, and whether they hold a `\` escape), in document order.
pub fn skim(json: &[u8], text: &mut impl FnMut(&[u8], bool)) -> Option<Skim> {
    let mut w = Walk::new(json, text);
    w.ws();
    if w.peek()? != b'{' {
        return None;
    }
    w.object(Role::Root)?;
    w.end()
}

struct Walk<'a, 't, F> {
    b: &'a [u8],
    i: usize,
    usage: [Option<Usage>; USAGE_SLOTS],
    choices: bool,
    /// Where the first member of the outermost object that accounting reads begins (its key's
    /// opening quote), unless it is the first member.
    first: Option<usize>,
    /// A member of the outermost object that accounting reads was met.
    read: bool,
    /// How many texts were handed out (at most 2 counted), the range of the last one between
    /// its quotes, and whether it held escapes.
    texts: u8,
    text_at: (usize, usize, bool),
    null_usage: Option<usize>,
    /// How many usage objects were met on their paths (at most 2 counted), and where the last
    /// one read begins and ends.
    usages: u8,
    usage_at: Option<(usize, usize)>,
    text: &'t mut F,
}

impl<'a, 't, F: FnMut(&[u8], bool)> Walk<'a, 't, F> {
    fn new(b: &'a [u8], text: &'t mut F) -> Self {
        Walk {
            b,
            i: 0,
            usage: [None; USAGE_SLOTS],
            choices: false,
            first: None,
            read: false,
            texts: 0,
            text_at: (0, 0, false),
            null_usage: None,
            usages: 0,
            usage_at: None,
            text,
        }
    }

    /// At the end of the outermost object: what the document held, if nothing follows it.
    fn end(&mut self) -> Option<Skim> {
        self.ws();
        if self.i != self.b.len() {
            return None;
        }
        Some(Skim {
            usage: self.usage.into_iter().flatten().next(),
            choices: self.choices,
            null_usage: self.null_usage,
        })
    }

    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\n' | b'\r' | b'\t')) {
            self.i += 1;
        }
    }

    /// At a `"`: the range of the string's content and whether it holds escapes; moves past it.
    fn string(&mut self) -> Option<(usize, usize, bool)> {
        let start = self.i + 1;
        let (mut j, mut escaped) = (start, false);
        loop {
            let k = j + memchr2(b'"', b'\\', self.b.get(j..)?)?;
            if self.b[k] == b'"' {
                self.i = k + 1;
                return Some((start, k, escaped));
            }
            escaped = true;
            j = k + 2;
        }
    }

    /// Skips one value of any kind.
    fn skip(&mut self) -> Option<()> {
        match self.peek()? {
            b'"' => {
                self.string()?;
            }
            b'{' | b'[' => {
                let mut depth = 0u32;
                loop {
                    match self.peek()? {
                        b'"' => {
                            self.string()?;
                            continue;
                        }
                        b'{' | b'[' => depth += 1,
                        b'}' | b']' => {
                            depth -= 1;
                            if depth == 0 {
                                self.i += 1;
                                return Some(());
                            }
                        }
                        _ => {}
                    }
                    self.i += 1;
                }
            }
            _ => {
                let start = self.i;
                while self.peek().is_some_and(|c| {
                    !matches!(c, b',' | b'}' | b']' | b' ' | b'\n' | b'\r' | b'\t')
                }) {
                    self.i += 1;
                }
                if self.i == start {
                    return None;
                }
            }
        }
        Some(())
    }

    fn value(&mut self, role: Role) -> Option<()> {
        match (role, self.peek()?) {
            (Role::Text, b'"') => {
                let (s, e, escaped) = self.string()?;
                self.texts = self.texts.saturating_add(1).min(2);
                self.text_at = (s, e, escaped);
                (self.text)(&self.b[s..e], escaped);
            }
            (Role::Usage(p), b'{') => {
                self.usages = self.usages.saturating_add(1).min(2);
                match usage(&self.b[self.i..]) {
                    Ok((u, len)) => {
                        self.usage[usize::from(p)] = Some(u);
                        self.usage_at = Some((self.i, self.i + len));
                        self.i += len;
                    }
                    Err(()) => {
                        self.usage_at = None;
                        self.skip()?;
                    }
                }
            }
            (r, b'{') if r.walked() => self.object(r)?,
            (r, b'[') if r.walked() => self.array(r)?,
            _ => self.skip()?,
        }
        Some(())
    }

    fn object(&mut self, role: Role) -> Option<()> {
        self.i += 1;
        self.ws();
        if self.peek()? == b'}' {
            self.i += 1;
            return Some(());
        }
        self.members(role)
    }

    /// The members of an object in `role`, from the next one to its closing brace.
    fn members(&mut self, role: Role) -> Option<()> {
        let mut later = false;
        loop {
            self.ws();
            if self.peek()? != b'"' {
                return None;
            }
            let (s, e, _) = self.string()?;
            let child = role.member(&self.b[s..e]);
            // Not the first member: a walk from `{` may also meet `}`.
            if role == Role::Root && child != Role::Other && !self.read {
                self.read = true;
                self.first = later.then_some(s - 1);
            }
            if child == Role::Usage(0)
                && self.null_usage.is_none()
                && s >= 2
                && self.b[s - 2..].starts_with(NULL_USAGE)
                && matches!(self.b.get(s - 2 + NULL_USAGE.len()), Some(b',' | b'}'))
            {
                self.null_usage = Some(s - 2);
            }
            self.ws();
            if self.peek()? != b':' {
                return None;
            }
            self.i += 1;
            self.ws();
            self.value(child)?;
            self.ws();
            match self.peek()? {
                b',' => self.i += 1,
                b'}' => {
                    self.i += 1;
                    return Some(());
                }
                _ => return None,
            }
            later = true;
        }
    }

    fn array(&mut self, role: Role) -> Option<()> {
        self.i += 1;
        self.ws();
        if self.peek()? == b']' {
            self.i += 1;
            return Some(());
        }
        let element = role.element();
        loop {
            self.ws();
            if role == Role::Choices {
                self.choices = true;
            }
            self.value(element)?;
            self.ws();
            match self.peek()? {
                b',' => self.i += 1,
                b']' => {
                    self.i += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }
}

/// A usage object at the start of `b`, as serde reads it (its flat form without serde:
/// [`flat`](super::flat)), and the bytes it took.
fn usage(b: &[u8]) -> Result<(Usage, usize), ()> {
    if let Some(read) = super::flat::read(b) {
        return read;
    }
    let mut values = serde_json::Deserializer::from_slice(b).into_iter::<Usage>();
    match values.next() {
        Some(Ok(u)) => Ok((u, values.byte_offset())),
        _ => Err(()),
    }
}

/// Appends the JSON string content `raw` (between its quotes), its escapes decoded, to `out`;
/// `false` (and `out` as it was) when it is not valid (bad UTF-8, a bad escape, a lone
/// surrogate), as serde would refuse it.
pub fn unescape(raw: &[u8], out: &mut String) -> bool {
    let start = out.len();
    if unescape_with(raw, &mut |s| out.push_str(s)).is_none() {
        out.truncate(start);
        return false;
    }
    true
}

/// The JSON string content `raw` decoded, piece by piece to `out`, in order; `None` when it is
/// not valid (the pieces before the fault were handed out).
pub fn unescape_with(mut raw: &[u8], out: &mut impl FnMut(&str)) -> Option<()> {
    loop {
        let Some(k) = memchr(b'\\', raw) else {
            out(std::str::from_utf8(raw).ok()?);
            return Some(());
        };
        out(std::str::from_utf8(&raw[..k]).ok()?);
        let (c, used) = match *raw.get(k + 1)? {
            b'"' => ('"', 2),
            b'\\' => ('\\', 2),
            b'/' => ('/', 2),
            b'b' => ('\u{8}', 2),
            b'f' => ('\u{c}', 2),
            b'n' => ('\n', 2),
            b'r' => ('\r', 2),
            b't' => ('\t', 2),
            b'u' => {
                let hi = hex4(raw.get(k + 2..k + 6)?)?;
                match hi {
                    0xD800..=0xDBFF => {
                        if raw.get(k + 6..k + 8)? != b"\\u" {
                            return None;
                        }
                        let lo = hex4(raw.get(k + 8..k + 12)?)?;
                        if !(0xDC00..=0xDFFF).contains(&lo) {
                            return None;
                        }
                        let c = 0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00);
                        (char::from_u32(c)?, 12)
                    }
                    0xDC00..=0xDFFF => return None,
                    _ => (char::from_u32(hi)?, 6),
                }
            }
            _ => return None,
        };
        out(c.encode_utf8(&mut [0; 4]));
        raw = &raw[k + used..];
    }
}

fn hex4(h: &[u8]) -> Option<u32> {
    h.iter().try_fold(0u32, |n, &d| {
        let v = (d as char).to_digit(16)?;
        Some(n * 16 + v)
    })
}

#[cfg(test)]
mod tests;
