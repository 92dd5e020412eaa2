//! Request handling of the mock: route, admit (or refuse), read and parse, wait, answer.
//!
//! Invariants:
//! - Admission happens before the body is read; a refused request is never in flight. It is
//!   answered at once (429, or 503 in the `vllm` profile, with the profile's retry headers and
//!   `x-ratelimit-remaining-requests: 0` on 429s), except in the `rough` profile, which reads the
//!   whole body and waits [`ROUGH_REJECT_DELAY`](super::profile::ROUGH_REJECT_DELAY) first.
//! - An admitted request's guard moves into its response body, so the time before the head
//!   (delays) and the whole body are both "in flight"; dropping either counts as cancelled.
//! - With zero delays no timer is created; every error body is OpenAI-shaped.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderValue, CACHE_CONTROL};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};

use super::body::MockBody;
use super::dialect;
use super::format::{self, Reply};
use super::limits::Served;
use super::reply::{embeddings, error, respond, status_error, Shared, JSON, MAX_BODY_BYTES};
use super::request::{MockRequest, Overrides};
use super::sse::SseStream;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Endpoint {
    Chat,
    Completions,
    Embeddings,
    Responses,
    Models,
}

/// The answer to one request, before the profile's envelope (see `envelope.rs`).
pub(crate) async fn answer<B>(
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
        if let Some(delay) = shared.cfg.profile.slow_refusal() {
            // Whatever the body holds, the refusal comes after it (a read error only ends it).
            let _ = Limited::new(req.into_body(), MAX_BODY_BYTES)
                .collect()
                .await;
            wait(shared.cfg.base_latency + delay).await;
        }
        return Ok(shared.overloaded());
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
    let mut reply = Reply::new(seq, model, parsed.prompt_tokens(), output, hit_limit);
    reply.usage_style = shared.cfg.profile.usage_style();
    let served = Served {
        model: model.to_owned(),
        tokens: u64::from(reply.prompt) + u64::from(output),
    };
    if endpoint == Endpoint::Embeddings {
        return Ok(served.tag(embeddings(&shared, &bytes, guard)));
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
        let resp = respond(StatusCode::OK, JSON, MockBody::full(body, Some(guard)));
        return Ok(served.tag(resp));
    }
    let placement = match overrides.omit_usage {
        true => None,
        false => shared.cfg.profile.stream_usage(parsed.include_usage()),
    };
    let (pre, first, rest, mut tail) = match endpoint {
        Endpoint::Completions => {
            let (first, rest, tail) = reply.completion_stream(placement);
            (None, first, rest, tail)
        }
        Endpoint::Responses => {
            let (created, delta, tail) = reply.response_stream();
            (Some(created), delta.clone(), delta, tail)
        }
        _ => {
            let (first, rest, tail) = reply.chat_stream(placement);
            (None, first, rest, tail)
        }
    };
    let mut tokens = output;
    if let Some(after) = overrides.error_after {
        tokens = tokens.min(after);
        tail = vec![dialect::error_event(
            endpoint == Endpoint::Responses,
            tokens,
        )];
    }
    let rough = shared.cfg.profile.rough_sse();
    let (pre, first, rest, tail) = dialect::frames(rough, pre, first, rest, tail);
    let sse = SseStream::new(
        pre,
        first,
        rest,
        tokens,
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
    Ok(served.tag(resp))
}

async fn wait(delay: Duration) {
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
}
