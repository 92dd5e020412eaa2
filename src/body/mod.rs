//! Body stage: reads the request body once into `Bytes`, bounded by `[server] max_body_bytes`,
//! and parses JSON endpoints once into the context's [`Parsed`] (model, stream, usage, max
//! tokens).
//!
//! One representation: the parsed form keeps only the top-level fields fairgate reads
//! ([`KEPT_FIELDS`]); every other field (a big unknown field, say) is validated and skipped
//! without being allocated, and lives only in the body bytes, forwarded as received. What the
//! parsed form holds is measured ([`value_bytes`]) and counted with the body in the byte budget.
//!
//! Invariants: a `Content-Length` over the cap is rejected (413) before any byte is read; a body
//! growing over the cap while read is rejected at the cap; JSON endpoints require
//! `application/json` (415), valid JSON (400) and a string `model` (400); the bytes are kept as
//! received and the request continues as `Request<Bytes>` — later stages never re-read it, and
//! re-serialize it in one case only: the estimate stage asks for `stream_options.include_usage`
//! on behalf of a streaming client that did not. One exception: a file upload (`POST
//! /v1/files`) is not read here but handed on as a stream ([`crate::context::Upload`]) for the
//! `jobs` stage, which bounds it by `[jobs] max_file_bytes` and holds a chunk at a time.

pub mod linger;
pub mod timeout;

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body::Body;
use http_body_util::BodyExt;

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
    fn reason(&self) -> crate::error::Reason {
        match self {
            Error::Timeout(_) => crate::error::Reason::BodyTimeout,
            _ => crate::error::Reason::BadRequest,
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

/// The top-level fields the parsed form keeps (what routing, counting and admission read).
pub const KEPT_FIELDS: &[&str] = &[
    "model",
    "stream",
    "stream_options",
    "max_tokens",
    "max_completion_tokens",
    "max_output_tokens",
    "messages",
    "tools",
    "functions",
    "prompt",
    "input",
    "instructions",
    "tool_choice",
    "max_tool_calls",
    "parallel_tool_calls",
    "n",
    "best_of",
];

/// A JSON object with only [`KEPT_FIELDS`]; other values are skipped unallocated.
struct Kept(serde_json::Map<String, serde_json::Value>);

impl<'de> serde::Deserialize<'de> for Kept {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Kept;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Kept, A::Error> {
                let mut out = serde_json::Map::new();
                while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    if KEPT_FIELDS.contains(&key.as_ref()) {
                        out.insert(key.into_owned(), map.next_value()?);
                    } else {
                        map.next_value::<serde::de::IgnoredAny>()?;
                    }
                }
                Ok(Kept(out))
            }
        }
        d.deserialize_map(V)
    }
}

/// Bytes a JSON value holds on the heap, measured: each node's size, plus string and key bytes.
pub fn value_bytes(v: &serde_json::Value) -> u64 {
    use serde_json::Value;
    let node = std::mem::size_of::<Value>() as u64;
    node + match v {
        Value::String(s) => s.capacity() as u64,
        Value::Array(a) => a.iter().map(value_bytes).sum::<u64>(),
        Value::Object(o) => o
            .iter()
            .map(|(k, v)| k.capacity() as u64 + 3 * 8 + value_bytes(v))
            .sum::<u64>(),
        _ => 0,
    }
}

/// Parses a JSON request body once.
pub fn parse(bytes: &[u8]) -> Result<Parsed, Error> {
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
    if first != Some(&b'{') {
        // Not an object: say whether it is JSON at all.
        return Err(
            match serde_json::from_slice::<serde::de::IgnoredAny>(bytes) {
                Ok(_) => Error::NotAnObject,
                Err(e) => Error::InvalidJson(e),
            },
        );
    }
    let Kept(obj) = serde_json::from_slice(bytes).map_err(Error::InvalidJson)?;
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
        if let Some(v) = int_field(&obj, key, 0, MAX_OUTPUT_CAP)? {
            if max_tokens.is_none_or(|(m, _)| v > m) {
                max_tokens = Some((v, key));
            }
        }
    }
    let mut choices = (1, None);
    for key in ["n", "best_of"] {
        if let Some(v) = int_field(&obj, key, 1, MAX_CHOICES)? {
            if v > choices.0 {
                choices = (v, Some(key));
            }
        }
    }
    let value = serde_json::Value::Object(obj);
    Ok(Parsed {
        model,
        stream,
        include_usage,
        max_tokens: max_tokens.map(|(v, _)| v),
        max_tokens_param: max_tokens.map_or("max_tokens", |(_, k)| k),
        choices: choices.0,
        choices_param: choices.1,
        kept_bytes: value_bytes(&value),
        value: crate::context::Document::new(value),
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

/// The declared `Content-Length`, if any.
fn declared_length(headers: &http::HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
}

/// Whether the request is a file upload (`POST /v1/files`), streamed by `jobs`.
pub fn is_upload(method: &Method, path: &str) -> bool {
    method == Method::POST && path == "/v1/files"
}

/// Reads a body up to `max` bytes.
pub async fn read<B>(headers: &http::HeaderMap, body: B, max: usize) -> Result<Bytes, Error>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let declared = declared_length(headers);
    if declared.is_some_and(|n| n > max as u64) {
        return Err(Error::TooLarge(max));
    }
    // One buffer, sized from the declared length: each frame is copied in and freed at once
    // (collecting the frames and joining them would hold the body twice at its peak).
    let mut buf = bytes::BytesMut::with_capacity(declared.unwrap_or(0) as usize);
    let mut body = std::pin::pin!(body);
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| {
            let e: BoxError = e.into();
            match e.downcast_ref::<timeout::BodyTimeout>() {
                Some(t) => Error::Timeout(*t),
                None => Error::Read,
            }
        })?;
        if let Ok(data) = frame.into_data() {
            if buf.len() + data.len() > max {
                return Err(Error::TooLarge(max));
            }
            buf.extend_from_slice(&data);
        }
    }
    Ok(buf.freeze())
}

