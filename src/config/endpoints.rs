//! `[[upstreams.endpoints]]`: the endpoints one upstream pool spreads its traffic over, and how
//! an `[[upstreams]]` entry is resolved into them.
//!
//! Invariants (after resolution, i.e. in every [`UpstreamConfig`] a `Config` holds):
//! - A plain `base_url` upstream is a pool of exactly one endpoint, named after the upstream,
//!   holding every endpoint-level key the upstream sets; with `[[upstreams.endpoints]]` each
//!   endpoint inherits what it does not set itself (key, TLS, timeouts, `auth_header`, `query`,
//!   `models_map`) from its upstream. A map an endpoint sets replaces the upstream's whole.
//! - The pool's `max_concurrency` is the one given, else the sum of its endpoints'.
//! - Setting both `base_url` and endpoints, or neither, leaves `endpoints` empty and
//!   `base_url` as given; `validate` refuses both (naming the key).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

use super::schema::UpstreamConfig;
use super::validate::{env_name, invalid, positive_weight};
use super::ConfigError;

/// One endpoint of a pool, resolved (every inherited key filled in from its upstream).
#[derive(Debug, Clone, PartialEq)]
pub struct EndpointConfig {
    /// Unique within the pool (metrics, logs, the console; the upstream's name for a plain
    /// `base_url` upstream).
    pub name: String,
    /// `http(s)://host[:port]/prefix`; `/v1/X` goes to `base_url + /X`.
    pub base_url: String,
    /// Env var holding this endpoint's provider key.
    pub api_key_env: Option<String>,
    /// Concurrent requests this endpoint accepts (a ceiling; the limit in force is learned).
    pub max_concurrency: usize,
    /// 0 is primary; an endpoint of priority n takes work only while none below n can.
    pub priority: u32,
    /// Share of the free capacity this endpoint is given among its priority level (> 0).
    pub weight: f64,
    /// The header carrying the key: `authorization` (sent as `Bearer KEY`, the default) or any
    /// other name, sent as the bare key (`api-key` for Azure OpenAI).
    pub auth_header: Option<String>,
    /// Query parameters added to every request (`api-version` for Azure OpenAI).
    pub query: BTreeMap<String, String>,
    /// Model names rewritten in the request body for this endpoint (an Azure deployment name).
    pub models_map: BTreeMap<String, String>,
    /// TCP connect timeout, ms.
    pub connect_timeout_ms: u64,
    /// Time to the response head, ms.
    pub first_byte_timeout_ms: u64,
    /// Max gap between body chunks, ms.
    pub idle_timeout_ms: u64,
    /// Extra CA bundle (PEM).
    pub ca_file: Option<PathBuf>,
    /// Also trust the OS store.
    pub system_roots: bool,
    /// mTLS client chain (PEM).
    pub client_cert_file: Option<PathBuf>,
    /// mTLS client key (PEM).
    pub client_key_file: Option<PathBuf>,
    /// Written as `[[upstreams.endpoints]]` (false: made from the upstream's `base_url`); config
    /// errors name `upstreams[i].endpoints[j].KEY` or `upstreams[i].KEY` accordingly.
    pub listed: bool,
}

impl EndpointConfig {
    /// The config key path of `key` on endpoint `j` of upstream `i`.
    pub fn key(&self, i: usize, j: usize, key: &str) -> String {
        if self.listed {
            format!("upstreams[{i}].endpoints[{j}].{key}")
        } else {
            format!("upstreams[{i}].{key}")
        }
    }
}

/// `[[upstreams.endpoints]]` as written: every key but `name` and `base_url` optional.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawEndpoint {
    name: String,
    base_url: String,
    #[serde(default)]
    api_key_env: Option<String>,
    #[serde(default)]
    max_concurrency: Option<usize>,
    #[serde(default)]
    priority: u32,
    #[serde(default = "one")]
    weight: f64,
    #[serde(default)]
    auth_header: Option<String>,
    #[serde(default)]
    query: Option<BTreeMap<String, String>>,
    #[serde(default)]
    models_map: Option<BTreeMap<String, String>>,
    #[serde(default)]
    connect_timeout_ms: Option<u64>,
    #[serde(default)]
    first_byte_timeout_ms: Option<u64>,
    #[serde(default)]
    idle_timeout_ms: Option<u64>,
    #[serde(default)]
    ca_file: Option<PathBuf>,
    #[serde(default)]
    system_roots: Option<bool>,
    #[serde(default)]
    client_cert_file: Option<PathBuf>,
    #[serde(default)]
    client_key_file: Option<PathBuf>,
}

