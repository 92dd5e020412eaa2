//! The jobs stage's errors (async requests, files, batches).

use http::StatusCode;

use crate::error::{ApiError, Limit, Reason};

/// Why a jobs request is refused.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No such job, file or batch for this tenant (another tenant's id is also "not found").
    #[error("no such {0}")]
    NotFound(&'static str),
    /// `stream: true` cannot be answered later.
    #[error("`stream: true` cannot be combined with `Prefer: respond-async`: a job's result is stored and fetched whole; send the request without `stream`, or without `respond-async`")]
    Stream,
    /// The tenant's queued jobs or stored bytes are at `[jobs]`'s limit.
    #[error("{what} limit of this tenant reached ({limit}); retry when earlier jobs finish")]
    Limit {
        /// Which limit.
        what: &'static str,
        /// Its value.
        limit: u64,
    },
    /// The tenant's request bucket (`requests_per_minute`) is empty: every files and batches
    /// call takes one request of it.
    #[error("rate limit reached for requests per minute; retry after {}s", crate::error::secs(*retry_after))]
    RequestRate {
        /// When a request fits again.
        retry_after: std::time::Duration,
    },
    /// A malformed request to the files or batches API.
    #[error("{message}")]
    Invalid {
        /// What is wrong.
        message: String,
        /// The field at fault.
        param: Option<&'static str>,
    },
    /// An upload larger than `[jobs] max_file_bytes`.
    #[error("the file is larger than {0} bytes (max_file_bytes)")]
    TooLarge(u64),
    /// The method is not allowed on this path.
    #[error("method not allowed")]
    Method,
    /// `[jobs]` is not configured.
    #[error(
        "asynchronous jobs and batches are not enabled on this server ([jobs] is not configured)"
    )]
    Disabled,
    /// The job store failed.
    #[error("job store error")]
    Store(super::store::StoreError),
    /// A job's answer could not be read whole (stored as the job's result, never sent).
    #[error("the answer could not be read whole")]
    Unreadable,
}

impl Error {
    /// An invalid request naming `param`.
    pub fn invalid(message: impl Into<String>, param: Option<&'static str>) -> Self {
        Error::Invalid {
            message: message.into(),
            param,
        }
    }
}

impl From<super::store::StoreError> for Error {
    fn from(e: super::store::StoreError) -> Self {
        match e {
            super::store::StoreError::Limit { what, limit } => Error::Limit { what, limit },
            e => Error::Store(e),
        }
    }
}

impl ApiError for Error {
    fn status(&self) -> StatusCode {
        match self {
            Error::NotFound(_) | Error::Disabled => StatusCode::NOT_FOUND,
            Error::Stream | Error::Invalid { .. } => StatusCode::BAD_REQUEST,
            Error::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Error::Limit { .. } | Error::RequestRate { .. } => StatusCode::TOO_MANY_REQUESTS,
            Error::Method => StatusCode::METHOD_NOT_ALLOWED,
            Error::Store(super::store::StoreError::Redis) => StatusCode::SERVICE_UNAVAILABLE,
            Error::Store(_) => StatusCode::INTERNAL_SERVER_ERROR,
            Error::Unreadable => StatusCode::BAD_GATEWAY,
        }
    }
    fn kind(&self) -> &'static str {
        match self {
            // fairgate's 429s share OpenAI's rate-limit `type` (see `error::Error::all_headers`).
            Error::Limit { .. } | Error::RequestRate { .. } => "requests",
            Error::Store(_) | Error::Unreadable => "server_error",
            _ => "invalid_request_error",
        }
    }
    fn code(&self) -> &'static str {
        match self {
            Error::NotFound(_) | Error::Disabled => "not_found",
            Error::Stream => "stream_not_async",
            Error::Limit { .. } => "job_limit_exceeded",
            Error::RequestRate { .. } => "rate_limit_exceeded",
            Error::Invalid { .. } => "invalid_request",
            Error::TooLarge(_) => "file_too_large",
            Error::Method => "method_not_allowed",
            Error::Store(super::store::StoreError::Redis) => "job_store_unavailable",
            Error::Store(_) => "internal_error",
            Error::Unreadable => "job_result_unreadable",
        }
    }
    fn param(&self) -> Option<&str> {
        match self {
            Error::Stream => Some("stream"),
            Error::Invalid { param, .. } => *param,
            Error::TooLarge(_) => Some("file"),
            _ => None,
        }
    }
    fn limit(&self) -> Option<Limit> {
        matches!(self, Error::Limit { .. } | Error::RequestRate { .. }).then_some(Limit::Tenant)
    }
    fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            Error::RequestRate { retry_after } => Some(*retry_after),
            _ => None,
        }
    }
    fn reason(&self) -> Reason {
        match self {
            Error::Limit { .. } => Reason::JobLimit,
            Error::RequestRate { .. } => Reason::RequestRate,
            Error::Store(_) => Reason::JobStore,
            Error::Unreadable => Reason::Internal,
            Error::NotFound(_) | Error::Disabled => Reason::NotFound,
            _ => Reason::BadRequest,
        }
    }
    fn never_sent(&self) -> bool {
        // An unreadable answer came from the provider.
        !matches!(self, Error::Unreadable)
    }
}
