//! Upstream stage (innermost): forwards the request to the routed provider and streams the
//! answer back.
//!
//! `/v1/X?q` goes to `base_url + /X?q`. Headers are cleaned by [`headers::for_upstream`]; the
//! `authorization` sent is the tenant's own provider key, else the upstream's, else none; an
//! answer to the tenant's own key is marked [`answer::OwnKey`], and the provider's `x-fairgate-*`
//! headers are removed (only fairgate writes those). Which of the answer's headers reach the
//! tenant is [`answer`]'s rule, applied above `feedback`.
//! Invariants: the tenant's key never goes upstream; the response body is never collected — it
//! is [`ResponseBody::upstream`], polled only as fast as the client reads, and dropping it
//! cancels the upstream request; connect failure → 502 (503 with `Retry-After` when fairgate
//! is out of file descriptors), no response head within
//! `first_byte_timeout_ms` → 504, an upstream error status is passed through untouched.

pub mod answer;
mod endpoint;
pub mod headers;
mod tls;

pub use endpoint::{rewrite_model, Endpoint};

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Request, Response, StatusCode, Uri, Version};
use http_body_util::Full;

use crate::config::{ConfigError, UpstreamConfig};
use crate::context::Ctx;
use crate::error::ApiError;
use crate::response::idle::IdleTimeout;
use crate::response::ResponseBody;
use crate::stage::BoxFuture;

/// One provider pool: its name, routing patterns, limits and endpoints (in config order, as
/// the pool's `feedback::capacity` indexes them).
pub struct Upstream {
    /// Unique name.
    pub name: String,
    /// Model glob patterns.
    pub models: Vec<String>,
    /// Pool size shared by all tenants.
    pub max_concurrency: usize,
    /// Bounds of the provider's model list fetch (`models_list_*`).
    pub models_list: ModelsListLimits,
    /// The endpoints (at least one).
    pub endpoints: Box<[Endpoint]>,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream")
            .field("name", &self.name)
            .field("endpoints", &self.endpoints)
            .finish_non_exhaustive()
    }
}

/// `models_list_*` of `[[upstreams]]`: how the provider's own `GET /models` is fetched.
#[derive(Debug, Clone, Copy)]
pub struct ModelsListLimits {
    /// Whole fetch (connect, head, body).
    pub timeout: Duration,
    /// Served this long before a background refresh.
    pub ttl: Duration,
    /// Entries kept.
    pub max: usize,
    /// Body bytes read.
    pub max_bytes: usize,
}

/// Upstream stage errors.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Connecting failed.
    #[error("upstream {0} is unavailable")]
    Unavailable(String),
    /// The request failed after connecting, before a response head.
    #[error("upstream {0} failed to answer")]
    Failed(String),
    /// No response head in time.
    #[error("upstream {0} did not answer within {1:?}")]
    Timeout(String, Duration),
    /// The request path cannot be forwarded.
    #[error("invalid request path")]
    BadPath,
    /// The TLS handshake with the upstream failed (an untrusted certificate, a name mismatch,
    /// a client certificate refused…).
    #[error("upstream {0}: TLS handshake failed: {1}")]
    Tls(String, String),
    /// Connecting failed for lack of file descriptors (EMFILE/ENFILE): fairgate is overloaded.
    #[error("fairgate is out of connections to upstream {0}; retry shortly")]
    NoDescriptors(String),
}

