//! Decoding a copy of a compressed response for accounting: the provider's compressed bytes go
//! to the client unchanged, and a streaming decoder, fed each frame as it passes, writes the
//! decoded bytes straight into the usage observer.
//!
//! Why this and not "ask the provider for `identity` and compress towards the client": decoding
//! costs a fraction of compressing (see BENCHMARKS.md, "Compressed answers"), the client gets
//! the provider's own bytes, and nothing is held back (an SSE event reaches the client the moment
//! the provider flushes it, compressed or not).
//!
//! Invariants:
//! - Bounded memory: no decoded output is buffered here (the sink receives it as it is produced);
//!   the decoder's own window is bounded — zstd at [`ZSTD_WINDOW_LOG_MAX`] (8 MiB, the limit
//!   RFC 8878 sets for HTTP), brotli by its format (at most 16 MiB), gzip/deflate 32 KiB.
//! - `Content-Encoding` must be one coding among gzip (`x-gzip`), deflate (zlib, RFC 9110),
//!   br, zstd or identity; anything else (an unknown token, a stacked list) is [`Unknown`] and
//!   the body's usage is not read (`unread = "encoding"`).
//! - A decoding error stops decoding for the rest of the body (`unread = "decode"`); it never
//!   affects the bytes the client receives.

use std::io::{self, Write};

use http::header::{HeaderMap, CONTENT_ENCODING};

/// Largest zstd window accepted (log2 bytes).
pub const ZSTD_WINDOW_LOG_MAX: u32 = 23;

/// The brotli decoder's input buffer.
const BROTLI_BUFFER: usize = 4096;

/// A response coding fairgate can decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Coding {
    /// No `Content-Encoding` (or `identity`).
    Identity,
    /// `gzip` / `x-gzip`.
    Gzip,
    /// `deflate` (the zlib format).
    Deflate,
    /// `br`.
    Br,
    /// `zstd`.
    Zstd,
}

/// A `Content-Encoding` fairgate does not decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unknown;

impl Coding {
    /// The coding of a response.
    pub fn of(headers: &HeaderMap) -> Result<Coding, Unknown> {
        let mut values = headers.get_all(CONTENT_ENCODING).iter();
        let Some(value) = values.next() else {
            return Ok(Coding::Identity);
        };
        if values.next().is_some() {
            return Err(Unknown);
        }
        let token = value.to_str().map_err(|_| Unknown)?.trim();
        Ok(match token.to_ascii_lowercase().as_str() {
            "" | "identity" => Coding::Identity,
            "gzip" | "x-gzip" => Coding::Gzip,
            "deflate" => Coding::Deflate,
            "br" => Coding::Br,
            "zstd" => Coding::Zstd,
            _ => return Err(Unknown),
        })
    }
}

/// A streaming decoder writing into `W`.
pub struct Decoder<W: Write>(Inner<W>);

enum Inner<W: Write> {
    Gzip(flate2::write::GzDecoder<W>),
    Deflate(flate2::write::ZlibDecoder<W>),
    Br(Box<brotli::DecompressorWriter<W>>),
    Zstd(zstd::stream::write::Decoder<'static, W>),
}

impl<W: Write> Decoder<W> {
    /// A decoder for `coding` writing into `sink`; `None` for identity.
    pub fn new(coding: Coding, sink: W) -> io::Result<Option<Self>> {
        Ok(Some(Decoder(match coding {
            Coding::Identity => return Ok(None),
            Coding::Gzip => Inner::Gzip(flate2::write::GzDecoder::new(sink)),
            Coding::Deflate => Inner::Deflate(flate2::write::ZlibDecoder::new(sink)),
            Coding::Br => Inner::Br(Box::new(brotli::DecompressorWriter::new(
                sink,
                BROTLI_BUFFER,
            ))),
            Coding::Zstd => {
                let mut d = zstd::stream::write::Decoder::new(sink)?;
                d.window_log_max(ZSTD_WINDOW_LOG_MAX)?;
                Inner::Zstd(d)
            }
        })))
    }

