//! A counting-only byte-pair encoder for the o200k encodings (`o200k_base`, `o200k_harmony`:
//! the same ranks and pre-split): it answers how many tokens tiktoken's `encode_ordinary`
//! would give, and nothing else, from a fraction of the memory.
//!
//! tiktoken-rs keeps every token's bytes three times (encoder, decoder, a sorted copy), each in
//! its own allocation, and 128 clones of the pre-split regex (~38 MiB for o200k). Counting needs
//! only the bytes → rank map: here all tokens' bytes sit in one buffer, indexed by an
//! open-addressing table of ranks (~4 MiB in all), with one regex.
//!
//! Invariants:
//! - Counts equal `CoreBPE::encode_ordinary(text).len()` (same pre-split pattern, same merges:
//!   lowest rank first, leftmost on ties; checked against tiktoken-rs in the tests).
//! - Built once from the o200k ranks bundled in the binary ([`O200K_RANKS`], written from
//!   tiktoken-rs's own data; a test checks they are still the crate's rank for rank).
//! - No allocation per call for pieces under [`SMALL`] bytes (the merge works on the stack).

use std::hash::BuildHasher;

use tiktoken_rs::Rank;

/// Pieces shorter than this are merged on the stack; longer ones with a heap (O(n log n)), as
/// tiktoken does (its threshold too).
pub const SMALL: usize = 100;

/// The counting-only encoder; see the module docs.
pub struct Bpe {
    regex: fancy_regex::Regex,
    /// Every token's bytes, by rank, end to end.
    bytes: Box<[u8]>,
    /// Where token `r`'s bytes end in `bytes` (they start where `r - 1`'s end).
    ends: Box<[u32]>,
    /// Open addressing: `rank + 1` at the slot of its bytes' hash (0: empty).
    slots: Box<[u32]>,
    hasher: foldhash::fast::FixedState,
}

/// tiktoken-rs's o200k ranks (its `o200k_base.tiktoken`), as `encode_ranks` (in the tests)
/// writes them: zstd of each token's length (one byte) and bytes, by rank. 856 KiB instead
/// of the 3.6 MiB base64 text tiktoken-rs parses (every page of which became resident on first
/// use, and whose `CoreBPE`, built only to read it back, peaked at ~40 MiB). `bpe::tests` checks
/// it against tiktoken-rs's own ranks; `cargo test --lib -- --ignored write_o200k_ranks`
/// rewrites it.
pub const O200K_RANKS: &[u8] = include_bytes!("bpe/o200k.ranks.zst");

/// Every token's bytes by rank, end to end, and where each ends in them.
type Ranks = (Box<[u8]>, Box<[u32]>);

/// The [`Ranks`] of `encode_ranks`'s form; `None` if it is not that.
fn decode_ranks(zst: &[u8]) -> Option<Ranks> {
    let raw = zstd::stream::decode_all(zst).ok()?;
    let mut bytes = Vec::with_capacity(raw.len());
    let mut ends = Vec::with_capacity(200_000);
    let mut at = 0;
    while at < raw.len() {
        let len = usize::from(raw[at]);
        let token = raw.get(at + 1..at + 1 + len)?;
        if token.is_empty() {
            return None;
        }
        bytes.extend_from_slice(token);
        ends.push(u32::try_from(bytes.len()).ok()?);
        at += 1 + len;
    }
    Some((bytes.into_boxed_slice(), ends.into_boxed_slice()))
}

/// The bundled form of `ranks` (each token's bytes, by rank): see [`O200K_RANKS`].
#[cfg(test)]
fn encode_ranks(ranks: &[Vec<u8>]) -> Vec<u8> {
    let mut raw = Vec::new();
    for token in ranks {
        raw.push(u8::try_from(token.len()).expect("a token is at most 255 bytes"));
        raw.extend_from_slice(token);
    }
    zstd::stream::encode_all(&raw[..], 19).expect("zstd compresses in memory")
}

impl std::fmt::Debug for Bpe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bpe")
            .field("tokens", &self.ends.len())
            .finish_non_exhaustive()
    }
}

impl Bpe {
    /// The o200k counter, from the ranks bundled in the binary ([`O200K_RANKS`]).
    pub fn o200k() -> Self {
        let (bytes, ends) = decode_ranks(O200K_RANKS).expect("the bundled o200k ranks decode");
        Self::new(tiktoken_rs::O200K_BASE_PAT_STR, bytes, ends)
    }

    fn new(pattern: &str, bytes: Box<[u8]>, ends: Box<[u32]>) -> Self {
        let size = (ends.len() * 2).next_power_of_two().max(2);
        let mut c = Self {
            regex: fancy_regex::Regex::new(pattern).expect("tiktoken's pattern compiles"),
            bytes,
            ends,
            slots: vec![0; size].into_boxed_slice(),
            hasher: foldhash::fast::FixedState::with_seed(0x5eed_fa17_6a7e_0001),
        };
        for rank in 0..c.ends.len() {
            let mask = c.slots.len() - 1;
            let mut i = c.slot(c.token(rank as Rank));
            while c.slots[i] != 0 {
                i = (i + 1) & mask;
            }
            c.slots[i] = rank as u32 + 1;
        }
        c
    }

    fn token(&self, rank: Rank) -> &[u8] {
        let r = rank as usize;
        let start = if r == 0 { 0 } else { self.ends[r - 1] as usize };
        &self.bytes[start..self.ends[r] as usize]
    }

