//! Tenants and keys made at runtime through the admin API (`/admin/tenants`), held in the
//! durable store — SQLite (`[store] path`) on one replica, Redis with `[cluster]` — and merged
//! with the config file's tenants by one rule:
//!
//! **The file wins.** A config tenant is read-only through the API (409 naming the file); an
//! API tenant whose id the file later takes is hidden (logged) and its keys are refused, so an
//! API tenant never shadows a config tenant or its keys. API tenants are appended after the
//! file's, in id order, as `[[tenants]]` entries without keys ([`Registry::merge`]): every
//! stage sees them exactly as config tenants, and a tenant change is applied as a config
//! reload is (`server::reload`: queues re-weighted in place, a deleted tenant's queued requests
//! answered as a reload's removal does).
//!
//! Keys never enter the config: the [`Registry`] indexes the live keys of API tenants by
//! SHA-256 (`tenant::Directory` asks it after its own map: one more probe, only for keys the
//! file does not know). A key added, rotated or revoked changes that index alone — no new
//! generation — so a burst of key changes costs the request path nothing but a read lock.
//!
//! Invariants: the store is written first and the index after, so what this replica serves is
//! never ahead of the store; a revoked key is removed from the index when its revocation is
//! written here, or when the change is read from Redis (`[cluster] sync_interval_ms`); no write
//! makes a revoked key live again (see [`record`]); a store that cannot be reached refuses the
//! change (503) and the index keeps serving what it last knew.
//!
//! Writes do not compete with requests: at most `[admin] max_queued_writes` wait at once (one
//! more: [`Error::Busy`], 503 with a `Retry-After`), and SQLite's transactions run one at a time
//! on the control plane's thread at `SCHED_IDLE` ([`control`]). That thread takes no lock the
//! request path takes; the caller (a connection worker) applies the change to the index and
//! logs it, so a revocation's answer is sent once this replica refuses the key.

pub mod control;
pub mod record;
pub mod redis;
pub mod sqlite;
mod store;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use http::StatusCode;
use serde_json::{Map, Value};

use crate::config::{Config, TenantConfig};
use crate::domain::{FastMap, KeyDigest};
use crate::error::ApiError;
use record::{now, Change, KeyRecord, TenantRecord, Versioned};
pub use store::{Store, StoreError};

/// Why a runtime change was refused.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The tenant is defined in the config file.
    #[error("tenant {0:?} is defined in the config file: change it there (config tenants are read-only through the API)")]
    ConfigTenant(String),
    /// An API tenant with this id exists.
    #[error("tenant {0:?} already exists")]
    Exists(String),
    /// No such API tenant.
    #[error("no tenant {0:?}")]
    NoTenant(String),
    /// No such live key of the tenant.
    #[error("no live key {0:?} of this tenant")]
    NoKey(String),
    /// A field is invalid (named, as `fairgate check` names a key).
    #[error("{field}: {message}")]
    Invalid {
        /// The field.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// The store did not take the change.
    #[error("the tenant store is unavailable, nothing was changed: {0}")]
    Unavailable(String),
    /// `[admin] max_queued_writes` admin writes are waiting already.
    #[error("too many admin writes are waiting ([admin] max_queued_writes); nothing was changed: retry in {} s", crate::error::secs(.0 .0))]
    Busy(control::Busy),
}