    /// Decodes `data` into the sink.
    pub fn write(&mut self, data: &[u8]) -> io::Result<()> {
        match &mut self.0 {
            Inner::Gzip(d) => d.write_all(data),
            Inner::Deflate(d) => d.write_all(data),
            Inner::Br(d) => d.write_all(data),
            Inner::Zstd(d) => d.write_all(data),
        }
    }

    /// At the end of the body: writes out what the decoder still holds, and fails if the
    /// coded stream did not end properly (truncated).
    pub fn finish(&mut self) -> io::Result<()> {
        match &mut self.0 {
            Inner::Gzip(d) => d.try_finish(),
            Inner::Deflate(d) => d.try_finish(),
            Inner::Br(d) => d.close(),
            Inner::Zstd(d) => d.do_finish(),
        }
    }

    /// The sink.
    pub fn sink(&mut self) -> &mut W {
        match &mut self.0 {
            Inner::Gzip(d) => d.get_mut(),
            Inner::Deflate(d) => d.get_mut(),
            Inner::Br(d) => d.get_mut(),
            Inner::Zstd(d) => d.get_mut(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(coding: Coding, data: &[u8]) -> Vec<u8> {
        match coding {
            Coding::Identity => data.to_vec(),
            Coding::Gzip => {
                let mut e = flate2::write::GzEncoder::new(Vec::new(), Default::default());
                e.write_all(data).unwrap();
                e.finish().unwrap()
            }
            Coding::Deflate => {
                let mut e = flate2::write::ZlibEncoder::new(Vec::new(), Default::default());
                e.write_all(data).unwrap();
                e.finish().unwrap()
            }
            Coding::Br => {
                let mut out = Vec::new();
                {
                    let mut e = brotli::CompressorWriter::new(&mut out, 4096, 5, 22);
                    e.write_all(data).unwrap();
                }
                out
            }
            Coding::Zstd => zstd::stream::encode_all(data, 3).unwrap(),
        }
    }

    #[test]
    fn every_coding_decodes_whatever_the_chunking() {
        let plain: Vec<u8> = (0..20_000u32)
            .flat_map(|i| format!("data: {{\"i\":{i}}}\n\n").into_bytes())
            .collect();
        for coding in [Coding::Gzip, Coding::Deflate, Coding::Br, Coding::Zstd] {
            let coded = encode(coding, &plain);
            for chunk in [1, 7, 4096, coded.len()] {
                let mut d = Decoder::new(coding, Vec::new()).unwrap().unwrap();
                for piece in coded.chunks(chunk) {
                    d.write(piece).unwrap();
                }
                d.finish().unwrap();
                assert_eq!(d.sink(), &plain, "{coding:?} in chunks of {chunk}");
            }
        }
    }

    #[test]
    fn a_truncated_or_corrupt_stream_fails_and_unknown_codings_are_refused() {
        let plain = br#"{"usage":{"prompt_tokens":1,"completion_tokens":2}}"#;
        for coding in [Coding::Gzip, Coding::Deflate, Coding::Br, Coding::Zstd] {
            let coded = encode(coding, plain);
            let mut d = Decoder::new(coding, Vec::new()).unwrap().unwrap();
            let cut = d.write(&coded[..coded.len() / 2]).and_then(|()| d.finish());
            assert!(cut.is_err(), "{coding:?} truncated");
            let mut d = Decoder::new(coding, Vec::new()).unwrap().unwrap();
            let bad = d.write(b"\xff\xfe garbage").and_then(|()| d.finish());
            assert!(bad.is_err(), "{coding:?} corrupt");
        }
        let h = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(CONTENT_ENCODING, v.parse().unwrap());
            h
        };
        assert_eq!(Coding::of(&HeaderMap::new()), Ok(Coding::Identity));
        assert_eq!(Coding::of(&h(" GZIP ")), Ok(Coding::Gzip));
        assert_eq!(Coding::of(&h("br")), Ok(Coding::Br));
        assert_eq!(Coding::of(&h("compress")), Err(Unknown));
        assert_eq!(Coding::of(&h("gzip, br")), Err(Unknown));
        assert!(Decoder::new(Coding::Identity, Vec::new())
            .unwrap()
            .is_none());
    }
}
