//! The request's place in a distributed trace (W3C Trace Context): the client's `traceparent`
//! continued, else a new trace; the ids of the spans fairgate reports for the request.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

/// Request header of W3C Trace Context.
pub const TRACEPARENT: http::HeaderName = http::HeaderName::from_static("traceparent");

/// Trace ids of one request. Written once, by `render`, when the context is created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Trace {
    /// The trace (the client's, else new).
    pub trace_id: [u8; 16],
    /// The client's span (the parent of the request span), if it sent a valid `traceparent`.
    pub parent: Option<[u8; 8]>,
    /// The request span (`fairgate.request`).
    pub span: [u8; 8],
    /// The upstream span (`fairgate.upstream`): the parent the provider sees.
    pub upstream_span: [u8; 8],
    /// The client asked for this trace to be recorded (flag `01`; a new trace is sampled).
    pub sampled: bool,
    /// Wall-clock time of the context's `started` (spans are reported in Unix time).
    pub wall: SystemTime,
}

fn nonzero_u64() -> [u8; 8] {
    rand::random::<u64>().max(1).to_be_bytes()
}

impl Trace {
    /// Continues the client's `traceparent` (`00-<32 hex>-<16 hex>-<2 hex>`, ids not all
    /// zero), else starts a new sampled trace.
    pub fn from_header(traceparent: Option<&http::HeaderValue>) -> Self {
        let parsed = traceparent.and_then(|v| parse(v.as_bytes()));
        let (trace_id, parent, sampled) = match parsed {
            Some((t, p, flags)) => (t, Some(p), flags & 1 == 1),
            None => (rand::random::<u128>().max(1).to_be_bytes(), None, true),
        };
        Self {
            trace_id,
            parent,
            span: nonzero_u64(),
            upstream_span: nonzero_u64(),
            sampled,
            wall: SystemTime::now(),
        }
    }

    /// The `traceparent` the provider is sent: this trace, the upstream span as its parent,
    /// sampled when fairgate records the request (`recorded`: the sampler's decision).
    pub fn upstream_header(&self, recorded: bool) -> http::HeaderValue {
        let s = format!(
            "00-{}-{}-{}",
            hex::encode(self.trace_id),
            hex::encode(self.upstream_span),
            if recorded { "01" } else { "00" }
        );
        http::HeaderValue::try_from(s).expect("hex is a valid header value")
    }

    /// The trace id in hex (the log line's `trace_id`), without allocating.
    pub fn trace_id_hex<'b>(&self, buf: &'b mut [u8; 32]) -> &'b str {
        hex::encode_to_slice(self.trace_id, buf).expect("32 hex digits for 16 bytes");
        std::str::from_utf8(buf).expect("hex is ASCII")
    }

    /// Unix time in ns of `at`, given the context started at `started`.
    pub fn unix_nanos(&self, started: Instant, at: Instant) -> u64 {
        let wall = if at >= started {
            self.wall + (at - started)
        } else {
            self.wall.checked_sub(started - at).unwrap_or(self.wall)
        };
        wall.duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO)
            .as_nanos()
            .try_into()
            .unwrap_or(u64::MAX)
    }
}

/// `version-traceid-parentid-flags` of version 00 (a later version: its first four fields).
fn parse(v: &[u8]) -> Option<([u8; 16], [u8; 8], u8)> {
    if v.len() < 55 || (v.len() > 55 && v[55] != b'-') {
        return None;
    }
    let s = std::str::from_utf8(v).ok()?;
    let (version, rest) = s.split_at(2);
    if version == "ff" || !version.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    if version == "00" && v.len() != 55 {
        return None;
    }
    let lower = |x: &str| x.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    let (trace, span, flags) = (rest.get(1..33)?, rest.get(34..50)?, rest.get(51..53)?);
    if rest.as_bytes()[0] != b'-' || rest.as_bytes()[33] != b'-' || rest.as_bytes()[50] != b'-' {
        return None;
    }
    if !lower(trace) || !lower(span) || !lower(flags) {
        return None;
    }
    let mut t = [0u8; 16];
    let mut p = [0u8; 8];
    hex::decode_to_slice(trace, &mut t).ok()?;
    hex::decode_to_slice(span, &mut p).ok()?;
    if t == [0; 16] || p == [0; 8] {
        return None;
    }
    let f = u8::from_str_radix(flags, 16).ok()?;
    Some((t, p, f))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_valid_traceparent_is_continued_and_a_bad_one_replaced() {
        let v = http::HeaderValue::from_static(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        );
        let t = Trace::from_header(Some(&v));
        assert_eq!(hex::encode(t.trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(
            t.parent.map(hex::encode).as_deref(),
            Some("00f067aa0ba902b7")
        );
        assert!(t.sampled);
        let up = t.upstream_header(true);
        let up = up.to_str().unwrap();
        assert!(
            up.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"),
            "{up}"
        );
        assert_ne!(&up[36..52], "00f067aa0ba902b7");
        assert_eq!(&up[36..52], hex::encode(t.upstream_span));
        for bad in [
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "garbage",
        ] {
            let t = Trace::from_header(Some(&http::HeaderValue::from_static(bad)));
            assert_eq!(t.parent, None, "{bad}");
            assert!(t.sampled);
        }
        let unsampled = http::HeaderValue::from_static(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",
        );
        assert!(!Trace::from_header(Some(&unsampled)).sampled);
    }
}