impl ApiError for Error {
    fn status(&self) -> StatusCode {
        match self {
            Error::Unavailable(_) | Error::Failed(_) | Error::Tls(..) => StatusCode::BAD_GATEWAY,
            Error::Timeout(..) => StatusCode::GATEWAY_TIMEOUT,
            Error::BadPath => StatusCode::BAD_REQUEST,
            Error::NoDescriptors(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
    fn kind(&self) -> &'static str {
        match self {
            Error::BadPath => "invalid_request_error",
            _ => "server_error",
        }
    }
    fn code(&self) -> &'static str {
        match self {
            Error::Unavailable(_) | Error::Failed(_) => "upstream_unavailable",
            Error::Tls(..) => "upstream_tls_error",
            Error::Timeout(..) => "upstream_timeout",
            Error::BadPath => "invalid_path",
            Error::NoDescriptors(_) => "overloaded",
        }
    }
    fn retry_after(&self) -> Option<Duration> {
        match self {
            Error::NoDescriptors(_) => Some(Duration::from_secs(1)),
            _ => None,
        }
    }
    fn reason(&self) -> crate::error::Reason {
        crate::error::Reason::UpstreamError
    }
    fn endpoint_failed(&self) -> bool {
        matches!(
            self,
            Error::Unavailable(_) | Error::Failed(_) | Error::Timeout(..) | Error::Tls(..)
        )
    }
}

impl Upstream {
    /// Builds an upstream (each endpoint with `lanes` pooled clients, one per connection
    /// worker) from `[[upstreams]]` entry `index`; `env` resolves the `api_key_env`s (unset →
    /// an error naming the key).
    pub fn from_config(
        cfg: &UpstreamConfig,
        index: usize,
        lanes: usize,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        if cfg.endpoints.is_empty() {
            return Err(ConfigError::Invalid {
                key: format!("upstreams[{index}].base_url"),
                message: "required (or list the pool's [[upstreams.endpoints]])".into(),
            });
        }
        let endpoints = cfg
            .endpoints
            .iter()
            .enumerate()
            .map(|(j, e)| Endpoint::from_config(e, (index, j), lanes, &env))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            name: cfg.name.clone(),
            models: cfg.models.clone(),
            max_concurrency: cfg.max_concurrency,
            models_list: ModelsListLimits {
                timeout: Duration::from_millis(cfg.models_list_timeout_ms),
                ttl: Duration::from_millis(cfg.models_list_ttl_ms),
                max: cfg.models_list_max,
                max_bytes: cfg.models_list_max_bytes,
            },
            endpoints,
        })
    }

    /// Whether `other` sends the same provider keys to the same endpoints (a reload keeps this
    /// upstream, and its pooled connections, only then).
    pub fn same_key(&self, other: &Upstream) -> bool {
        self.endpoints.len() == other.endpoints.len()
            && self
                .endpoints
                .iter()
                .zip(other.endpoints.iter())
                .all(|(a, b)| a.same_key(b))
    }

    /// The provider's own model list: `GET base_url + /models` of the first endpoint with its
    /// key, over this worker's pooled client (its TLS), within `models_list.timeout` (connect,
    /// head and body), the body read up to `models_list.max_bytes`. The error says why, never
    /// the key.
    pub async fn list_models(&self) -> Result<Bytes, String> {
        use http_body_util::BodyExt;
        let limits = self.models_list;
        let endpoint = &self.endpoints[0];
        let uri = endpoint
            .target(&Uri::from_static("/v1/models"))
            .map_err(|e| e.to_string())?;
        let mut req = Request::new(Full::new(Bytes::new()));
        *req.uri_mut() = uri;
        req.headers_mut().insert(
            http::header::ACCEPT,
            HeaderValue::from_static("application/json"),
        );
        if let Some((name, key)) = endpoint.auth(None) {
            req.headers_mut().insert(name, key);
        }
        let fut = endpoint.lane().client.request(req);
        let fetch = async move {
            let res = fut.await.map_err(|e| match tls_failure(&e) {
                Some(why) => format!("TLS handshake failed: {why}"),
                None => format!("request failed: {e}"),
            })?;
            if !res.status().is_success() {
                return Err(format!("answered {}", res.status()));
            }
            let body = http_body_util::Limited::new(res.into_body(), limits.max_bytes);
            body.collect()
                .await
                .map(|b| b.to_bytes())
                .map_err(|e| format!("body: {e}"))
        };
        match tokio::time::timeout(limits.timeout, fetch).await {
            Ok(r) => r,
            Err(_) => Err(format!("no answer within {:?}", limits.timeout)),
        }
    }

    /// `base_url + (path without /v1) + ?query` on the first endpoint.
    pub fn target(&self, uri: &Uri) -> Result<Uri, Error> {
        self.endpoints[0].target(uri)
    }
}

/// The innermost service: forwards to the routed upstream.
#[derive(Clone)]
pub struct Service {
    upstreams: Arc<[Arc<Upstream>]>,
    tenant_header: Option<HeaderName>,
    propagate_trace: bool,
}

impl Service {
    /// Forwards to `upstreams` (indexed like `[[upstreams]]`, as the context's route is);
    /// `tenant_header`: the sidecar header to strip, if configured.
    pub fn new(upstreams: Arc<[Arc<Upstream>]>, tenant_header: Option<HeaderName>) -> Self {
        Self {
            upstreams,
            tenant_header,
            propagate_trace: false,
        }
    }

