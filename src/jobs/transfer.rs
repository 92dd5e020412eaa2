//! File transfers of `/v1/files` with bounded memory: an upload is parsed as a stream
//! (`multer`) and written to the store in chunks of [`CHUNK_BYTES`] while its JSONL is checked
//! line by line ([`Lines`]); a download streams the stored chunks one at a time. A tenant has at
//! most `[jobs] max_transfers_per_tenant` transfers open at once ([`Transfers`]; 429
//! `x-fairgate-limit: tenant` beyond), each holding one slot until its upload is stored or its
//! download body is dropped.
//!
//! Invariant: a transfer holds at most one chunk (plus the partial line it is checking, itself
//! at most `[server] max_body_bytes`: a line is a request body) whatever the file's size, so
//! the memory of transfers is bounded by tenants × `max_transfers_per_tenant` × that, never by
//! the files' sizes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body::Frame;

use super::Error;
use crate::domain::TenantId;

pub use super::store::CHUNK_BYTES;

/// Open transfers per tenant, bounded.
#[derive(Debug)]
pub struct Transfers {
    per_tenant: usize,
    open: Mutex<HashMap<TenantId, usize>>,
}

/// One open transfer: its tenant's slot, given back on drop.
#[derive(Debug)]
pub struct Slot {
    transfers: Arc<Transfers>,
    tenant: TenantId,
}

impl Transfers {
    /// At most `per_tenant` open transfers per tenant.
    pub fn new(per_tenant: usize) -> Arc<Self> {
        Arc::new(Self {
            per_tenant,
            open: Mutex::new(HashMap::new()),
        })
    }

    /// A slot for one more transfer of `tenant`, or the limit it would pass.
    pub fn take(self: &Arc<Self>, tenant: &TenantId) -> Result<Slot, Error> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let n = open.entry(tenant.clone()).or_insert(0);
        if *n >= self.per_tenant {
            return Err(Error::Limit {
                what: "concurrent file transfers (max_transfers_per_tenant)",
                limit: self.per_tenant as u64,
            });
        }
        *n += 1;
        Ok(Slot {
            transfers: self.clone(),
            tenant: tenant.clone(),
        })
    }

    /// Transfers of `tenant` open now.
    pub fn open(&self, tenant: &TenantId) -> usize {
        let open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        open.get(tenant).copied().unwrap_or(0)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self
            .transfers
            .open
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(n) = open.get_mut(&self.tenant) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.tenant);
            }
        }
    }
}

/// Checks a JSONL upload as it streams: every non-blank line a JSON object, at most
/// `max_lines` lines, no line longer than `max_line` bytes. Holds only the partial last line.
#[derive(Debug)]
pub struct Lines {
    max_lines: u64,
    max_line: usize,
    partial: Vec<u8>,
    lines: u64,
}

impl Lines {
    /// A checker for at most `max_lines` lines of at most `max_line` bytes.
    pub fn new(max_lines: u64, max_line: usize) -> Self {
        Self {
            max_lines,
            max_line,
            partial: Vec::new(),
            lines: 0,
        }
    }

    /// Lines seen so far (blank ones not counted).
    pub fn count(&self) -> u64 {
        self.lines
    }

    /// Checks the next bytes of the file.
    pub fn feed(&mut self, mut data: &[u8]) -> Result<(), Error> {
        while let Some(end) = data.iter().position(|&b| b == b'\n') {
            let (head, rest) = (&data[..end], &data[end + 1..]);
            if self.partial.is_empty() {
                self.line(head)?;
            } else {
                self.grow(head)?;
                let line = std::mem::take(&mut self.partial);
                self.line(&line)?;
            }
            data = rest;
        }
        self.grow(data)
    }

    /// Checks the last line (one without a final newline).
    pub fn finish(&mut self) -> Result<u64, Error> {
        let line = std::mem::take(&mut self.partial);
        self.line(&line)?;
        Ok(self.lines)
    }

    fn grow(&mut self, data: &[u8]) -> Result<(), Error> {
        if self.partial.len() + data.len() > self.max_line {
            return Err(self.error(format!(
                "line {} is longer than {} bytes",
                self.lines + 1,
                self.max_line
            )));
        }
        self.partial.extend_from_slice(data);
        Ok(())
    }

    fn line(&mut self, raw: &[u8]) -> Result<(), Error> {
        if raw.len() > self.max_line {
            return Err(self.error(format!(
                "line {} is longer than {} bytes",
                self.lines + 1,
                self.max_line
            )));
        }
        if raw.iter().all(u8::is_ascii_whitespace) {
            return Ok(());
        }
        self.lines += 1;
        if self.lines > self.max_lines {
            return Err(self.error(format!(
                "the file has more than {} lines (max_file_lines)",
                self.max_lines
            )));
        }
        match serde_json::from_slice::<serde::de::IgnoredAny>(raw) {
            Ok(_) if raw.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{') => Ok(()),
            _ => Err(self.error(format!("line {} is not a JSON object", self.lines))),
        }
    }

    fn error(&self, message: String) -> Error {
        Error::invalid(format!("file: {message}"), Some("file"))
    }
}

/// What a download's body reads: chunk `seq` of the file, `None` past its end.
pub type ChunkReader = Box<
    dyn FnMut(u32) -> futures_util::future::BoxFuture<'static, Result<Option<Bytes>, Error>> + Send,
>;

/// A download body: chunk 0 (already read, to answer 404 before a head is sent), then each
/// further chunk read when the client has taken the one before.
pub fn download(
    first: Bytes,
    mut read: ChunkReader,
) -> impl futures_util::Stream<Item = Result<Frame<Bytes>, Error>> + Send {
    let state = (Some(first), 1u32, false);
    futures_util::stream::unfold(state, move |(first, seq, done)| {
        let next = (!done && first.is_none()).then(|| read(seq));
        async move {
            if let Some(c) = first {
                return Some((Ok(Frame::data(c)), (None, seq, false)));
            }
            match next?.await {
                Ok(Some(c)) => Some((Ok(Frame::data(c)), (None, seq + 1, false))),
                Ok(None) => None,
                Err(e) => Some((Err(e), (None, seq, true))),
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_has_at_most_its_transfers_and_a_dropped_slot_is_given_back() {
        let t = Transfers::new(2);
        let (ta, tb) = (TenantId::new("a"), TenantId::new("b"));
        let (a, _b) = (t.take(&ta).unwrap(), t.take(&ta).unwrap());
        assert!(t.take(&ta).is_err());
        let _other = t.take(&tb).unwrap();
        drop(a);
        assert_eq!(t.open(&ta), 1);
        let _c = t.take(&ta).unwrap();
    }

    #[test]
    fn lines_are_checked_across_chunk_boundaries() {
        let mut l = Lines::new(3, 64);
        for part in [&b"{\"a\":"[..], b"1}\n\n  \n{\"b\"", b":2}\n{}"] {
            l.feed(part).unwrap();
        }
        assert_eq!(l.finish().unwrap(), 3);
        let mut l = Lines::new(3, 64);
        assert!(l.feed(b"{\"a\":1}\n[1]\n").is_err(), "not an object");
        let mut l = Lines::new(1, 64);
        l.feed(b"{}\n").unwrap();
        assert!(l.feed(b"{}\n").is_err(), "past max_lines");
        let mut l = Lines::new(10, 8);
        assert!(
            l.feed(b"{\"longer\":").is_err(),
            "a partial line past max_line"
        );
        let mut l = Lines::new(10, 8);
        l.feed(b"{\"a\":").unwrap();
        assert!(l.finish().is_err(), "cut JSON");
    }
}
