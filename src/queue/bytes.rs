//! Memory bounded in bytes (`[scheduler] max_queued_bytes`, `max_queued_bytes_per_tenant`, a
//! plan's or tenant's `max_queued_bytes`): the request bytes held queued or in flight, per
//! tenant (all pools) and per pool.
//!
//! A request's size is its body as received plus the parsed form fairgate keeps of it
//! (`Parsed::kept_bytes`, measured). Two [`Reservation`]s, each attached to the response body
//! and released on `Drop` — when the answer ends, fails, or the request is cancelled at any
//! point:
//! - the tenant's, taken by the `body` stage from the tenant-wide [`ByteBudget`] *before* the
//!   body is read when its `Content-Length` is declared (else once read), then grown by the
//!   parsed form's bytes ([`Reservation::grow`]: counted, never a refusal of its own);
//! - the pool's, taken by this module's [`Layer`] right after `route` (the pool is known).
//!
//! Invariants: held bytes never exceed the pool's and the tenant's budget, except by one request
//! alone (a request that finds nothing of its tenant — or nothing at all in the pool — held
//! always passes, so no configuration refuses a request forever); the std mutex is never held
//! across `.await`; a refusal carries a Retry-After of the time the pool needs to serve what it
//! holds (at its recent service time), never a constant.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};

use super::{FairQueue, QueueError};
use crate::domain::TenantId;
use crate::response::ResponseBody;

#[derive(Default)]
struct Held {
    /// Bytes and requests held in the pool.
    bytes: u64,
    requests: usize,
    /// Bytes and requests held per tenant (entries removed at zero: the map stays bounded by
    /// the tenants with a request in the pool).
    tenants: HashMap<TenantId, (u64, usize)>,
}

/// One pool's byte budget; see the module docs.
pub struct ByteBudget {
    held: Mutex<Held>,
    pool_max: AtomicU64,
}

impl std::fmt::Debug for ByteBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ByteBudget")
            .field("pool_max", &self.pool_max.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// Whose byte budget refused a request, and how many requests it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Over {
    /// The tenant's (`max_queued_bytes` of the tenant or plan, else the scheduler default).
    Tenant(usize),
    /// The pool's (`[scheduler] max_queued_bytes`).
    Pool(usize),
}

impl ByteBudget {
    /// A budget of `pool_max` bytes for the whole pool.
    pub fn new(pool_max: u64) -> Arc<Self> {
        Arc::new(Self {
            held: Mutex::new(Held::default()),
            pool_max: AtomicU64::new(pool_max),
        })
    }

    /// Sets the pool's budget (a reload; what is held stays held).
    pub fn set_pool_max(&self, max: u64) {
        self.pool_max.store(max, Ordering::Relaxed);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reserves `n` bytes for `tenant` (whose budget is `tenant_max`), or says whose budget is
    /// exhausted.
    pub fn reserve(
        self: &Arc<Self>,
        tenant: &TenantId,
        tenant_max: u64,
        n: u64,
    ) -> Result<Reservation, Over> {
        let mut held = self.lock();
        let (t_bytes, t_requests) = held.tenants.get(tenant).copied().unwrap_or((0, 0));
        if t_bytes > 0 && t_bytes.saturating_add(n) > tenant_max {
            return Err(Over::Tenant(t_requests));
        }
        let pool_max = self.pool_max.load(Ordering::Relaxed);
        if held.bytes > 0 && held.bytes.saturating_add(n) > pool_max {
            return Err(Over::Pool(held.requests));
        }
        held.bytes += n;
        held.requests += 1;
        let entry = held.tenants.entry(tenant.clone()).or_default();
        entry.0 += n;
        entry.1 += 1;
        Ok(Reservation {
            budget: self.clone(),
            tenant: tenant.clone(),
            bytes: n,
        })
    }

    /// Bytes held in all, and by `tenant`.
    pub fn held(&self, tenant: &TenantId) -> (u64, u64) {
        let held = self.lock();
        let t = held.tenants.get(tenant).map_or(0, |t| t.0);
        (held.bytes, t)
    }
}

/// Bytes held for one request; released on `Drop`.
pub struct Reservation {
    budget: Arc<ByteBudget>,
    tenant: TenantId,
    bytes: u64,
}

impl Reservation {
    /// Counts `n` more bytes of the same request (its parsed form): never refused, the request
    /// was admitted on its body.
    pub fn grow(&mut self, n: u64) {
        let mut held = self.budget.lock();
        held.bytes += n;
        if let Some(t) = held.tenants.get_mut(&self.tenant) {
            t.0 += n;
        }
        self.bytes += n;
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut held = self.budget.lock();
        held.bytes -= self.bytes;
        held.requests -= 1;
        if let Some(t) = held.tenants.get_mut(&self.tenant) {
            t.0 -= self.bytes;
            t.1 -= 1;
            if t.1 == 0 {
                held.tenants.remove(&self.tenant);
            }
        }
    }
}

/// The tenant-wide budget the `body` stage reserves from, with the pools whose service time
/// prices its Retry-After. Kept across reloads (what is held stays held).
#[derive(Clone, Debug)]
pub struct TenantBudget {
    /// Bytes held per tenant, all pools.
    pub bytes: Arc<ByteBudget>,
    /// The pools of the generation in force.
    pub pools: Arc<[Arc<FairQueue>]>,
}

impl TenantBudget {
    /// Reserves `n` bytes for `tenant` within its `max_queued_bytes`; over it, the 429 with
    /// the time the slowest pool needs to serve the tenant's held requests.
    pub fn reserve(
        &self,
        tenant: &crate::context::Tenant,
        n: u64,
    ) -> Result<Reservation, crate::Error> {
        self.bytes
            .reserve(&tenant.id, tenant.max_queued_bytes, n)
            .map_err(|over| {
                let requests = match over {
                    Over::Tenant(r) | Over::Pool(r) => r,
                };
                let retry_after = self
                    .pools
                    .iter()
                    .map(|p| p.drain_time(requests))
                    .max()
                    .unwrap_or(Duration::from_secs(1));
                QueueError::TenantBytes { retry_after }.into()
            })
    }
}

/// Tower layer of the pool's byte budget (placed right after `route`).
#[derive(Clone)]
pub struct Layer(pub Arc<[Arc<FairQueue>]>);

impl<S> tower::Layer<S> for Layer {
    type Service = Service<S>;
    fn layer(&self, inner: S) -> Service<S> {
        Service {
            pools: self.0.clone(),
            inner,
        }
    }
}

/// See the module docs.
#[derive(Clone)]
pub struct Service<S> {
    pools: Arc<[Arc<FairQueue>]>,
    inner: S,
}

/// What a request holds: its body and the parsed form kept of it.
pub fn request_bytes(body: &Bytes, ctx: &crate::context::Context) -> u64 {
    body.len() as u64 + ctx.request_if_parsed().map_or(0, |p| p.kept_bytes)
}

impl<S> tower::Service<Request<Bytes>> for Service<S>
where
    S: tower::Service<Request<Bytes>, Response = Response<ResponseBody>, Error = crate::Error>
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = Response<ResponseBody>;
    type Error = crate::Error;
    type Future = crate::stage::BoxFuture<Result<Self::Response, crate::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), crate::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Bytes>) -> Self::Future {
        let reserved = (|| {
            let ctx = crate::context::of(&req)?;
            let tenant = &ctx.identity()?.tenant;
            let pool = self
                .pools
                .get(ctx.route()?.pool)
                .ok_or_else(|| crate::Error::internal("routed to an unknown pool"))?;
            let n = request_bytes(req.body(), &ctx);
            // The tenant's budget was taken by `body` (tenant-wide); this one is the pool's.
            pool.bytes()
                .reserve(&tenant.id, u64::MAX, n)
                .map_err(|over| {
                    let (requests, tenant) = match over {
                        Over::Tenant(r) => (r, true),
                        Over::Pool(r) => (r, false),
                    };
                    let retry_after = pool.drain_time(requests);
                    crate::Error::from(if tenant {
                        QueueError::TenantBytes { retry_after }
                    } else {
                        QueueError::PoolBytes { retry_after }
                    })
                })
        })();
        let reservation = match reserved {
            Ok(r) => r,
            Err(e) => return Box::pin(std::future::ready(Err(e))),
        };
        // The reservation lives in this future until the answer exists, then in its body.
        let fut = self.inner.call(req);
        Box::pin(async move {
            let mut res = fut.await?;
            res.body_mut().attach(Box::new(reservation));
            Ok(res)
        })
    }
}

