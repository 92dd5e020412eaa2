//! The upstream-feedback stage, just above `upstream`: every upstream answer feeds the pool's
//! [`PoolCapacity`], and a 429/502/503 that arrived before any byte reached the client is
//! retried while the request still holds its fair-queue permit.
//!
//! Retries: exponential backoff (`retry_backoff_ms × 2^attempt`, capped at
//! `retry_backoff_max_ms`) with full jitter in its upper half, never shorter than the wait the
//! upstream asked for (`Retry-After` & co), at most `max_retries`, and never past the request's
//! deadline. Each extra attempt is charged to the tenant's token ledger (what admission charged)
//! and to its fair-queue credit (the cost charged at dispatch, through the context's `retries`,
//! which the permit reads when released), and counted ([`RetryStats`]). A 429 that is finally passed to the client says
//! `x-fairgate-limit: upstream` and always carries a `Retry-After` (the upstream's, else the wait
//! the next attempt would have had).
//!
//! Retries hold the request's pool slot while they wait, so the whole wait of one request is
//! capped by `max_retry_wait_ms`: a retry whose wait (backoff, the upstream's `Retry-After`, the
//! pool's pause) would pass it is not made, and the 429 goes to the client at once.
//!
//! A tenant with its own provider key (`upstream_api_key_env`): its answers feed
//! [`KeyPauses`], never the pool's capacity (nor its wire order); while its key is paused its
//! requests are refused at the top of this stage ([`KeyPaused`]: 429, `x-fairgate-limit:
//! upstream`, `Retry-After` = the pause left, never sent) and its 429s are passed on at once,
//! not retried — the key's exhaustion is the tenant's limit and never pins a pool slot.
//!
//! Invariant: only a complete upstream *head* is inspected, and a retried answer's body is
//! dropped unread, so nothing of a failed attempt reaches the client.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::{HeaderValue, Request, Response, StatusCode};
use rand::Rng;

use super::capacity::{upstream_wait, PoolCapacity};
use super::keys::KeyPauses;
use crate::config::AdmissionConfig;
use crate::error::{retry_headers, Error, LIMIT_HEADER, RETRY_AFTER_MS};
use crate::ratelimit::RateStore;
use crate::response::ResponseBody;

/// Retry policy, from `[admission]`.
#[derive(Clone, Copy, Debug)]
pub struct RetryPolicy {
    /// Extra attempts at most.
    pub max_retries: u32,
    /// First backoff.
    pub base: Duration,
    /// Backoff ceiling.
    pub max: Duration,
    /// Total wait between one request's attempts (`max_retry_wait_ms`).
    pub max_wait: Duration,
}

impl RetryPolicy {
    /// From the config table.
    pub fn from_config(c: &AdmissionConfig) -> Self {
        Self {
            max_retries: c.max_retries,
            base: Duration::from_millis(c.retry_backoff_ms),
            max: Duration::from_millis(c.retry_backoff_max_ms),
            max_wait: Duration::from_millis(c.max_retry_wait_ms),
        }
    }

    /// The backoff before retry number `attempt` (0-based): in [b/2, b], b = base × 2^attempt.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let b = self
            .base
            .saturating_mul(1u32 << attempt.min(16))
            .min(self.max);
        let half = b / 2;
        half + half.mul_f64(rand::rng().random::<f64>())
    }
}

/// Retry counters (read by metrics).
#[derive(Debug, Default)]
pub struct RetryStats {
    /// Upstream attempts beyond the first.
    pub retries: AtomicU64,
    /// Requests whose last attempt was still retryable (retries exhausted or no time left).
    pub exhausted: AtomicU64,
}

/// Shared by every clone of the retry service.
pub struct Shared {
    /// Each pool's learned capacity, indexed like `[[upstreams]]`.
    pub capacity: Arc<[Arc<PoolCapacity>]>,
    /// Tenants' own provider keys' pauses.
    pub key_pauses: Arc<KeyPauses>,
    /// Where a retried attempt is charged.
    pub store: Arc<dyn RateStore>,
    /// Backoff and attempts.
    pub policy: RetryPolicy,
    /// Counters.
    pub stats: Arc<RetryStats>,
}

