//! Body stage: reads the request body once into `Bytes`, bounded by `[server] max_body_bytes`,
//! and parses JSON endpoints once into the context's [`Parsed`] (model, stream, usage, max
//! tokens).
//!
//! Invariants: a `Content-Length` over the cap is rejected (413) before any byte is read; a body
//! growing over the cap while read is rejected at the cap; JSON endpoints require
//! `application/json` (415), valid JSON (400) and a string `model` (400); the bytes are kept as
//! received and the request continues as `Request<Bytes>` — later stages never re-read it, and
//! re-serialize it in one case only: the estimate stage asks for `stream_options.include_usage`
//! on behalf of a streaming client that did not.

pub mod linger;
pub mod timeout;

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body::Body;
use http_body_util::{BodyExt, LengthLimitError, Limited};

use crate::error::ApiError;
use crate::response::{BoxError, ResponseBody};

pub use crate::context::Parsed;

/// Body stage errors.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The body is larger than the configured cap.
    #[error("request body is larger than {0} bytes")]
    TooLarge(usize),
    /// A JSON endpoint got another content type.
    #[error("content-type must be application/json")]
    UnsupportedMediaType,
    /// The body is not valid JSON.
    #[error("request body is not valid JSON: {0}")]
    InvalidJson(serde_json::Error),
    /// The body is JSON but not an object.
    #[error("request body must be a JSON object")]
    NotAnObject,
    /// `model` is missing or not a string.
    #[error("you must provide a model parameter (a string)")]
    MissingModel,
    /// The client stopped sending the body.
    #[error("failed to read request body")]
    Read,
    /// The body made no progress for `[server] client_body_timeout_ms`.
    #[error("{0}")]
    Timeout(timeout::BodyTimeout),
    /// An output cap, `n` or `best_of` that is not an integer in its range.
    #[error("invalid `{param}`: must be an integer from {min} to {max}")]
    Field {
        /// The field.
        param: &'static str,
        /// Its smallest value.
        min: u64,
        /// Its largest value.
        max: u64,
    },
}

impl ApiError for Error {
    fn status(&self) -> StatusCode {
        match self {
            Error::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Error::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Error::Timeout(_) => StatusCode::REQUEST_TIMEOUT,
            _ => StatusCode::BAD_REQUEST,
        }
    }
    fn kind(&self) -> &'static str {
        "invalid_request_error"
    }
    fn code(&self) -> &'static str {
        match self {
            Error::TooLarge(_) => "request_too_large",
            Error::UnsupportedMediaType => "unsupported_media_type",
            Error::InvalidJson(_) | Error::NotAnObject => "invalid_json",
            Error::MissingModel => "missing_model",
            Error::Read => "invalid_body",
            Error::Timeout(_) => "request_timeout",
            Error::Field { .. } => "invalid_value",
        }
    }
    fn param(&self) -> Option<&str> {
        match self {
            Error::Field { param, .. } => Some(param),
            _ => None,
        }
    }
    fn reason(&self) -> &'static str {
        match self {
            Error::Timeout(_) => "body_timeout",
            _ => "bad_request",
        }
    }
}

/// Whether `POST path` is a JSON endpoint with a `model`.
pub fn is_json_endpoint(method: &Method, path: &str) -> bool {
    method == Method::POST
        && matches!(
            path,
            "/v1/chat/completions" | "/v1/completions" | "/v1/embeddings" | "/v1/responses"
        )
}

fn is_json(headers: &http::HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|mime| mime.trim().eq_ignore_ascii_case("application/json"))
}

