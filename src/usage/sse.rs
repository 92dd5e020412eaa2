//! An incremental SSE line scanner: finds `data:` payloads across arbitrary chunk boundaries and,
//! in strip mode, removes events the caller rejects.
//!
//! Invariants:
//! - Observe mode forwards every chunk untouched (the same `Bytes`, no copy) and keeps at most
//!   one partial line, bounded by [`MAX_LINE`] (a longer line is skipped unobserved).
//! - Strip mode holds back only the current partial line (an event can only be dropped once its
//!   line is complete), so no complete line is ever delayed; a dropped `data:` line takes the
//!   blank line ending its event with it, and from a kept line the `,"usage":null` the observer
//!   of its payload points at ([`Verdict::Trim`]: the event's top-level null usage, which is
//!   there only because usage was asked for) is removed. A partial line over [`MAX_LINE`] is forwarded as
//!   is, and that line is then passed through unobserved.
//! - Output = input minus dropped events, byte for byte, whatever the chunking.
//! - No copy and no allocation per chunk: lines are found with `memchr`; a strip-mode chunk that
//!   needs no edit is forwarded as a slice of itself, an edited one is built in one buffer that
//!   is reused once the client has written the previous one.

use bytes::{BufMut, Bytes, BytesMut};
use memchr::memchr;

/// Longest line observed (or held back in strip mode).
pub const MAX_LINE: usize = 1 << 20;

use super::skim::NULL_USAGE;

/// What strip mode does with an event's `data:` line, as the observer of its payload says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Forward it.
    Keep,
    /// Drop it, and the blank line that ends its event.
    Drop,
    /// Forward it without the [`NULL_USAGE`] that begins at this offset of the payload.
    Trim(usize),
}

/// The scanner; see the module docs.
#[derive(Debug, Default)]
pub struct Scanner {
    strip: bool,
    partial: Vec<u8>,
    /// Inside a line too long to observe: pass until its end.
    overlong: bool,
    /// The previous `data:` line was dropped: drop the blank line that ends its event.
    skip_blank: bool,
    /// Strip mode's output buffer, reused from chunk to chunk.
    out: BytesMut,
}

fn payload(line: &[u8]) -> Option<&[u8]> {
    data(line).map(|(_, p)| p)
}

/// A `data:` line's payload and where it begins in the line.
fn data(line: &[u8]) -> Option<(usize, &[u8])> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let rest = line.strip_prefix(b"data:")?;
    Some(match rest.strip_prefix(b" ") {
        Some(p) => (6, p),
        None => (5, rest),
    })
}

/// What strip mode does with one complete line.
enum Edit {
    Keep,
    Drop,
    /// Keep it without the `,"usage":null` at this offset.
    Cut(usize),
}

/// Strip mode's output for one chunk: a prefix of the chunk itself while nothing was edited,
/// else the scanner's buffer.
struct Out<'a> {
    chunk: &'a Bytes,
    /// Not built: the output so far is `chunk[..verbatim]`.
    built: bool,
    verbatim: usize,
}

impl Out<'_> {
    /// Forwards `chunk[at..at + len]`.
    fn pass(&mut self, buf: &mut BytesMut, at: usize, len: usize) {
        if self.built {
            buf.put_slice(&self.chunk[at..at + len]);
        } else {
            debug_assert_eq!(self.verbatim, at);
            self.verbatim = at + len;
        }
    }

    /// Switches to building (the bytes so far copied into `buf`).
    fn build(&mut self, buf: &mut BytesMut, extra: usize) {
        if !self.built {
            self.built = true;
            buf.reserve(self.chunk.len() + extra);
            buf.put_slice(&self.chunk[..self.verbatim]);
        }
    }
}

impl Scanner {
    /// A scanner; `strip` enables dropping events.
    pub fn new(strip: bool) -> Self {
        Self {
            strip,
            ..Self::default()
        }
    }

