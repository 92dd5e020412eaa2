//! The upstream-feedback stage, just above `upstream`: picks the pool's endpoint for each
//! attempt ([`PoolCapacity::pick`]), feeds every answer to that endpoint, sends a request one
//! endpoint refused or failed before any byte reached the client on to another, and retries a
//! 429/502/503 with backoff — all while the request still holds its fair-queue permit.
//!
//! Failover: a 429, 500, 502, 503, 504, connect or TLS error or missing head from one endpoint,
//! with another endpoint in service that this round has not tried, is sent on at once, no
//! backoff, charged once (not a retry: neither the tenant's buckets nor its credit pay for it),
//! counted in [`RetryStats::failovers`] and per endpoint. Once every endpoint in service has
//! been tried, the round ends as a single endpoint's would:
//!
//! Retries: exponential backoff (`retry_backoff_ms × 2^attempt`, capped at
//! `retry_backoff_max_ms`) with full jitter in its upper half, never shorter than the wait the
//! upstream asked for (`Retry-After` & co), at most `max_retries`, and never past the request's
//! deadline. Each extra attempt is charged to the tenant's token ledger (what admission charged)
//! and to its fair-queue credit (the cost charged at dispatch, through the context's `retries`,
//! which the permit reads when released), and counted ([`RetryStats`]). A 429 that is finally
//! passed to the client says `x-fairgate-limit: upstream` and always carries a `Retry-After`
//! (the upstream's, else the wait the next attempt would have had).
//!
//! Retries hold the request's pool slot while they wait, so the whole wait of one request is
//! capped by `max_retry_wait_ms`: a retry whose wait (backoff, the upstream's `Retry-After`, the
//! pool's pause) would pass it is not made, and the 429 goes to the client at once. A pick that
//! finds every endpoint full waits for one within the same cap ([`NoEndpoint`] past it).
//!
//! A tenant with its own provider key on the endpoint picked (`upstream_api_key_env`,
//! `upstream_api_key_envs`): its answers feed [`KeyPauses`], never the endpoint's learned limit;
//! endpoints where its key is paused are skipped, and while it is paused on every endpoint it
//! would use its requests are refused at the top of this stage ([`KeyPaused`]: 429,
//! `x-fairgate-limit: upstream`, `Retry-After` = the pause left, never sent); its 429s with no
//! endpoint left to try are passed on at once, not retried — the key's exhaustion is the
//! tenant's limit and never pins a pool slot.
//!
//! Invariant: only a complete upstream *head* is inspected, and a retried answer's body is
//! dropped unread, so nothing of a failed attempt reaches the client.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode};
use rand::Rng;

use super::capacity::{upstream_wait, PoolCapacity};
use super::keys::KeyPauses;
use crate::config::AdmissionConfig;
use crate::context::SentTo;
#[cfg(test)]
use crate::error::LIMIT_HEADER;
use crate::error::{retry_headers, Error, Limit, Reason, RETRY_AFTER_MS};
use crate::ratelimit::RateStore;
use crate::response::ResponseBody;

mod decide;

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
    /// Attempts sent on to another endpoint after one refused or failed them.
    pub failovers: AtomicU64,
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

/// The retry stage: holds only an `Arc`.
#[derive(Clone)]
pub struct Retry(Arc<Shared>);

impl From<Shared> for Retry {
    fn from(shared: Shared) -> Self {
        Self(Arc::new(shared))
    }
}

/// The retry layer (`Layer::new(shared)`).
pub type Layer = crate::stage::Layer<Retry>;

