//! The SQLite backend's [`Store`]: each call is one [`Db`] transaction on tokio's blocking pool
//! (its arguments moved in), so neither the connection's mutex nor the disk blocks an async
//! worker. A claim holds while the process lives: no lease to renew or reclaim
//! ([`Store::lease`] is `None`; [`Db::open`] queues again what a dead process ran).

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;

use super::super::{Claimed, Counts, File, Job, JobState, Line, NewJob, Result, Store, StoreError};
use super::Db;
use crate::domain::TenantId;

/// The SQLite job store (cheap to clone).
#[derive(Debug, Clone)]
pub struct Sqlite(Arc<Db>);

impl Sqlite {
    /// Opens (creating if absent) the store at `path` ([`Db::open`]).
    pub fn open(path: &Path) -> rusqlite::Result<Self> {
        Db::open(path).map(|db| Self(Arc::new(db)))
    }

    /// Runs `f` on the file on the blocking pool.
    async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Db) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T> {
        let db = self.0.clone();
        match tokio::task::spawn_blocking(move || f(&db)).await {
            Ok(r) => r.map_err(StoreError::from),
            Err(_) => Err(StoreError::Task),
        }
    }
}

/// An owned copy of a tenant and ids, to move into a blocking call.
fn own(t: &TenantId, id: &str) -> (String, String) {
    (t.as_str().to_owned(), id.to_owned())
}

#[async_trait::async_trait]
impl Store for Sqlite {
    fn lease(&self) -> Option<std::time::Duration> {
        None
    }

    async fn usage(&self, tenant: &TenantId) -> Result<(u64, u64)> {
        let t = tenant.as_str().to_owned();
        self.run(move |db| db.usage(&t)).await
    }

    async fn insert(
        &self,
        tenant: &TenantId,
        jobs: Vec<NewJob>,
        batch: Option<(String, String)>,
    ) -> Result<()> {
        let t = tenant.as_str().to_owned();
        self.run(move |db| {
            let b = batch.as_ref().map(|(i, d)| (i.as_str(), d.as_str()));
            db.insert(&t, &jobs, b)
        })
        .await
    }

    async fn job(&self, tenant: &TenantId, id: &str) -> Result<Option<Job>> {
        let (t, i) = own(tenant, id);
        self.run(move |db| db.job(&t, &i)).await
    }

    async fn cancel(&self, tenant: &TenantId, id: &str) -> Result<Option<JobState>> {
        let (t, i) = own(tenant, id);
        self.run(move |db| db.cancel(&t, &i)).await
    }

    async fn queued_tenants(&self) -> Result<Vec<TenantId>> {
        let names = self.run(|db| db.queued_tenants()).await?;
        Ok(names.into_iter().map(TenantId::new).collect())
    }

    async fn claim(&self, tenant: &TenantId, n: usize) -> Result<Vec<Claimed>> {
        let t = tenant.as_str().to_owned();
        self.run(move |db| db.claim(&t, n)).await
    }

    async fn renew(&self, _claims: &[(String, u64)]) -> Result<usize> {
        Ok(0)
    }

    async fn reclaim(&self, _own: &[(String, u64)]) -> Result<usize> {
        Ok(0)
    }

    async fn requeue(&self, id: &str, _token: u64) -> Result<()> {
        let i = id.to_owned();
        self.run(move |db| db.requeue(&i)).await
    }

    async fn finish(
        &self,
        id: &str,
        _token: u64,
        status: u16,
        resp_type: Option<&str>,
        body: &[u8],
    ) -> Result<bool> {
        let (i, t, b) = (id.to_owned(), resp_type.map(str::to_owned), body.to_vec());
        self.run(move |db| db.finish(&i, status, t.as_deref(), &b))
            .await
    }

    async fn put_chunk(&self, id: &str, seq: u32, data: Bytes) -> Result<()> {
        let i = id.to_owned();
        self.run(move |db| db.put_chunk(&i, seq, &data)).await
    }

    async fn commit_file(&self, tenant: &TenantId, f: &File) -> Result<()> {
        let (t, f) = (tenant.as_str().to_owned(), f.clone());
        self.run(move |db| db.commit_file(&t, &f)).await
    }

