//! The request path's error type: a leaf that knows no stage.
//!
//! Each stage owns a `thiserror` enum (its doc comment is the message) and implements
//! [`ApiError`] for it: status, OpenAI `type` and `code`, extra headers, the typed [`Reason`]
//! (the metrics label, and what other stages may ask of it: deferrable? a deadline miss?), the
//! typed [`Limit`], and whether the request never reached the provider. A stage returns `Err(e.into())`;
//! [`Error`] wraps any such error behind the trait, so no stage matches on another stage's
//! variants. The outermost layer (`render`) turns an [`Error`] into OpenAI's error shape — the
//! one place an error becomes HTTP; [`openai_json`] is the one writer of that shape (a stream
//! cut by `usage` ends with it too).
//!
//! Invariant: an error message never contains an API key or prompt text.

use std::fmt;

use http::{HeaderName, HeaderValue, StatusCode};

mod reason;
pub use reason::{Limit, Reason};

/// Response header saying whose limit refused a request: `tenant`, `queue` or `upstream`.
pub const LIMIT_HEADER: http::HeaderName = http::HeaderName::from_static("x-fairgate-limit");

/// How a stage's error presents itself to an OpenAI client, to metrics and to admission.
pub trait ApiError: std::error::Error + Send + Sync + 'static {
    /// The HTTP status.
    fn status(&self) -> StatusCode;
    /// OpenAI's `error.type`, e.g. `invalid_request_error`.
    fn kind(&self) -> &'static str;
    /// OpenAI's `error.code`, e.g. `invalid_api_key`.
    fn code(&self) -> &'static str;
    /// OpenAI's `error.param`: the request field at fault, if one is.
    fn param(&self) -> Option<&str> {
        None
    }
    /// Whose limit refused the request (`x-fairgate-limit`), if it was a limit.
    fn limit(&self) -> Option<Limit> {
        None
    }
    /// When the client may retry: rendered as `Retry-After` (whole seconds, rounded up) and
    /// `retry-after-ms` (which the OpenAI SDKs prefer).
    fn retry_after(&self) -> Option<std::time::Duration> {
        None
    }
    /// Extra response headers.
    fn headers(&self) -> Vec<(HeaderName, HeaderValue)> {
        Vec::new()
    }
    /// Why the request was refused (the `reason` label of `fairgate_rejected_total`).
    fn reason(&self) -> Reason;
    /// Whether the request certainly never reached the provider (so what admission charged it
    /// is given back in full).
    fn never_sent(&self) -> bool {
        false
    }
    /// Whether the endpoint the request was sent to failed it (connect or TLS error, no
    /// response head in time): a health failure of that endpoint, and a reason to fail over.
    fn endpoint_failed(&self) -> bool {
        false
    }
}

/// Any error a request can end with: a stage's [`ApiError`], plus headers that stages above
/// the one that failed add on its way out (e.g. the tenant's `x-ratelimit-*`).
pub struct Error {
    inner: Box<dyn ApiError>,
    extra: Vec<(HeaderName, HeaderValue)>,
}

impl<E: ApiError> From<E> for Error {
    fn from(e: E) -> Self {
        Self {
            inner: Box::new(e),
            extra: Vec::new(),
        }
    }
}

impl Error {
    /// A bug: a stage panicked, or found a context field that the stage above it must have
    /// written missing (a misordered stack). Logged once, here, and answered 500.
    pub fn internal(what: &'static str) -> Self {
        tracing::error!(target: "fairgate::bug", error = what, "internal error");
        Internal(what).into()
    }

    /// The stage's error.
    pub fn api(&self) -> &dyn ApiError {
        &*self.inner
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        self.inner.status()
    }

    /// Why the request was refused.
    pub fn reason(&self) -> Reason {
        self.inner.reason()
    }

    /// Whose limit refused the request, if any.
    pub fn limit(&self) -> Option<Limit> {
        self.inner.limit()
    }

    /// Whether the request certainly never reached the provider.
    pub fn never_sent(&self) -> bool {
        self.inner.never_sent()
    }

