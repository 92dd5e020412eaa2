//! Scenario files for `fairgate simulate`: tenants with weights and caps, arrival processes,
//! cost distributions, estimate error, and the pool.
//!
//! Invariants: unknown keys are rejected; every duration and count is finite and bounded, so a
//! simulation always terminates (arrivals stop at `duration_s`, at most `MAX_REQUESTS`).

use std::path::Path;

use serde::Deserialize;

use super::rng::Rng;

/// Upper bound on generated requests, so a typo cannot make a run endless.
pub const MAX_REQUESTS: usize = 2_000_000;

/// A whole scenario.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Shown in the report.
    pub name: String,
    /// What it demonstrates.
    #[serde(default)]
    pub description: String,
    /// Arrivals happen in [0, duration_s); the run continues until the queue drains.
    pub duration_s: f64,
    /// Random seed.
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// The upstream pool.
    pub pool: Pool,
    /// Tenants (each may stand for `replicas` identical tenants).
    pub tenants: Vec<TenantSpec>,
    /// Entitlement by max-min fair windows of this many seconds (a light tenant is entitled to
    /// what it asked for) instead of sharing each request among the tenants queued at that instant.
    #[serde(default)]
    pub fairness_window_s: Option<f64>,
}

fn default_seed() -> u64 {
    1
}

/// The pool and the provider behind it.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pool {
    /// fairgate's `max_concurrency` for the pool.
    pub capacity: u32,
    /// DRR quantum (tokens at weight 1); default as in config.toml.
    #[serde(default = "default_quantum")]
    pub quantum: u64,
    /// Base service time of a request, ms.
    pub service_ms: f64,
    /// Added service time per 1,000 actual tokens, ms.
    #[serde(default)]
    pub service_ms_per_1k_tokens: f64,
    /// The provider accepts this many concurrent requests and answers 429 beyond (optional).
    #[serde(default)]
    pub provider_capacity: Option<u32>,
    /// `Retry-After` the provider sends with its 429s, ms.
    #[serde(default = "default_retry_after")]
    pub provider_retry_after_ms: f64,
    /// Several deployments below the pool (`[[pool.endpoints]]`, see `sim::endpoints`); none:
    /// one provider as above.
    #[serde(default)]
    pub endpoints: Vec<super::endpoints::EndpointSpec>,
    /// Each service time is scaled by a uniform factor in [1 − jitter, 1 + jitter] (0.3: ±30%).
    /// With 0 every slot frees at once and a light tenant's share drops (see `docs/fairness.md`).
    #[serde(default)]
    pub service_jitter: f64,
    /// Round trip between fairgate and a closed-loop client, ms: its next request arrives this
    /// long after the answer (plus its think time), so the slot it frees goes to whoever waits.
    #[serde(default = "default_rtt")]
    pub client_rtt_ms: f64,
}

fn default_rtt() -> f64 {
    1.0
}

fn default_quantum() -> u64 {
    crate::scheduler::Config::default().quantum.0
}

fn default_retry_after() -> f64 {
    1000.0
}

/// One tenant (or a group of identical ones).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantSpec {
    /// Id (suffixed `-1`, `-2`, … when `replicas` > 1).
    pub id: String,
    /// Share weight.
    #[serde(default = "one")]
    pub weight: f64,
    /// Per-tenant concurrency cap.
    #[serde(default)]
    pub max_concurrency: Option<u32>,
    /// Number of identical tenants this entry stands for.
    #[serde(default = "one_u32")]
    pub replicas: u32,
    /// When requests arrive.
    pub arrivals: Arrivals,
    /// Actual cost of a request in tokens.
    pub cost: Dist,
    /// actual / estimated: 1 = exact estimates, 3–10 = chronic under-estimate.
    #[serde(default)]
    pub actual_over_estimate: Option<Dist>,
    /// Extra time, ms, each of its requests keeps its slot after the answer is ready: a client
    /// that reads slowly or not at all (in fairgate, cut at `[server] client_write_timeout_ms`).
    #[serde(default)]
    pub hold_ms: Option<Dist>,
    /// The tenant whose service `fairgate simulate` compares alone, under FIFO, under DRR and
    /// at the limit (its weight ×1000: near-strict priority, what a non-preemptive pool allows).
    #[serde(default)]
    pub victim: bool,
}

fn one() -> f64 {
    1.0
}

fn one_u32() -> u32 {
    1
}

/// An arrival process.
#[derive(Clone, Debug, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum Arrivals {
    /// `count` requests evenly spread over [start_s, start_s + over_s).
    Burst {
        count: u32,
        #[serde(default)]
        start_s: f64,
        over_s: f64,
    },
    /// Evenly spaced at `per_minute` from start_s to end_s (default: the whole run).
    Steady {
        per_minute: f64,
        #[serde(default)]
        start_s: f64,
        #[serde(default)]
        end_s: Option<f64>,
    },
    /// Poisson at `per_hour` from start_s to end_s (default: the whole run).
    Poisson {
        per_hour: f64,
        #[serde(default)]
        start_s: f64,
        #[serde(default)]
        end_s: Option<f64>,
    },
    /// A closed loop: `concurrency` clients, each sending its next request `think_ms` (plus the
    /// pool's `client_rtt_ms`) after its answer, from start_s to end_s: an agent with one request
    /// outstanding is `concurrency = 1, think_ms = 0`; a person reading is a think time of seconds.
    Closed {
        #[serde(default = "one_u32")]
        concurrency: u32,
        #[serde(default)]
        think_ms: Option<Dist>,
        #[serde(default)]
        start_s: f64,
        #[serde(default)]
        end_s: Option<f64>,
    },
}

