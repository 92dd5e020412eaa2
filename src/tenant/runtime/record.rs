//! What the runtime store holds: a tenant made through the admin API ([`TenantRecord`]: its
//! `[[tenants]]` fields, without keys) and one of its keys ([`KeyRecord`]: the SHA-256 of the
//! key, never the key). Both backends store the same JSON documents.
//!
//! Invariants: a key's plaintext exists only in the answer that created it ([`new_key`]);
//! a revoked key (`revoked_at`) stays revoked — no write makes it live again, and deleting a
//! tenant revokes all its keys, so re-creating the id revives none of them.

use rand::distr::{Alphanumeric, SampleString};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::config::TenantConfig;

/// Seconds since the Unix epoch.
pub fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Fields of `[[tenants]]` the API does not take: keys are made by `POST …/keys`, and a
/// tenant's own provider key names an environment variable of the proxy (the config file's
/// business).
pub const FILE_ONLY_FIELDS: &[&str] = &[
    "api_keys",
    "api_key_sha256",
    "recovery_api_keys",
    "batch_api_keys",
    "upstream_api_key_env",
    "upstream_api_key_envs",
];

/// A tenant created through the admin API.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TenantRecord {
    /// Tenant id.
    pub id: String,
    /// Its `[[tenants]]` fields other than `id` (weight or plan, caps, limits, …).
    pub spec: Map<String, Value>,
    /// Seconds since the epoch.
    pub created_at: u64,
    /// Seconds since the epoch (last `PATCH`).
    pub updated_at: u64,
    /// Deleted (a tombstone, so that other replicas learn of it).
    #[serde(default)]
    pub deleted: bool,
}

impl TenantRecord {
    /// The `[[tenants]]` entry of this tenant (no keys: those are looked up in the registry).
    pub fn config(&self) -> Result<TenantConfig, serde_json::Error> {
        config_of(&self.id, &self.spec)
    }

    /// The API's view of it.
    pub fn view(&self) -> Value {
        let mut doc = self.spec.clone();
        doc.insert("id".into(), self.id.clone().into());
        doc.insert("source".into(), "api".into());
        doc.insert("created_at".into(), self.created_at.into());
        doc.insert("updated_at".into(), self.updated_at.into());
        Value::Object(doc)
    }
}

/// The `[[tenants]]` entry `id` with `spec` (unknown fields are errors naming the field).
pub fn config_of(id: &str, spec: &Map<String, Value>) -> Result<TenantConfig, serde_json::Error> {
    let mut doc = spec.clone();
    doc.insert("id".into(), id.into());
    serde_json::from_value(Value::Object(doc))
}

/// One key of an API tenant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeyRecord {
    /// `key_…`: how the API names it.
    pub id: String,
    /// Its tenant.
    pub tenant: String,
    /// SHA-256 of the key, hex.
    pub sha256: String,
    /// Free text given at creation.
    #[serde(default)]
    pub label: Option<String>,
    /// Seconds since the epoch.
    pub created_at: u64,
    /// Refused from this second on (`None`: never expires).
    #[serde(default)]
    pub expires_at: Option<u64>,
    /// Revoked at this second (refused from then on, for ever).
    #[serde(default)]
    pub revoked_at: Option<u64>,
}

impl KeyRecord {
    /// Whether it is accepted at `now`.
    pub fn live_at(&self, now: u64) -> bool {
        self.revoked_at.is_none() && self.expires_at.is_none_or(|e| now < e)
    }

    /// The API's view of it: never the key, only its id, label, dates and a hash prefix.
    pub fn view(&self) -> Value {
        serde_json::json!({
            "id": self.id,
            "tenant": self.tenant,
            "label": self.label,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "sha256_prefix": self.sha256.get(..8).unwrap_or(""),
        })
    }
}

/// One record as a backend hands it over (a write, or a change another replica made).
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// A tenant (possibly a tombstone).
    Tenant(TenantRecord),
    /// A key (possibly revoked).
    Key(KeyRecord),
}

/// A change and the store's version of it (later writes have larger versions).
pub type Versioned = (u64, Change);

/// A new key for `tenant`: its record and the plaintext (`fg-` and 43 random alphanumerics,
/// about 256 bits), shown once.
pub fn new_key(
    tenant: &str,
    label: Option<String>,
    expires_at: Option<u64>,
) -> (KeyRecord, String) {
    let mut rng = rand::rng();
    let key = format!("fg-{}", Alphanumeric.sample_string(&mut rng, 43));
    let record = KeyRecord {
        id: format!("key_{}", Alphanumeric.sample_string(&mut rng, 24)),
        tenant: tenant.to_owned(),
        sha256: hex::encode(crate::domain::digest(key.as_bytes())),
        label,
        created_at: now(),
        expires_at,
        revoked_at: None,
    };
    (record, key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_key_is_stored_only_as_its_digest() {
        let (r, key) = new_key("acme", Some("ci".into()), None);
        assert!(key.starts_with("fg-") && key.len() == 46, "{key}");
        assert!(r.id.starts_with("key_"));
        assert_eq!(r.sha256, hex::encode(crate::domain::digest(key.as_bytes())));
        let shown = r.view().to_string();
        assert!(
            !shown.contains(&key) && !shown.contains(&r.sha256),
            "{shown}"
        );
        assert!(shown.contains(&r.sha256[..8]));
    }

    #[test]
    fn a_key_is_live_until_it_expires_or_is_revoked() {
        let (mut r, _) = new_key("a", None, Some(100));
        assert!(r.live_at(99));
        assert!(!r.live_at(100));
        r.expires_at = None;
        assert!(r.live_at(u64::MAX));
        r.revoked_at = Some(5);
        assert!(!r.live_at(0));
    }

    #[test]
    fn a_spec_is_a_tenants_entry_and_unknown_fields_are_named() {
        let spec: Map<String, Value> =
            serde_json::from_str(r#"{"weight": 2.5, "max_concurrency": 3}"#).unwrap();
        let t = config_of("acme", &spec).unwrap();
        assert_eq!(
            (t.id.as_str(), t.weight, t.max_concurrency),
            ("acme", Some(2.5), Some(3))
        );
        let bad: Map<String, Value> = serde_json::from_str(r#"{"wieght": 2}"#).unwrap();
        let e = config_of("acme", &bad).unwrap_err().to_string();
        assert!(e.contains("wieght"), "{e}");
    }
}
