//! Response compression of the `openai` profile: OpenAI's edge compresses JSON bodies and SSE
//! streams whenever the request's `Accept-Encoding` allows it (gzip and br in practice; deflate and
//! zstd are offered here too so a proxy meets every coding a CDN may pick).
//!
//! Invariants:
//! - [`Encoding::negotiate`] honours q-values (`q=0` refuses a coding, `*` stands for the rest);
//!   among equal q-values the order of preference is br, zstd, gzip, deflate. No acceptable coding
//!   means an uncompressed answer (never 406).
//! - A stream is compressed frame by frame: [`Encoder::chunk`] flushes, so every SSE event a client
//!   receives decodes at once (no event waits in the compressor), and [`Encoder::finish`] writes
//!   the coding's trailer, so the concatenated chunks decode to exactly the uncompressed stream.
//! - `deflate` is the zlib format (RFC 9110 §8.4.1.2), not raw deflate.

#[cfg(test)]
use std::io::Read;
use std::io::Write;

use bytes::Bytes;
use flate2::write::{GzEncoder, ZlibEncoder};
use flate2::Compression;
use http::header::{HeaderMap, ACCEPT_ENCODING};

/// A content coding the mock can produce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// `br` (RFC 7932).
    Br,
    /// `zstd` (RFC 8878).
    Zstd,
    /// `gzip` (RFC 1952).
    Gzip,
    /// `deflate`: the zlib format (RFC 1950).
    Deflate,
}

/// Most preferred first.
const PREFERENCE: [Encoding; 4] = [
    Encoding::Br,
    Encoding::Zstd,
    Encoding::Gzip,
    Encoding::Deflate,
];

impl Encoding {
    /// The `Content-Encoding` token.
    pub fn name(self) -> &'static str {
        match self {
            Encoding::Br => "br",
            Encoding::Zstd => "zstd",
            Encoding::Gzip => "gzip",
            Encoding::Deflate => "deflate",
        }
    }

    /// The coding to answer with, given the request headers; `None`: send it uncompressed.
    pub fn negotiate(headers: &HeaderMap) -> Option<Encoding> {
        let mut q = [None::<u16>; 4];
        let mut star = None;
        for value in headers.get_all(ACCEPT_ENCODING) {
            let Ok(value) = value.to_str() else { continue };
            for item in value.split(',') {
                let mut parts = item.split(';');
                let token = parts.next().unwrap_or("").trim().to_ascii_lowercase();
                let weight = parts
                    .find_map(|p| p.trim().strip_prefix("q=").map(parse_q))
                    .unwrap_or(Some(1000));
                let Some(weight) = weight else { continue };
                if token == "*" {
                    star = Some(weight);
                } else if let Some(i) = PREFERENCE.iter().position(|e| e.name() == token) {
                    q[i] = Some(weight);
                }
            }
        }
        let mut best: Option<(u16, Encoding)> = None;
        for (i, enc) in PREFERENCE.into_iter().enumerate() {
            let w = q[i].or(star).unwrap_or(0);
            if w > 0 && best.is_none_or(|(bw, _)| w > bw) {
                best = Some((w, enc));
            }
        }
        best.map(|(_, enc)| enc)
    }
}

/// A q-value in thousandths; `None` when malformed (the item is then ignored).
fn parse_q(s: &str) -> Option<u16> {
    let v: f32 = s.trim().parse().ok()?;
    (0.0..=1.0)
        .contains(&v)
        .then(|| (v * 1000.0).round() as u16)
}

/// A streaming compressor writing into memory.
pub(crate) struct Encoder(Inner);

enum Inner {
    Br(Box<brotli::CompressorWriter<Vec<u8>>>),
    Zstd(zstd::stream::write::Encoder<'static, Vec<u8>>),
    Gzip(GzEncoder<Vec<u8>>),
    Deflate(ZlibEncoder<Vec<u8>>),
}

impl std::fmt::Debug for Encoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Encoder")
    }
}

impl Encoder {
    pub fn new(encoding: Encoding) -> Self {
        Encoder(match encoding {
            // Quality 5, 64 KiB window: cheap per stream, still a real brotli stream.
            Encoding::Br => Inner::Br(Box::new(brotli::CompressorWriter::new(
                Vec::new(),
                4096,
                5,
                16,
            ))),
            Encoding::Zstd => Inner::Zstd(
                zstd::stream::write::Encoder::new(Vec::new(), 3)
                    .expect("zstd level 3 is valid for every libzstd"),
            ),
            Encoding::Gzip => Inner::Gzip(GzEncoder::new(Vec::new(), Compression::fast())),
            Encoding::Deflate => Inner::Deflate(ZlibEncoder::new(Vec::new(), Compression::fast())),
        })
    }

