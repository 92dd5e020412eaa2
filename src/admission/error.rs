//! Admission errors, and the `x-ratelimit-*` headers of limited tenants (added to every response
//! of such a tenant by [`super::headers`]).

use std::time::Duration;

use http::{header, HeaderName, HeaderValue, StatusCode};

use super::rate::{BucketState, Budget, RateState};
use crate::domain::Tokens;
use crate::error::ApiError;

/// Response header saying whose limit refused a request: `tenant`, `queue` or `upstream`.
pub const LIMIT_HEADER: &str = "x-fairgate-limit";

/// Why admission refused a request.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// The tenant's request bucket is empty.
    #[error("rate limit reached for requests per minute; retry after {}s", secs(*retry_after))]
    RequestRate {
        /// When a request fits again.
        retry_after: Duration,
    },
    /// One of the tenant's token buckets cannot cover its part of the request's estimate.
    #[error("rate limit reached for {budget} per minute; retry after {}s", secs(*retry_after))]
    TokenRate {
        /// The refusing budget.
        budget: Budget,
        /// When the estimate fits again.
        retry_after: Duration,
    },
    /// A part of one request's estimate exceeds its whole token bucket.
    #[error("request is estimated at {} {budget}, more than this tenant's budget of {burst} {budget}", cost.0)]
    TokenBurst {
        /// The budget.
        budget: Budget,
        /// The estimate.
        cost: Tokens,
        /// The bucket size.
        burst: u64,
    },
    /// Too many input tokens.
    #[error("request has about {estimated} input tokens; the limit is {max}")]
    InputTooLarge {
        /// Estimated input tokens.
        estimated: u64,
        /// The cap.
        max: u64,
    },
    /// `max_tokens` above the cap.
    #[error("max_tokens is {requested}; the limit is {max}")]
    OutputTooLarge {
        /// The request's `max_tokens`.
        requested: u64,
        /// The cap.
        max: u64,
    },
    /// Malformed deadline header.
    #[error("x-fairgate-deadline-ms must be a positive integer (milliseconds)")]
    BadDeadline,
    /// The predicted queue wait exceeds the deadline.
    #[error("the predicted wait ({} ms) exceeds the deadline ({} ms); retry after {}s",
        predicted.as_millis(), budget.as_millis(), secs(*predicted))]
    DeadlineInfeasible {
        /// Predicted wait.
        predicted: Duration,
        /// The budget.
        budget: Duration,
        /// `queue` or `upstream`.
        limit: &'static str,
    },
    /// The deadline passed while queued; the request was removed before dispatch.
    #[error("the request waited its whole deadline ({} ms) in the queue and was not sent upstream", budget.as_millis())]
    DeadlineExceeded {
        /// The budget.
        budget: Duration,
    },
}

/// Whole seconds, rounded up, at least 1 (Retry-After).
pub fn secs(d: Duration) -> u64 {
    let whole = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    whole.max(1)
}

impl ApiError for Error {
    fn status(&self) -> StatusCode {
        match self {
            Error::RequestRate { .. }
            | Error::TokenRate { .. }
            | Error::DeadlineInfeasible { .. } => StatusCode::TOO_MANY_REQUESTS,
            Error::DeadlineExceeded { .. } => StatusCode::GATEWAY_TIMEOUT,
            _ => StatusCode::BAD_REQUEST,
        }
    }
    fn kind(&self) -> &'static str {
        match self {
            Error::RequestRate { .. } => "requests",
            Error::TokenRate { .. } => "tokens",
            Error::DeadlineInfeasible { .. } | Error::DeadlineExceeded { .. } => "server_error",
            _ => "invalid_request_error",
        }
    }
    fn code(&self) -> &'static str {
        match self {
            Error::RequestRate { .. } | Error::TokenRate { .. } => "rate_limit_exceeded",
            Error::TokenBurst { .. } => "request_exceeds_token_budget",
            Error::InputTooLarge { .. } => "context_length_exceeded",
            Error::OutputTooLarge { .. } => "max_tokens_too_large",
            Error::BadDeadline => "invalid_deadline",
            Error::DeadlineInfeasible { .. } => "deadline_infeasible",
            Error::DeadlineExceeded { .. } => "deadline_exceeded",
        }
    }
    fn headers(&self) -> Vec<(HeaderName, HeaderValue)> {
        let (wait, limit) = match self {
            Error::RequestRate { retry_after } | Error::TokenRate { retry_after, .. } => {
                (*retry_after, "tenant")
            }
            Error::DeadlineInfeasible {
                predicted, limit, ..
            } => (*predicted, *limit),
            _ => return Vec::new(),
        };
        vec![
            (header::RETRY_AFTER, HeaderValue::from(secs(wait))),
            (
                HeaderName::from_static(LIMIT_HEADER),
                HeaderValue::from_static(limit),
            ),
        ]
    }
}

/// OpenAI's `x-ratelimit-{limit,remaining,reset}-{requests,tokens}` for the configured buckets,
/// and the same trio for `input-tokens` and `output-tokens` when those budgets are configured.
pub fn rate_headers(state: &RateState) -> Vec<(HeaderName, HeaderValue)> {
    let mut h = Vec::with_capacity(12);
    let tokens = Budget::ALL.map(|b| (b.header_name(), state.budget(b)));
    for (kind, bucket) in std::iter::once(("requests", state.requests)).chain(tokens) {
        let Some(BucketState {
            limit,
            remaining,
            reset,
        }) = bucket
        else {
            continue;
        };
        let name = |what: &str| {
            HeaderName::from_bytes(format!("x-ratelimit-{what}-{kind}").as_bytes())
                .expect("static header name")
        };
        h.push((name("limit"), HeaderValue::from(limit)));
        h.push((name("remaining"), HeaderValue::from(remaining)));
        let reset = if reset < Duration::from_secs(1) {
            format!("{}ms", reset.as_millis())
        } else {
            format!("{:.3}s", reset.as_secs_f64())
        };
        h.push((name("reset"), HeaderValue::from_str(&reset).expect("ascii")));
    }
    h
}