    /// See [`ApiError::endpoint_failed`].
    pub fn endpoint_failed(&self) -> bool {
        self.inner.endpoint_failed()
    }

    /// Adds headers to the eventual response (replacing none of the stage's own).
    pub fn with_headers(
        mut self,
        headers: impl IntoIterator<Item = (HeaderName, HeaderValue)>,
    ) -> Self {
        self.extra.extend(headers);
        self
    }

    /// Every header of the eventual response beyond content type: `Retry-After` and
    /// `retry-after-ms`, the stage's own, the `x-fairgate-limit`, then what stages above added.
    /// A wait longer than [`SDK_MAX_RETRY_WAIT`] also says `x-should-retry: false`: the OpenAI
    /// SDKs honour `Retry-After` only up to 60 s and would retry early, in vain.
    pub fn all_headers(&self) -> Vec<(HeaderName, HeaderValue)> {
        let mut h = Vec::new();
        let own = self.inner.headers();
        if let Some(wait) = self.inner.retry_after() {
            h.extend(retry_headers(wait));
            if wait > SDK_MAX_RETRY_WAIT && !own.iter().any(|(k, _)| k == SHOULD_RETRY) {
                h.push((
                    HeaderName::from_static(SHOULD_RETRY),
                    HeaderValue::from_static("false"),
                ));
            }
        }
        h.extend(own);
        if let Some(limit) = self.inner.limit() {
            h.push(limit.header());
        }
        h.extend(self.extra.iter().cloned());
        h
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Error")
            .field("status", &self.status())
            .field("code", &self.inner.code())
            .field("message", &self.inner.to_string())
            .finish()
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.inner, f)
    }
}

impl std::error::Error for Error {}

/// A bug (see [`Error::internal`]).
#[derive(Debug, thiserror::Error)]
#[error("internal error: {0}")]
pub struct Internal(pub &'static str);

impl ApiError for Internal {
    fn status(&self) -> StatusCode {
        StatusCode::INTERNAL_SERVER_ERROR
    }
    fn kind(&self) -> &'static str {
        "server_error"
    }
    fn code(&self) -> &'static str {
        "internal_error"
    }
    fn reason(&self) -> Reason {
        Reason::Internal
    }
}

/// `api` in OpenAI's error shape, `{"error":{"message","type","param","code"}}`: the one writer
/// of it (the error response, and the last event of a stream `usage` cut).
pub fn openai_json(api: &dyn ApiError) -> Vec<u8> {
    let body = serde_json::json!({
        "error": {
            "message": api.to_string(),
            "type": api.kind(),
            "code": api.code(),
            "param": api.param(),
        }
    });
    serde_json::to_vec(&body).unwrap_or_default()
}

/// Response header the OpenAI SDKs obey before anything else: `false`, do not retry.
pub const SHOULD_RETRY: &str = "x-should-retry";

/// The longest `Retry-After` the OpenAI SDKs wait for (a longer one they replace by their own
/// short backoff).
pub const SDK_MAX_RETRY_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Response header: the wait in milliseconds, beside `Retry-After` (the OpenAI SDKs read it
/// first).
pub const RETRY_AFTER_MS: &str = "retry-after-ms";

/// `Retry-After` (whole seconds, rounded up, at least 1) and `retry-after-ms` for `wait`.
pub fn retry_headers(wait: std::time::Duration) -> [(HeaderName, HeaderValue); 2] {
    let ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX).max(1);
    [
        (http::header::RETRY_AFTER, HeaderValue::from(secs(wait))),
        (
            HeaderName::from_static(RETRY_AFTER_MS),
            HeaderValue::from(ms),
        ),
    ]
}

