//! A `usage` object read without serde when it is written the way providers write it: flat
//! members whose values are unsigned integers, `null`, or (one level down, the `*_details`
//! objects) flat objects of the same. A provider that reports usage on every chunk of a stream
//! sends one per event, so this is the common case of the hot path; serde reads the rest.
//!
//! Invariants:
//! - Exact or nothing: [`read`] returns what `serde_json` would deserialize as an
//!   [`Usage`](super::extract::Usage) from the same bytes, with the same end offset, or `None`
//!   when it is not sure (whitespace, escapes or non-ASCII in a key, strings, booleans,
//!   arrays, signs, fractions, exponents, 20-digit numbers, deeper nesting), and the caller asks
//!   serde. A document serde refuses (a duplicate field, a leading zero) is refused here too,
//!   or left to serde. Checked against serde by a proptest.
//! - No allocation, one pass, no recursion deeper than the details level.

use super::extract::{Details, Usage};

/// What [`read`] found: the usage and the bytes it took.
pub type Read = (Usage, usize);

/// Reads a usage object at the start of `b` (which begins with `{`): `Some(Ok(..))` as serde
/// would read it, `Some(Err(()))` where serde would fail, `None` to ask serde.
pub fn read(b: &[u8]) -> Option<Result<Read, ()>> {
    let mut p = Parser { b, i: 0 };
    let mut u = Usage::default();
    let (mut prompt, mut completion, mut details) = (false, false, false);
    let ok = p.members(&mut |p, key| match key {
        b"prompt_tokens" | b"input_tokens" => p.field(&mut prompt, &mut u.prompt_tokens),
        b"completion_tokens" | b"output_tokens" => {
            p.field(&mut completion, &mut u.completion_tokens)
        }
        b"prompt_tokens_details" | b"input_tokens_details" => {
            if std::mem::replace(&mut details, true) {
                return Some(Err(()));
            }
            let d = p.details()?;
            Some(d.map(|d| u.prompt_tokens_details = d))
        }
        _ => p.ignored(true),
    })?;
    Some(ok.map(|()| (u, p.i)))
}

struct Parser<'a> {
    b: &'a [u8],
    i: usize,
}

/// `Some(Ok)`: read; `Some(Err)`: serde would fail; `None`: not sure, ask serde.
type Step = Option<Result<(), ()>>;

impl Parser<'_> {
    /// An object at `i`: each member's key to `member`, which reads its value.
    fn members(&mut self, member: &mut dyn FnMut(&mut Self, &[u8]) -> Step) -> Step {
        if self.b.get(self.i) != Some(&b'{') {
            return None;
        }
        self.i += 1;
        if self.b.get(self.i) == Some(&b'}') {
            self.i += 1;
            return Some(Ok(()));
        }
        loop {
            if self.b.get(self.i) != Some(&b'"') {
                return None;
            }
            let start = self.i + 1;
            let len = self.b[start..]
                .iter()
                .position(|&c| !(0x20..0x7f).contains(&c) || c == b'"' || c == b'\\')?;
            if self.b[start + len] != b'"' || self.b.get(start + len + 1) != Some(&b':') {
                return None;
            }
            self.i = start + len + 2;
            let b = self.b;
            let key = &b[start..start + len];
            if let Err(()) = member(self, key)? {
                return Some(Err(()));
            }
            match self.b.get(self.i) {
                Some(b',') => self.i += 1,
                Some(b'}') => {
                    self.i += 1;
                    return Some(Ok(()));
                }
                _ => return None,
            }
        }
    }

    /// A field of `Option<u64>` seen before when `seen`.
    fn field(&mut self, seen: &mut bool, slot: &mut Option<u64>) -> Step {
        if std::mem::replace(seen, true) {
            return Some(Err(()));
        }
        *slot = self.number()?;
        Some(Ok(()))
    }

    /// `null` (`None`) or an unsigned integer of at most 19 digits; `None` for anything else.
    fn number(&mut self) -> Option<Option<u64>> {
        let rest = &self.b[self.i..];
        if rest.starts_with(b"null") {
            self.i += 4;
            return self.delimited().then_some(None);
        }
        let len = rest.iter().take_while(|c| c.is_ascii_digit()).count();
        if len == 0 || len > 19 || (len > 1 && rest[0] == b'0') {
            return None;
        }
        let n = rest[..len]
            .iter()
            .fold(0u64, |n, &d| n * 10 + u64::from(d - b'0'));
        self.i += len;
        self.delimited().then_some(Some(n))
    }

    /// Whether a member ends here (what follows a number or literal that serde accepts).
    fn delimited(&self) -> bool {
        matches!(self.b.get(self.i), Some(b',' | b'}'))
    }

    /// A details object: `null`, or flat members of which `cached_tokens` is read.
    fn details(&mut self) -> Option<Result<Option<Details>, ()>> {
        if self.b[self.i..].starts_with(b"null") {
            self.i += 4;
            return self.delimited().then_some(Ok(None));
        }
        let mut d = Details::default();
        let mut seen = false;
        let ok = self.members(&mut |p, key| match key {
            b"cached_tokens" => p.field(&mut seen, &mut d.cached_tokens),
            _ => p.ignored(false),
        })?;
        Some(ok.map(|()| Some(d)))
    }

    /// A value nobody reads: a number, `null`, or (when `nest`) a flat object of those.
    fn ignored(&mut self, nest: bool) -> Step {
        if nest && self.b.get(self.i) == Some(&b'{') {
            return self.members(&mut |p, _| p.ignored(false));
        }
        self.number()?;
        Some(Ok(()))
    }
}

#[cfg(test)]
mod tests;
