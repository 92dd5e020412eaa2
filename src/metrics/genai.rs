//! OpenTelemetry's GenAI client metrics in their Prometheus form, for every request fairgate
//! sent to a provider: `gen_ai_client_operation_duration_seconds` (histogram, dispatch to the
//! end of the answer — the upstream call, as the client span measures it — with `error_type`
//! when it failed) and `gen_ai_client_token_usage` (histogram of the provider's reported input
//! and output tokens per request, `gen_ai_token_type`). Labels are the conventions' attributes
//! with `_` for `.`: `gen_ai_operation_name`, `gen_ai_provider_name`, `gen_ai_request_model`,
//! `server_address`, `server_port`; buckets are the conventions' own.
//!
//! Invariants: labels are static strings, the pool's peer (from the config) and the model's
//! bounded label; at most [`MAX_MODELS`] models per operation and pool, then `other`. Handles
//! are registered once per label set and found again by a short scan under one lock: no label
//! string is built per request.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use metrics::{Histogram, Key, Label, Recorder, SharedString};
use metrics_exporter_prometheus::PrometheusRecorder;

use super::META;
use crate::config::Config;
use crate::context::Endpoint;
use crate::domain::Charge;
use crate::otel::semconv::{self, Peer};

/// The token usage family.
pub const TOKEN_USAGE: &str = "gen_ai_client_token_usage";
/// The operation duration family.
pub const DURATION: &str = "gen_ai_client_operation_duration_seconds";
/// `gen_ai.client.token.usage`'s bucket boundaries.
pub const TOKEN_BUCKETS: [f64; 14] = [
    1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0,
    16777216.0, 67108864.0,
];
/// `gen_ai.client.operation.duration`'s bucket boundaries, seconds.
pub const DURATION_BUCKETS: [f64; 14] = [
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
];
/// Distinct request models per operation and pool; further ones are `other`.
pub const MAX_MODELS: usize = 64;

/// One label set's handles.
struct Series {
    operation: &'static str,
    pool: usize,
    endpoint: usize,
    model: Box<str>,
    error: Option<&'static str>,
    duration: Histogram,
    input: Histogram,
    output: Histogram,
}

/// The GenAI client metrics of one configuration generation (the registry is shared).
pub struct GenAi {
    recorder: Arc<PrometheusRecorder>,
    /// The peer of each pool's endpoints (by index); `None` when its URL has no host.
    peers: Vec<Vec<Option<Peer>>>,
    series: Mutex<Vec<Series>>,
}

/// One finished upstream call.
pub struct Call<'a> {
    /// The endpoint.
    pub endpoint: Endpoint,
    /// The pool it was sent to.
    pub pool: usize,
    /// The endpoint of the pool that answered (its index).
    pub endpoint_index: usize,
    /// The request model, as labelled (bounded).
    pub model: &'a str,
    /// Dispatch to the end of the answer.
    pub duration: Duration,
    /// `error.type`, when it failed.
    pub error: Option<&'static str>,
    /// The provider's reported usage, if it reported one.
    pub usage: Option<Charge>,
}

impl GenAi {
    /// The metrics of `config`'s pools in `recorder`.
    pub fn new(recorder: Arc<PrometheusRecorder>, config: &Config) -> Self {
        Self {
            recorder,
            peers: config
                .upstreams
                .iter()
                .map(|u| {
                    u.endpoints
                        .iter()
                        .map(|e| Peer::of_url(&e.base_url))
                        .collect()
                })
                .collect(),
            series: Mutex::default(),
        }
    }

    /// The peer of endpoint `endpoint` of pool `pool`.
    pub fn peer(&self, pool: usize, endpoint: usize) -> Option<&Peer> {
        self.peers.get(pool)?.get(endpoint)?.as_ref()
    }

    /// Records one finished upstream call.
    pub fn record(&self, call: &Call<'_>) {
        let operation = semconv::operation(call.endpoint);
        let mut series = self.series.lock().unwrap_or_else(|p| p.into_inner());
        let found = series.iter().position(|s| {
            s.operation == operation
                && s.pool == call.pool
                && s.endpoint == call.endpoint_index
                && s.error == call.error
                && *s.model == *call.model
        });
        let i = match found {
            Some(i) => i,
            None => {
                let here = |s: &&Series| s.operation == operation && s.pool == call.pool;
                let mut named: Vec<&str> = Vec::new();
                for s in series.iter().filter(here) {
                    if &*s.model != "other" && !named.contains(&&*s.model) {
                        named.push(&s.model);
                    }
                }
                let model = if named.contains(&call.model) || named.len() < MAX_MODELS {
                    call.model
                } else {
                    "other"
                };
                let again = series.iter().position(|s| {
                    here(&s)
                        && s.endpoint == call.endpoint_index
                        && s.error == call.error
                        && *s.model == *model
                });
                match again {
                    Some(i) => i,
                    None => {
                        let s = self.register(operation, call, model);
                        series.push(s);
                        series.len() - 1
                    }
                }
            }
        };
        let s = &series[i];
        s.duration.record(call.duration.as_secs_f64());
        if let Some(u) = call.usage {
            s.input.record(u.input as f64);
            s.output.record(u.output as f64);
        }
    }

    fn register(&self, operation: &'static str, call: &Call<'_>, model: &str) -> Series {
        let (pool, endpoint, error) = (call.pool, call.endpoint_index, call.error);
        let mut labels = vec![
            Label::new("gen_ai_operation_name", operation),
            Label::new("gen_ai_request_model", SharedString::from(model.to_owned())),
        ];
        if let Some(p) = self.peer(pool, endpoint) {
            labels.push(Label::new("gen_ai_provider_name", p.provider));
            labels.push(Label::new(
                "server_address",
                SharedString::from(p.address.clone()),
            ));
            labels.push(Label::new(
                "server_port",
                SharedString::from(p.port.to_string()),
            ));
        } else {
            labels.push(Label::new("gen_ai_provider_name", "openai"));
        }
        let tokens = |kind: &'static str| {
            let mut l = labels.clone();
            l.push(Label::new("gen_ai_token_type", kind));
            self.recorder
                .register_histogram(&Key::from_parts(TOKEN_USAGE, l), &META)
        };
        let (input, output) = (tokens("input"), tokens("output"));
        if let Some(e) = error {
            labels.push(Label::new("error_type", e));
        }
        let duration = self
            .recorder
            .register_histogram(&Key::from_parts(DURATION, labels), &META);
        Series {
            operation,
            pool,
            endpoint,
            model: model.into(),
            error,
            duration,
            input,
            output,
        }
    }
}

/// `error.type` of an HTTP status fairgate passed on without a reason of its own.
pub fn status_error(status: u16) -> &'static str {
    match status {
        400 => "400",
        401 => "401",
        403 => "403",
        404 => "404",
        408 => "408",
        409 => "409",
        413 => "413",
        422 => "422",
        429 => "429",
        500 => "500",
        502 => "502",
        503 => "503",
        504 => "504",
        _ => "_OTHER",
    }
}