    /// With OpenTelemetry on: the provider is sent `traceparent` naming this request's trace
    /// and its `fairgate.upstream` span (replacing the client's); off, the client's passes as
    /// it came.
    pub fn propagate_trace(mut self, on: bool) -> Self {
        self.propagate_trace = on;
        self
    }
}

/// A copy of `req` holding what this stage reads — method, URI, version, headers, body, and the
/// request context — for one more attempt of it (the retry stage). Cheaper than a full clone:
/// no other extension is copied.
pub fn attempt(req: &Request<Bytes>) -> Request<Bytes> {
    let mut out = Request::new(req.body().clone());
    *out.method_mut() = req.method().clone();
    *out.uri_mut() = req.uri().clone();
    *out.version_mut() = req.version();
    *out.headers_mut() = req.headers().clone();
    if let Some(ctx) = req.extensions().get::<Ctx>() {
        out.extensions_mut().insert(ctx.clone());
    }
    out
}

impl tower::Service<Request<Bytes>> for Service {
    type Response = Response<ResponseBody>;
    type Error = crate::Error;
    type Future = BoxFuture<Result<Response<ResponseBody>, crate::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), crate::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Bytes>) -> Self::Future {
        let fail = |e: crate::Error| -> Self::Future { Box::pin(std::future::ready(Err(e))) };
        let ctx = match crate::context::of(&req) {
            Ok(ctx) => ctx,
            Err(e) => return fail(e),
        };
        let (route, identity) = match (ctx.route(), ctx.identity()) {
            (Ok(r), Ok(i)) => (r, i),
            (Err(e), _) | (_, Err(e)) => return fail(e),
        };
        let Some(upstream) = self.upstreams.get(route.pool).cloned() else {
            return fail(crate::Error::internal("no upstream for the routed pool"));
        };
        // The retry stage picks the endpoint of each attempt; a pool of one needs no pick.
        let index = match ctx.endpoint() {
            Some(to) => to.index,
            None if upstream.endpoints.len() == 1 => 0,
            None => return fail(crate::Error::internal("no endpoint picked for the attempt")),
        };
        let Some(endpoint) = upstream.endpoints.get(index) else {
            // Picked from a reloaded endpoint list this (older) stack does not have.
            return fail(Error::Unavailable(upstream.name.clone()).into());
        };
        let (mut parts, mut body) = req.into_parts();
        let uri = match endpoint.target(&parts.uri) {
            Ok(uri) => uri,
            Err(e) => return fail(e.into()),
        };
        if let Some(to) = ctx
            .request()
            .ok()
            .and_then(|p| endpoint.mapped_model(&p.model))
        {
            if let Some(rewritten) = endpoint::rewrite_model(&body, to) {
                body = rewritten;
            }
        }
        let own = identity.tenant.upstream_keys.for_endpoint(&endpoint.name);
        let own_key = own.is_some();
        let auth = endpoint.auth(own.map(|k| k.expose()));
        headers::for_upstream(
            &mut parts.headers,
            self.tenant_header.as_ref(),
            &identity.tenant.forward_headers,
        );
        // Correlation: the provider sees the client's request id, else fairgate's own.
        parts
            .headers
            .entry(crate::context::REQUEST_ID_HEADER)
            .or_insert_with(|| ctx.own_request_id().clone());
        if let Some((name, value)) = auth {
            parts.headers.insert(name, value);
        }
        if self.propagate_trace {
            parts.headers.insert(
                crate::context::TRACEPARENT,
                ctx.trace().upstream_header(ctx.recorded()),
            );
        }
        let mut out = Request::new(Full::new(body));
        *out.method_mut() = parts.method;
        *out.uri_mut() = uri;
        *out.version_mut() = Version::HTTP_11;
        *out.headers_mut() = parts.headers;
        let fut = endpoint.lane().client.request(out);
        let (first_byte, idle) = (endpoint.first_byte_timeout, endpoint.idle_timeout);
        Box::pin(async move {
            // Named only when the attempt fails (a pool of one: its name; else with the endpoint's).
            let label = || {
                let endpoint = &upstream.endpoints[index];
                if upstream.endpoints.len() == 1 {
                    upstream.name.clone()
                } else {
                    format!("{} ({})", upstream.name, endpoint.name)
                }
            };
            let res = match tokio::time::timeout(first_byte, fut).await {
                Err(_) => {
                    return Err(Error::Timeout(label(), first_byte).into());
                }
                Ok(Err(e)) => {
                    tracing::warn!(
                        upstream = %upstream.name,
                        endpoint = %upstream.endpoints[index].name,
                        error = %e,
                        "upstream request failed"
                    );
                    let label = label();
                    return Err(if let Some(why) = tls_failure(&e) {
                        Error::Tls(label, why).into()
                    } else if crate::fdlimit::caused_by_exhaustion(&e) {
                        Error::NoDescriptors(label).into()
                    } else if e.is_connect() {
                        Error::Unavailable(label).into()
                    } else {
                        Error::Failed(label).into()
                    });
                }
                Ok(Ok(res)) => res,
            };
            let (mut head, body) = res.into_parts();
            headers::strip_hop_by_hop(&mut head.headers);
            headers::strip_ours(&mut head.headers);
            if own_key {
                head.extensions.insert(answer::OwnKey);
            }
            // The provider's id of an answer that is not retried (a retried attempt's answer is
            // dropped unread, so its id would name nothing the client saw).
            let retryable = matches!(head.status.as_u16(), 429 | 502 | 503);
            if let Some(id) = head.headers.get(crate::context::REQUEST_ID_HEADER) {
                if !retryable {
                    ctx.set_upstream_request_id_once(id.clone());
                }
            }
            let body = ResponseBody::upstream(IdleTimeout::new(body, idle));
            Ok(Response::from_parts(head, body))
        })
    }
}