/// The layer: holds only an `Arc`.
#[derive(Clone)]
pub struct Layer(Arc<Shared>);

impl Layer {
    /// The retry stage over `shared`.
    pub fn new(shared: Shared) -> Self {
        Self(Arc::new(shared))
    }
}

impl<S> tower::Layer<S> for Layer {
    type Service = Service<S>;
    fn layer(&self, inner: S) -> Service<S> {
        Service {
            shared: self.0.clone(),
            inner,
        }
    }
}

/// See the module docs.
#[derive(Clone)]
pub struct Service<S> {
    shared: Arc<Shared>,
    inner: S,
}

fn retryable(status: StatusCode) -> bool {
    matches!(status.as_u16(), 429 | 502 | 503)
}

impl<S> tower::Service<Request<Bytes>> for Service<S>
where
    S: tower::Service<Request<Bytes>, Response = Response<ResponseBody>, Error = Error>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = Response<ResponseBody>;
    type Error = Error;
    type Future = BoxFuture<'static, Result<Self::Response, Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Bytes>) -> Self::Future {
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let shared = self.shared.clone();
        Box::pin(async move {
            let ctx = crate::context::of(&req)?;
            let index = ctx.route()?.pool;
            let pool = shared
                .capacity
                .get(index)
                .cloned()
                .ok_or_else(|| Error::internal("no capacity controller for the routed pool"))?;
            let identity = ctx.identity()?;
            let tenant = identity.tenant.id.clone();
            // A tenant's own provider key: its answers teach that key, not the pool.
            let own_key = identity.tenant.upstream_key.is_some();
            let model = ctx.request().map(|p| p.model.clone()).unwrap_or_default();
            let admitted = *ctx.admitted()?;
            let deadline = admitted.deadline;
            let mut waited = Duration::ZERO;
            let mut attempt = 0;
            let mut req = Some(req);
            loop {
                use tower::ServiceExt;
                if own_key {
                    let paused = shared.key_pauses.paused_for(index, &tenant, &model);
                    if !paused.is_zero() {
                        return Err(KeyPaused(paused).into());
                    }
                }
                let ready = inner.ready().await?;
                // Only the pool key's requests are on the pool's wire (they alone say where
                // the shared key's limit is).
                let ticket = (!own_key).then(|| pool.send());
                // The last attempt allowed takes the request itself; earlier ones a copy.
                let this = match req.take() {
                    Some(r) if attempt >= shared.policy.max_retries => r,
                    Some(r) => {
                        let copy = crate::upstream::attempt(&r);
                        req = Some(r);
                        copy
                    }
                    None => return Err(Error::internal("retry past the last attempt")),
                };
                let mut result = ready.call(this).await;
                let (status, wait) = match &result {
                    Ok(res) if own_key => {
                        let h = res.headers();
                        shared
                            .key_pauses
                            .observe(index, &tenant, &model, res.status(), h);
                        (res.status(), upstream_wait(h))
                    }
                    Ok(res) => {
                        pool.observe(ticket.as_ref(), res.status(), res.headers());
                        (res.status(), upstream_wait(res.headers()))
                    }
                    Err(e) => (e.status(), None),
                };
                if !retryable(status) {
                    // The request occupies the upstream until its body ends.
                    if let (Ok(res), Some(ticket)) = (&mut result, ticket) {
                        res.body_mut().attach(Box::new(ticket));
                    }
                    return result;
                }
                drop(ticket);
                let pool_pause = if own_key {
                    Duration::ZERO
                } else {
                    pool.paused_for()
                };
                let backoff = shared
                    .policy
                    .backoff(attempt)
                    .max(wait.unwrap_or_default())
                    .max(pool_pause);
                let in_time = deadline.is_none_or(|d| backoff < d.remaining());
                // A retry waits holding its pool slot: the whole wait is capped.
                let within_cap = waited + backoff <= shared.policy.max_wait;
                // An exhausted own key is the tenant's limit: said at once, never waited out
                // in a pool slot.
                let own_refusal = own_key && status == StatusCode::TOO_MANY_REQUESTS;
                if attempt >= shared.policy.max_retries || !in_time || !within_cap || own_refusal {
                    shared.stats.exhausted.fetch_add(1, Ordering::Relaxed);
                    return result.map(|res| give_up(res, backoff));
                }
                drop(result);
                tokio::time::sleep(backoff).await;
                waited += backoff;
                attempt += 1;
                shared.stats.retries.fetch_add(1, Ordering::Relaxed);
                // The attempt is the tenant's load, not everyone's: charged to its buckets here
                // and to its fair-queue credit when the permit is released (the context's
                // `retries`).
                if let Some(charge) = admitted.charged {
                    shared.store.charge(&tenant, charge);
                }
                ctx.add_retry();
            }
        })
    }
}