fn one() -> f64 {
    1.0
}

/// `[upstreams.health]`: when an endpoint is taken out of its pool and how it comes back.
///
/// A failure is a connect or TLS error, a missing response head within
/// `first_byte_timeout_ms`, or a 5xx answer (a 503 that names a wait is an overload, not a
/// failure); any other answer is a success. An endpoint is ejected after
/// `consecutive_failures` failures in a row, or when at least `error_rate` of its last
/// `error_window` answers failed. It stays out `eject_ms × 2^(n-1)` (n: ejections in a row,
/// at most `max_eject_ms`), then takes one request as a probe: a success puts it back (and
/// resets n), a failure ejects it again. The last endpoint of a pool in service is never
/// ejected: with nowhere else to go, a request is better sent than refused.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct HealthConfig {
    /// Failures in a row that eject an endpoint.
    pub consecutive_failures: u32,
    /// Failed fraction of the last `error_window` answers that ejects an endpoint.
    pub error_rate: f64,
    /// Answers the error rate is counted over (at most 64).
    pub error_window: u32,
    /// First ejection, ms (doubled per ejection in a row).
    pub eject_ms: u64,
    /// Longest ejection, ms.
    pub max_eject_ms: u64,
}

impl Default for HealthConfig {
    fn default() -> Self {
        Self {
            consecutive_failures: 5,
            error_rate: 0.5,
            error_window: 20,
            eject_ms: 1_000,
            max_eject_ms: 30_000,
        }
    }
}

/// Deserializes `[[upstreams]]` and resolves each entry (see the module docs).
pub(super) fn resolved_upstreams<'de, D>(d: D) -> Result<Vec<UpstreamConfig>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    let written: Vec<UpstreamConfig> = Vec::deserialize(d)?;
    Ok(written.into_iter().map(UpstreamConfig::resolved).collect())
}

impl UpstreamConfig {
    /// This entry with its endpoints and pool size filled in (done when a `Config` is read;
    /// call it on an `UpstreamConfig` deserialized on its own).
    pub fn resolved(mut self) -> Self {
        let raw = std::mem::take(&mut self.written_endpoints);
        let given = self.written_concurrency;
        resolve(&mut self, raw, given);
        self
    }
}

/// An endpoint's default `max_concurrency`.
pub const DEFAULT_ENDPOINT_CONCURRENCY: usize = 64;

/// Fills `u.endpoints` from `raw` (or from `u.base_url`) and `u.max_concurrency` (see the
/// module docs). `given`: the upstream's own `max_concurrency`, if set.
pub(super) fn resolve(u: &mut UpstreamConfig, raw: Vec<RawEndpoint>, given: Option<usize>) {
    // Kept for `validate` (which names the key when both or neither are set).
    u.written_endpoints = raw.clone();
    let inherit = |e: RawEndpoint, listed: bool| EndpointConfig {
        api_key_env: e.api_key_env.or_else(|| u.api_key_env.clone()),
        max_concurrency: e.max_concurrency.unwrap_or(DEFAULT_ENDPOINT_CONCURRENCY),
        priority: e.priority,
        weight: e.weight,
        auth_header: e.auth_header.or_else(|| u.auth_header.clone()),
        query: e.query.unwrap_or_else(|| u.query.clone()),
        models_map: e.models_map.unwrap_or_else(|| u.models_map.clone()),
        connect_timeout_ms: e.connect_timeout_ms.unwrap_or(u.connect_timeout_ms),
        first_byte_timeout_ms: e.first_byte_timeout_ms.unwrap_or(u.first_byte_timeout_ms),
        idle_timeout_ms: e.idle_timeout_ms.unwrap_or(u.idle_timeout_ms),
        ca_file: e.ca_file.or_else(|| u.ca_file.clone()),
        system_roots: e.system_roots.unwrap_or(u.system_roots),
        client_cert_file: e.client_cert_file.or_else(|| u.client_cert_file.clone()),
        client_key_file: e.client_key_file.or_else(|| u.client_key_file.clone()),
        name: e.name,
        base_url: e.base_url,
        listed,
    };
    u.endpoints = match (&u.base_url, raw.is_empty()) {
        (Some(base_url), true) => {
            let one = RawEndpoint {
                name: u.name.clone(),
                base_url: base_url.clone(),
                api_key_env: None,
                max_concurrency: Some(given.unwrap_or(DEFAULT_ENDPOINT_CONCURRENCY)),
                priority: 0,
                weight: 1.0,
                auth_header: None,
                query: None,
                models_map: None,
                connect_timeout_ms: None,
                first_byte_timeout_ms: None,
                idle_timeout_ms: None,
                ca_file: None,
                system_roots: None,
                client_cert_file: None,
                client_key_file: None,
            };
            vec![inherit(one, false)]
        }
        (None, false) => raw.into_iter().map(|e| inherit(e, true)).collect(),
        // Both or neither: refused by `validate`.
        _ => Vec::new(),
    };
    u.max_concurrency = given.unwrap_or_else(|| {
        if u.endpoints.is_empty() {
            DEFAULT_ENDPOINT_CONCURRENCY
        } else {
            u.endpoints.iter().map(|e| e.max_concurrency).sum()
        }
    });
}

