//! Tenant stage: who is calling. `Authorization: Bearer <key>` → SHA-256 digest → [`Tenant`],
//! or, in sidecar mode (`[server] tenant_header`), a trusted header naming the tenant id.
//!
//! Sidecar mode is safe by default: the header is trusted only from a peer in `[server]
//! trusted_sources` (default loopback: `127.0.0.1/32`, `::1/128`). From any other peer (or
//! with no known peer) the header is ignored, an API key is required as without sidecar mode,
//! and the request is counted (`fairgate_untrusted_tenant_header_total`) when it carried one.
//!
//! Writes the request context's [`Identity`]. Invariants: keys are only ever held as
//! digests, never logged or echoed; every lookup costs one hash and one map probe whether or not
//! the key matches; an unknown or missing key never reaches later stages (401).

use std::net::IpAddr;
use std::sync::Arc;

use http::{header, HeaderMap, HeaderName, StatusCode};

use crate::config::{Cidr, Config, ConfigError};
use crate::domain::{Class, TenantId};
use crate::error::ApiError;

pub mod runtime;
mod service;
pub use service::{Layer, Service};

/// Request header choosing the class of one request: `interactive` or `batch`.
pub const PRIORITY_HEADER: http::HeaderName = http::HeaderName::from_static("x-fairgate-priority");

pub use crate::context::{Identity, OwnKeys, ProviderKey, Tenant};
pub use crate::domain::{digest, parse_digest};
pub use crate::upstream::headers::bearer;

/// Tenant stage errors.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No key was sent.
    #[error("missing API key: send `Authorization: Bearer <key>`")]
    MissingKey,
    /// The key matches no tenant.
    #[error("incorrect API key provided")]
    UnknownKey,
    /// Sidecar mode: the tenant header is missing or names no configured tenant.
    #[error("missing or unknown tenant in the {0} header")]
    UnknownTenant(HeaderName),
    /// `x-fairgate-priority` is neither `interactive` nor `batch`.
    #[error("invalid x-fairgate-priority header: expected `interactive` or `batch`")]
    BadPriority,
}

impl ApiError for Error {
    fn status(&self) -> StatusCode {
        match self {
            Error::BadPriority => StatusCode::BAD_REQUEST,
            _ => StatusCode::UNAUTHORIZED,
        }
    }
    fn kind(&self) -> &'static str {
        "invalid_request_error"
    }
    fn code(&self) -> &'static str {
        match self {
            Error::BadPriority => "invalid_priority",
            _ => "invalid_api_key",
        }
    }
    fn reason(&self) -> crate::error::Reason {
        crate::error::Reason::Auth
    }
}

/// All tenants, indexed by key digest and by id.
#[derive(Debug, Default)]
pub struct Directory {
    /// Key digest → (tenant, recovery key?, class the key defaults to).
    by_digest: crate::domain::FastMap<[u8; 32], (Arc<Tenant>, bool, Option<Class>)>,
    by_id: crate::domain::FastMap<Box<str>, Arc<Tenant>>,
    header: Option<HeaderName>,
    /// Peers whose sidecar header is trusted.
    trusted: Vec<Cidr>,
    /// Requests that carried the sidecar header from an untrusted peer.
    untrusted: Option<metrics::Counter>,
    /// The keys of API tenants (asked for a key this directory does not know).
    runtime: Option<Arc<runtime::Registry>>,
}