    /// Feeds one chunk; `keep(payload)` sees every complete `data:` payload and (in strip mode)
    /// says what to do with its line. Returns the bytes to forward now.
    pub fn feed(&mut self, chunk: Bytes, keep: &mut dyn FnMut(&[u8]) -> Verdict) -> Bytes {
        if !self.strip {
            self.observe(&chunk, &mut |p| {
                keep(p);
            });
            return chunk;
        }
        let mut out = Out {
            chunk: &chunk,
            built: false,
            verbatim: 0,
        };
        let buf = &mut self.out;
        if !self.partial.is_empty() {
            out.build(buf, self.partial.len());
        }
        let mut pos = 0;
        while let Some(nl) = memchr(b'\n', &chunk[pos..]) {
            let (at, len) = (pos, nl + 1);
            pos += len;
            if self.overlong {
                self.overlong = false;
                out.pass(buf, at, len);
                continue;
            }
            let from_partial = !self.partial.is_empty();
            if from_partial {
                self.partial.extend_from_slice(&chunk[at..pos]);
            }
            let line: &[u8] = if from_partial {
                &self.partial
            } else {
                &chunk[at..pos]
            };
            match edit(&mut self.skip_blank, line, keep) {
                Edit::Keep if from_partial => buf.put_slice(line),
                Edit::Keep => out.pass(buf, at, len),
                Edit::Drop => out.build(buf, 0),
                Edit::Cut(i) => {
                    out.build(buf, 0);
                    buf.put_slice(&line[..i]);
                    buf.put_slice(&line[i + NULL_USAGE.len()..]);
                }
            }
            self.partial.clear();
        }
        let rest = chunk.len() - pos;
        if self.overlong {
            out.pass(buf, pos, rest);
        } else if self.partial.len() + rest > MAX_LINE {
            if !self.partial.is_empty() {
                buf.put_slice(&self.partial);
            }
            out.pass(buf, pos, rest);
            self.partial.clear();
            self.overlong = true;
        } else {
            self.partial.extend_from_slice(&chunk[pos..]);
        }
        if out.built {
            buf.split().freeze()
        } else {
            chunk.slice(..out.verbatim)
        }
    }

    /// Observe mode over a borrowed chunk (forwarding is the caller's): `see` sees every
    /// complete `data:` payload.
    pub fn observe(&mut self, chunk: &[u8], see: &mut dyn FnMut(&[u8])) {
        let mut rest = chunk;
        while let Some(nl) = memchr(b'\n', rest) {
            let (line, tail) = (&rest[..nl], &rest[nl + 1..]);
            rest = tail;
            if std::mem::take(&mut self.overlong) {
                continue;
            }
            if self.partial.is_empty() {
                if let Some(p) = payload(line) {
                    see(p);
                }
            } else {
                self.partial.extend_from_slice(line);
                if let Some(p) = payload(&self.partial) {
                    see(p);
                }
                self.partial.clear();
            }
        }
        if self.overlong {
            return;
        }
        if self.partial.len() + rest.len() > MAX_LINE {
            self.partial.clear();
            self.overlong = true;
        } else {
            self.partial.extend_from_slice(rest);
        }
    }

    /// At end of stream: observes a last unterminated line and returns what is still held
    /// (dropped as `keep` says, never trimmed).
    pub fn finish(&mut self, keep: &mut dyn FnMut(&[u8]) -> Verdict) -> Bytes {
        let partial = std::mem::take(&mut self.partial);
        if self.overlong || partial.is_empty() {
            return Bytes::new();
        }
        let forward = payload(&partial).is_none_or(|p| keep(p) != Verdict::Drop);
        if self.strip && forward {
            Bytes::from(partial)
        } else {
            Bytes::new()
        }
    }
}

/// What strip mode does with one complete line (with its `\n`).
fn edit(skip_blank: &mut bool, line: &[u8], keep: &mut dyn FnMut(&[u8]) -> Verdict) -> Edit {
    let body = &line[..line.len() - 1];
    let blank = body.is_empty() || body == b"\r";
    if std::mem::take(skip_blank) && blank {
        return Edit::Drop;
    }
    if let Some((start, p)) = data(body) {
        match keep(p) {
            Verdict::Keep => {}
            Verdict::Drop => {
                *skip_blank = true;
                return Edit::Drop;
            }
            // Checked again here: a verdict never cuts anything else.
            Verdict::Trim(at) if p.get(at..).is_some_and(|r| r.starts_with(NULL_USAGE)) => {
                return Edit::Cut(start + at);
            }
            Verdict::Trim(_) => {}
        }
    }
    Edit::Keep
}

#[cfg(test)]
mod tests;