impl ApiError for Error {
    fn status(&self) -> StatusCode {
        match self {
            Error::ConfigTenant(_) | Error::Exists(_) => StatusCode::CONFLICT,
            Error::NoTenant(_) | Error::NoKey(_) => StatusCode::NOT_FOUND,
            Error::Invalid { .. } => StatusCode::BAD_REQUEST,
            Error::Unavailable(_) | Error::Busy(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
    fn kind(&self) -> &'static str {
        match self {
            Error::Unavailable(_) | Error::Busy(_) => "server_error",
            _ => "invalid_request_error",
        }
    }
    fn code(&self) -> &'static str {
        match self {
            Error::ConfigTenant(_) => "config_tenant",
            Error::Exists(_) => "tenant_exists",
            Error::NoTenant(_) => "tenant_not_found",
            Error::NoKey(_) => "key_not_found",
            Error::Invalid { .. } => "invalid_tenant",
            Error::Unavailable(_) => "store_unavailable",
            Error::Busy(_) => "admin_writes_busy",
        }
    }
    fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            Error::Busy(b) => Some(b.0),
            _ => None,
        }
    }
    fn param(&self) -> Option<&str> {
        match self {
            Error::Invalid { field, .. } => Some(field),
            _ => None,
        }
    }
    fn reason(&self) -> crate::error::Reason {
        crate::error::Reason::Admin
    }
}

fn invalid(field: &str, message: impl Into<String>) -> Error {
    Error::Invalid {
        field: field.to_owned(),
        message: message.into(),
    }
}

/// What the index holds (one lock: a lookup reads it once).
#[derive(Default)]
struct Index {
    /// Live API tenants by id.
    tenants: BTreeMap<String, TenantRecord>,
    /// Live keys by id.
    keys: HashMap<String, KeyRecord>,
    /// Live keys by digest → (tenant, expiry).
    by_digest: FastMap<KeyDigest, (Arc<str>, Option<u64>)>,
    /// The config file's tenant ids (last merge).
    file_ids: HashSet<String>,
    /// The config file without its tenants (last merge): what a tenant is validated against.
    base: Option<Arc<Config>>,
    /// The version of every record applied (`t:ID`, `k:ID`), tombstones included: an older
    /// write read late (a sync that raced this replica's own write) is ignored, so a revoked
    /// key never comes back.
    seen: HashMap<String, u64>,
}

impl Index {
    /// Applies one record written at `version`, unless a later write of it was applied;
    /// whether the set of tenants changed.
    fn apply(&mut self, version: u64, change: Change) -> bool {
        let name = match &change {
            Change::Tenant(t) => format!("t:{}", t.id),
            Change::Key(k) => format!("k:{}", k.id),
        };
        match self.seen.get(&name) {
            Some(&v) if v >= version => return false,
            _ => self.seen.insert(name, version),
        };
        match change {
            Change::Tenant(t) if t.deleted => {
                let gone: Vec<String> = (self.keys.values())
                    .filter(|k| k.tenant == t.id)
                    .map(|k| k.id.clone())
                    .collect();
                for id in gone {
                    self.remove_key(&id);
                }
                self.tenants.remove(&t.id).is_some()
            }
            Change::Tenant(t) => self.tenants.insert(t.id.clone(), t.clone()) != Some(t),
            Change::Key(k) => {
                self.remove_key(&k.id);
                if k.revoked_at.is_none() {
                    if let Some(d) = crate::domain::parse_digest(&k.sha256) {
                        self.by_digest
                            .insert(d, (k.tenant.as_str().into(), k.expires_at));
                    }
                    self.keys.insert(k.id.clone(), k);
                }
                false
            }
        }
    }

    fn remove_key(&mut self, id: &str) {
        if let Some(old) = self.keys.remove(id) {
            if let Some(d) = crate::domain::parse_digest(&old.sha256) {
                self.by_digest.remove(&d);
            }
        }
    }
}

/// `fairgate_tenant_changes_total{op}` and the sync counters, set by the server.
#[derive(Default)]
pub struct Counters {
    /// One counter per [`Op`], indexed by `op as usize`.
    pub ops: Vec<metrics::Counter>,
    /// Failed store reads by the sync (`fairgate_tenant_sync_failures_total`).
    pub sync_failures: Option<metrics::Counter>,
}

