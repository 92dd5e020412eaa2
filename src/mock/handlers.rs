//! Request handling of the mock: route, admit (or 429), read and parse, wait, answer.
//!
//! Invariants:
//! - Admission happens before the body is read; a refused request is answered at once with 429,
//!   `Retry-After`, `retry-after-ms` and `x-ratelimit-remaining-requests: 0` and is never in flight.
//! - An admitted request's guard moves into its response body, so the time before the head
//!   (delays) and the whole body are both "in flight"; dropping either counts as cancelled.
//! - With zero delays no timer is created; every error body is OpenAI-shaped.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderValue, CACHE_CONTROL, CONTENT_TYPE, RETRY_AFTER};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};

use super::body::MockBody;
use super::format::{self, Reply};
use super::request::{EmbeddingsRequest, MockRequest, Overrides};
use super::sse::SseStream;
use super::stats::{InFlightGuard, MockStats};
use super::MockConfig;

/// Largest request body the mock reads.
pub const MAX_BODY_BYTES: usize = 16 * 1024 * 1024;
/// Dimensions of an embedding when the request does not choose (`dimensions` caps at 4096).
pub const DEFAULT_EMBEDDING_DIMS: usize = 16;

const JSON: &str = "application/json";

/// State shared by every connection of one mock server; built once at start.
#[derive(Debug)]
pub(crate) struct Shared {
    pub cfg: MockConfig,
    pub stats: Arc<MockStats>,
    models: Bytes,
    too_many: Bytes,
    retry_after: HeaderValue,
    retry_after_ms: HeaderValue,
}

impl Shared {
    pub fn new(cfg: MockConfig, stats: Arc<MockStats>) -> Self {
        let secs = cfg.retry_after.as_millis().div_ceil(1000).max(1);
        let too_many = format::error_json(
            "mock upstream: too many concurrent requests",
            "rate_limit_exceeded",
            Some("rate_limit_exceeded"),
        );
        Shared {
            models: format::models_json(&cfg.models).into(),
            too_many: too_many.into(),
            retry_after: HeaderValue::from(secs as u64),
            retry_after_ms: HeaderValue::from(cfg.retry_after.as_millis() as u64),
            cfg,
            stats,
        }
    }

    fn default_model(&self) -> &str {
        self.cfg.models.first().map_or("mock", String::as_str)
    }

