//! Who is calling: the configured [`Tenant`] and this request's [`Identity`] (written by the
//! `tenant` stage, which builds tenants from config).

use std::sync::Arc;

use http::{HeaderName, HeaderValue};

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
    /// Its own provider key as a ready `Bearer …` header value (marked sensitive), if configured.
    pub upstream_key: Option<HeaderValue>,
    /// Credential or account headers this tenant's clients may send to the provider
    /// (`forward_headers`; every other one is stripped, see `upstream::headers`).
    pub forward_headers: Vec<HeaderName>,
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
