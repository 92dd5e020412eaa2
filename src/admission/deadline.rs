//! Deadlines: how long a request may wait for the fair queue, and whether it can.
//!
//! The budget comes from the `x-fairgate-deadline-ms` request header (relative milliseconds),
//! else the tenant's/plan's `max_queue_wait_ms`. Admission predicts the wait ([`predict_wait`])
//! and refuses at once when the budget cannot be met: **429** with `x-fairgate-limit: queue` (or
//! `upstream` when the upstream's pause is what makes it infeasible) and `Retry-After` = the
//! predicted wait — the condition is a backlog that drains, so the client may come back, which
//! 504 would not say. A request admitted with a deadline that then passes while queued is
//! removed from the queue before dispatch (its `acquire` is dropped: no charge) and answered
//! **504** `deadline_exceeded`.
//!
//! Prediction: under DRR a tenant's next request waits for about one request per backlogged
//! tenant per request of its own already queued (bounded by the whole pool's queue); the pool
//! completes `capacity / service_time` requests a second (its recent mean hold time).

use std::time::Duration;

use http::HeaderMap;
use tokio::time::Instant;

use super::Error;
use crate::queue::WaitInputs;

/// Request header: the request's queue-wait budget in milliseconds, relative to arrival.
pub const DEADLINE_HEADER: http::HeaderName =
    http::HeaderName::from_static("x-fairgate-deadline-ms");

pub use crate::context::Deadline;

/// The header's budget, else `default_ms`; a malformed header is a 400.
pub fn from_request(
    headers: &HeaderMap,
    default_ms: Option<u64>,
) -> Result<Option<Deadline>, Error> {
    let ms = match headers.get(DEADLINE_HEADER) {
        Some(v) => Some(
            v.to_str()
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
                .filter(|&ms| ms > 0)
                .ok_or(Error::BadDeadline)?,
        ),
        None => default_ms,
    };
    Ok(ms.map(|ms| {
        let budget = Duration::from_millis(ms.min(86_400_000));
        Deadline {
            at: Instant::now() + budget,
            budget,
        }
    }))
}

/// Predicted queue wait of a new request; see the module docs.
pub fn predict_wait(w: &WaitInputs) -> Duration {
    let free = w.capacity.saturating_sub(w.in_flight) as usize;
    let others = w.backlogged_tenants - usize::from(w.tenant_queued > 0).min(w.backlogged_tenants);
    let ahead = w.queued.min((w.tenant_queued + 1) * (others + 1) - 1);
    if ahead < free {
        return Duration::ZERO;
    }
    let completions = (ahead + 1 - free) as f64;
    let rate = f64::from(w.capacity.max(1)) / w.service_time.as_secs_f64().max(1e-3);
    Duration::from_secs_f64((completions / rate).min(86_400.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(queued: usize, in_flight: u32, tenant_queued: usize, backlogged: usize) -> WaitInputs {
        WaitInputs {
            queued,
            in_flight,
            capacity: 4,
            tenant_queued,
            backlogged_tenants: backlogged,
            service_time: Duration::from_secs(2),
        }
    }

    #[test]
    fn free_slot_means_no_wait_and_position_scales_the_wait() {
        assert_eq!(predict_wait(&w(0, 3, 0, 0)), Duration::ZERO);
        // Pool full, nothing queued: one completion at 4 per 2 s.
        assert_eq!(predict_wait(&w(0, 4, 0, 0)), Duration::from_millis(500));
        // A newcomer behind 100 queued requests of one other tenant waits about one slot (DRR).
        assert_eq!(predict_wait(&w(100, 4, 0, 1)), Duration::from_secs(1));
        // The flooder's own next request waits behind its whole queue.
        assert_eq!(
            predict_wait(&w(100, 4, 100, 1)),
            Duration::from_secs_f64(50.5)
        );
    }

    #[test]
    fn header_overrides_default_and_garbage_is_rejected() {
        let mut h = HeaderMap::new();
        assert!(from_request(&h, None).unwrap().is_none());
        let d = from_request(&h, Some(250)).unwrap().unwrap();
        assert_eq!(d.budget, Duration::from_millis(250));
        h.insert(DEADLINE_HEADER, http::HeaderValue::from_static("1500"));
        let d = from_request(&h, Some(250)).unwrap().unwrap();
        assert_eq!(d.budget, Duration::from_millis(1500));
        h.insert(DEADLINE_HEADER, http::HeaderValue::from_static("soon"));
        assert!(matches!(from_request(&h, None), Err(Error::BadDeadline)));
    }
}
