//! What every answer of the mock gets on its way out, per profile: the rate-limit headers real
//! providers put on every API answer (OpenAI, Groq; per model in `rough`) and, in the `openai`
//! profile, the response compression its edge applies when the client accepts it.
//!
//! The `openai` profile also sends what api.openai.com puts on every API answer about the
//! account and its edge (`account_headers`): the organization and project of the key, its
//! processing time, Cloudflare's `__cf_bm` cookie, `server`, `cf-ray`, HSTS, `alt-svc`.
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
            account_headers(h);
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

/// The account and edge headers api.openai.com sends on every API answer (the values are the
/// mock's own; a proxy must not pass the account's or the cookie to its tenants).
fn account_headers(h: &mut http::HeaderMap) {
    for (name, value) in [
        ("openai-organization", "org-mock-operator"),
        ("openai-project", "proj_mock_operator"),
        ("openai-processing-ms", "12"),
        ("openai-version", "2020-10-01"),
        ("server", "cloudflare"),
        ("cf-ray", "8e0c2f0a1b2c3d4e-IAD"),
        ("cf-cache-status", "DYNAMIC"),
        (
            "strict-transport-security",
            "max-age=31536000; includeSubDomains; preload",
        ),
        ("alt-svc", "h3=\":443\"; ma=86400"),
        ("access-control-expose-headers", "X-Request-ID"),
        ("x-content-type-options", "nosniff"),
    ] {
        h.insert(name, HeaderValue::from_static(value));
    }
    for cookie in [
        "__cf_bm=mock.cookie.value; path=/; expires=Wed, 02-Dec-2026 01:00:00 GMT; domain=.api.openai.com; HttpOnly; Secure; SameSite=None",
        "_cfuvid=mock.visitor; path=/; domain=.api.openai.com; HttpOnly; Secure; SameSite=None",
    ] {
        h.append(http::header::SET_COOKIE, HeaderValue::from_static(cookie));
    }
}
