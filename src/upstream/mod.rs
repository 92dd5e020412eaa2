//! Upstream stage (innermost): forwards the request to the routed provider and streams the
//! answer back.
//!
//! `/v1/X?q` goes to `base_url + /X?q`. Headers are cleaned by [`headers::for_upstream`]; the
//! `authorization` sent is the tenant's own provider key, else the upstream's, else none.
//! Invariants: the tenant's key never goes upstream; the response body is never collected — it
//! is [`ResponseBody::upstream`], polled only as fast as the client reads, and dropping it
//! cancels the upstream request; connect failure → 502 (503 with `Retry-After` when fairgate
//! is out of file descriptors), no response head within
//! `first_byte_timeout_ms` → 504, an upstream error status is passed through untouched.

pub mod headers;
mod tls;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Request, Response, StatusCode, Uri, Version};
use http_body_util::Full;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::config::{ConfigError, UpstreamConfig};
use crate::context::Ctx;
use crate::error::ApiError;
use crate::response::idle::IdleTimeout;
use crate::response::ResponseBody;

/// One connection worker's client and authority (see [`Upstream`]).
struct Lane {
    client: HttpClient,
    authority: http::uri::Authority,
}

type HttpClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// One provider pool: its address, key, limits, routing patterns and pooled client.
pub struct Upstream {
    /// Unique name.
    pub name: String,
    /// Model glob patterns.
    pub models: Vec<String>,
    /// Pool size shared by all tenants.
    pub max_concurrency: usize,
    /// Time to the response head.
    pub first_byte_timeout: Duration,
    /// Bounds of the provider's model list fetch (`models_list_*`).
    pub models_list: ModelsListLimits,
    /// Max gap between body frames.
    pub idle_timeout: Duration,
    scheme: http::uri::Scheme,
    prefix: String,
    api_key: Option<HeaderValue>,
    /// One lane per connection worker ([`crate::worker`]): a worker's requests use
    /// its own pooled client (whose connection tasks run on its own runtime), and its own copy
    /// of what every request clones (the authority, the connector's shared state), so the
    /// reference counts of one worker's requests are not written by the others.
    lanes: Box<[Lane]>,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream")
            .field("name", &self.name)
            .field("authority", &self.lanes[0].authority)
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
    fn reason(&self) -> &'static str {
        "upstream_error"
    }
}

impl Upstream {
    /// Builds an upstream (and `lanes` pooled clients, one per connection worker) from
    /// `[[upstreams]]` entry `index`; `env` resolves `api_key_env` (unset → error naming the key).
    pub fn from_config(
        cfg: &UpstreamConfig,
        index: usize,
        lanes: usize,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let key = |k: &str| format!("upstreams[{index}].{k}");
        let invalid = |k: &str, message: String| ConfigError::Invalid {
            key: key(k),
            message,
        };
        let uri: Uri = cfg
            .base_url
            .parse()
            .map_err(|e| invalid("base_url", format!("not a URL: {e}")))?;
        let parts = uri.into_parts();
        let (Some(scheme), Some(authority)) = (parts.scheme, parts.authority) else {
            return Err(invalid("base_url", "must be an absolute URL".into()));
        };
        let prefix = parts
            .path_and_query
            .map(|p| p.path().trim_end_matches('/').to_owned())
            .unwrap_or_default();
        let tls = tls::client_config(cfg, index)?;
        let api_key = match &cfg.api_key_env {
            None => None,
            Some(var) => {
                let value = env(var).ok_or_else(|| ConfigError::MissingEnv {
                    key: key("api_key_env"),
                    var: var.clone(),
                })?;
                Some(headers::bearer(&value).ok_or_else(|| {
                    invalid("api_key_env", format!("{var} is not a valid header value"))
                })?)
            }
        };
        Ok(Self {
            name: cfg.name.clone(),
            models: cfg.models.clone(),
            max_concurrency: cfg.max_concurrency,
            first_byte_timeout: Duration::from_millis(cfg.first_byte_timeout_ms),
            models_list: ModelsListLimits {
                timeout: Duration::from_millis(cfg.models_list_timeout_ms),
                ttl: Duration::from_millis(cfg.models_list_ttl_ms),
                max: cfg.models_list_max,
                max_bytes: cfg.models_list_max_bytes,
            },
            idle_timeout: Duration::from_millis(cfg.idle_timeout_ms),
            scheme,
            prefix,
            api_key,
            lanes: (0..lanes.max(1))
                .map(|_| Lane {
                    client: client(
                        tls.clone(),
                        Duration::from_millis(cfg.connect_timeout_ms),
                        cfg.max_concurrency,
                    ),
                    // A copy of its own, not a clone sharing one reference count.
                    authority: http::uri::Authority::from_maybe_shared(Bytes::copy_from_slice(
                        authority.as_str().as_bytes(),
                    ))
                    .unwrap_or_else(|_| authority.clone()),
                })
                .collect(),
        })
    }

    /// Whether `other` sends the same provider key (a reload keeps this upstream, and its
    /// pooled connections, only then).
    pub fn same_key(&self, other: &Upstream) -> bool {
        self.api_key == other.api_key
    }

    /// This connection worker's lane.
    fn lane(&self) -> &Lane {
        &self.lanes[crate::worker::current() % self.lanes.len()]
    }

