//! Admission errors: what the gate refuses, with the limit that refused it and an honest
//! `Retry-After`.

use std::time::Duration;

use http::StatusCode;

use crate::domain::Tokens;
use crate::error::{secs, ApiError, Limit, Reason};
use crate::ratelimit::Budget;

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
    /// The output cap (times the choices) above the limit.
    #[error("the request may generate {requested} output tokens (its output cap times n/best_of and prompts); the limit is {max}")]
    OutputTooLarge {
        /// The request's output cap times its choices.
        requested: u64,
        /// The cap.
        max: u64,
        /// The field to blame: the governing cap alias, or `n`/`best_of`/`prompt`.
        param: &'static str,
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
        /// [`Limit::Queue`] or [`Limit::Upstream`].
        limit: Limit,
    },
}

impl ApiError for Error {
    fn status(&self) -> StatusCode {
        match self {
            Error::RequestRate { .. }
            | Error::TokenRate { .. }
            | Error::DeadlineInfeasible { .. } => StatusCode::TOO_MANY_REQUESTS,
            _ => StatusCode::BAD_REQUEST,
        }
    }
    fn kind(&self) -> &'static str {
        match self {
            Error::RequestRate { .. } => "requests",
            Error::TokenRate { .. } => "tokens",
            // A 429 like every other of fairgate's: OpenAI's rate-limit `type`.
            Error::DeadlineInfeasible { .. } => "requests",
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
        }
    }
    fn param(&self) -> Option<&str> {
        match self {
            Error::OutputTooLarge { param, .. } => Some(param),
            _ => None,
        }
    }
    fn limit(&self) -> Option<Limit> {
        match self {
            Error::RequestRate { .. } | Error::TokenRate { .. } => Some(Limit::Tenant),
            Error::DeadlineInfeasible { limit, .. } => Some(*limit),
            _ => None,
        }
    }
    fn retry_after(&self) -> Option<Duration> {
        match self {
            Error::RequestRate { retry_after } | Error::TokenRate { retry_after, .. } => {
                Some(*retry_after)
            }
            Error::DeadlineInfeasible { predicted, .. } => Some(*predicted),
            _ => None,
        }
    }
    fn reason(&self) -> Reason {
        match self {
            Error::RequestRate { .. } => Reason::RequestRate,
            Error::TokenRate { budget, .. } => match budget {
                Budget::Tokens => Reason::TokenRate,
                Budget::Input => Reason::InputTokenRate,
                Budget::Output => Reason::OutputTokenRate,
            },
            Error::TokenBurst { .. } => Reason::TokenBurst,
            Error::InputTooLarge { .. } => Reason::InputTooLarge,
            Error::OutputTooLarge { .. } => Reason::OutputTooLarge,
            Error::BadDeadline => Reason::BadRequest,
            Error::DeadlineInfeasible { .. } => Reason::DeadlineInfeasible,
        }
    }
}
