//! Who is calling: the configured [`Tenant`] and this request's [`Identity`] (written by the
//! `tenant` stage, which builds tenants from config).

use std::sync::Arc;

use http::HeaderName;

use crate::domain::{Class, TenantId, Weight};

/// A configured tenant with its effective (tenant > plan > default) settings.
#[derive(Debug)]
pub struct Tenant {
    /// The tenant id.
    pub id: TenantId,
    /// Share weight.
    pub weight: Weight,
    /// Concurrency cap, if any.
    pub max_concurrency: Option<usize>,
    /// Queued-requests cap.
    pub max_queued: usize,
    /// Request bytes it may have queued or in flight in one pool (`max_queued_bytes`).
    pub max_queued_bytes: u64,
    /// Default class of its requests.
    pub priority: Class,
    /// Its own provider keys (`upstream_api_key_env`, `upstream_api_key_envs`), if configured.
    pub upstream_keys: OwnKeys,
    /// Credential or account headers this tenant's clients may send to the provider
    /// (`forward_headers`; every other one is stripped, see `upstream::headers`).
    pub forward_headers: Vec<HeaderName>,
}

/// A provider key, never printed (`Debug` shows only that it is there).
#[derive(Clone, PartialEq, Eq)]
pub struct ProviderKey(Box<str>);

impl ProviderKey {
    /// Wraps a key read from the environment.
    pub fn new(key: &str) -> Self {
        Self(key.into())
    }

    /// The key itself, to put in a header.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for ProviderKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProviderKey(<redacted>)")
    }
}

/// A tenant's own provider keys: one for every endpoint (`upstream_api_key_env`) and one per
/// endpoint name (`upstream_api_key_envs`, which wins on its endpoint). On an endpoint with
/// neither, the tenant's requests use the endpoint's key.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OwnKeys {
    /// For every endpoint.
    pub default: Option<ProviderKey>,
    /// Per endpoint name.
    pub endpoints: Vec<(Box<str>, ProviderKey)>,
}

impl OwnKeys {
    /// The tenant's key on endpoint `name`, if it has one there.
    pub fn for_endpoint(&self, name: &str) -> Option<&ProviderKey> {
        self.endpoints
            .iter()
            .find(|(n, _)| &**n == name)
            .map(|(_, k)| k)
            .or(self.default.as_ref())
    }

    /// Whether the tenant has no key of its own anywhere.
    pub fn is_empty(&self) -> bool {
        self.default.is_none() && self.endpoints.is_empty()
    }
}

/// Who is calling.
#[derive(Debug, Clone)]
pub struct Identity {
    /// The tenant.
    pub tenant: Arc<Tenant>,
    /// This request's class (header `x-fairgate-priority`, else the tenant's `priority`).
    pub class: Class,
    /// Whether the key used is a recovery key (may use reserved slots).
    pub recovery: bool,
}