/// A tenant's own provider key is paused (it answered 429 or said its budget is spent): the
/// tenant's request is refused before it reaches the provider.
#[derive(Debug, thiserror::Error)]
#[error("your provider key's rate limit is exhausted; retry after the provider's reset")]
pub struct KeyPaused(pub Duration);

impl crate::error::ApiError for KeyPaused {
    fn status(&self) -> StatusCode {
        StatusCode::TOO_MANY_REQUESTS
    }
    fn kind(&self) -> &'static str {
        "rate_limit_error"
    }
    fn code(&self) -> &'static str {
        "rate_limit_exceeded"
    }
    fn limit(&self) -> Option<&'static str> {
        Some("upstream")
    }
    fn retry_after(&self) -> Option<Duration> {
        Some(self.0)
    }
    fn reason(&self) -> &'static str {
        "upstream_key_paused"
    }
    fn never_sent(&self) -> bool {
        true
    }
}

/// The upstream's 429 as passed to the client once retries are over: `x-fairgate-limit:
/// upstream`, and a `Retry-After` — the upstream's own, else the wait before the next attempt
/// would have been (the upstream's reset, the pool's pause, or the backoff) — never none.
fn give_up(mut res: Response<ResponseBody>, next_attempt: Duration) -> Response<ResponseBody> {
    if res.status() == StatusCode::TOO_MANY_REQUESTS {
        let h = res.headers_mut();
        h.insert(LIMIT_HEADER, HeaderValue::from_static("upstream"));
        // The upstream's own wait wins; else the one the next attempt would have had.
        if !h.contains_key(http::header::RETRY_AFTER) {
            h.extend(retry_headers(next_attempt));
        } else if !h.contains_key(RETRY_AFTER_MS) {
            if let Some(wait) = upstream_wait(h) {
                let ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX).max(1);
                h.insert(RETRY_AFTER_MS, HeaderValue::from(ms));
            }
        }
    }
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_final_upstream_429_always_says_when_to_retry() {
        let res = |retry_after: Option<&'static str>| {
            let mut r = Response::new(ResponseBody::empty());
            *r.status_mut() = StatusCode::TOO_MANY_REQUESTS;
            if let Some(v) = retry_after {
                r.headers_mut()
                    .insert("retry-after", HeaderValue::from_static(v));
            }
            r
        };
        let wait = Duration::from_millis(2500);
        let r = give_up(res(None), wait);
        assert_eq!(r.headers()["retry-after"], "3");
        assert_eq!(r.headers()[LIMIT_HEADER], "upstream");
        let r = give_up(res(Some("7")), wait);
        assert_eq!(r.headers()["retry-after"], "7", "the upstream's own wins");
        let mut ok = Response::new(ResponseBody::empty());
        *ok.status_mut() = StatusCode::BAD_GATEWAY;
        assert!(give_up(ok, wait).headers().get("retry-after").is_none());
    }

    #[test]
    fn backoff_doubles_with_jitter_and_is_capped() {
        let p = RetryPolicy {
            max_retries: 3,
            base: Duration::from_millis(100),
            max: Duration::from_millis(500),
            max_wait: Duration::from_secs(3),
        };
        for _ in 0..50 {
            let b0 = p.backoff(0);
            assert!(b0 >= Duration::from_millis(50) && b0 <= Duration::from_millis(100));
            let b2 = p.backoff(2);
            assert!(b2 >= Duration::from_millis(200) && b2 <= Duration::from_millis(400));
            assert!(p.backoff(10) <= Duration::from_millis(500));
        }
    }
}
