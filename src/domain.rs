//! Domain newtypes shared by every stage: no bare `u64`/`f64` crosses a module boundary.
//! A leaf: it imports no other module of the crate.
//!
//! Invariants: `Tokens` is a non-negative count of (possibly estimated) tokens; `Weight` is finite
//! and strictly positive; `TenantId` is the configured tenant id and never a key (keys are only
//! held as [`KeyDigest`]s); a [`Charge`]'s arithmetic saturates.

use std::fmt;
use std::sync::Arc;

/// A tenant's configured identifier (never an API key).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TenantId(Arc<str>);

impl TenantId {
    /// Wraps a configured tenant id.
    pub fn new(id: impl Into<Arc<str>>) -> Self {
        Self(id.into())
    }

    /// The id as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for TenantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for TenantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A number of tokens: the unit every cost, quantum and deficit is metered in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Tokens(pub u64);

impl Tokens {
    /// Zero tokens.
    pub const ZERO: Tokens = Tokens(0);

    /// The count as `i64` (saturating), for signed credit arithmetic.
    pub fn signed(self) -> i64 {
        i64::try_from(self.0).unwrap_or(i64::MAX)
    }
}

impl fmt::Display for Tokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A tenant's (or plan's, or class's) share weight: finite and > 0.
#[derive(Clone, Copy, Debug, PartialEq, PartialOrd)]
pub struct Weight(f64);

impl Weight {
    /// Weight 1.
    pub const ONE: Weight = Weight(1.0);

    /// Returns `None` unless `w` is finite and strictly positive.
    pub fn new(w: f64) -> Option<Self> {
        (w.is_finite() && w > 0.0).then_some(Self(w))
    }

    /// The raw value.
    pub fn get(self) -> f64 {
        self.0
    }

    /// `base × weight` tokens, rounded, at least 1.
    pub fn scale(self, base: Tokens) -> Tokens {
        Tokens(((base.0 as f64) * self.0).round().max(1.0) as u64)
    }
}

impl Default for Weight {
    fn default() -> Self {
        Self::ONE
    }
}

/// A request's service class within a pool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Class {
    /// Someone is waiting on the answer.
    #[default]
    Interactive,
    /// Throughput work that may wait.
    Batch,
}

impl Class {
    /// Parses `interactive` / `batch` (ASCII case-insensitive).
    pub fn parse(s: &str) -> Option<Self> {
        if s.eq_ignore_ascii_case("interactive") {
            Some(Class::Interactive)
        } else if s.eq_ignore_ascii_case("batch") {
            Some(Class::Batch)
        } else {
            None
        }
    }
}

/// A hash map for the request path: keys are config-derived (tenant ids, models) or already
/// hashes, so a fast seeded hasher (foldhash) replaces SipHash.
pub type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// Which discipline orders a pool's queue (`[scheduler] policy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// Weighted deficit round robin in tokens (the point of fairgate).
    #[default]
    Drr,
    /// One arrival-ordered queue (exists to compare against).
    Fifo,
}

/// What a request is charged, in raw tokens, by direction.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Charge {
    /// Input (prompt) tokens.
    pub input: u64,
    /// Output (completion) tokens.
    pub output: u64,
}

impl Charge {
    /// Input plus output.
    pub fn total(self) -> Tokens {
        Tokens(self.input.saturating_add(self.output))
    }
}

/// The SHA-256 digest of an API key: the only form in which keys are kept.
pub type KeyDigest = [u8; 32];

/// SHA-256 of a key.
pub fn digest(key: &[u8]) -> KeyDigest {
    use sha2::Digest;
    sha2::Sha256::digest(key).into()
}

/// Parses a 64-hex-character SHA-256 digest.
pub fn parse_digest(hex_digest: &str) -> Option<KeyDigest> {
    let mut out = [0u8; 32];
    hex::decode_to_slice(hex_digest, &mut out).ok()?;
    Some(out)
}

/// A tiktoken encoding, by its tiktoken name (counting with it lives in `estimate`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Encoding(pub tiktoken_rs::tokenizer::Tokenizer);

impl Encoding {
    /// `o200k_base`, the default for unknown models.
    pub const O200K: Encoding = Encoding(tiktoken_rs::tokenizer::Tokenizer::O200kBase);
    /// `cl100k_base`.
    pub const CL100K: Encoding = Encoding(tiktoken_rs::tokenizer::Tokenizer::Cl100kBase);

    /// Parses a tiktoken encoding name (`o200k_base`, `cl100k_base`, …).
    pub fn parse(name: &str) -> Option<Self> {
        use tiktoken_rs::tokenizer::Tokenizer;
        Some(Encoding(match name {
            "o200k_base" => Tokenizer::O200kBase,
            "o200k_harmony" => Tokenizer::O200kHarmony,
            "cl100k_base" => Tokenizer::Cl100kBase,
            "p50k_base" => Tokenizer::P50kBase,
            "p50k_edit" => Tokenizer::P50kEdit,
            "r50k_base" => Tokenizer::R50kBase,
            "gpt2" => Tokenizer::Gpt2,
            _ => return None,
        }))
    }