/// What a change did (the `op` label).
#[derive(Debug, Clone, Copy)]
pub enum Op {
    /// `POST /admin/tenants`.
    CreateTenant,
    /// `PATCH /admin/tenants/{id}`.
    UpdateTenant,
    /// `DELETE /admin/tenants/{id}`.
    DeleteTenant,
    /// `POST /admin/tenants/{id}/keys`.
    CreateKey,
    /// `POST /admin/tenants/{id}/keys/{key_id}/rotate`.
    RotateKey,
    /// `DELETE /admin/tenants/{id}/keys/{key_id}`.
    RevokeKey,
}

impl Op {
    /// Every op, in label order.
    pub const ALL: [Op; 6] = [
        Op::CreateTenant,
        Op::UpdateTenant,
        Op::DeleteTenant,
        Op::CreateKey,
        Op::RotateKey,
        Op::RevokeKey,
    ];

    /// The `op` label.
    pub fn label(self) -> &'static str {
        match self {
            Op::CreateTenant => "create_tenant",
            Op::UpdateTenant => "update_tenant",
            Op::DeleteTenant => "delete_tenant",
            Op::CreateKey => "create_key",
            Op::RotateKey => "rotate_key",
            Op::RevokeKey => "revoke_key",
        }
    }
}

/// The runtime tenants and keys of this replica, over the durable store. Lives as long as the
/// server (kept across generations, like the jobs store).
pub struct Registry {
    store: Store,
    index: RwLock<Index>,
    /// Bumped whenever the set of API tenants changes: a generation built before must be
    /// rebuilt (`server::live`).
    tenants_version: AtomicU64,
    /// The store's change-log version last applied (Redis).
    synced: AtomicU64,
    /// The last sync read a full batch: more changes wait.
    more: std::sync::atomic::AtomicBool,
    counters: Counters,
    /// The control plane's thread (the store's writes) and the bound on the writes waiting.
    control: control::Control,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

impl Registry {
    /// The registry over `store`, loaded with what it holds (SQLite: read now; Redis: read by
    /// the first [`Registry::sync`], which the server awaits before serving).
    /// At most `max_queued_writes` writes wait at once (more: [`Error::Busy`]).
    pub fn new(
        store: Store,
        counters: Counters,
        max_queued_writes: usize,
    ) -> Result<Arc<Self>, StoreError> {
        let loaded = store.load_now()?;
        let mut index = Index::default();
        for (version, change) in loaded {
            index.apply(version, change);
        }
        Ok(Arc::new(Self {
            store,
            index: RwLock::new(index),
            tenants_version: AtomicU64::new(0),
            synced: AtomicU64::new(0),
            more: Default::default(),
            counters,
            control: control::Control::new(max_queued_writes),
        }))
    }

