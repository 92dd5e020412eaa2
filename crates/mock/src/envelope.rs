//! What every answer of the mock gets on its way out, per profile: the rate-limit headers real
//! providers put on every API answer (OpenAI, Groq; per model in `rough`) and, in the `openai`
//! profile, the response compression its edge applies when the client accepts it.
//!
//! Invariants:
//! - Only `/v1/…` answers carry rate-limit headers and charge the buckets (one request, plus the
//!   prompt and output tokens of a served completion); `/healthz` is left alone.
//! - Only JSON and SSE bodies are compressed, and never one the mock cuts on purpose; a compressed
//!   answer says `content-encoding` and `vary: accept-encoding`.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_ENCODING, CONTENT_TYPE, VARY};
use http::{Request, Response};

use super::body::MockBody;
use super::encoding::Encoding;
use super::handlers;
use super::limits::{self, Served};
use super::reply::Shared;

/// The mock's whole service: never fails, answers every request.
pub(crate) async fn handle<B>(
    shared: Arc<Shared>,
    req: Request<B>,
) -> Result<Response<MockBody>, Infallible>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let profile = shared.cfg.profile;
    let api = req.uri().path().starts_with("/v1/");
    let encoding = profile
        .compresses()
        .then(|| Encoding::negotiate(req.headers()))
        .flatten();
    let Ok(mut resp) = handlers::answer(Arc::clone(&shared), req).await;
    if api {
        let served = resp.extensions_mut().remove::<Served>();
        let (model, tokens) = served.map_or((String::new(), 0), |s| (s.model, s.tokens));
        let snapshot = shared.buckets.charge(1, tokens);
        let refused = resp
            .headers()
            .get("x-ratelimit-remaining-requests")
            .cloned();
        let h = resp.headers_mut();
        limits::write_limits(h, profile.limit_headers(), &snapshot, &model);
        if profile == super::Profile::Openai {
            // OpenAI names every answer.
            let id = format!("req_{:032x}", rand::random::<u128>());
            h.insert(
                "x-request-id",
                id.parse().expect("hex is a valid header value"),
            );
        }
        // A 429 said it has no request left; the buckets (which never refuse) must not contradict.
        if let Some(zero) = refused {
            h.insert("x-ratelimit-remaining-requests", zero);
        }
    }
    if let Some(encoding) = encoding {
        let compressible = resp
            .headers()
            .get(CONTENT_TYPE)
            .is_some_and(|t| t == "application/json" || t == "text/event-stream");
        if compressible && resp.body_mut().encode(encoding) {
            let h = resp.headers_mut();
            h.insert(CONTENT_ENCODING, HeaderValue::from_static(encoding.name()));
            h.insert(VARY, HeaderValue::from_static("accept-encoding"));
        }
    }
    Ok(resp)
}
