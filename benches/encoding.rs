//! CPU cost of reading usage from a compressed answer, two ways, against a baseline measured in
//! the same run (see BENCHMARKS.md, "Compressed answers"):
//! - `baseline`: the provider answers uncompressed and fairgate observes it (what every
//!   identity answer costs);
//! - `decode_copy` (what fairgate does): the provider's compressed bytes pass unchanged and a
//!   streaming decoder feeds the same observation;
//! - `compress_to_client` (the alternative): fairgate asks the provider for `identity`, observes
//!   it, and compresses towards the client (tower-http's default levels: gzip 6, br 4, zstd 3;
//!   an SSE stream is flushed after every event so nothing waits in the compressor).
//!
//! Inputs: a 2.3 KB chat completion JSON with usage; a 300-event chat SSE stream (≈ 52 KB) with
//! a usage chunk, compressed event by event with a flush as a provider's edge does.

use std::io::Write;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use fairgate::usage::decode::{Coding, Decoder};
use fairgate::usage::extract::Tally;
use fairgate::usage::sse::Scanner;

fn json_body() -> Vec<u8> {
    let content =
        "The incident began at 14:02 UTC when the primary database failed over. ".repeat(30);
    format!(
        r#"{{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"gpt-4o","choices":[{{"index":0,"message":{{"role":"assistant","content":"{content}"}},"finish_reason":"stop"}}],"usage":{{"prompt_tokens":812,"completion_tokens":455,"total_tokens":1267}}}}"#
    )
    .into_bytes()
}

fn sse_events() -> Vec<Vec<u8>> {
    let mut events: Vec<Vec<u8>> = (0..300)
        .map(|i| {
            format!(
                "data: {{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\" token{i}\"}},\"finish_reason\":null}}]}}\n\n"
            )
            .into_bytes()
        })
        .collect();
    events.push(b"data: {\"id\":\"chatcmpl-1\",\"choices\":[],\"usage\":{\"prompt_tokens\":812,\"completion_tokens\":300,\"total_tokens\":1112}}\n\n".to_vec());
    events.push(b"data: [DONE]\n\n".to_vec());
    events
}

/// A compressor flushed after every piece, as a provider's edge compresses a stream.
enum Enc {
    Gzip(flate2::write::GzEncoder<Vec<u8>>),
    Br(Box<brotli::CompressorWriter<Vec<u8>>>),
    Zstd(zstd::stream::write::Encoder<'static, Vec<u8>>),
}

impl Enc {
    fn new(c: Coding) -> Self {
        match c {
            Coding::Gzip => Enc::Gzip(flate2::write::GzEncoder::new(
                Vec::new(),
                flate2::Compression::new(6),
            )),
            Coding::Br => Enc::Br(Box::new(brotli::CompressorWriter::new(
                Vec::new(),
                4096,
                4,
                22,
            ))),
            Coding::Zstd => Enc::Zstd(zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap()),
            _ => unreachable!(),
        }
    }
    /// Compresses and flushes `piece`; returns the bytes produced.
    fn chunk(&mut self, piece: &[u8]) -> Vec<u8> {
        match self {
            Enc::Gzip(e) => {
                e.write_all(piece).unwrap();
                e.flush().unwrap();
                std::mem::take(e.get_mut())
            }
            Enc::Br(e) => {
                e.write_all(piece).unwrap();
                e.flush().unwrap();
                std::mem::take(e.get_mut())
            }
            Enc::Zstd(e) => {
                e.write_all(piece).unwrap();
                e.flush().unwrap();
                std::mem::take(e.get_mut())
            }
        }
    }
    fn finish(self) -> Vec<u8> {
        match self {
            Enc::Gzip(e) => e.finish().unwrap(),
            Enc::Br(mut e) => {
                e.flush().unwrap();
                e.into_inner()
            }
            Enc::Zstd(e) => e.finish().unwrap(),
        }
    }
}

/// The observation every answer gets (JSON: copied aside, read once at the end).
struct Json(Vec<u8>);
impl Write for Json {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The SSE observation: the line scanner feeding the tally.
struct Sse(Scanner, Tally);
impl Write for Sse {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        let tally = &mut self.1;
        self.0.observe(b, &mut |p| {
            if p.first() == Some(&b'{') {
                tally.observe(p);
            }
        });
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn compressed(c: Coding, pieces: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let mut e = Enc::new(c);
    let mut out: Vec<Vec<u8>> = pieces.iter().map(|p| e.chunk(p)).collect();
    out.push(e.finish());
    out
}

fn bench(c: &mut Criterion) {
    let codings = [
        ("gzip", Coding::Gzip),
        ("br", Coding::Br),
        ("zstd", Coding::Zstd),
    ];
    let json = json_body();
    let mut g = c.benchmark_group("encoding/json_2k");
    g.throughput(Throughput::Bytes(json.len() as u64));
    g.bench_function("baseline", |b| {
        b.iter(|| {
            let mut sink = Json(Vec::new());
            sink.write_all(&json).unwrap();
            Tally::new(1 << 20).observe_body(&sink.0).usage.unwrap()
        })
    });
    for (name, coding) in codings {
        let coded = compressed(coding, std::slice::from_ref(&json)).concat();
        g.bench_function(format!("decode_copy/{name}"), |b| {
            b.iter(|| {
                let mut d = Decoder::new(coding, Json(Vec::new())).unwrap().unwrap();
                d.write(&coded).unwrap();
                d.finish().unwrap();
                Tally::new(1 << 20).observe_body(&d.sink().0).usage.unwrap()
            })
        });
        g.bench_function(format!("compress_to_client/{name}"), |b| {
            b.iter(|| {
                let mut sink = Json(Vec::new());
                sink.write_all(&json).unwrap();
                let u = Tally::new(1 << 20).observe_body(&sink.0).usage.unwrap();
                let mut e = Enc::new(coding);
                let mut out = e.chunk(&json);
                out.extend(e.finish());
                (u, out.len())
            })
        });
    }
    g.finish();

    let events = sse_events();
    let total: usize = events.iter().map(Vec::len).sum();
    let mut g = c.benchmark_group("encoding/sse_300_events");
    g.throughput(Throughput::Bytes(total as u64));
    g.bench_function("baseline", |b| {
        b.iter(|| {
            let mut sink = Sse(Scanner::new(false), Tally::new(1 << 20));
            for e in &events {
                sink.write_all(e).unwrap();
            }
            sink.1.usage.unwrap()
        })
    });
    for (name, coding) in codings {
        let coded = compressed(coding, &events);
        g.bench_function(format!("decode_copy/{name}"), |b| {
            b.iter(|| {
                let sink = Sse(Scanner::new(false), Tally::new(1 << 20));
                let mut d = Decoder::new(coding, sink).unwrap().unwrap();
                for piece in &coded {
                    d.write(piece).unwrap();
                }
                d.finish().unwrap();
                d.sink().1.usage.unwrap()
            })
        });
        g.bench_function(format!("compress_to_client/{name}"), |b| {
            b.iter(|| {
                let mut sink = Sse(Scanner::new(false), Tally::new(1 << 20));
                let mut e = Enc::new(coding);
                let mut bytes = 0;
                for piece in &events {
                    sink.write_all(piece).unwrap();
                    bytes += e.chunk(piece).len();
                }
                bytes += e.finish().len();
                (sink.1.usage.unwrap(), bytes)
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
