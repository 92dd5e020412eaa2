//! Domain newtypes shared by every stage: no bare `u64`/`f64` crosses a module boundary.
//!
//! Invariants: `Tokens` is a non-negative count of (possibly estimated) tokens; `Weight` is finite
//! and strictly positive; `TenantId` is the configured tenant id and never a key.

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
