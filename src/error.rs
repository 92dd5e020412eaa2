//! Errors of every request-path stage, rendered to HTTP once, here.
//!
//! Each stage owns a `thiserror` enum (its doc comment is the message) and implements
//! [`ApiError`] to say which status, OpenAI `type` and `code` each variant maps to. Stages return
//! `Err(Error)`; the outermost layer of [`crate::server::stack`] calls [`Error::into_response`],
//! so the OpenAI error shape `{"error":{"message","type","code"}}` is built in exactly one place.
//!
//! Invariant: an error message never contains an API key or prompt text.

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};

use crate::response::ResponseBody;

/// How a stage's error presents itself to an OpenAI client.
pub trait ApiError: std::error::Error {
    /// The HTTP status.
    fn status(&self) -> StatusCode;
    /// OpenAI's `error.type`, e.g. `invalid_request_error`.
    fn kind(&self) -> &'static str;
    /// OpenAI's `error.code`, e.g. `invalid_api_key`.
    fn code(&self) -> &'static str;
    /// Extra response headers (e.g. `Retry-After`, `x-fairgate-limit`).
    fn headers(&self) -> Vec<(header::HeaderName, HeaderValue)> {
        Vec::new()
    }
}

/// Any error a request can end with: one variant per stage.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The tenant stage rejected the request.
    #[error(transparent)]
    Tenant(#[from] crate::tenant::Error),
    /// The body stage rejected the request.
    #[error(transparent)]
    Body(#[from] crate::body::Error),
    /// The estimate stage rejected the request (malformed content).
    #[error(transparent)]
    Estimate(#[from] crate::estimate::Error),
    /// No route for the request.
    #[error(transparent)]
    Route(#[from] crate::route::Error),
    /// Admission refused the request (size, deadline, rate limit).
    #[error(transparent)]
    Admission(#[from] crate::admission::Error),
    /// The fair queue refused or could not grant the request.
    #[error(transparent)]
    Queue(#[from] crate::queue::QueueError),
    /// The upstream could not be reached or timed out.
    #[error(transparent)]
    Upstream(#[from] crate::upstream::Error),
    /// A bug: a stage panicked or a required extension was missing.
    #[error("internal error: {0}")]
    Internal(&'static str),
}

impl Error {
    fn parts(&self) -> (StatusCode, &'static str, &'static str) {
        fn of(e: &dyn ApiError) -> (StatusCode, &'static str, &'static str) {
            (e.status(), e.kind(), e.code())
        }
        match self {
            Error::Tenant(e) => of(e),
            Error::Body(e) => of(e),
            Error::Estimate(e) => of(e),
            Error::Route(e) => of(e),
            Error::Admission(e) => of(e),
            Error::Queue(e) => of(e),
            Error::Upstream(e) => of(e),
            Error::Internal(_) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                "internal_error",
            ),
        }
    }

    /// The HTTP status this error renders with.
    pub fn status(&self) -> StatusCode {
        self.parts().0
    }

    /// Renders the error in OpenAI's shape with its status. The only place errors become HTTP.
    pub fn into_response(self) -> Response<ResponseBody> {
        let (status, kind, code) = self.parts();
        let mut res = render(status, &self.to_string(), kind, code);
        let extra = match &self {
            Error::Queue(e) => e.headers(),
            Error::Admission(e) => e.headers(),
            Error::Upstream(e) => e.headers(),
            _ => Vec::new(),
        };
        res.headers_mut().extend(extra);
        res
    }
}

/// Builds an OpenAI-shaped error response.
pub fn render(status: StatusCode, message: &str, kind: &str, code: &str) -> Response<ResponseBody> {
    let body = serde_json::json!({
        "error": { "message": message, "type": kind, "code": code, "param": null }
    });
    let bytes = Bytes::from(serde_json::to_vec(&body).unwrap_or_default());
    let mut res = Response::new(ResponseBody::full(bytes));
    *res.status_mut() = status;
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    res
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn renders_openai_shape() {
        let res = Error::Route(crate::route::Error::ModelNotFound("gpt-x".into())).into_response();
        assert_eq!(res.status(), StatusCode::NOT_FOUND);
        let body = res.into_body().collect().await.unwrap().to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["error"]["code"], "model_not_found");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert!(v["error"]["message"].as_str().unwrap().contains("gpt-x"));
    }
}