/// Loads upstream `index`'s endpoints' TLS files (CA bundle, client certificate and key) as
/// `serve` would, for `fairgate check`.
pub fn check_tls(cfg: &UpstreamConfig, index: usize) -> Result<(), ConfigError> {
    for (j, e) in cfg.endpoints.iter().enumerate() {
        tls::client_config(e, index, j)?;
    }
    Ok(())
}

/// The TLS error behind a failed upstream request, if that is what failed.
fn tls_failure(e: &hyper_util::client::legacy::Error) -> Option<String> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    // Bounded: error chains are short, and a cycle must not hang a request.
    for _ in 0..16 {
        let s = source?;
        if let Some(t) = s.downcast_ref::<rustls::Error>() {
            return Some(t.to_string());
        }
        // An io::Error's `source` skips the error it wraps (hyper-rustls wraps tokio-rustls's
        // io::Error, which wraps the rustls::Error): step into it instead.
        source = match s
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
            None => s.source(),
        };
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upstream(base_url: &str) -> Upstream {
        let cfg: UpstreamConfig = toml::from_str::<UpstreamConfig>(&format!(
            "name = \"u\"\nbase_url = \"{base_url}\"\nmodels = [\"gpt-*\", \"exact\"]\n"
        ))
        .unwrap()
        .resolved();
        Upstream::from_config(&cfg, 0, 1, |_| None).unwrap()
    }

    #[test]
    fn target_joins_base_and_keeps_query() {
        let u = upstream("https://api.example.com/v1/");
        let t = u
            .target(&"/v1/chat/completions?a=1".parse().unwrap())
            .unwrap();
        assert_eq!(
            t.to_string(),
            "https://api.example.com/v1/chat/completions?a=1"
        );
        let u = upstream("http://127.0.0.1:9000");
        let t = u.target(&"/v1/embeddings".parse().unwrap()).unwrap();
        assert_eq!(t.to_string(), "http://127.0.0.1:9000/embeddings");
        assert!(u.target(&"/other".parse().unwrap()).is_err());
    }

    #[test]
    fn missing_upstream_env_names_the_key() {
        let cfg: UpstreamConfig = toml::from_str::<UpstreamConfig>(
            "name = \"u\"\nbase_url = \"http://a/v1\"\napi_key_env = \"NOPE_X\"\n",
        )
        .unwrap()
        .resolved();
        let e = Upstream::from_config(&cfg, 2, 1, |_| None)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("upstreams[2].api_key_env") && e.contains("NOPE_X"),
            "{e}"
        );
    }

    #[test]
    fn out_of_descriptors_is_a_503_with_retry_after() {
        let e = crate::Error::from(Error::NoDescriptors("u".into()));
        assert_eq!(e.status(), StatusCode::SERVICE_UNAVAILABLE);
        let headers = e.all_headers();
        assert!(headers
            .iter()
            .any(|(k, v)| k == http::header::RETRY_AFTER && v == "1"));
    }
}