    async fn abort_file(&self, id: &str) -> Result<()> {
        let i = id.to_owned();
        self.run(move |db| db.abort_file(&i)).await
    }

    async fn file_chunk(&self, tenant: &TenantId, id: &str, seq: u32) -> Result<Option<Bytes>> {
        let (t, i) = own(tenant, id);
        let chunk = self.run(move |db| db.file_chunk(&t, &i, seq)).await?;
        Ok(chunk.map(Bytes::from))
    }

    async fn file(&self, tenant: &TenantId, id: &str) -> Result<Option<File>> {
        let (t, i) = own(tenant, id);
        self.run(move |db| db.file(&t, &i)).await
    }

    async fn delete_file(&self, tenant: &TenantId, id: &str) -> Result<bool> {
        let (t, i) = own(tenant, id);
        self.run(move |db| db.delete_file(&t, &i)).await
    }

    async fn batch(&self, tenant: &TenantId, id: &str) -> Result<Option<String>> {
        let (t, i) = own(tenant, id);
        self.run(move |db| db.batch(&t, &i)).await
    }

    async fn batches(
        &self,
        tenant: &TenantId,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<String>> {
        let (t, a) = (tenant.as_str().to_owned(), after.map(str::to_owned));
        self.run(move |db| db.batches(&t, a.as_deref(), limit))
            .await
    }

    async fn cancel_batch(&self, tenant: &TenantId, id: &str, doc: &str) -> Result<bool> {
        let ((t, i), d) = (own(tenant, id), doc.to_owned());
        self.run(move |db| db.cancel_batch(&t, &i, &d)).await
    }

    async fn insert_failed_batch(&self, tenant: &TenantId, id: &str, doc: &str) -> Result<()> {
        let ((t, i), d) = (own(tenant, id), doc.to_owned());
        self.run(move |db| db.insert_failed_batch(&t, &i, &d)).await
    }

    async fn counts(&self, id: &str) -> Result<Counts> {
        let i = id.to_owned();
        self.run(move |db| db.counts(&i)).await
    }

    async fn files(
        &self,
        tenant: &TenantId,
        after: Option<&str>,
        limit: usize,
        purpose: Option<&str>,
    ) -> Result<Vec<File>> {
        let t = tenant.as_str().to_owned();
        let (a, p) = (after.map(str::to_owned), purpose.map(str::to_owned));
        self.run(move |db| db.files(&t, a.as_deref(), limit, p.as_deref()))
            .await
    }

    async fn unfinished(&self, id: &str) -> Result<bool> {
        let i = id.to_owned();
        self.run(move |db| db.unfinished(&i)).await
    }

    async fn lines(&self, id: &str) -> Result<Vec<Line>> {
        let i = id.to_owned();
        self.run(move |db| db.lines(&i)).await
    }

    async fn batch_tenant(&self, id: &str) -> Result<Option<String>> {
        let i = id.to_owned();
        self.run(move |db| db.batch_tenant(&i)).await
    }

    async fn due_batches(&self, now: u64) -> Result<Vec<(String, String, String)>> {
        self.run(move |db| db.due_batches(now)).await
    }

    async fn settled_batches(&self) -> Result<Vec<String>> {
        self.run(|db| db.settled_batches()).await
    }

    async fn finalize(
        &self,
        id: &str,
        expected: &str,
        doc: &str,
        status: &str,
        files: Vec<(File, Vec<u8>)>,
    ) -> Result<bool> {
        let (i, e) = (id.to_owned(), expected.to_owned());
        let (d, st) = (doc.to_owned(), status.to_owned());
        self.run(move |db| db.finalize(&i, &e, &d, &st, &files))
            .await
    }

    async fn cleanup(&self, before: u64) -> Result<usize> {
        self.run(move |db| db.cleanup(before)).await
    }

    async fn oldest_queued(&self) -> Result<u64> {
        self.run(|db| db.oldest_queued()).await
    }

    async fn states(&self) -> Result<Vec<(String, JobState, u64)>> {
        self.run(|db| db.states()).await
    }
}