    /// The encoding tiktoken-rs's own model map gives `model`, if it knows the model.
    pub fn for_model(model: &str) -> Option<Self> {
        tiktoken_rs::tokenizer::get_tokenizer(model).map(Encoding)
    }
}

/// Longest model name kept in an [`OutputKey`] (longer names are cut, so clients cannot grow
/// keys).
const MAX_MODEL_LEN: usize = 128;

/// Whose output history an output estimate comes from: (tenant, model).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct OutputKey {
    /// The tenant.
    pub tenant: TenantId,
    /// The requested model (cut to 128 bytes).
    pub model: Arc<str>,
}

impl OutputKey {
    /// The key of `tenant` asking `model`.
    pub fn new(tenant: TenantId, model: &str) -> Self {
        let mut end = model.len().min(MAX_MODEL_LEN);
        while !model.is_char_boundary(end) {
            end -= 1;
        }
        Self {
            tenant,
            model: model[..end].into(),
        }
    }
}

/// A duration as Go (and so OpenAI) prints it, to the millisecond: `0s`, `250ms`, `6s`,
/// `8.64s`, `1m30s`, `6m0s`, `1h2m3s`.
pub fn go_duration(d: std::time::Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        return "0s".into();
    }
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let (h, m, s, frac) = (ms / 3_600_000, ms / 60_000 % 60, ms / 1000 % 60, ms % 1000);
    let mut out = String::new();
    if h > 0 {
        out.push_str(&format!("{h}h"));
    }
    if h > 0 || m > 0 {
        out.push_str(&format!("{m}m"));
    }
    out.push_str(&s.to_string());
    if frac > 0 {
        let digits = format!("{frac:03}");
        out.push('.');
        out.push_str(digits.trim_end_matches('0'));
    }
    out.push('s');
    out
}

/// A budget period: a calendar day or month (in the configured [`Zone`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Period {
    /// A calendar day.
    Day,
    /// A calendar month.
    Month,
}

impl Period {
    /// Both periods.
    pub const ALL: [Period; 2] = [Period::Day, Period::Month];

    /// `day` or `month`.
    pub fn name(self) -> &'static str {
        match self {
            Period::Day => "day",
            Period::Month => "month",
        }
    }
}

/// The calendar that budget periods and the usage ledger's days are counted in (`[store]
/// timezone`): UTC, an IANA zone of the bundled database, or a fixed offset.
#[derive(Clone, Debug, PartialEq)]
pub struct Zone(jiff::tz::TimeZone);

impl Default for Zone {
    fn default() -> Self {
        Self(jiff::tz::TimeZone::UTC)
    }
}

impl Zone {
    /// Parses `UTC`, an IANA name (`Europe/Berlin`) or a fixed offset (`+05:30`, `-08:00`).
    pub fn parse(s: &str) -> Result<Self, String> {
        if s.eq_ignore_ascii_case("utc") || s == "Z" {
            return Ok(Self::default());
        }
        if let Some(sign) = s
            .strip_prefix('+')
            .map(|r| (1, r))
            .or(s.strip_prefix('-').map(|r| (-1, r)))
        {
            let (k, rest) = sign;
            let (h, m) = rest.split_once(':').unwrap_or((rest, "0"));
            let parsed = h.parse::<i32>().ok().zip(m.parse::<i32>().ok());
            if let Some((h, m)) = parsed.filter(|&(h, m)| h <= 18 && (0..60).contains(&m)) {
                let offset = jiff::tz::Offset::from_seconds(k * (h * 3600 + m * 60))
                    .map_err(|e| e.to_string())?;
                return Ok(Self(jiff::tz::TimeZone::fixed(offset)));
            }
            return Err(format!("{s:?} is not an offset like \"+05:30\""));
        }
        jiff::tz::TimeZone::get(s).map(Self).map_err(|_| {
            format!("unknown time zone {s:?} (use \"UTC\", an IANA name or \"+HH:MM\")")
        })
    }

    /// The zone.
    pub fn tz(&self) -> &jiff::tz::TimeZone {
        &self.0
    }
}

/// Money, in picodollars (10⁻¹² USD): exact for prices with up to six decimals per million
/// tokens, up to about 18 million USD.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Usd(pub u64);

impl Usd {
    /// Picodollars in one dollar.
    pub const PER_DOLLAR: u64 = 1_000_000_000_000;

    /// From dollars (rounded to the picodollar; negative and NaN are 0).
    pub fn from_dollars(d: f64) -> Self {
        Self((d * Self::PER_DOLLAR as f64).round().max(0.0) as u64)
    }

    /// In dollars.
    pub fn dollars(self) -> f64 {
        self.0 as f64 / Self::PER_DOLLAR as f64
    }
}

impl fmt::Display for Usd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.6}", self.dollars())
    }
}