/// Whole seconds, rounded up, at least 1 (`Retry-After`).
pub fn secs(d: std::time::Duration) -> u64 {
    let whole = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    whole.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("slow down")]
    struct Limited(std::time::Duration);

    /// The rate refusal of these tests: a wait of 2.5 s.
    const LIMITED: Limited = Limited(std::time::Duration::from_millis(2500));

    impl ApiError for Limited {
        fn status(&self) -> StatusCode {
            StatusCode::TOO_MANY_REQUESTS
        }
        fn kind(&self) -> &'static str {
            "requests"
        }
        fn code(&self) -> &'static str {
            "rate_limit_exceeded"
        }
        fn limit(&self) -> Option<Limit> {
            Some(Limit::Tenant)
        }
        fn retry_after(&self) -> Option<std::time::Duration> {
            Some(self.0)
        }
        fn reason(&self) -> Reason {
            Reason::RequestRate
        }
        fn never_sent(&self) -> bool {
            true
        }
    }

    #[test]
    fn wraps_any_stage_error_through_the_trait() {
        let e: Error = LIMITED.into();
        assert_eq!(e.status(), 429);
        assert_eq!(e.reason(), Reason::RequestRate);
        assert_eq!(e.reason().as_str(), "request_rate");
        assert!(e.never_sent());
        let e = e.with_headers([(
            HeaderName::from_static("x-ratelimit-limit-requests"),
            HeaderValue::from(10),
        )]);
        let names: Vec<String> = e.all_headers().iter().map(|(k, _)| k.to_string()).collect();
        assert_eq!(
            names,
            [
                "retry-after",
                RETRY_AFTER_MS,
                LIMIT_HEADER.as_str(),
                "x-ratelimit-limit-requests"
            ]
        );
        let values: Vec<String> = e
            .all_headers()
            .iter()
            .map(|(_, v)| v.to_str().unwrap().to_owned())
            .collect();
        assert_eq!(values[..2], ["3", "2500"]);
        let bug = Error::internal("x");
        assert_eq!(bug.status(), 500);
        assert!(!bug.never_sent());
        assert_eq!(bug.to_string(), "internal error: x");
    }

    #[test]
    fn reasons_say_whether_they_defer_or_miss_a_deadline() {
        assert!(Reason::PoolQueueFull.deferrable() && !Reason::PoolQueueFull.deadline_miss());
        assert!(Reason::DeadlineExceeded.deferrable() && Reason::DeadlineExceeded.deadline_miss());
        assert!(!Reason::TenantQueueBytes.deferrable());
        assert!(!Reason::RequestRate.deferrable() && !Reason::RequestRate.deadline_miss());
        assert_eq!(Reason::Upstream429.to_string(), "upstream_429");
    }

    #[test]
    fn a_limit_is_read_back_from_its_header() {
        let mut h = http::HeaderMap::new();
        assert_eq!(Limit::of(&h), None);
        for l in Limit::ALL {
            let (k, v) = l.header();
            h.insert(k, v);
            assert_eq!(Limit::of(&h), Some(l));
        }
        h.insert(LIMIT_HEADER, HeaderValue::from_static("other"));
        assert_eq!(Limit::of(&h), None);
    }

    #[test]
    fn the_openai_shape_has_message_type_code_and_param() {
        let v: serde_json::Value = serde_json::from_slice(&openai_json(&LIMITED)).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"error": {"message": "slow down", "type": "requests",
                "code": "rate_limit_exceeded", "param": null}})
        );
    }

    #[test]
    fn a_wait_past_what_the_sdks_honour_says_do_not_retry() {
        use std::time::Duration;
        let says = |wait| {
            Error::from(Limited(wait))
                .all_headers()
                .iter()
                .filter(|(k, _)| k == SHOULD_RETRY)
                .map(|(_, v)| v.to_str().unwrap().to_owned())
                .collect::<Vec<_>>()
        };
        assert_eq!(says(Duration::from_secs(75)), ["false"]);
        assert!(says(Duration::from_secs(60)).is_empty());
        assert!(says(Duration::from_secs(2)).is_empty());
    }

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        use std::time::Duration;
        assert_eq!(secs(Duration::from_millis(1)), 1);
        assert_eq!(secs(Duration::from_millis(2500)), 3);
        assert_eq!(secs(Duration::from_secs(4)), 4);
    }
}