/// The body stage: the cap and the byte budget it reads against.
#[derive(Clone)]
pub struct Reading {
    /// `[server] max_body_bytes`.
    pub max_body_bytes: usize,
    /// The tenant-wide byte budget (`max_queued_bytes`), reserved before the body is read.
    pub budget: crate::queue::bytes::TenantBudget,
}

/// Tower layer of the body stage: `Request<B>` in, `Request<Bytes>` to the service below.
pub type Layer = crate::stage::Layer<Reading>;

impl<S, B> crate::stage::Stage<Request<B>, S> for Reading
where
    S: crate::stage::Below<Request<Bytes>, Response<ResponseBody>, crate::Error>,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Down = Request<Bytes>;

    /// A plain function returning the future, which holds the cap, the budget, the request
    /// and the service below, nothing twice.
    fn call(
        self,
        req: Request<B>,
        mut inner: S,
    ) -> impl std::future::Future<Output = Result<Response<ResponseBody>, crate::Error>> + Send + 'static
    {
        let (max, budget) = (self.max_body_bytes, self.budget);
        async move {
            let ctx = crate::context::of(&req)?;
            let tenant = ctx.identity()?.tenant.clone();
            let (mut parts, body) = req.into_parts();
            // A file upload is read by `jobs` as a stream, bounded by `[jobs] max_file_bytes`
            // (not by `max_body_bytes`) and held a chunk at a time: handed on unread.
            if is_upload(&parts.method, parts.uri.path()) {
                let body = body.map_err(|e| -> BoxError { e.into() }).boxed_unsync();
                parts.extensions.insert(crate::context::Upload::new(body));
                return inner.call(Request::from_parts(parts, Bytes::new())).await;
            }
            let json = is_json_endpoint(&parts.method, parts.uri.path());
            if json && !is_json(&parts.headers) {
                return Err(Error::UnsupportedMediaType.into());
            }
            // The tenant's byte budget, before a byte is read when the length is declared
            // (the cap is checked first: a 413 is the more precise answer).
            let declared = declared_length(&parts.headers).filter(|&n| n <= max as u64);
            let early = match declared {
                Some(n) => Some(budget.reserve(&tenant, n)?),
                None => None,
            };
            let bytes = read(&parts.headers, body, max).await?;
            // Without a declared length the body is read first (bounded by the cap).
            let mut reservation = match early {
                Some(r) => r,
                None => budget.reserve(&tenant, bytes.len() as u64)?,
            };
            if json {
                let parsed = parse(&bytes)?;
                reservation.grow(parsed.kept_bytes);
                ctx.set_request(parsed);
            }
            let mut res = inner.call(Request::from_parts(parts, bytes)).await?;
            res.body_mut().attach(Box::new(reservation));
            Ok(res)
        }
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
        assert!(matches!(parse(b"[1"), Err(Error::InvalidJson(_))));
        assert!(matches!(
            parse(b"{\"model\":\"m\",\"x\":[}"),
            Err(Error::InvalidJson(_))
        ));
    }

    #[test]
    fn unknown_fields_are_not_kept_and_what_is_kept_is_measured() {
        let big = "x".repeat(1 << 20);
        let body = format!(
            r#"{{"model":"m","messages":[{{"role":"user","content":"hi"}}],"blob":"{big}"}}"#
        );
        let p = parse(body.as_bytes()).unwrap();
        let value = p.value.get().unwrap();
        assert!(value.get("blob").is_none());
        assert!(value.get("messages").is_some());
        assert!(p.kept_bytes < 4096, "{}", p.kept_bytes);
        // A kept field is counted at least at its size.
        let body = format!(r#"{{"model":"m","messages":[{{"role":"user","content":"{big}"}}]}}"#);
        let p = parse(body.as_bytes()).unwrap();
        assert!(p.kept_bytes >= 1 << 20, "{}", p.kept_bytes);
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