/// Parses a JSON request body once.
pub fn parse(bytes: &[u8]) -> Result<Parsed, Error> {
    let value: serde_json::Value = serde_json::from_slice(bytes).map_err(Error::InvalidJson)?;
    let obj = value.as_object().ok_or(Error::NotAnObject)?;
    let model = obj
        .get("model")
        .and_then(|m| m.as_str())
        .ok_or(Error::MissingModel)?
        .to_owned();
    let stream = obj.get("stream").and_then(|s| s.as_bool()).unwrap_or(false);
    let include_usage = obj
        .get("stream_options")
        .and_then(|o| o.get("include_usage"))
        .and_then(|u| u.as_bool())
        .unwrap_or(false);
    let mut max_tokens: Option<(u64, &'static str)> = None;
    for key in OUTPUT_CAPS {
        if let Some(v) = int_field(obj, key, 0, MAX_OUTPUT_CAP)? {
            if max_tokens.is_none_or(|(m, _)| v > m) {
                max_tokens = Some((v, key));
            }
        }
    }
    let mut choices = (1, None);
    for key in ["n", "best_of"] {
        if let Some(v) = int_field(obj, key, 1, MAX_CHOICES)? {
            if v > choices.0 {
                choices = (v, Some(key));
            }
        }
    }
    Ok(Parsed {
        model,
        stream,
        include_usage,
        max_tokens: max_tokens.map(|(v, _)| v),
        max_tokens_param: max_tokens.map_or("max_tokens", |(_, k)| k),
        choices: choices.0,
        choices_param: choices.1,
        value: std::sync::Arc::new(value),
    })
}

/// The output-cap aliases; the largest one given governs.
pub const OUTPUT_CAPS: [&str; 3] = ["max_tokens", "max_completion_tokens", "max_output_tokens"];
/// The largest output cap accepted (a larger one is a 400 naming the field).
pub const MAX_OUTPUT_CAP: u64 = u32::MAX as u64;
/// The largest `n` or `best_of` accepted.
pub const MAX_CHOICES: u64 = 128;

/// An optional integer field in `min..=max`: absent or `null` is `None`; anything else (a
/// float, a string, a negative or out-of-range number) is [`Error::Field`].
fn int_field(
    obj: &serde_json::Map<String, serde_json::Value>,
    param: &'static str,
    min: u64,
    max: u64,
) -> Result<Option<u64>, Error> {
    match obj.get(param) {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .filter(|v| (min..=max).contains(v))
            .map(Some)
            .ok_or(Error::Field { param, min, max }),
    }
}

/// Reads a body up to `max` bytes.
pub async fn read<B>(headers: &http::HeaderMap, body: B, max: usize) -> Result<Bytes, Error>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max as u64) {
        return Err(Error::TooLarge(max));
    }
    match Limited::new(body, max).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<LengthLimitError>() => Err(Error::TooLarge(max)),
        Err(e) => match e.downcast_ref::<timeout::BodyTimeout>() {
            Some(t) => Err(Error::Timeout(*t)),
            None => Err(Error::Read),
        },
    }
}

/// Tower layer of the body stage.
#[derive(Clone, Copy)]
pub struct Layer {
    /// `[server] max_body_bytes`.
    pub max_body_bytes: usize,
}

impl<S> tower::Layer<S> for Layer {
    type Service = Service<S>;
    fn layer(&self, inner: S) -> Service<S> {
        Service {
            max: self.max_body_bytes,
            inner,
        }
    }
}