impl Directory {
    /// Builds the directory; `env` resolves `upstream_api_key_env` (missing → error naming the key).
    pub fn from_config(
        config: &Config,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let mut dir = Directory {
            header: config
                .server
                .tenant_header
                .as_deref()
                .and_then(|h| HeaderName::from_bytes(h.as_bytes()).ok()),
            trusted: config
                .server
                .trusted_sources
                .iter()
                .filter_map(|s| Cidr::parse(s))
                .collect(),
            ..Directory::default()
        };
        for (i, t) in config.tenants.iter().enumerate() {
            let own = |key: String, var: &String| -> Result<ProviderKey, ConfigError> {
                let value = env(var).ok_or_else(|| ConfigError::MissingEnv {
                    key: key.clone(),
                    var: var.clone(),
                })?;
                if http::HeaderValue::from_str(&value).is_err() {
                    return Err(ConfigError::Invalid {
                        key,
                        message: format!("{var} is not a valid header value"),
                    });
                }
                Ok(ProviderKey::new(&value))
            };
            let mut upstream_keys = OwnKeys::default();
            if let Some(var) = &t.upstream_api_key_env {
                upstream_keys.default =
                    Some(own(format!("tenants[{i}].upstream_api_key_env"), var)?);
            }
            for (endpoint, var) in &t.upstream_api_key_envs {
                let key = format!("tenants[{i}].upstream_api_key_envs.{endpoint}");
                upstream_keys
                    .endpoints
                    .push((endpoint.as_str().into(), own(key, var)?));
            }
            let tenant = Arc::new(Tenant {
                id: TenantId::new(t.id.as_str()),
                weight: t.effective_weight(config),
                max_concurrency: t.effective_max_concurrency(config),
                max_queued: t.effective_max_queued(config),
                max_queued_bytes: t.effective_max_queued_bytes(config),
                priority: t.priority,
                upstream_keys,
                forward_headers: t
                    .forward_headers
                    .iter()
                    .filter_map(|h| HeaderName::from_bytes(h.as_bytes()).ok())
                    .collect(),
            });
            let keys = t
                .api_keys
                .iter()
                .map(|k| (digest(k.as_bytes()), false, None));
            let hashed = t.api_key_sha256.iter().filter_map(|h| parse_digest(h));
            let recovery = t.recovery_api_keys.iter();
            let batch = t.batch_api_keys.iter();
            let all = keys
                .chain(hashed.map(|d| (d, false, None)))
                .chain(recovery.map(|k| (digest(k.as_bytes()), true, None)))
                .chain(batch.map(|k| (digest(k.as_bytes()), false, Some(Class::Batch))));
            for (d, is_recovery, class) in all {
                dir.by_digest
                    .insert(d, (tenant.clone(), is_recovery, class));
            }
            dir.by_id.insert(t.id.as_str().into(), tenant);
        }
        Ok(dir)
    }

    /// Also accepts the live keys of `registry`'s tenants (see [`runtime`]).
    pub fn with_runtime(mut self, registry: Option<Arc<runtime::Registry>>) -> Self {
        self.runtime = registry;
        self
    }

    /// Counts sidecar headers from untrusted peers on `counter`.
    pub fn count_untrusted_on(mut self, counter: metrics::Counter) -> Self {
        self.untrusted = Some(counter);
        self
    }

    /// Every configured tenant (in no particular order).
    pub fn tenants(&self) -> impl Iterator<Item = &Arc<Tenant>> {
        self.by_id.values()
    }

    /// The sidecar header, if configured (stripped before forwarding).
    pub fn tenant_header(&self) -> Option<&HeaderName> {
        self.header.as_ref()
    }

    /// Number of tenants.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Whether no tenant is configured.
    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// The identity of a job of tenant `id` re-entering the stack (`context::JobRun`): the
    /// tenant's batch class, never a recovery key. A tenant removed since: `UnknownKey`.
    pub fn job(&self, id: &crate::domain::TenantId) -> Result<Identity, Error> {
        let tenant = self.by_id.get(id.as_str()).ok_or(Error::UnknownKey)?;
        Ok(Identity {
            tenant: tenant.clone(),
            class: Class::Batch,
            recovery: false,
        })
    }