    fn rate_limited(&self, body: MockBody) -> Response<MockBody> {
        let mut resp = respond(StatusCode::TOO_MANY_REQUESTS, JSON, body);
        let h = resp.headers_mut();
        h.insert(RETRY_AFTER, self.retry_after.clone());
        h.insert("retry-after-ms", self.retry_after_ms.clone());
        h.insert(
            "x-ratelimit-remaining-requests",
            HeaderValue::from_static("0"),
        );
        resp
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Endpoint {
    Chat,
    Completions,
    Embeddings,
    Responses,
    Models,
}

fn respond(status: StatusCode, content_type: &'static str, body: MockBody) -> Response<MockBody> {
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

fn error(
    status: StatusCode,
    message: &str,
    kind: &str,
    code: &str,
    guard: Option<InFlightGuard>,
) -> Response<MockBody> {
    let body = format::error_json(message, kind, Some(code));
    respond(status, JSON, MockBody::full(body, guard))
}

/// The mock's whole service: never fails, answers every request.
pub(crate) async fn handle<B>(
    shared: Arc<Shared>,
    req: Request<B>,
) -> Result<Response<MockBody>, Infallible>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let path = req.uri().path();
    let (endpoint, method) = match path {
        "/healthz" => {
            return Ok(respond(
                StatusCode::OK,
                "text/plain",
                MockBody::full("ok", None),
            ))
        }
        "/v1/chat/completions" => (Endpoint::Chat, Method::POST),
        "/v1/completions" => (Endpoint::Completions, Method::POST),
        "/v1/embeddings" => (Endpoint::Embeddings, Method::POST),
        "/v1/responses" => (Endpoint::Responses, Method::POST),
        "/v1/models" => (Endpoint::Models, Method::GET),
        p if p.starts_with("/v1/models/") => {
            let id = &p["/v1/models/".len()..];
            let known = shared.cfg.models.iter().any(|m| m == id);
            return Ok(if known {
                respond(
                    StatusCode::OK,
                    JSON,
                    MockBody::full(format::model_json(id), None),
                )
            } else {
                let msg = format!("The model '{id}' does not exist");
                error(
                    StatusCode::NOT_FOUND,
                    &msg,
                    "invalid_request_error",
                    "model_not_found",
                    None,
                )
            });
        }
        _ => {
            let msg = format!("Unknown request URL: {} {path}", req.method());
            return Ok(error(
                StatusCode::NOT_FOUND,
                &msg,
                "invalid_request_error",
                "unknown_url",
                None,
            ));
        }
    };
    if req.method() != method {
        let msg = format!(
            "Method {} not allowed on {path}; use {method}",
            req.method()
        );
        return Ok(error(
            StatusCode::METHOD_NOT_ALLOWED,
            &msg,
            "invalid_request_error",
            "method_not_allowed",
            None,
        ));
    }

    let stats = &shared.stats;
    let seq = stats.count_request();
    if shared.cfg.record_requests {
        stats.record_headers(req.headers());
    }
    let Some(guard) = stats.try_admit(shared.cfg.max_concurrency) else {
        stats.count_rejected();
        return Ok(shared.rate_limited(MockBody::full(shared.too_many.clone(), None)));
    };
    let overrides = Overrides::from_headers(req.headers());
    if endpoint == Endpoint::Models {
        wait(shared.cfg.base_latency + overrides.delay.unwrap_or_default()).await;
        return Ok(match overrides.status {
            Some(status) if !status.is_success() => status_error(&shared, status, guard),
            _ => respond(
                StatusCode::OK,
                JSON,
                MockBody::full(shared.models.clone(), Some(guard)),
            ),
        });
    }

    let bytes = match Limited::new(req.into_body(), MAX_BODY_BYTES)
        .collect()
        .await
    {
        Ok(collected) => collected.to_bytes(),
        Err(e) => {
            let too_large = e.is::<http_body_util::LengthLimitError>();
            let (status, msg) = if too_large {
                (StatusCode::PAYLOAD_TOO_LARGE, "request body too large")
            } else {
                (StatusCode::BAD_REQUEST, "could not read the request body")
            };
            return Ok(error(
                status,
                msg,
                "invalid_request_error",
                "invalid_body",
                Some(guard),
            ));
        }
    };
    let parsed = match serde_json::from_slice::<MockRequest>(&bytes) {
        Ok(parsed) => parsed,
        Err(e) => {
            let msg = format!("We could not parse the JSON body of your request: {e}");
            return Ok(error(
                StatusCode::BAD_REQUEST,
                &msg,
                "invalid_request_error",
                "invalid_json",
                Some(guard),
            ));
        }
    };
    if shared.cfg.record_requests {
        if let Ok(value) = serde_json::from_slice(&bytes) {
            stats.record_body(value);
        }
    }

    let output = parsed.output_tokens(overrides.output_tokens, shared.cfg.default_output_tokens);
    let hit_limit = parsed.limit().is_some_and(|l| output >= l);
    let stream = parsed.stream() && endpoint != Endpoint::Embeddings;
    let token_delay = overrides.token_delay.unwrap_or(shared.cfg.per_token);
    let mut delay = shared.cfg.base_latency + overrides.delay.unwrap_or_default();
    if let Some(status) = overrides.status.filter(|s| !s.is_success()) {
        wait(delay).await;
        return Ok(status_error(&shared, status, guard));
    }
    if !stream && endpoint != Endpoint::Embeddings {
        delay += token_delay.saturating_mul(output);
    }
    wait(delay).await;

    let model = parsed.model.as_deref().unwrap_or(shared.default_model());
    let reply = Reply::new(seq, model, parsed.prompt_tokens(), output, hit_limit);
    if endpoint == Endpoint::Embeddings {
        return Ok(embeddings(&shared, &bytes, guard));
    }
    if overrides.abort_after.is_some() && !stream {
        return Ok(respond(
            StatusCode::OK,
            JSON,
            MockBody::aborted(Some(guard)),
        ));
    }
    if !stream {
        let body = match endpoint {
            Endpoint::Completions => reply.completion_json(),
            Endpoint::Responses => reply.response_object(true),
            _ => reply.chat_json(),
        };
        return Ok(respond(
            StatusCode::OK,
            JSON,
            MockBody::full(body, Some(guard)),
        ));
    }
    let include_usage = parsed.include_usage();
    let (pre, first, rest, tail) = match endpoint {
        Endpoint::Completions => {
            let (token, tail) = reply.completion_stream(include_usage);
            (None, token.clone(), token, tail)
        }
        Endpoint::Responses => {
            let (created, delta, tail) = reply.response_stream();
            (Some(created.into()), delta.clone(), delta, tail)
        }
        _ => {
            let (first, rest, tail) = reply.chat_stream(include_usage);
            (None, first, rest, tail)
        }
    };
    let tail = tail.into_iter().map(Bytes::from).collect();
    let sse = SseStream::new(
        pre,
        first.into(),
        rest.into(),
        output,
        tail,
        token_delay,
        overrides.abort_after,
    );
    let mut resp = respond(
        StatusCode::OK,
        "text/event-stream",
        MockBody::sse(sse, Some(guard)),
    );
    resp.headers_mut()
        .insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    Ok(resp)
}

async fn wait(delay: Duration) {
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
}

fn status_error(shared: &Shared, status: StatusCode, guard: InFlightGuard) -> Response<MockBody> {
    let msg = format!("mock upstream: x-mock-status {}", status.as_u16());
    let (kind, code) = match status.as_u16() {
        429 => ("rate_limit_exceeded", "rate_limit_exceeded"),
        400..=499 => ("invalid_request_error", "mock_status"),
        _ => ("server_error", "mock_status"),
    };
    let body = MockBody::full(format::error_json(&msg, kind, Some(code)), Some(guard));
    if status == StatusCode::TOO_MANY_REQUESTS {
        return shared.rate_limited(body);
    }
    respond(status, JSON, body)
}

fn embeddings(shared: &Shared, bytes: &[u8], guard: InFlightGuard) -> Response<MockBody> {
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
