//! The answer-headers stage: which headers of the provider's answer reach the tenant. It sits
//! just above `feedback` (which reads every header of every attempt, the shared key's
//! `x-ratelimit-*` included, to learn the pool's capacity), so what the tenant receives is
//! decided once, on the answer that is finally passed on — JSON, SSE and 429 alike.
//!
//! The rule is an allowlist ([`passes`]): the provider's content headers (`content-type`,
//! `content-encoding`, `content-length`, `content-disposition`, `content-language`,
//! `cache-control`, `vary`, `etag`, `last-modified`), its request id and timings (`x-request-id`,
//! `openai-processing-ms`, `openai-version`, `x-should-retry`), and its wait of a refusal
//! (`retry-after`, `retry-after-ms`). fairgate's own `x-fairgate-*` (the provider's are removed
//! by `upstream`, so only fairgate's stages write them) pass. `x-ratelimit-*` pass only when
//! the answer was authorized with the tenant's own provider key ([`OwnKey`], written by
//! `upstream`); the shared key's are removed (a rate-limited tenant gets its own from
//! `ratelimit::headers`, above). Everything else is removed — in particular the operator's
//! `openai-organization` and `openai-project`, `set-cookie` (a provider's session cookie, e.g.
//! Cloudflare's `__cf_bm`, was never set for the tenant), `server`, `cf-ray`, `alt-svc`,
//! `strict-transport-security` and `access-control-*` (the provider's host, not fairgate's),
//! and Azure's `apim-request-id`/`x-ms-*` (the operator's deployment).
//!
//! Invariant: a header not on the list never reaches a tenant, whatever the provider sends.

use std::task::{Context, Poll};

use futures_util::future::{MapOk, TryFutureExt};
use http::header::{self, HeaderMap, HeaderName};
use http::{Request, Response};

use crate::response::ResponseBody;

/// Marks (in the response's extensions) an answer authorized with the tenant's own provider key,
/// whose `x-ratelimit-*` are the tenant's to see.
#[derive(Debug, Clone, Copy)]
pub struct OwnKey;

/// The provider's headers that pass (besides `x-fairgate-*` and an own key's `x-ratelimit-*`).
pub const PASSED: [HeaderName; 15] = [
    header::CONTENT_TYPE,
    header::CONTENT_ENCODING,
    header::CONTENT_LENGTH,
    header::CONTENT_DISPOSITION,
    header::CONTENT_LANGUAGE,
    header::CACHE_CONTROL,
    header::VARY,
    header::ETAG,
    header::LAST_MODIFIED,
    header::RETRY_AFTER,
    HeaderName::from_static("retry-after-ms"),
    HeaderName::from_static("x-request-id"),
    HeaderName::from_static("openai-processing-ms"),
    HeaderName::from_static("openai-version"),
    HeaderName::from_static("x-should-retry"),
];

/// Whether header `name` of an answer reaches the tenant (`own_key`: the answer was authorized
/// with the tenant's own provider key).
pub fn passes(name: &HeaderName, own_key: bool) -> bool {
    let n = name.as_str();
    PASSED.contains(name)
        || n.starts_with("x-fairgate-")
        || (own_key && n.starts_with("x-ratelimit-"))
}

/// Removes every header of `headers` that does not [`passes`].
pub fn for_tenant(headers: &mut HeaderMap, own_key: bool) {
    let dropped: Vec<HeaderName> = headers
        .keys()
        .filter(|k| !passes(k, own_key))
        .cloned()
        .collect();
    for k in dropped {
        headers.remove(k);
    }
}

/// Tower layer of the answer-headers stage.
#[derive(Clone, Copy, Debug, Default)]
pub struct Layer;

impl<S> tower::Layer<S> for Layer {
    type Service = Service<S>;
    fn layer(&self, inner: S) -> Service<S> {
        Service { inner }
    }
}

/// Tower service of the answer-headers stage; see the module docs.
#[derive(Clone, Debug)]
pub struct Service<S> {
    inner: S,
}

type Filter = fn(Response<ResponseBody>) -> Response<ResponseBody>;

fn filter(mut res: Response<ResponseBody>) -> Response<ResponseBody> {
    let own = res.extensions().get::<OwnKey>().is_some();
    for_tenant(res.headers_mut(), own);
    res
}

impl<S, B> tower::Service<Request<B>> for Service<S>
where
    S: tower::Service<Request<B>, Response = Response<ResponseBody>>,
{
    type Response = Response<ResponseBody>;
    type Error = S::Error;
    type Future = MapOk<S::Future, Filter>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        self.inner.call(req).map_ok(filter as Filter)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    /// What api.openai.com sends on a chat answer (values shortened).
    fn openai_answer() -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("content-type", "application/json"),
            ("content-encoding", "gzip"),
            ("vary", "accept-encoding"),
            ("openai-organization", "org-operator"),
            ("openai-project", "proj_operator"),
            ("openai-processing-ms", "312"),
            ("openai-version", "2020-10-01"),
            ("x-request-id", "req_1"),
            ("x-ratelimit-limit-requests", "10000"),
            ("x-ratelimit-remaining-tokens", "149990"),
            ("set-cookie", "__cf_bm=abc; path=/; HttpOnly; Secure"),
            ("server", "cloudflare"),
            ("cf-ray", "8f-IAD"),
            ("cf-cache-status", "DYNAMIC"),
            ("alt-svc", "h3=\":443\""),
            ("strict-transport-security", "max-age=31536000"),
            ("access-control-expose-headers", "X-Request-ID"),
            ("x-content-type-options", "nosniff"),
            ("apim-request-id", "azure"),
            ("x-ms-region", "East US"),
            ("retry-after", "2"),
            ("retry-after-ms", "1500"),
            ("x-fairgate-limit", "upstream"),
        ] {
            h.append(HeaderName::from_static(k), HeaderValue::from_static(v));
        }
        h.append("set-cookie", HeaderValue::from_static("_cfuvid=x; path=/"));
        h
    }

    fn left(own: bool) -> Vec<String> {
        let mut h = openai_answer();
        for_tenant(&mut h, own);
        let mut names: Vec<String> = h.keys().map(|k| k.as_str().to_owned()).collect();
        names.sort_unstable();
        names
    }

    #[test]
    fn the_shared_keys_answer_keeps_content_ids_and_waits_only() {
        assert_eq!(
            left(false),
            [
                "content-encoding",
                "content-type",
                "openai-processing-ms",
                "openai-version",
                "retry-after",
                "retry-after-ms",
                "vary",
                "x-fairgate-limit",
                "x-request-id",
            ]
        );
    }

    #[test]
    fn an_own_keys_answer_also_keeps_that_keys_rate_limits() {
        let names = left(true);
        assert!(names.contains(&"x-ratelimit-limit-requests".to_owned()));
        assert!(names.contains(&"x-ratelimit-remaining-tokens".to_owned()));
        for never in [
            "openai-organization",
            "openai-project",
            "set-cookie",
            "server",
        ] {
            assert!(!names.contains(&never.to_owned()), "{never}");
        }
    }
}
