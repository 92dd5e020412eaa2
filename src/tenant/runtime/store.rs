//! The runtime tenants' store: one [`Store`] with two backends, SQLite (one replica) and Redis
//! (`[cluster]`). Every write is conditional (see [`super::sqlite`], [`super::redis`]) and
//! answers the version it was written at. SQLite's writes run on the control plane's thread
//! ([`Control`]); Redis's are I/O (the work is Redis's), awaited by the caller.

use std::sync::Arc;

use super::control::Control;
use super::record::{KeyRecord, TenantRecord, Versioned};
use super::redis::RedisStore;
use super::sqlite::Sqlite;

/// Why the store did not take a write or answer a read.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The record to create exists (a live tenant with this id).
    #[error("exists")]
    Exists,
    /// The record to change is not there (or not live).
    #[error("missing")]
    Missing,
    /// SQLite failed.
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// Redis did not answer (or refused).
    #[error("Redis did not answer")]
    Redis,
    /// A blocking task died.
    #[error("the store task failed")]
    Task,
}

impl StoreError {
    /// The API's error for a write on tenant `id` that this refused.
    pub fn into_api(self, id: &str) -> super::Error {
        match self {
            StoreError::Exists => super::Error::Exists(id.to_owned()),
            StoreError::Missing => super::Error::NoTenant(id.to_owned()),
            e => super::Error::Unavailable(e.to_string()),
        }
    }
}

/// The backend.
#[derive(Debug, Clone)]
pub enum Store {
    /// `[store] path`.
    Sqlite(Arc<Sqlite>),
    /// `[cluster]`.
    Redis(RedisStore),
}

/// An SQLite write, on the control plane's thread (see [`super::control`]).
async fn blocking<T: Send + 'static>(
    control: &Control,
    s: &Arc<Sqlite>,
    f: impl FnOnce(&Sqlite) -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    let s = s.clone();
    control
        .run(move || f(&s))
        .await
        .unwrap_or(Err(StoreError::Task))
}

impl Store {
    /// What the store holds, read synchronously at startup (SQLite); Redis is read by the
    /// first `changes(0)` instead.
    pub fn load_now(&self) -> Result<Vec<Versioned>, StoreError> {
        match self {
            Store::Sqlite(s) => s.load(),
            Store::Redis(_) => Ok(Vec::new()),
        }
    }

    /// Writes a tenant (`create`: it must not be live; else it must be).
    pub async fn put_tenant(
        &self,
        control: &Control,
        t: &TenantRecord,
        create: bool,
    ) -> Result<u64, StoreError> {
        match self {
            Store::Sqlite(s) => {
                let t = t.clone();
                blocking(control, s, move |s| s.put_tenant(&t, create)).await
            }
            Store::Redis(r) => r.put_tenant(t, create).await,
        }
    }

    /// Deletes the live tenant `id` (a tombstone) and revokes its keys.
    pub async fn delete_tenant(
        &self,
        control: &Control,
        id: &str,
        at: u64,
    ) -> Result<u64, StoreError> {
        match self {
            Store::Sqlite(s) => {
                let id = id.to_owned();
                blocking(control, s, move |s| s.delete_tenant(&id, at)).await
            }
            Store::Redis(r) => r.delete_tenant(id, at).await,
        }
    }

    /// Writes a key (`create`: new, of a live tenant; else it must be live).
    pub async fn put_key(
        &self,
        control: &Control,
        k: &KeyRecord,
        create: bool,
    ) -> Result<u64, StoreError> {
        match self {
            Store::Sqlite(s) => {
                let k = k.clone();
                blocking(control, s, move |s| s.put_key(&k, create)).await
            }
            Store::Redis(r) => r.put_key(k, create).await,
        }
    }

    /// The store's version, the records changed after `since`, and whether more follow
    /// (SQLite: one replica writes it and knows; nothing).
    pub async fn changes(&self, since: u64) -> Result<(u64, Vec<Versioned>, bool), StoreError> {
        match self {
            Store::Sqlite(_) => Ok((since, Vec::new(), false)),
            Store::Redis(r) => r.changes(since).await,
        }
    }
}
