//! Estimation throughput (MB/s) on ordinary and hostile text, against raw
//! `CoreBPE::encode_ordinary` on the same input. Hostile inputs are larger than
//! `max_exact_bytes`, so estimation counts a 256 KiB prefix and extrapolates.
//!
//! Group `count`: fairgate's counting-only o200k BPE (`estimate::bpe`) against tiktoken-rs's
//! `encode_ordinary(..).len()`, the same text each, one call per iteration.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use fairgate::estimate::bpe::Bpe;
use fairgate::estimate::{Counter, Encoding, Endpoint, Estimator};
use rand::{Rng, SeedableRng};

fn inputs() -> Vec<(&'static str, String)> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let english = "The quick brown fox jumps over the lazy dog while the committee reviews \
                   the quarterly report and drafts a plan for the next release. "
        .repeat(1 << 20 >> 7);
    let letters: String = (0..4 << 20)
        .map(|_| char::from(b'a' + rng.random_range(0..26u8)))
        .collect();
    const B64: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let base64: String = (0..4 << 20)
        .map(|_| char::from(B64[rng.random_range(0..64usize)]))
        .collect();
    vec![
        ("english_1MiB", english),
        ("one_word_4MiB", "a".repeat(4 << 20)),
        ("random_letters_4MiB", letters),
        ("base64_4MiB", base64),
    ]
}

fn bench(c: &mut Criterion) {
    let est = Estimator::with_defaults();
    let bpe = tiktoken_rs::o200k_base_singleton();
    let mut g = c.benchmark_group("estimate");
    g.sample_size(10);
    for (name, text) in inputs() {
        g.throughput(Throughput::Bytes(text.len() as u64));
        let body = serde_json::json!({"input": text});
        g.bench_function(format!("{name}/fairgate"), |b| {
            b.iter(|| est.count(Endpoint::Embeddings, "gpt-4o", &body).unwrap())
        });
        // Raw tiktoken on a hostile 4 MiB single word is very slow; measure it on the first
        // 1 MiB (MB/s is what is compared).
        let raw = &text[..text.len().min(1 << 20)];
        g.throughput(Throughput::Bytes(raw.len() as u64));
        g.bench_function(format!("{name}/tiktoken_raw"), |b| {
            b.iter(|| bpe.encode_ordinary(raw).len())
        });
    }
    // Ordinary text within the exact budget, cache off: the exact path's own speed.
    let english = "The quick brown fox jumps over the lazy dog while the committee reviews \
                   the quarterly report and drafts a plan for the next release. "
        .repeat(200 << 10 >> 7);
    let body = serde_json::json!({"input": english});
    g.throughput(Throughput::Bytes(english.len() as u64));
    g.bench_function("english_200KiB/fairgate_exact_nocache", |b| {
        b.iter(|| {
            Counter::new(Encoding::O200K, usize::MAX, None)
                .body(Endpoint::Embeddings, &body)
                .unwrap()
        })
    });
    g.bench_function("english_200KiB/tiktoken_raw", |b| {
        b.iter(|| bpe.encode_ordinary(&english).len())
    });
    g.finish();
}

/// Texts of a chat request's size and shape, and the hostile shapes, each under 64 KiB.
fn count_inputs() -> Vec<(&'static str, String)> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let chat = "You are a helpful assistant. Summarize the following ticket in two sentences: \
                the customer reports that the export job fails with error 0x80070005 after \
                upgrading to version 4.2.1, and asks whether a rollback is safe. "
        .repeat(8);
    let code = "fn main() {\n    let xs: Vec<u64> = (0..10).map(|i| i * 2).collect();\n    \
                println!(\"{:?}\", xs);\n}\n"
        .repeat(40);
    let unicode = "日本語のテキストと naïve café, русский текст, العربية 😀👍🏽 ".repeat(60);
    let letters: String = (0..16 << 10)
        .map(|_| char::from(b'a' + rng.random_range(0..26u8)))
        .collect();
    let digits: String = (0..16 << 10)
        .map(|_| char::from(b'0' + rng.random_range(0..10u8)))
        .collect();
    vec![
        ("chat_1KiB", chat),
        ("code_3KiB", code),
        ("unicode_4KiB", unicode),
        (
            "english_64KiB",
            "The quick brown fox jumps over the lazy dog. ".repeat(1456),
        ),
        ("spaces_16KiB", " \n\t ".repeat(4 << 10)),
        ("digits_16KiB", digits),
        ("one_word_16KiB", letters),
    ]
}

fn count(c: &mut Criterion) {
    let ours = Bpe::o200k();
    let tiktoken = tiktoken_rs::o200k_base_singleton();
    let mut g = c.benchmark_group("count");
    g.sample_size(20);
    for (name, text) in count_inputs() {
        assert_eq!(
            ours.count(&text),
            tiktoken.encode_ordinary(&text).len() as u64
        );
        g.throughput(Throughput::Bytes(text.len() as u64));
        g.bench_function(format!("{name}/bpe"), |b| b.iter(|| ours.count(&text)));
        g.bench_function(format!("{name}/tiktoken"), |b| {
            b.iter(|| tiktoken.encode_ordinary(&text).len())
        });
    }
    g.finish();
}

criterion_group!(benches, bench, count);
criterion_main!(benches);