    fn slot(&self, piece: &[u8]) -> usize {
        self.hasher.hash_one(piece) as usize & (self.slots.len() - 1)
    }

    /// The rank of `piece`, if it is one token.
    pub fn rank(&self, piece: &[u8]) -> Option<Rank> {
        let mask = self.slots.len() - 1;
        let mut i = self.slot(piece);
        loop {
            match self.slots[i] {
                0 => return None,
                r if self.token(r - 1) == piece => return Some(r - 1),
                _ => i = (i + 1) & mask,
            }
        }
    }

    /// Tokens in `text`, as `encode_ordinary(text).len()`.
    pub fn count(&self, text: &str) -> u64 {
        let mut n = 0u64;
        let mut at = 0;
        for m in self.regex.find_iter(text) {
            let Ok(m) = m else {
                // The pre-split gave up (backtracking limit; tiktoken would panic): the rest
                // is estimated from its bytes.
                return n + (text.len() - at).div_ceil(4) as u64;
            };
            at = m.end();
            let piece = m.as_str().as_bytes();
            n += if self.rank(piece).is_some() {
                1
            } else {
                self.merged(piece)
            };
        }
        n
    }

    fn pair(&self, piece: &[u8], start: usize, end: usize) -> Rank {
        self.rank(&piece[start..end]).unwrap_or(Rank::MAX)
    }

    /// Tokens a piece (not itself a token) merges into.
    fn merged(&self, piece: &[u8]) -> u64 {
        if piece.len() < 2 {
            return piece.len() as u64;
        }
        if piece.len() >= SMALL {
            return self.merged_large(piece);
        }
        // tiktoken's `_byte_pair_merge`: parts[i] = (start, rank of the pair starting there).
        let mut parts = [(0u32, Rank::MAX); SMALL + 1];
        let mut len = piece.len() + 1;
        for (i, p) in parts.iter_mut().enumerate().take(len) {
            let rank = if i + 2 <= piece.len() {
                self.pair(piece, i, i + 2)
            } else {
                Rank::MAX
            };
            *p = (i as u32, rank);
        }
        loop {
            let (mut min, mut at) = (Rank::MAX, usize::MAX);
            for (i, &(_, r)) in parts[..len - 1].iter().enumerate() {
                if r < min {
                    (min, at) = (r, i);
                }
            }
            if min == Rank::MAX {
                break;
            }
            let rank_at = |parts: &[(u32, Rank)], i: usize| {
                if i + 3 < len {
                    self.pair(piece, parts[i].0 as usize, parts[i + 3].0 as usize)
                } else {
                    Rank::MAX
                }
            };
            if at > 0 {
                parts[at - 1].1 = rank_at(&parts, at - 1);
            }
            parts[at].1 = rank_at(&parts, at);
            parts.copy_within(at + 2..len, at + 1);
            len -= 1;
        }
        (len - 1) as u64
    }

    /// tiktoken's `_byte_pair_merge_large` (a heap of candidate merges), counting only.
    fn merged_large(&self, piece: &[u8]) -> u64 {
        use std::cmp::Reverse;
        use std::collections::BinaryHeap;
        // Per start: end of its part, end of the next part, the pair's rank, previous start.
        struct Part {
            prev: usize,
            end: usize,
            next_end: usize,
            next_rank: Rank,
        }
        let n = piece.len();
        let mut parts: Vec<Part> = (0..n)
            .map(|i| Part {
                prev: i.wrapping_sub(1),
                end: i + 1,
                next_end: i + 2,
                next_rank: Rank::MAX,
            })
            .collect();
        let mut heap = BinaryHeap::with_capacity(n);
        for (i, part) in parts.iter_mut().enumerate().take(n - 1) {
            let r = self.pair(piece, i, i + 2);
            if r != Rank::MAX {
                part.next_rank = r;
                heap.push(Reverse((r, i)));
            }
        }
        let mut count = n as u64;
        while let Some(Reverse((rank, left))) = heap.pop() {
            if rank != parts[left].next_rank {
                continue;
            }
            let right = parts[left].end;
            let right_end = parts[left].next_end;
            let right_next_end = parts[right].next_end;
            parts[left].end = right_end;
            count -= 1;
            // The merge that now starts at `left`.
            parts[left].next_end = right_next_end;
            parts[left].next_rank = Rank::MAX;
            if right_next_end <= n {
                let r = self.pair(piece, left, right_next_end);
                if r != Rank::MAX {
                    parts[left].next_rank = r;
                    heap.push(Reverse((r, left)));
                }
            }
            if right_end < n {
                parts[right_end].prev = left;
            }
            // The merge that ends at `left`.
            if left > 0 {
                let prev = parts[left].prev;
                parts[prev].next_end = right_end;
                parts[prev].next_rank = Rank::MAX;
                let r = self.pair(piece, prev, right_end);
                if r != Rank::MAX {
                    parts[prev].next_rank = r;
                    heap.push(Reverse((r, prev)));
                }
            }
            parts[right].next_rank = Rank::MAX;
        }
        count
    }

    /// Bytes held (for tests and the memory figures).
    pub fn heap_bytes(&self) -> usize {
        self.bytes.len() + self.ends.len() * 4 + self.slots.len() * 4
    }
}

#[cfg(test)]
mod tests;
