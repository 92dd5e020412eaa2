//! An incremental SSE line scanner: finds `data:` payloads across arbitrary chunk boundaries and,
//! in strip mode, removes events the caller rejects.
//!
//! Invariants:
//! - Observe mode forwards every chunk untouched (the same `Bytes`, no copy) and keeps at most
//!   one partial line, bounded by [`MAX_LINE`] (a longer line is skipped unobserved).
//! - Strip mode holds back only the current partial line (an event can only be dropped once its
//!   line is complete), so no complete line is ever delayed; a dropped `data:` line takes the
//!   blank line ending its event with it, and `,"usage":null` is removed from kept lines (it is
//!   there only because usage was asked for). A partial line over [`MAX_LINE`] is forwarded as
//!   is, and that line is then passed through unobserved.
//! - Output = input minus dropped events, byte for byte, whatever the chunking.

use bytes::{BufMut, Bytes, BytesMut};

/// Longest line observed (or held back in strip mode).
pub const MAX_LINE: usize = 1 << 20;

const NULL_USAGE: &[u8] = b",\"usage\":null";

/// The scanner; see the module docs.
#[derive(Debug, Default)]
pub struct Scanner {
    strip: bool,
    partial: Vec<u8>,
    /// Inside a line too long to observe: pass until its end.
    overlong: bool,
    /// The previous `data:` line was dropped: drop the blank line that ends its event.
    skip_blank: bool,
}

fn payload(line: &[u8]) -> Option<&[u8]> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let rest = line.strip_prefix(b"data:")?;
    Some(rest.strip_prefix(b" ").unwrap_or(rest))
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
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
    /// returns whether to forward it. Returns the bytes to forward now.
    pub fn feed(&mut self, chunk: Bytes, keep: &mut dyn FnMut(&[u8]) -> bool) -> Bytes {
        if !self.strip {
            self.observe(&chunk, keep);
            return chunk;
        }
        let mut out = BytesMut::new();
        let mut rest: &[u8] = &chunk;
        while let Some(nl) = rest.iter().position(|&b| b == b'\n') {
            let (piece, tail) = rest.split_at(nl + 1);
            rest = tail;
            if self.overlong {
                self.overlong = false;
                out.put_slice(piece);
                continue;
            }
            let line = if self.partial.is_empty() {
                piece
            } else {
                self.partial.extend_from_slice(piece);
                &self.partial[..]
            };
            emit(&mut self.skip_blank, line, &mut out, keep);
            self.partial.clear();
        }
        if self.overlong {
            out.put_slice(rest);
        } else if self.partial.len() + rest.len() > MAX_LINE {
            out.put_slice(&self.partial);
            out.put_slice(rest);
            self.partial.clear();
            self.overlong = true;
        } else {
            self.partial.extend_from_slice(rest);
        }
        out.freeze()
    }

    /// Observe mode over a borrowed chunk (forwarding is the caller's): `keep` sees every
    /// complete `data:` payload, its answer is ignored.
    pub fn observe(&mut self, chunk: &[u8], keep: &mut dyn FnMut(&[u8]) -> bool) {
        let mut rest = chunk;
        while let Some(nl) = rest.iter().position(|&b| b == b'\n') {
            let (line, tail) = (&rest[..nl], &rest[nl + 1..]);
            rest = tail;
            if std::mem::take(&mut self.overlong) {
                continue;
            }
            if self.partial.is_empty() {
                if let Some(p) = payload(line) {
                    keep(p);
                }
            } else {
                self.partial.extend_from_slice(line);
                if let Some(p) = payload(&self.partial) {
                    keep(p);
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

    /// At end of stream: observes a last unterminated line and returns what is still held.
    pub fn finish(&mut self, keep: &mut dyn FnMut(&[u8]) -> bool) -> Bytes {
        let partial = std::mem::take(&mut self.partial);
        if self.overlong || partial.is_empty() {
            return Bytes::new();
        }
        let forward = payload(&partial).is_none_or(keep);
        if self.strip && forward {
            Bytes::from(partial)
        } else {
            Bytes::new()
        }
    }
}

/// Handles one complete line (with its `\n`) in strip mode.
fn emit(
    skip_blank: &mut bool,
    line: &[u8],
    out: &mut BytesMut,
    keep: &mut dyn FnMut(&[u8]) -> bool,
) {
    let body = &line[..line.len() - 1];
    let blank = body.is_empty() || body == b"\r";
    if std::mem::take(skip_blank) && blank {
        return;
    }
    if let Some(p) = payload(body) {
        if !keep(p) {
            *skip_blank = true;
            return;
        }
        if let Some(i) = find(line, NULL_USAGE) {
            out.put_slice(&line[..i]);
            out.put_slice(&line[i + NULL_USAGE.len()..]);
            return;
        }
    }
    out.put_slice(line);
}

#[cfg(test)]
mod tests;