    /// Identifies the caller from request headers sent by `peer` (see the module docs).
    pub fn identify(&self, headers: &HeaderMap, peer: Option<IpAddr>) -> Result<Identity, Error> {
        let sidecar = self.header.as_ref().filter(|name| {
            let trusted = peer.is_some_and(|ip| self.trusted.iter().any(|c| c.contains(ip)));
            if !trusted && headers.contains_key(*name) {
                if let Some(c) = &self.untrusted {
                    c.increment(1);
                }
            }
            trusted
        });
        let (tenant, recovery, key_class) = match sidecar {
            Some(name) => {
                let id = headers.get(name).and_then(|v| v.to_str().ok());
                let t = id.and_then(|id| self.by_id.get(id));
                (
                    t.ok_or_else(|| Error::UnknownTenant(name.clone()))?.clone(),
                    false,
                    None,
                )
            }
            None => {
                let key = headers
                    .get(header::AUTHORIZATION)
                    .and_then(|v| bearer_token(v.as_bytes()))
                    .ok_or(Error::MissingKey)?;
                let d = digest(key);
                match self.by_digest.get(&d) {
                    Some((t, recovery, class)) => (t.clone(), *recovery, *class),
                    // Not a key of the file: one more probe, in the API tenants' keys.
                    None => {
                        let id = (self.runtime.as_ref().and_then(|r| r.lookup(&d)))
                            .ok_or(Error::UnknownKey)?;
                        let t = self.by_id.get(&*id).ok_or(Error::UnknownKey)?;
                        (t.clone(), false, None)
                    }
                }
            }
        };
        let class = match headers.get(PRIORITY_HEADER) {
            None => key_class.unwrap_or(tenant.priority),
            Some(v) => v
                .to_str()
                .ok()
                .and_then(Class::parse)
                .ok_or(Error::BadPriority)?,
        };
        Ok(Identity {
            tenant,
            class,
            recovery,
        })
    }
}