    /// A slot for one write (held until it is done), or [`Error::Busy`].
    fn admit(&self) -> Result<control::Slot, Error> {
        self.control.admit().map_err(Error::Busy)
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Index> {
        self.index.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Index> {
        self.index.write().unwrap_or_else(|p| p.into_inner())
    }

    /// The tenant of a live key of an API tenant with this digest (not expired, its tenant not
    /// shadowed by the config file).
    pub fn lookup(&self, digest: &KeyDigest) -> Option<Arc<str>> {
        let index = self.read();
        let (tenant, expires) = index.by_digest.get(digest)?;
        let live = expires.is_none_or(|e| now() < e) && !index.file_ids.contains(&**tenant);
        live.then(|| tenant.clone())
    }

    /// `config` (the file's) with the API tenants appended (see the module docs); remembers
    /// the file's tenant ids and settings for validation. An API tenant the file's settings no
    /// longer admit (a plan removed, say) is left out and logged.
    pub fn merge(&self, mut config: Config) -> Config {
        let file_ids: HashSet<String> = config.tenants.iter().map(|t| t.id.clone()).collect();
        let base = Arc::new(Config {
            tenants: Vec::new(),
            ..config.clone()
        });
        // The index is locked only to take the file's ids and settings, then to copy the API
        // tenants out: the merge's work (each tenant's entry, the validation of the whole) is
        // done outside it, so a key looked up meanwhile never waits for that.
        {
            let mut index = self.write();
            index.file_ids = file_ids.clone();
            index.base = Some(base.clone());
        }
        let api: Vec<TenantRecord> = self.read().tenants.values().cloned().collect();
        let file = config.tenants.len();
        for t in &api {
            if file_ids.contains(&t.id) {
                tracing::warn!(tenant = %t.id, "API tenant hidden: the config file defines this id");
                continue;
            }
            match t.config() {
                Ok(c) => config.tenants.push(c),
                Err(e) => tracing::error!(tenant = %t.id, error = %e, "API tenant left out"),
            }
        }
        // One validation of the whole; only when it fails, one per API tenant to find the
        // culprits (10,000 API tenants cost one pass, as 10,000 file tenants do).
        let mut check = config.clone();
        (check.tenants[file..].iter_mut().enumerate()).for_each(|(i, t)| with_key(t, i));
        if crate::config::validate(&check).is_err() {
            let api = config.tenants.split_off(file);
            for t in api {
                match validate_against(&base, &t) {
                    Ok(_) => config.tenants.push(t),
                    Err(e) => tracing::error!(tenant = %t.id, error = %e, "API tenant left out"),
                }
            }
        }
        config
    }

    /// The file's part of an effective (merged) `config`.
    pub fn file_config(&self, config: &Config) -> Config {
        let index = self.read();
        let mut c = config.clone();
        c.tenants.retain(|t| index.file_ids.contains(&t.id));
        c
    }

    /// Changes whenever the set of API tenants does.
    pub fn tenants_version(&self) -> u64 {
        self.tenants_version.load(Ordering::Acquire)
    }

    /// Whether `id` is a tenant of the config file.
    pub fn is_file_tenant(&self, id: &str) -> bool {
        self.read().file_ids.contains(id)
    }

    /// Whether `id` is a live API tenant (not hidden by the file).
    pub fn is_api_tenant(&self, id: &str) -> bool {
        let index = self.read();
        index.tenants.contains_key(id) && !index.file_ids.contains(id)
    }

    /// The live API tenant `id`.
    pub fn tenant(&self, id: &str) -> Option<TenantRecord> {
        self.read().tenants.get(id).cloned()
    }

    /// Up to `limit` API tenants after the id `after`, in id order, and whether more follow.
    pub fn tenants(&self, after: Option<&str>, limit: usize) -> (Vec<TenantRecord>, bool) {
        use std::ops::Bound;
        let index = self.read();
        let from = after.map_or(Bound::Unbounded, |a| Bound::Excluded(a.to_owned()));
        let mut it = index
            .tenants
            .range((from, Bound::Unbounded))
            .map(|(_, t)| t);
        let page: Vec<TenantRecord> = it.by_ref().take(limit).cloned().collect();
        (page, it.next().is_some())
    }

    /// The live keys of `tenant`, oldest first.
    pub fn keys_of(&self, tenant: &str) -> Vec<KeyRecord> {
        let mut keys: Vec<KeyRecord> = (self.read().keys.values())
            .filter(|k| k.tenant == tenant)
            .cloned()
            .collect();
        keys.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        keys
    }

    /// (API tenants, live keys).
    pub fn counts(&self) -> (usize, usize) {
        let index = self.read();
        (index.tenants.len(), index.keys.len())
    }

    fn applied(&self, op: Option<Op>, changes: Vec<Versioned>) {
        let mut tenants_changed = false;
        {
            let mut index = self.write();
            for (v, c) in changes {
                tenants_changed |= index.apply(v, c);
            }
        }
        if tenants_changed {
            self.tenants_version.fetch_add(1, Ordering::AcqRel);
        }
        if let Some(op) = op {
            if let Some(c) = self.counters.ops.get(op as usize) {
                c.increment(1);
            }
        }
    }

    /// `id` and `spec` as a `[[tenants]]` entry the config admits (errors name the field).
    fn validate(&self, id: &str, spec: &Map<String, Value>) -> Result<TenantConfig, Error> {
        let ok_char = |c: char| c.is_ascii_alphanumeric() || "-_.@:".contains(c);
        if id.is_empty() || id.len() > 128 || !id.chars().all(ok_char) {
            return Err(invalid(
                "id",
                "1 to 128 characters: letters, digits and - _ . @ :",
            ));
        }
        if let Some(f) = record::FILE_ONLY_FIELDS
            .iter()
            .find(|f| spec.contains_key(**f))
        {
            return Err(invalid(
                f,
                match *f {
                    "upstream_api_key_env" | "upstream_api_key_envs" => {
                        "a tenant's own provider key is set in the config file only"
                    }
                    _ => "keys are made with POST /admin/tenants/{id}/keys",
                },
            ));
        }
        let mut doc = spec.clone();
        doc.insert("id".into(), id.into());
        let t: TenantConfig =
            serde_path_to_error::deserialize(Value::Object(doc)).map_err(|e| {
                let path = e.path().to_string();
                let message = e.into_inner().to_string();
                let field = match path.as_str() {
                    "." => message.split('`').nth(1).unwrap_or("body").to_owned(),
                    p => p.to_owned(),
                };
                Error::Invalid { field, message }
            })?;
        let base = (self.read().base.clone())
            .ok_or_else(|| Error::Unavailable("not started yet".to_owned()))?;
        validate_against(&base, &t).map_err(|e| match e {
            crate::config::ConfigError::Invalid { key, message } => Error::Invalid {
                field: key.strip_prefix("tenants[0].").unwrap_or(&key).to_owned(),
                message,
            },
            other => invalid("body", other.to_string()),
        })?;
        Ok(t)
    }

    /// `POST /admin/tenants`.
    pub async fn create_tenant(
        &self,
        id: String,
        spec: Map<String, Value>,
    ) -> Result<TenantRecord, Error> {
        if self.is_file_tenant(&id) {
            return Err(Error::ConfigTenant(id));
        }
        self.validate(&id, &spec)?;
        let _slot = self.admit()?;
        let at = now();
        let t = TenantRecord {
            id,
            spec,
            created_at: at,
            updated_at: at,
            deleted: false,
        };
        let v = (self.store.put_tenant(&self.control, &t, true).await)
            .map_err(|e| e.into_api(&t.id))?;
        tracing::info!(tenant = %t.id, op = "create_tenant", "tenant change");
        self.applied(Some(Op::CreateTenant), vec![(v, Change::Tenant(t.clone()))]);
        Ok(t)
    }

    /// `PATCH /admin/tenants/{id}`: each field of `patch` replaces the tenant's (`null`
    /// removes it).
    pub async fn update_tenant(
        &self,
        id: &str,
        patch: Map<String, Value>,
    ) -> Result<TenantRecord, Error> {
        if self.is_file_tenant(id) {
            return Err(Error::ConfigTenant(id.to_owned()));
        }
        let mut t = self
            .tenant(id)
            .ok_or_else(|| Error::NoTenant(id.to_owned()))?;
        for (k, v) in patch {
            match v {
                Value::Null => t.spec.remove(&k),
                v => t.spec.insert(k, v),
            };
        }
        self.validate(id, &t.spec)?;
        let _slot = self.admit()?;
        t.updated_at = now();
        let v =
            (self.store.put_tenant(&self.control, &t, false).await).map_err(|e| e.into_api(id))?;
        tracing::info!(tenant = %id, op = "update_tenant", "tenant change");
        self.applied(Some(Op::UpdateTenant), vec![(v, Change::Tenant(t.clone()))]);
        Ok(t)
    }

    /// `DELETE /admin/tenants/{id}`: the tenant and all its keys.
    pub async fn delete_tenant(&self, id: &str) -> Result<(), Error> {
        if self.is_file_tenant(id) {
            return Err(Error::ConfigTenant(id.to_owned()));
        }
        let mut t = self
            .tenant(id)
            .ok_or_else(|| Error::NoTenant(id.to_owned()))?;
        let _slot = self.admit()?;
        t.deleted = true;
        t.updated_at = now();
        let v = (self
            .store
            .delete_tenant(&self.control, id, t.updated_at)
            .await)
            .map_err(|e| e.into_api(id))?;
        tracing::info!(tenant = %id, op = "delete_tenant", "tenant change");
        self.applied(Some(Op::DeleteTenant), vec![(v, Change::Tenant(t))]);
        Ok(())
    }

    fn api_tenant(&self, id: &str) -> Result<(), Error> {
        if self.is_file_tenant(id) {
            return Err(Error::ConfigTenant(id.to_owned()));
        }
        match self.read().tenants.contains_key(id) {
            true => Ok(()),
            false => Err(Error::NoTenant(id.to_owned())),
        }
    }

    /// `POST /admin/tenants/{id}/keys`: the new key's record and the key (shown once).
    pub async fn create_key(
        &self,
        tenant: &str,
        label: Option<String>,
        expires_at: Option<u64>,
    ) -> Result<(KeyRecord, String), Error> {
        self.api_tenant(tenant)?;
        let _slot = self.admit()?;
        let (k, key) = record::new_key(tenant, label, expires_at);
        let v =
            (self.store.put_key(&self.control, &k, true).await).map_err(|e| e.into_api(tenant))?;
        tracing::info!(tenant, key_id = %k.id, op = "create_key", "tenant change");
        self.applied(Some(Op::CreateKey), vec![(v, Change::Key(k.clone()))]);
        Ok((k, key))
    }

    /// `POST /admin/tenants/{id}/keys/{key_id}/rotate`: a new key, and the old one expiring
    /// `overlap_secs` from now (or sooner, if it already did): both work during the overlap.
    pub async fn rotate_key(
        &self,
        tenant: &str,
        key_id: &str,
        overlap_secs: u64,
        label: Option<String>,
    ) -> Result<(KeyRecord, String, KeyRecord), Error> {
        self.api_tenant(tenant)?;
        let mut old = self.live_key(tenant, key_id)?;
        let _slot = self.admit()?;
        let label = label.or_else(|| old.label.clone());
        let (k, key) = record::new_key(tenant, label, old.expires_at);
        let v =
            (self.store.put_key(&self.control, &k, true).await).map_err(|e| e.into_api(tenant))?;
        let mut changes = vec![(v, Change::Key(k.clone()))];
        let until = now().saturating_add(overlap_secs);
        old.expires_at = Some(old.expires_at.map_or(until, |e| e.min(until)));
        let result = self.store.put_key(&self.control, &old, false).await;
        if let Ok(v) = result {
            changes.push((v, Change::Key(old.clone())));
        }
        tracing::info!(tenant, key_id = %k.id, rotated = %old.id, op = "rotate_key", "tenant change");
        self.applied(Some(Op::RotateKey), changes);
        result.map_err(|e| e.into_api(tenant))?;
        Ok((k, key, old))
    }

    /// `DELETE /admin/tenants/{id}/keys/{key_id}`: refused (401) from now on, for good.
    pub async fn revoke_key(&self, tenant: &str, key_id: &str) -> Result<(), Error> {
        self.api_tenant(tenant)?;
        let mut k = self.live_key(tenant, key_id)?;
        let _slot = self.admit()?;
        k.revoked_at = Some(now());
        let v = (self.store.put_key(&self.control, &k, false).await).map_err(|e| match e {
            StoreError::Missing => Error::NoKey(key_id.to_owned()),
            e => e.into_api(tenant),
        })?;
        tracing::info!(tenant, key_id, op = "revoke_key", "tenant change");
        self.applied(Some(Op::RevokeKey), vec![(v, Change::Key(k))]);
        Ok(())
    }

    fn live_key(&self, tenant: &str, key_id: &str) -> Result<KeyRecord, Error> {
        (self.read().keys.get(key_id))
            .filter(|k| k.tenant == tenant)
            .cloned()
            .ok_or_else(|| Error::NoKey(key_id.to_owned()))
    }

    /// Whether the last [`Registry::sync`] left changes unread (a full batch).
    pub fn behind(&self) -> bool {
        self.more.load(Ordering::Acquire)
    }

    /// Reads what other replicas changed since the last sync (Redis; SQLite: nothing) and
    /// applies it: `Ok(true)` when the set of tenants changed (the server then rebuilds its
    /// generation). A failed read changes nothing (the index keeps what it knew).
    pub async fn sync(&self) -> Result<bool, StoreError> {
        let since = self.synced.load(Ordering::Acquire);
        let (version, changes, more) = match self.store.changes(since).await {
            Ok(c) => c,
            Err(e) => {
                if let Some(c) = &self.counters.sync_failures {
                    c.increment(1);
                }
                return Err(e);
            }
        };
        if version < since {
            // The store lost what it held (a Redis restarted without persistence, or flushed):
            // versions start again from there. The index keeps serving what it knew (nothing
            // revoked comes back: revoked keys are not in it); the next sync reads the store
            // again from the start, and new writes apply again.
            tracing::error!(
                had = since,
                now = version,
                "runtime tenants: the store's version went back; Redis lost its data"
            );
            self.write().seen.clear();
            self.synced.store(0, Ordering::Release);
            self.more.store(true, Ordering::Release);
            return Ok(false);
        }
        let before = self.tenants_version();
        self.more.store(more, Ordering::Release);
        if !changes.is_empty() {
            self.applied(None, changes);
        }
        self.synced.fetch_max(version, Ordering::AcqRel);
        Ok(self.tenants_version() != before)
    }
}

/// `t` checked against the file's settings `base` (its plans, endpoints, cluster mode).
fn validate_against(base: &Config, t: &TenantConfig) -> Result<(), crate::config::ConfigError> {
    let mut t = t.clone();
    with_key(&mut t, 0);
    crate::config::validate(&Config {
        tenants: vec![t],
        ..base.clone()
    })
}

/// An API tenant's keys are in the registry, not its entry: for validation only, it is given
/// one, distinct per `i` (the config requires a key per tenant, and no key twice).
fn with_key(t: &mut TenantConfig, i: usize) {
    let mut d = [0u8; 32];
    d[..8].copy_from_slice(&(i as u64).to_be_bytes());
    t.api_key_sha256 = vec![hex::encode(d)];
}

/// The registry of `config`'s store: Redis with `[cluster]` (`redis`: the cluster's link),
/// else SQLite at `[store] path`; `None` without either (the API's writes answer 409).
pub fn open(
    config: &Config,
    redis: Option<Arc<dyn crate::jobs::store::Redis>>,
    counters: Counters,
) -> Result<Option<Arc<Registry>>, crate::config::ConfigError> {
    let store = match (redis, &config.store) {
        (Some(r), _) => Store::Redis(redis::RedisStore::new(r)),
        (None, Some(s)) => {
            let db = sqlite::Sqlite::open(&s.path).map_err(|e| opening(s, e))?;
            Store::Sqlite(Arc::new(db))
        }
        (None, None) => return Ok(None),
    };
    let path = config.store.clone();
    Registry::new(store, counters, config.admin.max_queued_writes)
        .map(Some)
        .map_err(|e| match path {
            Some(s) => opening(&s, e),
            None => crate::config::ConfigError::Invalid {
                key: "cluster".to_owned(),
                message: e.to_string(),
            },
        })
}

fn opening(s: &crate::config::StoreConfig, e: StoreError) -> crate::config::ConfigError {
    crate::config::ConfigError::Invalid {
        key: "store.path".to_owned(),
        message: format!("cannot open {}: {e}", s.path.display()),
    }
}
