use std::sync::LazyLock;

use proptest::prelude::*;

use super::*;

static BPE: LazyLock<Bpe> = LazyLock::new(Bpe::o200k);

fn tiktoken(text: &str) -> u64 {
    tiktoken_rs::o200k_base_singleton()
        .encode_ordinary(text)
        .len() as u64
}

fn same(text: &str) {
    assert_eq!(
        BPE.count(text),
        tiktoken(text),
        "{:?}",
        text.chars().take(60).collect::<String>()
    );
}

#[test]
fn counts_as_tiktoken_does() {
    let long_word: String = (0..3000)
        .map(|i| (b'a' + (i * 7 % 26) as u8) as char)
        .collect();
    for text in [
        "",
        "hello",
        "Hello, world! How are you today?",
        "  leading and trailing spaces   \n\n\t tabs\r\n",
        "numbers 1234567890 and 3.14159, dates 2026-12-02T03:05Z",
        "unicode: naïve café, 日本語のテキスト, emoji 😀👍🏽, русский текст, العربية",
        "code: fn main() { println!(\"{}\", x.iter().map(|y| y * 2).sum::<u64>()); }",
        "<|endoftext|> is ordinary text here",
        "don't you'll we've THEY'RE I'M",
        &"The quick brown fox jumps over the lazy dog. ".repeat(40),
        &"a".repeat(500),
        &long_word,
        &"\u{1F600}".repeat(200),
        &format!("{}==", "QUJDRA".repeat(100)),
        &" ".repeat(5000),
        &"\n".repeat(300),
        &" \t\r\n".repeat(400),
        &"9".repeat(1000),
        &"1234567890".repeat(50),
        &"日本語".repeat(400),
        &"ё".repeat(700),
        &"!@#$%^&*()".repeat(60),
    ] {
        same(text);
    }
}

/// Pieces on either side of the stack merge's limit take the same merges as tiktoken's.
#[test]
fn pieces_around_the_small_limit_count_as_tiktoken() {
    for len in [SMALL - 2, SMALL - 1, SMALL, SMALL + 1, SMALL + 2] {
        let word: String = (0..len)
            .map(|i| (b'a' + (i * 11 % 26) as u8) as char)
            .collect();
        same(&word);
        same(&format!(" {word}"));
        let b64: String = (0..len)
            .map(|i| b"QUJDRA0189+/xyz"[i * 5 % 15] as char)
            .collect();
        same(&b64);
    }
}

#[test]
fn is_small() {
    assert!(BPE.heap_bytes() < 8 << 20, "{} bytes", BPE.heap_bytes());
    assert!(BPE.rank(b"hello").is_some());
    assert_eq!(BPE.rank(b"not-a-token-at-all-surely"), None);
    // Every ordinary rank is found again from its own bytes.
    let core = tiktoken_rs::o200k_base_singleton();
    for rank in (0..199_998).step_by(997) {
        let bytes = core.decode_bytes(&[rank]).unwrap();
        assert_eq!(BPE.rank(&bytes), Some(rank));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    #[test]
    fn any_text_counts_as_tiktoken(text in "(\\PC|\\s){0,300}") {
        prop_assert_eq!(BPE.count(&text), tiktoken(&text));
    }

    #[test]
    fn long_runs_count_as_tiktoken(text in "[a-zA-Z0-9+/]{100,600}") {
        prop_assert_eq!(BPE.count(&text), tiktoken(&text));
    }

    #[test]
    fn whitespace_and_digit_runs_count_as_tiktoken(
        text in "([ \\t\\r\\n]{1,200}|[0-9]{1,300}|[a-z]{1,20}|[éü日本ё😀]{1,40}|[.,;:'!?]{1,5})*"
    ) {
        prop_assert_eq!(BPE.count(&text), tiktoken(&text));
    }

    #[test]
    fn very_long_words_count_as_tiktoken(
        word in "[a-z]{1,8}", reps in 50usize..400, sep in "[A-Z0-9]?"
    ) {
        let text = format!("{word}{sep}").repeat(reps);
        prop_assert_eq!(BPE.count(&text), tiktoken(&text));
    }
}

/// tiktoken-rs's o200k ranks: every ordinary token's bytes, by rank.
fn tiktoken_ranks() -> Vec<Vec<u8>> {
    let core = tiktoken_rs::o200k_base_singleton();
    let mut ranks = Vec::new();
    // Ordinary ranks are 0..n without gaps; the first rank that does not decode ends them.
    while let Ok(token) = core.decode_bytes(&[ranks.len() as Rank]) {
        ranks.push(token);
    }
    ranks
}

#[test]
fn the_bundled_ranks_are_tiktokens() {
    let ranks = tiktoken_ranks();
    let (bytes, ends) = decode_ranks(O200K_RANKS).unwrap();
    assert_eq!(ends.len(), ranks.len(), "token count");
    let mut start = 0;
    for (rank, token) in ranks.iter().enumerate() {
        let end = ends[rank] as usize;
        assert_eq!(&bytes[start..end], &token[..], "rank {rank}");
        start = end;
    }
    assert_eq!(start, bytes.len());
    // The round trip of the bundled form.
    let (b2, e2) = decode_ranks(&encode_ranks(&ranks)).unwrap();
    assert_eq!((b2, e2), (bytes, ends));
    assert!(decode_ranks(b"not zstd").is_none());
}

/// Rewrites `o200k.ranks.zst` from tiktoken-rs (after a tiktoken-rs upgrade changed the ranks).
#[test]
#[ignore = "writes src/estimate/bpe/o200k.ranks.zst"]
fn write_o200k_ranks() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/src/estimate/bpe/o200k.ranks.zst"
    );
    std::fs::write(path, encode_ranks(&tiktoken_ranks())).unwrap();
}
