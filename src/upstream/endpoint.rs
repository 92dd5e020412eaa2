//! One endpoint of a pool as the upstream stage sends to it: its address, key and how the key
//! is written (`auth_header`), fixed query parameters, model-name map, timeouts and one pooled
//! client per connection worker.
//!
//! Invariants: the key is a sensitive header value and never logged; a fixed `query` parameter
//! replaces a client's parameter of the same name (an `api-version` is the operator's); the
//! request's `model` is rewritten only when `models_map` names it, and the answer is never
//! rewritten (its `model` is the provider's).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Uri};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use super::Error;
use crate::config::{ConfigError, EndpointConfig};

pub(super) type HttpClient = Client<HttpsConnector<HttpConnector>, http_body_util::Full<Bytes>>;

/// One connection worker's client and authority.
pub(super) struct Lane {
    pub(super) client: HttpClient,
    authority: http::uri::Authority,
}

/// One endpoint; see the module docs.
pub struct Endpoint {
    /// Its name.
    pub name: Arc<str>,
    /// Time to the response head.
    pub first_byte_timeout: Duration,
    /// Max gap between body frames.
    pub idle_timeout: Duration,
    scheme: http::uri::Scheme,
    prefix: String,
    auth: HeaderName,
    bearer: bool,
    api_key: Option<HeaderValue>,
    query: Vec<(String, String)>,
    models_map: BTreeMap<String, String>,
    lanes: Box<[Lane]>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("name", &self.name)
            .field("authority", &self.lanes[0].authority)
            .finish_non_exhaustive()
    }
}