/// `Bearer <token>` → token bytes (scheme case-insensitive, surrounding spaces trimmed).
fn bearer_token(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at_checked(7)?;
    if !scheme.eq_ignore_ascii_case(b"bearer ") {
        return None;
    }
    let token = rest.trim_ascii();
    (!token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    const LOCAL: Option<IpAddr> = Some(IpAddr::V4(std::net::Ipv4Addr::LOCALHOST));

    fn dir(extra: &str) -> Directory {
        let text = format!(
            "{extra}\n[[upstreams]]\nname = \"u\"\nbase_url = \"http://h/v1\"\n\
             [[tenants]]\nid = \"a\"\napi_keys = [\"ka\"]\nrecovery_api_keys = [\"ra\"]\n\
             batch_api_keys = [\"nightly\"]\n\
             [[tenants]]\nid = \"b\"\napi_key_sha256 = [\"{}\"]\npriority = \"batch\"\n\
             upstream_api_key_env = \"B_KEY\"\n",
            hex::encode(digest(b"kb"))
        );
        let config = Config::from_toml_str(&text).unwrap();
        Directory::from_config(&config, |v| (v == "B_KEY").then(|| "prov".to_owned())).unwrap()
    }

    #[test]
    fn a_job_is_its_tenant_in_the_batch_class_without_a_recovery_key() {
        let d = dir("");
        let id = d.job(&crate::domain::TenantId::new("a")).unwrap();
        assert_eq!(id.tenant.id.as_str(), "a");
        assert_eq!(id.class, Class::Batch);
        assert!(!id.recovery);
        assert!(d.job(&crate::domain::TenantId::new("gone")).is_err());
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(k, v)| {
                (
                    HeaderName::from_static(k),
                    HeaderValue::from_str(v).unwrap(),
                )
            })
            .collect()
    }

    #[test]
    fn looks_up_by_digest() {
        let d = dir("");
        let a = d
            .identify(&headers(&[("authorization", "Bearer ka")]), LOCAL)
            .unwrap();
        assert_eq!(a.tenant.id.as_str(), "a");
        assert!(!a.recovery);
        assert_eq!(a.class, Class::Interactive);
        let b = d
            .identify(&headers(&[("authorization", "bearer kb ")]), LOCAL)
            .unwrap();
        assert_eq!(b.tenant.id.as_str(), "b");
        assert_eq!(b.class, Class::Batch);
        assert_eq!(
            b.tenant.upstream_keys.default.as_ref().unwrap().expose(),
            "prov"
        );
        let r = d
            .identify(&headers(&[("authorization", "Bearer ra")]), LOCAL)
            .unwrap();
        assert!(r.recovery);
        let n = d
            .identify(&headers(&[("authorization", "Bearer nightly")]), LOCAL)
            .unwrap();
        assert_eq!((n.tenant.id.as_str(), n.class), ("a", Class::Batch));
        let h = headers(&[
            ("authorization", "Bearer nightly"),
            ("x-fairgate-priority", "interactive"),
        ]);
        assert_eq!(d.identify(&h, LOCAL).unwrap().class, Class::Interactive);
    }

    #[test]
    fn rejects_missing_and_unknown() {
        let d = dir("");
        assert!(matches!(
            d.identify(&HeaderMap::new(), LOCAL),
            Err(Error::MissingKey)
        ));
        let h = headers(&[("authorization", "Basic ka")]);
        assert!(matches!(d.identify(&h, LOCAL), Err(Error::MissingKey)));
        let h = headers(&[("authorization", "Bearer nope")]);
        assert!(matches!(d.identify(&h, LOCAL), Err(Error::UnknownKey)));
    }

    #[test]
    fn priority_header_overrides() {
        let d = dir("");
        let h = headers(&[
            ("authorization", "Bearer ka"),
            ("x-fairgate-priority", "Batch"),
        ]);
        assert_eq!(d.identify(&h, LOCAL).unwrap().class, Class::Batch);
        let h = headers(&[
            ("authorization", "Bearer ka"),
            ("x-fairgate-priority", "urgent"),
        ]);
        assert!(matches!(d.identify(&h, LOCAL), Err(Error::BadPriority)));
    }

    #[test]
    fn sidecar_header_names_tenant() {
        let d = dir("[server]\ntenant_header = \"x-tenant-id\"");
        let h = headers(&[("x-tenant-id", "b")]);
        assert_eq!(d.identify(&h, LOCAL).unwrap().tenant.id.as_str(), "b");
        let h = headers(&[("x-tenant-id", "zz"), ("authorization", "Bearer ka")]);
        assert!(matches!(
            d.identify(&h, LOCAL),
            Err(Error::UnknownTenant(_))
        ));
    }

    #[test]
    fn sidecar_header_is_trusted_only_from_trusted_sources() {
        let count = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counter = metrics::Counter::from_arc(count.clone());
        let d = dir("[server]\ntenant_header = \"x-tenant-id\"\n\
                     trusted_sources = [\"127.0.0.1/32\", \"10.1.0.0/16\"]")
        .count_untrusted_on(counter.clone());
        let ip = |s: &str| Some(s.parse::<IpAddr>().unwrap());
        let h = headers(&[("x-tenant-id", "b")]);
        assert_eq!(
            d.identify(&h, ip("10.1.2.3")).unwrap().tenant.id.as_str(),
            "b"
        );
        // From elsewhere (or an unknown peer) the header is ignored: a key is required.
        for peer in [ip("10.2.0.1"), ip("::1"), None] {
            assert!(matches!(d.identify(&h, peer), Err(Error::MissingKey)));
        }
        let h = headers(&[("x-tenant-id", "b"), ("authorization", "Bearer ka")]);
        let who = d.identify(&h, ip("203.0.113.9")).unwrap();
        assert_eq!(
            who.tenant.id.as_str(),
            "a",
            "the key decides, not the header"
        );
        let keyed = headers(&[("authorization", "Bearer ka")]);
        assert!(
            d.identify(&keyed, ip("203.0.113.9")).is_ok(),
            "no header: not counted"
        );
        // Counted: from 10.2.0.1, ::1, no peer, and the keyed one from 203.0.113.9.
        assert_eq!(count.load(std::sync::atomic::Ordering::Relaxed), 4);
    }

    #[test]
    fn missing_tenant_env_is_an_error_naming_the_key() {
        let text =
            "[[upstreams]]\nname = \"u\"\nbase_url = \"http://h/v1\"\n[[tenants]]\nid = \"a\"\n\
                    api_keys = [\"k\"]\nupstream_api_key_env = \"NOPE\"\n";
        let config = Config::from_toml_str(text).unwrap();
        let e = Directory::from_config(&config, |_| None)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("tenants[0].upstream_api_key_env") && e.contains("NOPE"),
            "{e}"
        );
    }
}