impl<S> crate::stage::Stage<Request<Bytes>, S> for Retry
where
    S: crate::stage::Below<Request<Bytes>, Response<ResponseBody>, Error>,
{
    type Down = Request<Bytes>;

    async fn call(
        self,
        req: Request<Bytes>,
        mut inner: S,
    ) -> Result<Response<ResponseBody>, Error> {
        let shared = self.0;
        let ctx = crate::context::of(&req)?;
        let index = ctx.route()?.pool;
        let pool = shared
            .capacity
            .get(index)
            .cloned()
            .ok_or_else(|| Error::internal("no capacity controller for the routed pool"))?;
        let identity = ctx.identity()?;
        let tenant = identity.tenant.id.clone();
        // A tenant's own provider keys: their answers teach those keys, not the endpoints.
        let keys = &identity.tenant.upstream_keys;
        let model = ctx.request().map(|p| p.model.clone()).unwrap_or_default();
        let admitted = *ctx.admitted()?;
        let deadline = admitted.deadline;
        let mut waited = Duration::ZERO;
        let mut attempt = 0;
        // Endpoints this round of attempts has tried (bit i: endpoint i).
        let mut tried = 0u64;
        loop {
            use tower::ServiceExt;
            let (key_paused, paused_for) =
                own_keys_paused(&shared.key_pauses, &pool, index, keys, &tenant, &model);
            let ready = inner.ready().await?;
            // A full pool waits for a free endpoint within what is left of the retry wait.
            let left = shared.policy.max_wait.saturating_sub(waited);
            let left = deadline.map_or(left, |d| left.min(d.remaining()));
            let ticket = match pool.pick(&model, tried | key_paused, left).await {
                Ok(t) => t,
                Err(_) if !paused_for.is_zero() => return Err(KeyPaused(paused_for).into()),
                Err(_) => return Err(NoEndpoint(pool.paused_for()).into()),
            };
            let ep = ticket.endpoint();
            let name = pool.endpoint_name(ep).unwrap_or_else(|| Arc::from(""));
            let own_key = keys.for_endpoint(&name).is_some();
            ctx.set_endpoint(SentTo {
                index: ep,
                name: name.clone(),
            });
            let mut result = ready.call(crate::upstream::attempt(&req)).await;
            let (status, wait) = match &result {
                Ok(res) if own_key => {
                    let h = res.headers();
                    shared
                        .key_pauses
                        .observe((index, ep), &tenant, &model, res.status(), h);
                    if res.status().is_server_error()
                        && res.status() != StatusCode::SERVICE_UNAVAILABLE
                    {
                        pool.fail(&ticket);
                    }
                    (res.status(), upstream_wait(h))
                }
                Ok(res) => {
                    pool.observe(&ticket, res.status(), res.headers(), &model);
                    (res.status(), upstream_wait(res.headers()))
                }
                Err(e) => {
                    if e.endpoint_failed() {
                        pool.fail(&ticket);
                    }
                    (e.status(), None)
                }
            };
            let bit = if ep < 64 { 1u64 << ep } else { 0 };
            let attempted = decide::Attempt {
                status,
                // Refused or failed before any byte reached the client, with another
                // endpoint to go to: sent on at once, charged once.
                failover: failover_status(status, &result)
                    && pool.has_other(tried | bit | key_paused),
                own_key,
                upstream_wait: wait,
            };
            let spent = decide::Spent {
                attempt,
                waited,
                deadline_left: deadline.map(|d| d.remaining()),
            };
            let waits = || decide::Waits {
                backoff: shared.policy.backoff(attempt),
                pool_pause: if own_key {
                    Duration::ZERO
                } else {
                    pool.paused_for()
                },
            };
            let backoff = match decide::next(&shared.policy, attempted, spent, waits) {
                decide::Next::Answer => {
                    // The request occupies the endpoint until its body ends.
                    if let Ok(res) = &mut result {
                        res.body_mut().attach(Box::new(ticket));
                    }
                    return result;
                }
                decide::Next::FailOver => {
                    drop(ticket);
                    pool.count_failover(ep);
                    shared.stats.failovers.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(endpoint = %name, status = status.as_u16(), "failing over");
                    tried |= bit;
                    continue;
                }
                decide::Next::GiveUp(backoff) => {
                    drop(ticket);
                    shared.stats.exhausted.fetch_add(1, Ordering::Relaxed);
                    return result.map(|res| give_up(res, backoff));
                }
                decide::Next::Retry(backoff) => {
                    drop(ticket);
                    backoff
                }
            };
            drop(result);
            tokio::time::sleep(backoff).await;
            waited += backoff;
            attempt += 1;
            tried = 0;
            shared.stats.retries.fetch_add(1, Ordering::Relaxed);
            // The attempt is the tenant's load, not everyone's: charged to its buckets here
            // and to its fair-queue credit when the permit is released (the context's
            // `retries`).
            if let Some(charge) = admitted.charged {
                shared.store.charge(&tenant, charge);
            }
            ctx.add_retry();
        }
    }
}