/// Checks upstream `i`'s endpoints (after resolution): exactly one of `base_url` and
/// `[[upstreams.endpoints]]`, unique names, http(s) URLs without a query, sizes, weights, header
/// names, `query` and `models_map` entries, health rules.
pub(super) fn validate(u: &UpstreamConfig, i: usize) -> Result<(), ConfigError> {
    let key = |k: &str| format!("upstreams[{i}].{k}");
    match (&u.base_url, u.written_endpoints.is_empty()) {
        (Some(_), false) => {
            return Err(invalid(
                key("endpoints"),
                "set either base_url or [[upstreams.endpoints]], not both",
            ))
        }
        (None, true) => {
            return Err(invalid(
                key("base_url"),
                "required (or list the pool's [[upstreams.endpoints]])",
            ))
        }
        _ => {}
    }
    if u.endpoints.len() > 64 {
        return Err(invalid(key("endpoints"), "at most 64 endpoints per pool"));
    }
    let mut names = std::collections::HashSet::new();
    for (j, e) in u.endpoints.iter().enumerate() {
        let key = |k: &str| e.key(i, j, k);
        if e.name.is_empty() || !names.insert(e.name.as_str()) {
            return Err(invalid(
                key("name"),
                format!(
                    "endpoint names must be unique and non-empty, got {:?}",
                    e.name
                ),
            ));
        }
        let uri: http::Uri = e
            .base_url
            .parse()
            .map_err(|err| invalid(key("base_url"), format!("not a URL: {err}")))?;
        if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.authority().is_none() {
            return Err(invalid(
                key("base_url"),
                "must be an http:// or https:// URL",
            ));
        }
        if uri.query().is_some() {
            return Err(invalid(
                key("base_url"),
                "must not have a query string (use `query`)",
            ));
        }
        if e.max_concurrency == 0 {
            return Err(invalid(key("max_concurrency"), "must be > 0"));
        }
        positive_weight(key("weight"), e.weight)?;
        env_name(key("api_key_env"), &e.api_key_env)?;
        if let Some(h) = &e.auth_header {
            match http::HeaderName::from_bytes(h.as_bytes()) {
                Ok(n) if !n.as_str().starts_with("x-fairgate-") => {}
                _ => {
                    return Err(invalid(
                        key("auth_header"),
                        format!("{h:?} is not a header name"),
                    ))
                }
            }
        }
        for (k, v) in &e.query {
            if k.is_empty() || k.contains(['\0', '\r', '\n']) || v.contains(['\0', '\r', '\n']) {
                return Err(invalid(key("query"), format!("bad parameter {k:?}")));
            }
        }
        for (from, to) in &e.models_map {
            if from.is_empty() || to.is_empty() {
                return Err(invalid(key("models_map"), "model names must not be empty"));
            }
        }
        for (k, v) in [
            ("connect_timeout_ms", e.connect_timeout_ms),
            ("first_byte_timeout_ms", e.first_byte_timeout_ms),
            ("idle_timeout_ms", e.idle_timeout_ms),
        ] {
            if v == 0 {
                return Err(invalid(key(k), "must be > 0"));
            }
        }
    }
    let h = &u.health;
    if h.consecutive_failures == 0 {
        return Err(invalid(key("health.consecutive_failures"), "must be > 0"));
    }
    if !(h.error_rate > 0.0 && h.error_rate <= 1.0) {
        return Err(invalid(key("health.error_rate"), "must be in (0, 1]"));
    }
    if !(1..=64).contains(&h.error_window) {
        return Err(invalid(key("health.error_window"), "must be in 1..=64"));
    }
    if h.eject_ms == 0 || h.max_eject_ms < h.eject_ms {
        return Err(invalid(
            key("health.max_eject_ms"),
            "eject_ms must be > 0 and max_eject_ms at least eject_ms",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn up(toml: &str) -> UpstreamConfig {
        toml::from_str::<UpstreamConfig>(toml).unwrap().resolved()
    }

    #[test]
    fn a_plain_base_url_is_a_pool_of_one_endpoint_holding_its_settings() {
        let u = up(
            "name = \"u\"\nbase_url = \"http://a/v1\"\napi_key_env = \"K\"\n\
                    auth_header = \"api-key\"\nquery = { api-version = \"1\" }\n",
        );
        assert_eq!(u.max_concurrency, 64);
        assert_eq!(u.endpoints.len(), 1);
        let e = &u.endpoints[0];
        assert_eq!((e.name.as_str(), e.base_url.as_str()), ("u", "http://a/v1"));
        assert_eq!(e.api_key_env.as_deref(), Some("K"));
        assert_eq!(e.auth_header.as_deref(), Some("api-key"));
        assert_eq!(e.query["api-version"], "1");
        assert_eq!((e.max_concurrency, e.priority, e.listed), (64, 0, false));
        assert_eq!(e.key(2, 0, "base_url"), "upstreams[2].base_url");
        let u = up("name = \"u\"\nbase_url = \"http://a/v1\"\nmax_concurrency = 7\n");
        assert_eq!((u.max_concurrency, u.endpoints[0].max_concurrency), (7, 7));
    }

    #[test]
    fn endpoints_inherit_what_they_do_not_set_and_the_pool_size_is_their_sum() {
        let u = up(r#"
            name = "gpt"
            api_key_env = "SHARED"
            first_byte_timeout_ms = 9000
            query = { "api-version" = "2024-10-21" }
            [[endpoints]]
            name = "eastus"
            base_url = "https://east/openai/v1"
            max_concurrency = 32
            auth_header = "api-key"
            models_map = { "gpt-4o" = "east-4o" }
            [[endpoints]]
            name = "openai"
            base_url = "https://api.openai.com/v1"
            api_key_env = "OPENAI_API_KEY"
            priority = 1
            weight = 2.0
            first_byte_timeout_ms = 100
            query = {}
        "#);
        assert_eq!(u.max_concurrency, 32 + 64);
        let (a, b) = (&u.endpoints[0], &u.endpoints[1]);
        assert_eq!(a.api_key_env.as_deref(), Some("SHARED"));
        assert_eq!(b.api_key_env.as_deref(), Some("OPENAI_API_KEY"));
        assert_eq!(
            (a.first_byte_timeout_ms, b.first_byte_timeout_ms),
            (9000, 100)
        );
        assert_eq!(a.query["api-version"], "2024-10-21");
        assert!(
            b.query.is_empty(),
            "a map set on the endpoint replaces the upstream's"
        );
        assert_eq!(a.models_map["gpt-4o"], "east-4o");
        assert_eq!(
            (b.priority, b.weight, b.auth_header.as_deref()),
            (1, 2.0, None)
        );
        assert_eq!(b.key(0, 1, "weight"), "upstreams[0].endpoints[1].weight");
        let capped = up(
            "name = \"g\"\nmax_concurrency = 5\n[[endpoints]]\nname = \"a\"\n\
                         base_url = \"http://a\"\n",
        );
        assert_eq!(capped.max_concurrency, 5, "a pool size given caps the sum");
    }
}
