//! Counters and bounded request logs of the mock upstream, plus the in-flight guard.
//!
//! Invariants:
//! - `in_flight` counts admitted requests from arrival until their response body has handed out
//!   its last frame or was dropped; the [`InFlightGuard`] is the only thing that changes it, and its
//!   `Drop` always decrements, so a cancelled future or a dropped body leaks nothing.
//! - Every guard ends exactly once as `completed`, `cancelled` or `aborted`.
//! - `requests` counts every request routed to an endpoint, including the ones answered 429.
//! - The `seen_*` logs keep at most [`SEEN_CAPACITY`] entries each, oldest dropped first.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use http::HeaderMap;

/// How many entries each `seen_*` log keeps.
pub const SEEN_CAPACITY: usize = 1024;

/// Live counters of a [`MockServer`](super::MockServer); shared, lock-free except the logs.
#[derive(Debug, Default)]
pub struct MockStats {
    requests: AtomicU64,
    in_flight: AtomicU64,
    max_in_flight: AtomicU64,
    rejected_429: AtomicU64,
    completed: AtomicU64,
    cancelled: AtomicU64,
    aborted: AtomicU64,
    seen: Mutex<Seen>,
}

#[derive(Debug, Default)]
struct Seen {
    authorization: VecDeque<Option<String>>,
    headers: VecDeque<HeaderMap>,
    bodies: VecDeque<serde_json::Value>,
}

fn push_bounded<T>(log: &mut VecDeque<T>, item: T) {
    if log.len() == SEEN_CAPACITY {
        log.pop_front();
    }
    log.push_back(item);
}

impl MockStats {
    /// Requests routed to an endpoint (including those answered 429).
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }
    /// Admitted requests whose response body has not yet ended or been dropped.
    /// Reads with `Acquire`: once it shows a request ended, that request's end counter shows too.
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Acquire)
    }
    /// The highest `in_flight` seen since start or the last [`reset_max_in_flight`](Self::reset_max_in_flight).
    pub fn max_in_flight(&self) -> u64 {
        self.max_in_flight.load(Ordering::Relaxed)
    }
    /// Requests refused because `max_concurrency` were in flight (429; 503 in the `vllm` profile).
    pub fn rejected_429(&self) -> u64 {
        self.rejected_429.load(Ordering::Relaxed)
    }
    /// Admitted requests whose response body was handed out to its end.
    pub fn completed(&self) -> u64 {
        self.completed.load(Ordering::Relaxed)
    }
    /// Admitted requests dropped before their end (client went away mid-stream or before the head).
    pub fn cancelled(&self) -> u64 {
        self.cancelled.load(Ordering::Relaxed)
    }
    /// Streams the mock cut on purpose (`x-mock-abort-after`); not counted as cancelled.
    pub fn aborted(&self) -> u64 {
        self.aborted.load(Ordering::Relaxed)
    }
    /// Restarts `max_in_flight` from the current `in_flight`.
    pub fn reset_max_in_flight(&self) {
        self.max_in_flight
            .store(self.in_flight.load(Ordering::Relaxed), Ordering::Relaxed);
    }
    /// The `Authorization` header of each recorded request, oldest first (last 1024).
    pub fn seen_authorization(&self) -> Vec<Option<String>> {
        self.seen().authorization.iter().cloned().collect()
    }
    /// The JSON bodies that parsed, oldest first (last 1024).
    pub fn seen_bodies(&self) -> Vec<serde_json::Value> {
        self.seen().bodies.iter().cloned().collect()
    }
    /// All request headers of each recorded request, oldest first (last 1024).
    pub fn seen_headers(&self) -> Vec<HeaderMap> {
        self.seen().headers.iter().cloned().collect()
    }

    fn seen(&self) -> MutexGuard<'_, Seen> {
        self.seen
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Counts a request; returns its 1-based sequence number (used in response ids).
    pub(crate) fn count_request(&self) -> u64 {
        self.requests.fetch_add(1, Ordering::Relaxed) + 1
    }

    pub(crate) fn count_rejected(&self) {
        self.rejected_429.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn record_headers(&self, headers: &HeaderMap) {
        let auth = headers
            .get(http::header::AUTHORIZATION)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
        let mut seen = self.seen();
        push_bounded(&mut seen.authorization, auth);
        push_bounded(&mut seen.headers, headers.clone());
    }

    pub(crate) fn record_body(&self, body: serde_json::Value) {
        push_bounded(&mut self.seen().bodies, body);
    }

    /// Admits one request unless `limit` are already in flight.
    pub(crate) fn try_admit(self: &Arc<Self>, limit: Option<usize>) -> Option<InFlightGuard> {
        let limit = limit.map_or(u64::MAX, |k| k as u64);
        let admitted = self
            .in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            });
        let now = admitted.ok()? + 1;
        self.max_in_flight.fetch_max(now, Ordering::Relaxed);
        Some(InFlightGuard {
            stats: Arc::clone(self),
            end: End::Cancelled,
        })
    }
}

#[derive(Debug, Clone, Copy)]
enum End {
    Completed,
    Cancelled,
    Aborted,
}

/// One admitted request; dropping it ends the request (as cancelled unless marked otherwise).
#[derive(Debug)]
pub(crate) struct InFlightGuard {
    stats: Arc<MockStats>,
    end: End,
}

impl InFlightGuard {
    /// Ends the request as fully answered.
    pub(crate) fn complete(mut self) {
        self.end = End::Completed;
    }
    /// Ends the request as cut on purpose by the mock.
    pub(crate) fn abort(mut self) {
        self.end = End::Aborted;
    }
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        let counter = match self.end {
            End::Completed => &self.stats.completed,
            End::Cancelled => &self.stats.cancelled,
            End::Aborted => &self.stats.aborted,
        };
        // End counter first, then in_flight (release): see `MockStats::in_flight`.
        counter.fetch_add(1, Ordering::Relaxed);
        self.stats.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guard_counts_each_end_once_and_respects_the_limit() {
        let stats = Arc::new(MockStats::default());
        let a = stats.try_admit(Some(2)).expect("first admitted");
        let b = stats.try_admit(Some(2)).expect("second admitted");
        assert!(stats.try_admit(Some(2)).is_none());
        assert_eq!((stats.in_flight(), stats.max_in_flight()), (2, 2));
        a.complete();
        drop(b);
        stats.try_admit(None).expect("unlimited").abort();
        assert_eq!(stats.in_flight(), 0);
        assert_eq!(
            (stats.completed(), stats.cancelled(), stats.aborted()),
            (1, 1, 1)
        );
        stats.reset_max_in_flight();
        assert_eq!(stats.max_in_flight(), 0);
    }

    #[test]
    fn seen_logs_are_bounded() {
        let stats = MockStats::default();
        for i in 0..(SEEN_CAPACITY + 5) {
            stats.record_body(serde_json::json!(i));
        }
        let bodies = stats.seen_bodies();
        assert_eq!(bodies.len(), SEEN_CAPACITY);
        assert_eq!(bodies[0], serde_json::json!(5));
    }
}