impl Endpoint {
    /// Builds endpoint `j` of upstream `i` with `lanes` pooled clients; `env` resolves
    /// `api_key_env` (unset → an error naming the key).
    pub fn from_config(
        cfg: &EndpointConfig,
        (i, j): (usize, usize),
        lanes: usize,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let invalid = |k: &str, message: String| ConfigError::Invalid {
            key: cfg.key(i, j, k),
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
        let tls = super::tls::client_config(cfg, i, j)?;
        let auth = match &cfg.auth_header {
            None => http::header::AUTHORIZATION,
            Some(h) => HeaderName::from_bytes(h.as_bytes())
                .map_err(|_| invalid("auth_header", format!("{h:?} is not a header name")))?,
        };
        let bearer = auth == http::header::AUTHORIZATION;
        let api_key = match &cfg.api_key_env {
            None => None,
            Some(var) => {
                let value = env(var).ok_or_else(|| ConfigError::MissingEnv {
                    key: cfg.key(i, j, "api_key_env"),
                    var: var.clone(),
                })?;
                Some(key_value(bearer, &value).ok_or_else(|| {
                    invalid("api_key_env", format!("{var} is not a valid header value"))
                })?)
            }
        };
        let connect = Duration::from_millis(cfg.connect_timeout_ms);
        Ok(Self {
            name: Arc::from(cfg.name.as_str()),
            first_byte_timeout: Duration::from_millis(cfg.first_byte_timeout_ms),
            idle_timeout: Duration::from_millis(cfg.idle_timeout_ms),
            scheme,
            prefix,
            auth,
            bearer,
            api_key,
            query: cfg
                .query
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            models_map: cfg.models_map.clone(),
            lanes: (0..lanes.max(1))
                .map(|_| Lane {
                    client: client(tls.clone(), connect, cfg.max_concurrency),
                    // A copy of its own, not a clone sharing one reference count.
                    authority: http::uri::Authority::from_maybe_shared(Bytes::copy_from_slice(
                        authority.as_str().as_bytes(),
                    ))
                    .unwrap_or_else(|_| authority.clone()),
                })
                .collect(),
        })
    }

    /// Whether `other` sends the same key.
    pub fn same_key(&self, other: &Endpoint) -> bool {
        self.api_key == other.api_key && self.auth == other.auth
    }

    /// This connection worker's lane.
    pub(super) fn lane(&self) -> &Lane {
        &self.lanes[crate::worker::current() % self.lanes.len()]
    }

    /// The key header to send: the tenant's own key `own` if given (written the way this
    /// endpoint expects), else the endpoint's, else none.
    pub fn auth(&self, own: Option<&str>) -> Option<(HeaderName, HeaderValue)> {
        let value = match own {
            Some(k) => key_value(self.bearer, k)?,
            None => self.api_key.clone()?,
        };
        Some((self.auth.clone(), value))
    }

    /// The model name this endpoint knows `model` by, when `models_map` renames it.
    pub fn mapped_model(&self, model: &str) -> Option<&str> {
        self.models_map.get(model).map(String::as_str)
    }

    /// `base_url + (path without /v1) + ?query`, the fixed `query` parameters replacing the
    /// client's of the same name.
    pub fn target(&self, uri: &Uri) -> Result<Uri, Error> {
        let rest = uri.path().strip_prefix("/v1").ok_or(Error::BadPath)?;
        let mut pq = String::with_capacity(self.prefix.len() + uri.path().len() + 16);
        pq.push_str(&self.prefix);
        pq.push_str(rest);
        if self.query.is_empty() {
            if let Some(q) = uri.query() {
                pq.push('?');
                pq.push_str(q);
            }
        } else {
            let mut out = form_urlencoded::Serializer::new(String::new());
            let fixed = |k: &str| self.query.iter().any(|(f, _)| f == k);
            for (k, v) in form_urlencoded::parse(uri.query().unwrap_or("").as_bytes()) {
                if !fixed(&k) {
                    out.append_pair(&k, &v);
                }
            }
            for (k, v) in &self.query {
                out.append_pair(k, v);
            }
            pq.push('?');
            pq.push_str(&out.finish());
        }
        Uri::builder()
            .scheme(self.scheme.clone())
            .authority(self.lane().authority.clone())
            .path_and_query(pq)
            .build()
            .map_err(|_| Error::BadPath)
    }
}

/// `Bearer KEY` (or the bare key), marked sensitive.
fn key_value(bearer: bool, key: &str) -> Option<HeaderValue> {
    let mut v = if bearer {
        super::headers::bearer(key)?
    } else {
        HeaderValue::try_from(key).ok()?
    };
    v.set_sensitive(true);
    Some(v)
}

/// The request body with its `model` replaced by `to` (the rest kept as parsed); `None` when
/// the body is not a JSON object.
pub fn rewrite_model(body: &[u8], to: &str) -> Option<Bytes> {
    let mut v: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(body).ok()?;
    v.insert("model".into(), serde_json::Value::String(to.into()));
    serde_json::to_vec(&v).ok().map(Bytes::from)
}

/// A pooled client with a connector of its own (its shared state is not shared with the other
/// lanes).
pub(super) fn client(
    tls: rustls::ClientConfig,
    connect_timeout: Duration,
    pool: usize,
) -> HttpClient {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint(extra: &str) -> Endpoint {
        let u: crate::config::UpstreamConfig = toml::from_str(&format!(
            "name = \"u\"\nbase_url = \"https://east.example/openai/v1\"\n{extra}\n"
        ))
        .unwrap();
        let u = u.resolved();
        Endpoint::from_config(&u.endpoints[0], (0, 0), 1, |_| Some("sk-1".into())).unwrap()
    }

    #[test]
    fn azure_style_key_header_query_and_model_map() {
        let e = endpoint(
            "api_key_env = \"K\"\nauth_header = \"api-key\"\n\
             query = { \"api-version\" = \"2024-10-21\" }\nmodels_map = { \"gpt-4o\" = \"dep-1\" }",
        );
        let (name, value) = e.auth(None).unwrap();
        assert_eq!(
            (name.as_str(), value.to_str().unwrap()),
            ("api-key", "sk-1")
        );
        assert!(value.is_sensitive());
        let (_, own) = e.auth(Some("tenant-own")).unwrap();
        assert_eq!(
            own, "tenant-own",
            "a tenant's key is written the endpoint's way"
        );
        let t = e
            .target(&"/v1/chat/completions?api-version=old&x=1".parse().unwrap())
            .unwrap();
        assert_eq!(
            t.to_string(),
            "https://east.example/openai/v1/chat/completions?x=1&api-version=2024-10-21"
        );
        assert_eq!(e.mapped_model("gpt-4o"), Some("dep-1"));
        assert_eq!(e.mapped_model("other"), None);
        let body = rewrite_model(br#"{"model":"gpt-4o","messages":[]}"#, "dep-1").unwrap();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["model"], "dep-1");
        assert_eq!(v["messages"], serde_json::json!([]));
        assert!(rewrite_model(b"[1]", "x").is_none());
    }

    #[test]
    fn the_default_is_a_bearer_authorization_and_the_query_passes_as_is() {
        let e = endpoint("api_key_env = \"K\"");
        let (name, value) = e.auth(None).unwrap();
        assert_eq!(
            (name, value.to_str().unwrap()),
            (http::header::AUTHORIZATION, "Bearer sk-1")
        );
        let t = e.target(&"/v1/embeddings?a=%20b".parse().unwrap()).unwrap();
        assert_eq!(
            t.to_string(),
            "https://east.example/openai/v1/embeddings?a=%20b"
        );
        assert!(endpoint("").auth(None).is_none());
    }
}
