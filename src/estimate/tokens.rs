//! Counting text with a tiktoken encoding, with a bounded CPU cost and a content-hash cache.
//!
//! Invariants:
//! - Encodings are process-wide singletons, each loaded once, lazily, on first use, and shared
//!   (`&'static`) by every request: the o200k encodings by fairgate's counting-only [`bpe`]
//!   (a few MiB instead of tiktoken-rs's ~38), the others by tiktoken-rs's own.
//!
//! [`bpe`]: super::bpe
//! - A request counts at most its [`Budget`] of text bytes exactly. Text past the budget is
//!   extrapolated at the bytes-per-token ratio measured on the exactly counted prefix of the same
//!   string (or, with no prefix, on everything counted so far in the request, or 4 bytes/token).
//!   So one 4 MB word, random letters or base64 cost at most `max_exact_bytes` of BPE work.
//! - BPE cost grows with the square of a piece's length, so text is encoded in chunks of at most
//!   [`CHUNK_BYTES`], cut before whitespace where there is any (where tiktoken's own pre-split
//!   cuts too, so ordinary text counts the same) and at a character boundary inside longer
//!   whitespace-free runs (hostile text: a run's count may move by a token per cut).
//! - The cache maps a 64-bit hash of (encoding, text) to its exact count; it holds at most
//!   `capacity` entries (two generations of `capacity / 2`; the older is dropped when the newer
//!   fills), is only locked to look up and to insert — never while counting — and stores
//!   every non-empty string of at least [`CACHE_MIN_BYTES`]: even a 6-byte role name costs
//!   ~2 µs in tiktoken (its pre-split regex runs per call), a hash and lookup ~0.1 µs.

use std::hash::BuildHasher;
use std::sync::{LazyLock, Mutex};

use tiktoken_rs::tokenizer::Tokenizer;
use tiktoken_rs::CoreBPE;

use super::bpe::Bpe;

/// Longest piece handed to BPE at once (see the module docs).
pub const CHUNK_BYTES: usize = 2048;

/// Strings shorter than this are counted, not cached.
pub const CACHE_MIN_BYTES: usize = 1;

pub use crate::domain::Encoding;

/// What counts an encoding's tokens.
#[derive(Clone, Copy)]
pub enum Counting {
    /// fairgate's counting-only o200k BPE.
    O200k(&'static Bpe),
    /// tiktoken-rs's BPE (every other encoding).
    Tiktoken(&'static CoreBPE),
}

impl Counting {
    /// Tokens in `text` (as tiktoken's `encode_ordinary`).
    pub fn count(self, text: &str) -> u64 {
        match self {
            Counting::O200k(b) => b.count(text),
            Counting::Tiktoken(b) => b.encode_ordinary(text).len() as u64,
        }
    }
}

static O200K: LazyLock<Bpe> = LazyLock::new(Bpe::o200k);

impl Encoding {
    /// tiktoken-rs's shared BPE of this encoding (loaded on first use); counting goes through
    /// [`Encoding::counting`].
    pub fn bpe(self) -> &'static CoreBPE {
        tiktoken_rs::bpe_for_tokenizer(self.0).expect("bundled encodings always load")
    }

    /// What counts this encoding (loaded on first use).
    pub fn counting(self) -> Counting {
        match self.0 {
            Tokenizer::O200kBase | Tokenizer::O200kHarmony => Counting::O200k(&O200K),
            _ => Counting::Tiktoken(self.bpe()),
        }
    }
}

/// A token count and how it was obtained.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Count {
    /// Tokens (exact, or exact prefix + extrapolated rest).
    pub tokens: u64,
    /// Whether any part was extrapolated rather than counted.
    pub extrapolated: bool,
}

/// Per-request bookkeeping: exact bytes left, and the ratio measured so far.
#[derive(Debug)]
pub struct Budget {
    remaining: usize,
    counted_bytes: u64,
    counted_tokens: u64,
    /// Whether anything in this request was extrapolated.
    pub extrapolated: bool,
}

impl Budget {
    /// A budget of `max_exact_bytes` exactly counted bytes.
    pub fn new(max_exact_bytes: usize) -> Self {
        Self {
            remaining: max_exact_bytes,
            counted_bytes: 0,
            counted_tokens: 0,
            extrapolated: false,
        }
    }

    fn bytes_per_token(&self) -> f64 {
        if self.counted_tokens == 0 {
            4.0
        } else {
            self.counted_bytes as f64 / self.counted_tokens as f64
        }
    }
}

/// The content-hash cache of exact counts; see the module docs.
#[derive(Debug)]
pub struct Cache {
    half: usize,
    /// Keys content with a per-process random seed, so which texts collide cannot be worked
    /// out offline (a collision would lend one text another's count).
    seed: foldhash::quality::RandomState,
    maps: Mutex<[crate::domain::FastMap<u64, u32>; 2]>,
}

impl Cache {
    /// A cache of at most `capacity` entries.
    pub fn new(capacity: usize) -> Self {
        Self {
            half: (capacity / 2).max(1),
            seed: foldhash::quality::RandomState::default(),
            maps: Mutex::default(),
        }
    }

    fn get(&self, key: u64) -> Option<u32> {
        let maps = self.maps.lock().unwrap_or_else(|p| p.into_inner());
        maps[0].get(&key).or_else(|| maps[1].get(&key)).copied()
    }

    fn put(&self, key: u64, tokens: u32) {
        let mut maps = self.maps.lock().unwrap_or_else(|p| p.into_inner());
        if maps[0].len() >= self.half {
            let newer = std::mem::take(&mut maps[0]);
            maps[1] = newer;
        }
        maps[0].insert(key, tokens);
    }

