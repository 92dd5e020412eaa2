//! Building the mock's responses: shared per-server state (prebuilt bodies and headers), the
//! OpenAI-shaped error replies (429 with retry headers, `x-mock-status`), and embeddings.
//!
//! Invariants: every error body is `{"error":{"message","type","param","code"}}`; every refusal
//! (429, and the `vllm` profile's 503) carries `Retry-After` in the profile's style (see
//! `limits.rs`), and every 429 `x-ratelimit-remaining-requests: 0`; the models list and the
//! overload body are built once per server.

use std::sync::Arc;

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE};
use http::{Response, StatusCode};

use super::body::MockBody;
use super::format;
use super::limits::{self, Buckets};
use super::profile::Profile;
use super::request::EmbeddingsRequest;
use super::stats::{InFlightGuard, MockStats};
use super::MockConfig;

/// The content type of every JSON reply.
pub(crate) const JSON: &str = "application/json";

/// Largest request body the mock reads.
pub const MAX_BODY_BYTES: usize = 16 * 1024 * 1024;
/// Dimensions of an embedding when the request does not choose (`dimensions` caps at 4096).
pub const DEFAULT_EMBEDDING_DIMS: usize = 16;

/// State shared by every connection of one mock server; built once at start.
#[derive(Debug)]
pub(crate) struct Shared {
    pub cfg: MockConfig,
    pub stats: Arc<MockStats>,
    pub models: Bytes,
    pub too_many: Bytes,
    /// The rate-limit headers' buckets (they report, never refuse).
    pub buckets: Buckets,
}

impl Shared {
    pub fn new(cfg: MockConfig, stats: Arc<MockStats>) -> Self {
        let too_many = match cfg.profile {
            Profile::Vllm => format::error_json(
                "mock upstream: the server is overloaded, retry later",
                "server_error",
                Some("overloaded"),
            ),
            _ => format::error_json(
                "mock upstream: too many concurrent requests",
                "rate_limit_exceeded",
                Some("rate_limit_exceeded"),
            ),
        };
        Shared {
            models: format::models_json(&cfg.models).into(),
            too_many: too_many.into(),
            buckets: Buckets::default(),
            cfg,
            stats,
        }
    }

    pub(crate) fn default_model(&self) -> &str {
        self.cfg.models.first().map_or("mock", String::as_str)
    }

    /// The answer to a request refused for capacity (429, or 503 in the `vllm` profile).
    pub(crate) fn overloaded(&self) -> Response<MockBody> {
        let body = MockBody::full(self.too_many.clone(), None);
        self.refusal(self.cfg.profile.overload_status(), body)
    }

    /// A refusal with `status`, carrying the profile's retry headers.
    pub(crate) fn refusal(&self, status: StatusCode, body: MockBody) -> Response<MockBody> {
        let mut resp = respond(status, JSON, body);
        let h = resp.headers_mut();
        limits::write_retry(h, self.cfg.profile.retry_style(), self.cfg.retry_after);
        if status == StatusCode::TOO_MANY_REQUESTS {
            h.insert(
                "x-ratelimit-remaining-requests",
                HeaderValue::from_static("0"),
            );
        }
        resp
    }
}

pub(crate) fn respond(
    status: StatusCode,
    content_type: &'static str,
    body: MockBody,
) -> Response<MockBody> {
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

pub(crate) fn error(
    status: StatusCode,
    message: &str,
    kind: &str,
    code: &str,
    guard: Option<InFlightGuard>,
) -> Response<MockBody> {
    let body = format::error_json(message, kind, Some(code));
    respond(status, JSON, MockBody::full(body, guard))
}

pub(crate) fn status_error(
    shared: &Shared,
    status: StatusCode,
    guard: InFlightGuard,
) -> Response<MockBody> {
    let msg = format!("mock upstream: x-mock-status {}", status.as_u16());
    let (kind, code) = match status.as_u16() {
        429 => ("rate_limit_exceeded", "rate_limit_exceeded"),
        400..=499 => ("invalid_request_error", "mock_status"),
        _ => ("server_error", "mock_status"),
    };
    let body = MockBody::full(format::error_json(&msg, kind, Some(code)), Some(guard));
    if status == shared.cfg.profile.overload_status() || status == StatusCode::TOO_MANY_REQUESTS {
        return shared.refusal(status, body);
    }
    respond(status, JSON, body)
}

pub(crate) fn embeddings(
    shared: &Shared,
    bytes: &[u8],
    guard: InFlightGuard,
) -> Response<MockBody> {
    let req = match serde_json::from_slice::<EmbeddingsRequest>(bytes) {
        Ok(req) => req,
        Err(_) => {
            let msg = "'input' must be a string, an array of strings, or token arrays";
            return error(
                StatusCode::BAD_REQUEST,
                msg,
                "invalid_request_error",
                "invalid_input",
                Some(guard),
            );
        }
    };
    let (seeds, prompt) = req.input.seeds_and_prompt();
    let dims = req
        .dimensions
        .map_or(DEFAULT_EMBEDDING_DIMS, |d| d.clamp(1, 4096) as usize);
    let model = req.model.as_deref().unwrap_or(shared.default_model());
    let body = format::embeddings_json(model, &seeds, dims, prompt);
    respond(StatusCode::OK, JSON, MockBody::full(body, Some(guard)))
}
