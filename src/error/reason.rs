//! The typed answers to the questions stages ask of another stage's refusal: why it was
//! ([`Reason`], the metrics label) and whose limit it was ([`Limit`], `x-fairgate-limit`).

use std::fmt;

use http::{HeaderName, HeaderValue};

use super::LIMIT_HEADER;

/// Whose limit refused a request: the value of `x-fairgate-limit` (and of the `limit` field of
/// the log line and the `fairgate.limit` span attribute).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Limit {
    /// The tenant's own quota (rate limits, job limits).
    Tenant,
    /// fairgate's queues (full, or too slow for the deadline).
    Queue,
    /// The provider's capacity (its 429s, paused keys, no endpoint).
    Upstream,
    /// A spent token or USD budget (`budgets`).
    Budget,
}

impl Limit {
    /// Every limit.
    pub const ALL: [Limit; 4] = [Limit::Tenant, Limit::Queue, Limit::Upstream, Limit::Budget];

    /// The header value.
    pub const fn as_str(self) -> &'static str {
        match self {
            Limit::Tenant => "tenant",
            Limit::Queue => "queue",
            Limit::Upstream => "upstream",
            Limit::Budget => "budget",
        }
    }

    /// The limit a response's `x-fairgate-limit` names, if any.
    pub fn of(headers: &http::HeaderMap) -> Option<Limit> {
        let v = headers.get(LIMIT_HEADER)?;
        Limit::ALL
            .into_iter()
            .find(|l| v.as_bytes() == l.as_str().as_bytes())
    }

    /// The header, ready to insert.
    pub fn header(self) -> (HeaderName, HeaderValue) {
        (LIMIT_HEADER, HeaderValue::from_static(self.as_str()))
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why fairgate refused a request, or ended its answer early: the `reason` label of
/// `fairgate_rejected_total` (and of the live console, the log line and the spans). Stages ask
/// questions of it ([`Reason::deferrable`], [`Reason::deadline_miss`]), never of its text.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    /// No valid API key (or sidecar header).
    Auth,
    /// Refused by the operations endpoints (admin API).
    Admin,
    /// The request itself is malformed.
    BadRequest,
    /// The client did not send its body in time.
    BodyTimeout,
    /// No such resource (a job, a file, a disabled endpoint).
    NotFound,
    /// No pool serves the model.
    NoRoute,
    /// The tenant's job limits.
    JobLimit,
    /// The job store failed.
    JobStore,
    /// The tenant's request bucket is empty.
    RequestRate,
    /// The tenant's token bucket cannot cover the estimate.
    TokenRate,
    /// The tenant's input-token bucket cannot cover the estimate.
    InputTokenRate,
    /// The tenant's output-token bucket cannot cover the estimate.
    OutputTokenRate,
    /// One request's estimate exceeds a whole bucket.
    TokenBurst,
    /// Too many input tokens.
    InputTooLarge,
    /// The output cap is above the limit.
    OutputTooLarge,
    /// The predicted wait exceeds the deadline.
    DeadlineInfeasible,
    /// The deadline passed while queued.
    DeadlineExceeded,
    /// The tenant's queue is full.
    TenantQueueFull,
    /// The pool's queue is full.
    PoolQueueFull,
    /// The tenant's queued bytes are at their cap.
    TenantQueueBytes,
    /// The pool's queued bytes are at their cap.
    PoolQueueBytes,
    /// The tenant is unknown to the queue.
    UnknownTenant,
    /// No endpoint of the pool can take the request.
    NoEndpoint,
    /// The tenant's own provider key is paused.
    UpstreamKeyPaused,
    /// The provider failed (connect, TLS, timeout, bad answer).
    UpstreamError,
    /// The provider's 429, passed on after retries.
    Upstream429,
    /// A bug.
    Internal,
    /// fairgate ended a stream at the tenant's stream limit or budget (`usage`).
    StreamBudget,
    /// The client stopped reading and the response was dropped (`server::stall`).
    ClientStalled,
    /// A spent day or month budget (`budget`).
    Budget,
    /// Cluster mode: Redis, which holds the budgets, did not answer (they fail closed).
    BudgetStore,
}

impl Reason {
    /// The label.
    pub const fn as_str(self) -> &'static str {
        match self {
            Reason::Auth => "auth",
            Reason::Admin => "admin",
            Reason::BadRequest => "bad_request",
            Reason::BodyTimeout => "body_timeout",
            Reason::NotFound => "not_found",
            Reason::NoRoute => "no_route",
            Reason::JobLimit => "job_limit",
            Reason::JobStore => "job_store",
            Reason::RequestRate => "request_rate",
            Reason::TokenRate => "token_rate",
            Reason::InputTokenRate => "input_token_rate",
            Reason::OutputTokenRate => "output_token_rate",
            Reason::TokenBurst => "token_burst",
            Reason::InputTooLarge => "input_too_large",
            Reason::OutputTooLarge => "output_too_large",
            Reason::DeadlineInfeasible => "deadline_infeasible",
            Reason::DeadlineExceeded => "deadline_exceeded",
            Reason::TenantQueueFull => "tenant_queue_full",
            Reason::PoolQueueFull => "pool_queue_full",
            Reason::TenantQueueBytes => "tenant_queue_bytes",
            Reason::PoolQueueBytes => "pool_queue_bytes",
            Reason::UnknownTenant => "unknown_tenant",
            Reason::NoEndpoint => "no_endpoint",
            Reason::UpstreamKeyPaused => "upstream_key_paused",
            Reason::UpstreamError => "upstream_error",
            Reason::Upstream429 => "upstream_429",
            Reason::Internal => "internal",
            Reason::StreamBudget => "stream_budget",
            Reason::ClientStalled => "client_stalled",
            Reason::Budget => "budget",
            Reason::BudgetStore => "budget_store",
        }
    }

    /// Whether a job may wait instead (`Prefer: respond-async, wait`): the queue is full, or
    /// the deadline cannot be met.
    pub const fn deferrable(self) -> bool {
        matches!(
            self,
            Reason::TenantQueueFull
                | Reason::PoolQueueFull
                | Reason::DeadlineInfeasible
                | Reason::DeadlineExceeded
        )
    }

    /// Whether the request was refused for its deadline (`fairgate_deadline_misses_total`).
    pub const fn deadline_miss(self) -> bool {
        matches!(self, Reason::DeadlineInfeasible | Reason::DeadlineExceeded)
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