/// Tower service of the body stage: `Request<B>` in, `Request<Bytes>` to the inner service.
#[derive(Clone)]
pub struct Service<S> {
    max: usize,
    inner: S,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B> tower::Service<Request<B>> for Service<S>
where
    S: tower::Service<Request<Bytes>, Response = Response<ResponseBody>, Error = crate::Error>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response<ResponseBody>;
    type Error = crate::Error;
    type Future = BoxFuture<Result<Response<ResponseBody>, crate::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), crate::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let max = self.max;
        Box::pin(async move {
            let ctx = crate::context::of(&req)?;
            let (parts, body) = req.into_parts();
            let json = is_json_endpoint(&parts.method, parts.uri.path());
            if json && !is_json(&parts.headers) {
                return Err(Error::UnsupportedMediaType.into());
            }
            let bytes = read(&parts.headers, body, max).await?;
            if json {
                ctx.set_request(parse(&bytes)?);
            }
            inner.call(Request::from_parts(parts, bytes)).await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::Full;

    #[test]
    fn parses_fields_once() {
        let p = parse(br#"{"model":"m","stream":true,"stream_options":{"include_usage":true},"max_completion_tokens":7}"#).unwrap();
        assert_eq!(p.model, "m");
        assert!(p.stream && p.include_usage);
        assert_eq!(p.max_tokens, Some(7));
        assert_eq!(
            (p.max_tokens_param, p.choices, p.choices_param),
            ("max_completion_tokens", 1, None)
        );
        assert!(matches!(parse(b"{\"model\":1}"), Err(Error::MissingModel)));
        assert!(matches!(parse(b"[1]"), Err(Error::NotAnObject)));
        assert!(matches!(parse(b"{nope"), Err(Error::InvalidJson(_))));
    }

    #[test]
    fn the_largest_cap_governs_and_choices_multiply() {
        let p = parse(br#"{"model":"m","max_tokens":1,"max_completion_tokens":100000,"max_output_tokens":null,"n":3,"best_of":5}"#).unwrap();
        assert_eq!(
            (p.max_tokens, p.max_tokens_param),
            (Some(100000), "max_completion_tokens")
        );
        assert_eq!((p.choices, p.choices_param), (5, Some("best_of")));
        let p = parse(br#"{"model":"m","n":null}"#).unwrap();
        assert_eq!((p.max_tokens, p.choices), (None, 1));
    }

    #[test]
    fn a_cap_or_choice_count_that_is_not_an_integer_in_range_names_its_field() {
        for (body, field) in [
            (r#"{"model":"m","max_tokens":100000.0}"#, "max_tokens"),
            (r#"{"model":"m","max_tokens":"100000"}"#, "max_tokens"),
            (r#"{"model":"m","max_tokens":-5}"#, "max_tokens"),
            (
                r#"{"model":"m","max_completion_tokens":true}"#,
                "max_completion_tokens",
            ),
            (
                r#"{"model":"m","max_output_tokens":1e30}"#,
                "max_output_tokens",
            ),
            (r#"{"model":"m","max_tokens":4294967296}"#, "max_tokens"),
            (r#"{"model":"m","n":0}"#, "n"),
            (r#"{"model":"m","n":129}"#, "n"),
            (r#"{"model":"m","best_of":2.5}"#, "best_of"),
        ] {
            let e = parse(body.as_bytes()).unwrap_err();
            assert_eq!(e.param(), Some(field), "{body}");
            assert_eq!(
                (e.status(), e.kind()),
                (StatusCode::BAD_REQUEST, "invalid_request_error")
            );
        }
    }

    #[tokio::test]
    async fn reads_within_limit_and_rejects_over() {
        let h = http::HeaderMap::new();
        let ok = read(&h, Full::new(Bytes::from_static(b"12345")), 5)
            .await
            .unwrap();
        assert_eq!(&ok[..], b"12345");
        let over = read(&h, Full::new(Bytes::from_static(b"123456")), 5).await;
        assert!(matches!(over, Err(Error::TooLarge(5))));
        let mut h = http::HeaderMap::new();
        h.insert(header::CONTENT_LENGTH, "6".parse().unwrap());
        let declared = read(&h, Full::new(Bytes::new()), 5).await;
        assert!(matches!(declared, Err(Error::TooLarge(5))));
    }

    #[test]
    fn content_type_with_parameters_is_json() {
        let mut h = http::HeaderMap::new();
        h.insert(
            header::CONTENT_TYPE,
            "Application/JSON; charset=utf-8".parse().unwrap(),
        );
        assert!(is_json(&h));
        h.insert(header::CONTENT_TYPE, "text/plain".parse().unwrap());
        assert!(!is_json(&h));
    }
}