/// Statuses (and failures) another endpoint may answer better: a refusal (429, 503) or a
/// failure (500, 502, 504, connect, TLS, no head in time).
fn failover_status(status: StatusCode, result: &Result<Response<ResponseBody>, Error>) -> bool {
    match result {
        Err(e) => e.endpoint_failed(),
        Ok(_) => matches!(status.as_u16(), 429 | 500 | 502 | 503 | 504),
    }
}

/// The endpoints of `pool` on which `tenant`'s own key is paused for `model` (bit i: endpoint
/// i), and the shortest such pause when that is every endpoint it has a key on and none
/// without (then the request is refused: zero otherwise).
pub fn own_keys_paused(
    pauses: &KeyPauses,
    pool: &PoolCapacity,
    index: usize,
    keys: &crate::context::OwnKeys,
    tenant: &crate::domain::TenantId,
    model: &str,
) -> (u64, Duration) {
    if keys.is_empty() {
        return (0, Duration::ZERO);
    }
    let (mut mask, mut shortest, mut open) = (0u64, None::<Duration>, false);
    for i in 0..pool.endpoints().min(64) {
        let Some(name) = pool.endpoint_name(i) else {
            continue;
        };
        if keys.for_endpoint(&name).is_none() {
            open = true;
            continue;
        }
        let left = pauses.paused_for((index, i), tenant, model);
        if left.is_zero() {
            open = true;
        } else {
            mask |= 1 << i;
            shortest = Some(shortest.map_or(left, |s| s.min(left)));
        }
    }
    (
        mask,
        if open {
            Duration::ZERO
        } else {
            shortest.unwrap_or_default()
        },
    )
}

/// No endpoint of the pool can take the request: all are out (ejected, or paused past the
/// retry wait) or full past it.
#[derive(Debug, thiserror::Error)]
#[error("no endpoint of the upstream can take the request now; retry shortly")]
pub struct NoEndpoint(pub Duration);

impl crate::error::ApiError for NoEndpoint {
    fn status(&self) -> StatusCode {
        StatusCode::SERVICE_UNAVAILABLE
    }
    fn kind(&self) -> &'static str {
        "server_error"
    }
    fn code(&self) -> &'static str {
        "upstream_unavailable"
    }
    fn limit(&self) -> Option<Limit> {
        Some(Limit::Upstream)
    }
    fn retry_after(&self) -> Option<Duration> {
        Some(self.0.max(Duration::from_secs(1)))
    }
    fn reason(&self) -> Reason {
        Reason::NoEndpoint
    }
    fn never_sent(&self) -> bool {
        true
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
        // OpenAI's rate-limit `type` (not Anthropic's `rate_limit_error`).
        "requests"
    }
    fn code(&self) -> &'static str {
        "rate_limit_exceeded"
    }
    fn limit(&self) -> Option<Limit> {
        Some(Limit::Upstream)
    }
    fn retry_after(&self) -> Option<Duration> {
        Some(self.0)
    }
    fn reason(&self) -> Reason {
        Reason::UpstreamKeyPaused
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
        h.extend([Limit::Upstream.header()]);
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
