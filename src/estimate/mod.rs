//! Estimate stage: counts a request's input tokens with the model's tiktoken encoding and
//! prepares what the fair queue needs to charge its cost at dispatch; learns output lengths from
//! reconciled requests and keeps estimate-error statistics.
//!
//! cost = (input × `input_weight` + output estimate × choices × `output_weight` +
//! `tool_call_tokens` × allowed tool calls) × the model's `weight`, where choices is `n` or
//! `best_of` (the larger), times the prompts of a completions request with an array `prompt`. The output estimate is evaluated when the request
//! is dispatched ([`Estimator::cost`], called by the fair queue), so a queued request is charged
//! what has been learned by then: the p90 of the (tenant, model)'s recent outputs, or
//! `default_output_tokens` before any history, capped by the request's `max_tokens`.
//!
//! Invariants:
//! - Counting never blocks a runtime worker for long: bodies over [`INLINE_MAX_BYTES`] are
//!   counted on the blocking pool, at most [`BLOCKING_PERMITS`] at once; all counting is bounded
//!   by `max_exact_bytes` of BPE work per request (see `tokens`).
//! - A malformed body (bad content part, non-array messages, …) is a 400 [`Error`], never a panic.
//! - A client streaming without `stream_options.include_usage` gets its forwarded body rewritten
//!   once, here, to ask for usage ([`Estimate::strip_usage`] tells `usage` to remove that chunk).
//! - Locks (cache, history, stats) are short, leaf-level, and never held across `.await`.

pub mod bpe;
mod layer;
mod learn;
mod request;
mod stats;
mod tokens;

use http::StatusCode;
use serde_json::Value;

use crate::config::{EstimateConfig, ModelConfig};
pub use crate::context::Estimate;
use crate::domain::{TenantId, Tokens, Weight};
use crate::error::ApiError;

pub use layer::{Counting, Layer, BLOCKING_PERMITS, INLINE_MAX_BYTES};
pub use learn::{History, OutputKey, WINDOW};
pub use request::{Counter, Endpoint, Input};
pub use stats::{Stats, TenantStats, BUCKETS};
pub use tokens::{count, Budget, Cache, Count, Encoding};

/// Entries of the content-hash count cache.
pub const CACHE_ENTRIES: usize = 4096;

/// Estimate stage errors.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A field has a shape OpenAI rejects.
    #[error("invalid request: malformed `{0}`")]
    Malformed(&'static str),
    /// A content part lacks its text.
    #[error("invalid request: content part is missing its `{0}` string")]
    Text(&'static str),
    /// Counting on the blocking pool failed (a bug).
    #[error("token counting failed")]
    Counting,
}

impl ApiError for Error {
    fn status(&self) -> StatusCode {
        match self {
            Error::Counting => StatusCode::INTERNAL_SERVER_ERROR,
            _ => StatusCode::BAD_REQUEST,
        }
    }
    fn kind(&self) -> &'static str {
        match self {
            Error::Counting => "server_error",
            _ => "invalid_request_error",
        }
    }
    fn code(&self) -> &'static str {
        match self {
            Error::Counting => "internal_error",
            _ => "invalid_content",
        }
    }
    fn reason(&self) -> crate::error::Reason {
        crate::error::Reason::BadRequest
    }
}

/// What the cost of a queued request is computed from, at dispatch time
/// ([`Estimator::cost`]: the output estimate is the one of that moment).
#[derive(Clone, Debug, Default)]
pub struct CostInputs {
    /// Input tokens (counted).
    pub input_tokens: u64,
    /// The request's output cap (`max_tokens` and friends), if any.
    pub max_output_tokens: Option<u64>,
    /// Whose learned output estimate applies (none: the configured default).
    pub output_key: Option<OutputKey>,
    /// Tool calls the request allows (each costs the configured tool budget).
    pub tool_calls: u64,
    /// The model's cost weight.
    pub model_weight: Weight,
    /// Completions generated (multiplies the output estimate; 0 is taken as 1).
    pub choices: u64,
}

impl Estimate {
    /// The fair queue's cost inputs for this request.
    pub fn cost_inputs(&self) -> CostInputs {
        CostInputs {
            input_tokens: self.input.tokens,
            max_output_tokens: self.max_output_tokens,
            output_key: Some(self.key.clone()),
            tool_calls: self.input.tool_calls,
            model_weight: self.model_weight,
            choices: self.choices,
        }
    }
}

#[derive(Debug, Clone)]
struct Model {
    weight: Weight,
    encoding: Option<Encoding>,
}