/// A distribution of positive values.
#[derive(Clone, Debug, Deserialize)]
#[serde(tag = "dist", rename_all = "lowercase", deny_unknown_fields)]
pub enum Dist {
    /// Always `value`.
    Const { value: f64 },
    /// Uniform in [min, max].
    Uniform { min: f64, max: f64 },
    /// Log-normal with this median and sigma (of the log).
    Lognormal { median: f64, sigma: f64 },
}

impl Dist {
    /// One sample (at least `floor`).
    pub fn sample(&self, rng: &mut Rng, floor: f64) -> f64 {
        let v = match *self {
            Dist::Const { value } => value,
            Dist::Uniform { min, max } => rng.uniform(min, max),
            Dist::Lognormal { median, sigma } => median * (sigma * rng.normal()).exp(),
        };
        v.max(floor)
    }
}

impl Arrivals {
    /// Arrival times (ms) within [0, duration_s), in order; for a closed loop, its first
    /// requests (the rest follow answers, see `engine.rs`).
    pub fn times(&self, duration_s: f64, rng: &mut Rng) -> Vec<f64> {
        let end_of = |end: Option<f64>| end.unwrap_or(duration_s).min(duration_s) * 1000.0;
        let mut out = Vec::new();
        match *self {
            Arrivals::Burst {
                count,
                start_s,
                over_s,
            } => {
                let gap = over_s * 1000.0 / f64::from(count.max(1));
                out.extend((0..count).map(|i| start_s * 1000.0 + gap * f64::from(i)));
            }
            Arrivals::Steady {
                per_minute,
                start_s,
                end_s,
            } => {
                let gap = 60_000.0 / per_minute;
                let mut t = start_s * 1000.0;
                while t < end_of(end_s) && out.len() < MAX_REQUESTS {
                    out.push(t);
                    t += gap;
                }
            }
            Arrivals::Poisson {
                per_hour,
                start_s,
                end_s,
            } => {
                let mean = 3_600_000.0 / per_hour;
                let mut t = start_s * 1000.0 + rng.exponential(mean);
                while t < end_of(end_s) && out.len() < MAX_REQUESTS {
                    out.push(t);
                    t += rng.exponential(mean);
                }
            }
            Arrivals::Closed {
                concurrency,
                start_s,
                ..
            } => {
                // Staggered by a microsecond each so ties break by arrival, not by chance.
                out.extend((0..concurrency).map(|i| start_s * 1000.0 + f64::from(i) / 1000.0));
            }
        }
        out.retain(|&t| t < duration_s * 1000.0);
        out
    }
}

impl Arrivals {
    /// A closed loop's think time and end (ms), `None` for open-loop arrivals.
    pub fn closed(&self, duration_s: f64) -> Option<(Option<&Dist>, f64)> {
        match self {
            Arrivals::Closed {
                think_ms, end_s, ..
            } => Some((
                think_ms.as_ref(),
                end_s.unwrap_or(duration_s).min(duration_s) * 1000.0,
            )),
            _ => None,
        }
    }
}

/// Why a scenario file was refused.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The TOML did not parse or had an unknown/missing key.
    #[error("{0}")]
    Parse(String),
    /// A value out of range.
    #[error("invalid scenario: {0}")]
    Invalid(String),
}

impl Scenario {
    /// Reads and validates a scenario file.
    pub fn load(path: &Path) -> Result<Self, ScenarioError> {
        let text = std::fs::read_to_string(path).map_err(|source| ScenarioError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_toml(&text)
    }

    /// Parses and validates scenario TOML.
    pub fn from_toml(text: &str) -> Result<Self, ScenarioError> {
        let s: Scenario = toml::from_str(text).map_err(|e| ScenarioError::Parse(e.to_string()))?;
        s.validate()?;
        Ok(s)
    }

    fn validate(&self) -> Result<(), ScenarioError> {
        let bad = |m: String| Err(ScenarioError::Invalid(m));
        if !(self.duration_s > 0.0 && self.duration_s <= 30.0 * 86_400.0) {
            return bad("duration_s must be in (0, 30 days]".into());
        }
        if self.pool.capacity == 0
            || self.pool.service_ms.is_nan()
            || self.pool.service_ms <= 0.0
            || self.pool.quantum == 0
        {
            return bad("pool.capacity, pool.quantum and pool.service_ms must be > 0".into());
        }
        let jitter_ok = (0.0..1.0).contains(&self.pool.service_jitter);
        let rtt_ok = self.pool.client_rtt_ms >= 0.0 && self.pool.client_rtt_ms.is_finite();
        if !(jitter_ok && rtt_ok) {
            return bad("pool.service_jitter must be in [0, 1), pool.client_rtt_ms ≥ 0".into());
        }
        if self.tenants.is_empty() {
            return bad("at least one tenant".into());
        }
        for t in &self.tenants {
            if !(t.weight > 0.0 && t.weight.is_finite()) {
                return bad(format!("tenant {}: weight must be > 0", t.id));
            }
            if let Arrivals::Closed { concurrency, .. } = t.arrivals {
                if concurrency == 0 || concurrency > 10_000 {
                    return bad(format!("tenant {}: concurrency must be in 1..=10000", t.id));
                }
            }
            if t.replicas == 0 || t.replicas > 100_000 {
                return bad(format!("tenant {}: replicas must be in 1..=100000", t.id));
            }
        }
        Ok(())
    }
}
