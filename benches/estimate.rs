//! Estimation throughput (MB/s) on ordinary and hostile text, against raw
//! `CoreBPE::encode_ordinary` on the same input. Hostile inputs are larger than
//! `max_exact_bytes`, so estimation counts a 256 KiB prefix and extrapolates.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
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

criterion_group!(benches, bench);
criterion_main!(benches);