/// Counting settings, per-model overrides, the count cache, the learned history and the
/// estimate-error statistics. Built once; shared as `Arc`.
#[derive(Debug)]
pub struct Estimator {
    cfg: EstimateConfig,
    default_encoding: Encoding,
    models: crate::domain::FastMap<String, Model>,
    cache: Cache,
    history: History,
    stats: Stats,
}

impl Estimator {
    /// From `[estimate]` and `[models]` (validated: encodings exist, weights > 0).
    pub fn new(
        cfg: &EstimateConfig,
        models: &std::collections::BTreeMap<String, ModelConfig>,
    ) -> Self {
        let models = models
            .iter()
            .map(|(name, m)| {
                let model = Model {
                    weight: Weight::new(m.weight).unwrap_or(Weight::ONE),
                    encoding: m.encoding.as_deref().and_then(Encoding::parse),
                };
                (name.clone(), model)
            })
            .collect();
        Self {
            default_encoding: Encoding::parse(&cfg.default_encoding).unwrap_or(Encoding::O200K),
            cfg: cfg.clone(),
            models,
            cache: Cache::new(CACHE_ENTRIES),
            history: History::default(),
            stats: Stats::default(),
        }
    }

    /// With every default.
    pub fn with_defaults() -> Self {
        Self::new(&EstimateConfig::default(), &Default::default())
    }

    /// The settings.
    pub fn config(&self) -> &EstimateConfig {
        &self.cfg
    }

    /// `model`'s encoding: its override, else tiktoken-rs's map, else the default.
    pub fn encoding(&self, model: &str) -> Encoding {
        self.models
            .get(model)
            .and_then(|m| m.encoding)
            .or_else(|| Encoding::for_model(model))
            .unwrap_or(self.default_encoding)
    }

    /// `model`'s cost weight (1 unless configured).
    pub fn model_weight(&self, model: &str) -> Weight {
        self.models.get(model).map_or(Weight::ONE, |m| m.weight)
    }

    /// Counts a parsed body's input tokens (synchronously; see [`Layer`] for where).
    pub fn count(&self, endpoint: Endpoint, model: &str, body: &Value) -> Result<Input, Error> {
        Counter::new(
            self.encoding(model),
            self.cfg.max_exact_bytes,
            Some(&self.cache),
        )
        .body(endpoint, body)
    }

    /// Counts output text (when usage never came), within `max_exact_bytes`.
    pub fn count_text(&self, enc: Encoding, text: &str) -> Count {
        count(enc, text, &mut Budget::new(self.cfg.max_exact_bytes), None)
    }

    /// The output estimate of the moment: learned p90 (or the default), capped by `max`.
    pub fn output_estimate(&self, key: Option<&OutputKey>, max: Option<u64>) -> u64 {
        let learned = key.and_then(|k| self.history.p90(k));
        let est = learned.unwrap_or(self.cfg.default_output_tokens);
        max.map_or(est, |m| est.min(m))
    }

    /// The cost charged at dispatch: the output estimate (per choice) times the choices.
    /// Saturates: client-supplied counts never wrap.
    pub fn cost(&self, c: &CostInputs) -> Tokens {
        let output = self
            .output_estimate(c.output_key.as_ref(), c.max_output_tokens)
            .saturating_mul(c.choices.max(1));
        let base = c.input_tokens as f64 * self.cfg.input_weight
            + output as f64 * self.cfg.output_weight
            + self.cfg.tool_call_tokens.saturating_mul(c.tool_calls) as f64;
        Tokens((base * c.model_weight.get()).round() as u64)
    }

    /// The actual cost of a completed request, with the same weights.
    pub fn actual_cost(&self, input: u64, output: u64, model_weight: Weight) -> Tokens {
        let base = input as f64 * self.cfg.input_weight + output as f64 * self.cfg.output_weight;
        Tokens((base * model_weight.get()).round() as u64)
    }

    /// Learns one actual output length.
    pub fn record_output(&self, key: &OutputKey, output: u64) {
        self.history.record(key, output);
    }

    /// The learned history.
    pub fn history(&self) -> &History {
        &self.history
    }

    /// The estimate-error statistics.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// The count cache.
    pub fn cache(&self) -> &Cache {
        &self.cache
    }

    /// Records a reconciled request's estimate error.
    pub fn record_error(&self, tenant: &TenantId, estimated: Tokens, actual: Tokens, usage: bool) {
        self.stats.record(tenant, estimated, actual, usage);
    }
}

#[cfg(test)]
mod tests;