    /// Entries held (for tests and metrics).
    pub fn len(&self) -> usize {
        let maps = self.maps.lock().unwrap_or_else(|p| p.into_inner());
        maps[0].len() + maps[1].len()
    }

    /// Whether the cache is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Cache {
    fn key(&self, enc: Encoding, text: &str) -> u64 {
        self.seed.hash_one((enc, text))
    }
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    if i >= s.len() {
        return s.len();
    }
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// Token count of `text`, encoded in chunks of at most [`CHUNK_BYTES`] (see the module docs).
pub fn encode_len(bpe: Counting, mut text: &str) -> u64 {
    let mut n = 0;
    while text.len() > CHUNK_BYTES {
        let limit = floor_char_boundary(text, CHUNK_BYTES);
        let cut = text[..limit]
            .rfind(char::is_whitespace)
            .filter(|&i| i > 0)
            .unwrap_or(limit);
        n += bpe.count(&text[..cut]);
        text = &text[cut..];
    }
    n + bpe.count(text)
}

/// Counts `text`, within `budget`, through `cache`; see the module docs.
pub fn count(enc: Encoding, text: &str, budget: &mut Budget, cache: Option<&Cache>) -> Count {
    if text.is_empty() {
        return Count::default();
    }
    let cacheable = text.len() >= CACHE_MIN_BYTES && text.len() <= budget.remaining;
    let k = cache.filter(|_| cacheable).map(|c| (c, c.key(enc, text)));
    if let Some((cache, k)) = k {
        if let Some(n) = cache.get(k) {
            budget.remaining -= text.len();
            budget.counted_bytes += text.len() as u64;
            budget.counted_tokens += u64::from(n);
            return Count {
                tokens: u64::from(n),
                extrapolated: false,
            };
        }
    }
    let exact_len = floor_char_boundary(text, budget.remaining);
    let exact = encode_len(enc.counting(), &text[..exact_len]);
    budget.remaining -= exact_len;
    budget.counted_bytes += exact_len as u64;
    budget.counted_tokens += exact;
    let rest = text.len() - exact_len;
    if rest == 0 {
        if let Some((cache, k)) = k {
            cache.put(k, u32::try_from(exact).unwrap_or(u32::MAX));
        }
        return Count {
            tokens: exact,
            extrapolated: false,
        };
    }
    // Past the budget: the prefix's own ratio when it is long enough to mean something.
    let ratio = if exact_len >= 1024 && exact > 0 {
        exact_len as f64 / exact as f64
    } else {
        budget.bytes_per_token()
    };
    budget.extrapolated = true;
    Count {
        tokens: exact + (rest as f64 / ratio.max(1.0)).ceil() as u64,
        extrapolated: true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_caches() {
        let cache = Cache::new(4);
        let mut b = Budget::new(1 << 20);
        let text = "The quick brown fox jumps over the lazy dog, again and again and again.";
        let n = count(Encoding::O200K, text, &mut b, Some(&cache));
        assert!(!n.extrapolated && n.tokens > 10);
        assert_eq!(cache.len(), 1);
        assert_eq!(count(Encoding::O200K, text, &mut b, Some(&cache)), n);
        assert_eq!(
            count(Encoding::O200K, "hello", &mut b, Some(&cache)).tokens,
            1
        );
        for i in 0..10 {
            let t = format!("{text} {i}");
            count(Encoding::CL100K, &t, &mut b, Some(&cache));
        }
        assert!(cache.len() <= 4, "bounded: {}", cache.len());
    }

    #[test]
    fn chunking_keeps_ordinary_counts() {
        let text = "The quick brown fox jumps over the lazy dog. ".repeat(500);
        let whole = Encoding::O200K.bpe().encode_ordinary(&text).len() as u64;
        let chunked = encode_len(Encoding::O200K.counting(), &text);
        assert_eq!(chunked, whole);
    }

    #[test]
    fn hostile_text_is_extrapolated_past_the_budget() {
        let word = "a".repeat(4 << 20);
        let mut b = Budget::new(64 * 1024);
        let n = count(Encoding::O200K, &word, &mut b, None);
        assert!(n.extrapolated && b.extrapolated);
        // Exactly 64 KiB were counted; the estimate scales to the full length.
        assert_eq!(b.counted_bytes, 64 * 1024);
        let exact_prefix = encode_len(Encoding::O200K.counting(), &word[..64 * 1024]);
        let ratio = (64 * 1024) as f64 / exact_prefix as f64;
        let expected = (word.len() as f64 / ratio) as u64;
        assert!(
            n.tokens.abs_diff(expected) <= 2,
            "{} vs {expected}",
            n.tokens
        );
        // The budget is spent: the next string is extrapolated at the measured ratio.
        let m = count(Encoding::O200K, "hello world", &mut b, None);
        assert!(m.extrapolated && m.tokens >= 1);
    }

    #[test]
    fn multibyte_text_is_cut_on_a_char_boundary() {
        let text = "é".repeat(1000);
        let mut b = Budget::new(1001);
        let n = count(Encoding::CL100K, &text, &mut b, None);
        assert!(n.extrapolated && n.tokens > 0);
    }

    #[test]
    fn encodings_parse_and_map_models() {
        assert_eq!(Encoding::parse("cl100k_base"), Some(Encoding::CL100K));
        assert_eq!(Encoding::parse("nope"), None);
        assert_eq!(Encoding::for_model("gpt-4o-mini"), Some(Encoding::O200K));
        assert_eq!(Encoding::for_model("gpt-3.5-turbo"), Some(Encoding::CL100K));
        assert_eq!(Encoding::for_model("llama-3.1-70b"), None);
    }
}