    /// The provider's own model list: `GET base_url + /models` with the upstream's key, over
    /// this worker's pooled client (its TLS), within `models_list.timeout` (connect, head and
    /// body), the body read up to `models_list.max_bytes`. The error says why, never the key.
    pub async fn list_models(&self) -> Result<Bytes, String> {
        use http_body_util::BodyExt;
        let limits = self.models_list;
        let uri = self
            .target(&Uri::from_static("/v1/models"))
            .map_err(|e| e.to_string())?;
        let mut req = Request::new(Full::new(Bytes::new()));
        *req.uri_mut() = uri;
        req.headers_mut().insert(
            http::header::ACCEPT,
            HeaderValue::from_static("application/json"),
        );
        if let Some(key) = &self.api_key {
            req.headers_mut()
                .insert(http::header::AUTHORIZATION, key.clone());
        }
        let fut = self.lane().client.request(req);
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

    /// `base_url + (path without /v1) + ?query`.
    pub fn target(&self, uri: &Uri) -> Result<Uri, Error> {
        let rest = uri.path().strip_prefix("/v1").ok_or(Error::BadPath)?;
        let mut pq = String::with_capacity(self.prefix.len() + uri.path().len() + 16);
        pq.push_str(&self.prefix);
        pq.push_str(rest);
        if let Some(q) = uri.query() {
            pq.push('?');
            pq.push_str(q);
        }
        Uri::builder()
            .scheme(self.scheme.clone())
            .authority(self.lane().authority.clone())
            .path_and_query(pq)
            .build()
            .map_err(|_| Error::BadPath)
    }
}

/// A pooled client with a connector of its own (its shared state is not shared with the other
/// lanes).
fn client(tls: rustls::ClientConfig, connect_timeout: Duration, pool: usize) -> HttpClient {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(connect_timeout));
    let connector = HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .enable_http2()
        .wrap_connector(http);
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(pool)
        .pool_idle_timeout(Duration::from_secs(90))
        .pool_timer(hyper_util::rt::TokioTimer::new())
        .build(connector)
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

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

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
        let (mut parts, body) = req.into_parts();
        let uri = match upstream.target(&parts.uri) {
            Ok(uri) => uri,
            Err(e) => return fail(e.into()),
        };
        let auth = identity
            .tenant
            .upstream_key
            .clone()
            .or_else(|| upstream.api_key.clone());
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
        if let Some(auth) = auth {
            parts.headers.insert(http::header::AUTHORIZATION, auth);
        }
        if self.propagate_trace {
            parts
                .headers
                .insert(crate::context::TRACEPARENT, ctx.trace().upstream_header());
        }
        let mut out = Request::new(Full::new(body));
        *out.method_mut() = parts.method;
        *out.uri_mut() = uri;
        *out.version_mut() = Version::HTTP_11;
        *out.headers_mut() = parts.headers;
        let fut = upstream.lane().client.request(out);
        Box::pin(async move {
            let res = match tokio::time::timeout(upstream.first_byte_timeout, fut).await {
                Err(_) => {
                    let e = Error::Timeout(upstream.name.clone(), upstream.first_byte_timeout);
                    return Err(e.into());
                }
                Ok(Err(e)) => {
                    tracing::warn!(upstream = %upstream.name, error = %e, "upstream request failed");
                    return Err(if let Some(why) = tls_failure(&e) {
                        Error::Tls(upstream.name.clone(), why).into()
                    } else if crate::fdlimit::caused_by_exhaustion(&e) {
                        Error::NoDescriptors(upstream.name.clone()).into()
                    } else if e.is_connect() {
                        Error::Unavailable(upstream.name.clone()).into()
                    } else {
                        Error::Failed(upstream.name.clone()).into()
                    });
                }
                Ok(Ok(res)) => res,
            };
            let (mut head, body) = res.into_parts();
            headers::strip_hop_by_hop(&mut head.headers);
            // The provider's id of an answer that is not retried (a retried attempt's answer is
            // dropped unread, so its id would name nothing the client saw).
            let retryable = matches!(head.status.as_u16(), 429 | 502 | 503);
            if let Some(id) = head.headers.get(crate::context::REQUEST_ID_HEADER) {
                if !retryable {
                    ctx.set_upstream_request_id_once(id.clone());
                }
            }
            let body = ResponseBody::upstream(IdleTimeout::new(body, upstream.idle_timeout));
            Ok(Response::from_parts(head, body))
        })
    }
}

/// Loads upstream `index`'s TLS files (CA bundle, client certificate and key) as `serve`
/// would, for `fairgate check`.
pub fn check_tls(cfg: &UpstreamConfig, index: usize) -> Result<(), ConfigError> {
    tls::client_config(cfg, index).map(drop)
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
        let cfg: UpstreamConfig = toml::from_str(&format!(
            "name = \"u\"\nbase_url = \"{base_url}\"\nmodels = [\"gpt-*\", \"exact\"]\n"
        ))
        .unwrap();
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
        let cfg: UpstreamConfig =
            toml::from_str("name = \"u\"\nbase_url = \"http://a/v1\"\napi_key_env = \"NOPE_X\"\n")
                .unwrap();
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