    /// Compresses `data`, flushes, and returns every byte produced so far.
    pub fn chunk(&mut self, data: &[u8]) -> Bytes {
        // Writing into a Vec cannot fail; the compressors only report their sink's errors.
        let out = match &mut self.0 {
            Inner::Br(w) => write_flush(w.as_mut(), data).map(|()| w.get_mut()),
            Inner::Zstd(w) => write_flush(w, data).map(|()| w.get_mut()),
            Inner::Gzip(w) => write_flush(w, data).map(|()| w.get_mut()),
            Inner::Deflate(w) => write_flush(w, data).map(|()| w.get_mut()),
        };
        out.map(|v| Bytes::from(std::mem::take(v)))
            .unwrap_or_default()
    }

    /// Compresses `data`, ends the stream, and returns the remaining bytes (with the trailer).
    pub fn finish(mut self, data: &[u8]) -> Bytes {
        let mut head = self.chunk(data).to_vec();
        let tail = match self.0 {
            Inner::Br(w) => Ok(w.into_inner()),
            Inner::Zstd(w) => w.finish(),
            Inner::Gzip(w) => w.finish(),
            Inner::Deflate(w) => w.finish(),
        };
        head.extend_from_slice(&tail.unwrap_or_default());
        head.into()
    }
}

fn write_flush(w: &mut impl Write, data: &[u8]) -> std::io::Result<()> {
    w.write_all(data)?;
    w.flush()
}

/// `data` compressed as one whole body.
pub(crate) fn encode_all(encoding: Encoding, data: &[u8]) -> Bytes {
    Encoder::new(encoding).finish(data)
}

/// Decodes a whole body (tests only: the mock itself never decodes).
#[cfg(test)]
pub(crate) fn decode(encoding: Encoding, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    decoder(encoding, data)
        .read_to_end(&mut out)
        .unwrap_or_else(|e| panic!("{} body decodes: {e}", encoding.name()));
    out
}

#[cfg(test)]
fn decoder(encoding: Encoding, data: &[u8]) -> Box<dyn std::io::Read + '_> {
    match encoding {
        Encoding::Br => Box::new(brotli::Decompressor::new(data, 4096)),
        Encoding::Zstd => Box::new(zstd::stream::read::Decoder::new(data).expect("zstd decoder")),
        Encoding::Gzip => Box::new(flate2::read::GzDecoder::new(data)),
        Encoding::Deflate => Box::new(flate2::read::ZlibDecoder::new(data)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a decoder yields from an unfinished stream before it runs out of input.
    fn decode_prefix(enc: Encoding, data: &[u8]) -> Vec<u8> {
        let (mut d, mut out, mut buf) = (decoder(enc, data), Vec::new(), [0u8; 256]);
        while let Ok(n @ 1..) = d.read(&mut buf) {
            out.extend_from_slice(&buf[..n]);
        }
        out
    }

    fn accept(value: &str) -> Option<Encoding> {
        let mut h = HeaderMap::new();
        h.insert(ACCEPT_ENCODING, value.parse().expect("header value"));
        Encoding::negotiate(&h)
    }

    #[test]
    fn negotiation_honours_q_values_and_preference() {
        assert_eq!(Encoding::negotiate(&HeaderMap::new()), None);
        assert_eq!(accept("identity"), None);
        assert_eq!(accept("gzip, deflate, br, zstd"), Some(Encoding::Br));
        assert_eq!(accept("gzip, deflate"), Some(Encoding::Gzip));
        assert_eq!(accept("br;q=0.5, gzip"), Some(Encoding::Gzip));
        assert_eq!(accept("br;q=0, *"), Some(Encoding::Zstd));
        assert_eq!(accept("*;q=0"), None);
        assert_eq!(accept("GZIP;q=0.8, deflate;q=0.9"), Some(Encoding::Deflate));
        assert_eq!(accept("gzip;q=nonsense, deflate"), Some(Encoding::Deflate));
    }

    #[test]
    fn chunks_decode_one_by_one_and_whole() {
        let frames = [
            "data: {\"a\":1}\n\n",
            "data: {\"b\":2}\n\n",
            "data: [DONE]\n\n",
        ];
        for enc in PREFERENCE {
            let mut e = Encoder::new(enc);
            let mut wire = e.chunk(frames[0].as_bytes()).to_vec();
            let first = decode_prefix(enc, &wire);
            assert_eq!(
                first,
                frames[0].as_bytes(),
                "{}: first event alone",
                enc.name()
            );
            wire.extend_from_slice(&e.chunk(frames[1].as_bytes()));
            wire.extend_from_slice(&e.finish(frames[2].as_bytes()));
            assert_eq!(
                decode(enc, &wire),
                frames.concat().as_bytes(),
                "{}",
                enc.name()
            );
            let whole = encode_all(enc, b"{\"usage\":{}}");
            assert_eq!(decode(enc, &whole), b"{\"usage\":{}}", "{}", enc.name());
        }
    }
}