/// The time to serve `requests` at the pool's recent rate, at least 1 s.
pub(super) fn drain(requests: usize, service_s: f64, capacity: u32) -> Duration {
    let secs = (requests as f64 * service_s / f64::from(capacity.max(1))).ceil();
    Duration::from_secs(secs.clamp(1.0, 3600.0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> TenantId {
        TenantId::new(s)
    }

    #[test]
    fn tenant_and_pool_budgets_hold_and_drop_releases() {
        let b = ByteBudget::new(100);
        let a1 = b.reserve(&id("a"), 50, 40).unwrap();
        let a2 = b.reserve(&id("a"), 50, 10).unwrap();
        // The tenant's budget is full; another tenant still fits in the pool.
        assert_eq!(b.reserve(&id("a"), 50, 1).err(), Some(Over::Tenant(2)));
        let c1 = b.reserve(&id("c"), 50, 50).unwrap();
        assert_eq!(b.reserve(&id("d"), 50, 1).err(), Some(Over::Pool(3)));
        assert_eq!(b.held(&id("a")), (100, 50));
        drop(a1);
        assert_eq!(b.held(&id("a")), (60, 10));
        let d1 = b.reserve(&id("d"), 50, 40).unwrap();
        drop((a2, c1, d1));
        assert_eq!(b.held(&id("a")), (0, 0));
        assert!(b.lock().tenants.is_empty(), "entries go at zero");
    }

    #[test]
    fn grow_counts_the_parsed_form_and_drop_releases_it() {
        let b = ByteBudget::new(u64::MAX);
        let mut r = b.reserve(&id("a"), 100, 60).unwrap();
        r.grow(30);
        assert_eq!(b.held(&id("a")), (90, 90));
        assert_eq!(b.reserve(&id("a"), 100, 20).err(), Some(Over::Tenant(1)));
        drop(r);
        assert_eq!(b.held(&id("a")), (0, 0));
    }

    #[test]
    fn one_request_alone_always_passes() {
        let b = ByteBudget::new(10);
        let big = b.reserve(&id("a"), 5, 1000).unwrap();
        assert_eq!(b.reserve(&id("c"), 5, 1).err(), Some(Over::Pool(1)));
        drop(big);
        assert!(b.reserve(&id("c"), 5, 1000).is_ok());
    }

    #[test]
    fn retry_after_is_the_time_to_serve_what_is_held() {
        assert_eq!(drain(0, 2.0, 4), Duration::from_secs(1));
        assert_eq!(drain(40, 2.0, 4), Duration::from_secs(20));
    }
}
